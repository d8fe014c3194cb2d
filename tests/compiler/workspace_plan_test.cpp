// The workspace planner (compiler/Lowering.h planWorkspace): activations share memory only when
// every access of one happens before every access of the other, by stream order and wait_for
// events; and the memory accounting's schedule walk (plan/MemoryAccounting.h).
#include <gtest/gtest.h>

#include "compiler/Lowering.h"
#include "plan/MemoryAccounting.h"

namespace loom {
namespace {

class ProgramMaker {
 public:
  int buffer(int64_t bytes) {
    plan::Buffer *b = prog.add_buffers();
    b->set_id(prog.buffers_size() - 1);
    b->add_shape(bytes / 4);
    b->set_dtype(plan::F32);
    b->set_bytes(bytes);
    b->set_kind(plan::Buffer::ACTIVATION);
    return b->id();
  }
  int instruction(plan::Stream stream, std::vector<int> in, std::vector<int> out, std::vector<int> waits = {}) {
    plan::Instruction *i = prog.add_instructions();
    i->set_op(stream == plan::COMPUTE ? "scale" : "all_reduce");
    i->set_stream(stream);
    for (int b : in) i->add_inputs(b);
    for (int b : out) i->add_outputs(b);
    for (int w : waits) i->add_wait_for(w);
    int index = prog.instructions_size() - 1;
    for (int b : out)
      if (prog.buffers(b).first_use() == 0 && index) prog.mutable_buffers(b)->set_first_use(index);
    for (int b : in) prog.mutable_buffers(b)->set_last_use(index);
    return index;
  }
  bool overlap(int a, int b) const {
    const plan::Buffer &x = prog.buffers(a), &y = prog.buffers(b);
    return x.offset() < y.offset() + y.bytes() && y.offset() < x.offset() + x.bytes();
  }
  plan::Program prog;
};

// The tensor-parallel pattern: a GEMM's output all-reduced on the tp stream, the compute stream
// waiting for the all-reduce before it reads the sum. Once the waiting instruction has run,
// both the all-reduce's input and output are free for later activations.
TEST(WorkspacePlan, BuffersOfAnotherStreamAreFreeAfterTheWaitThatOrdersThem) {
  ProgramMaker m;
  int x = m.buffer(1024), partial = m.buffer(1024), sum = m.buffer(1024), y = m.buffer(1024), z = m.buffer(1024);
  int gemm = m.instruction(plan::COMPUTE, {x}, {partial});
  int reduce = m.instruction(plan::TP, {partial}, {sum}, {gemm});
  m.instruction(plan::COMPUTE, {sum}, {y}, {reduce});
  m.instruction(plan::COMPUTE, {y}, {z});
  planWorkspace(m.prog);
  EXPECT_FALSE(m.overlap(x, partial));
  EXPECT_FALSE(m.overlap(partial, sum));
  EXPECT_FALSE(m.overlap(sum, y));
  // z is written after the compute stream waited for the all-reduce: it may reuse partial's or x's bytes.
  EXPECT_TRUE(m.overlap(z, partial) || m.overlap(z, x));
  EXPECT_LE(m.prog.workspace_bytes(), 3 * 1024);
}

// Without an event ordering them, a compute buffer written later in program order may still
// run while the other stream reads: no sharing.
TEST(WorkspacePlan, UnorderedStreamsDoNotShare) {
  ProgramMaker m;
  int a = m.buffer(1024), b = m.buffer(1024), c = m.buffer(1024), d = m.buffer(1024);
  int produce = m.instruction(plan::COMPUTE, {}, {a});
  m.instruction(plan::DP, {a}, {b}, {produce});  // the dp stream reads a; nobody waits for it
  m.instruction(plan::COMPUTE, {}, {c});
  m.instruction(plan::COMPUTE, {c}, {d});
  planWorkspace(m.prog);
  for (int later : {c, d}) {
    EXPECT_FALSE(m.overlap(later, a));
    EXPECT_FALSE(m.overlap(later, b));
  }
}

// A result is handed over after its producer on the producer's stream: its bytes stay in use
// until that stream runs its next instruction.
TEST(WorkspacePlan, AResultIsHeldUntilItsStreamMovesOn) {
  ProgramMaker m;
  int r = m.buffer(1024), t1 = m.buffer(1024), t2 = m.buffer(1024);
  m.instruction(plan::COMPUTE, {}, {r});
  m.instruction(plan::COMPUTE, {}, {t1});
  m.instruction(plan::COMPUTE, {t1}, {t2});
  m.prog.add_results()->set_buffer(r);
  planWorkspace(m.prog);
  EXPECT_FALSE(m.overlap(t1, r));  // written by the instruction after the producer (the hand-over)
  EXPECT_TRUE(m.overlap(t2, r));   // after it: free
}

TEST(MemoryAccounting, WalksTheScheduleOverStashesInFlight) {
  // 1F1B on the first of 2 stages, 4 micro-batches: at most 2 forwards' stashes held.
  std::vector<Task> tasks;
  for (auto [type, mb] : std::vector<std::pair<Task::Type, int>>{{Task::kForward, 0}, {Task::kForward, 1},
                                                                 {Task::kBackward, 0}, {Task::kForward, 2},
                                                                 {Task::kBackward, 1}, {Task::kForward, 3},
                                                                 {Task::kBackward, 2}, {Task::kBackward, 3}})
    tasks.push_back({type, 0, mb});
  plan::MemoryPlan mem;
  memory::accountWeights(1000, plan::BF16, 500, /*mastersSharded=*/false, &mem);
  EXPECT_EQ(mem.parameter_bytes(), 4000);
  EXPECT_EQ(mem.gradient_bytes(), 4000);
  EXPECT_EQ(mem.optimizer_bytes(), 4000);  // 8 bytes per element of a 500-element shard
  EXPECT_EQ(mem.half_weight_bytes(), 2000);
  memory::StageActivations acts{{100}, 10, 50, "backward_0"};
  memory::accountActivations(tasks, acts, 1, &mem);
  EXPECT_EQ(mem.peak_stash_bytes(), 200);
  EXPECT_EQ(mem.peak_stash_chunks(), 2);
  EXPECT_DOUBLE_EQ(memory::microBatchesInFlight(mem), 2.0);
  EXPECT_EQ(mem.peak_input_bytes(), 20);
  EXPECT_EQ(mem.peak_bytes(), 14000 + 200 + 20 + 50);
  EXPECT_EQ(mem.timeline_bytes_size(), 9);
  EXPECT_EQ(memory::namedParts(mem).front().second, "parameters");
}

}  // namespace
}  // namespace loom
