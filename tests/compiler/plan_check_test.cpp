// loomc check (compiler/PlanCheck.h) on gpt-tiny's compiled plans: they pass, and plans
// mutated on one rank are refused with a one-line reason naming the rank, program,
// micro-batch, instruction and op: two collectives swapped, a send dropped, a receive's shape
// changed, the tied embedding's all-reduce moved into the last stage's backward (the deadlock
// the compiler avoids by putting it in the optimizer), a schedule entry reordered.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "analysis/PlanCheck.h"
#include "analysis/PlanViews.h"
#include "plan/PlanAttributes.h"

namespace loom {
namespace {

std::string runfile(const std::string &path) {
  const char *dir = std::getenv("TEST_SRCDIR");
  const char *ws = std::getenv("TEST_WORKSPACE");
  return std::string(dir ? dir : ".") + "/" + (ws ? ws : "loom") + "/" + path;
}
std::string tmpdir() { return std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"; }

// A compiled job whose ranks each own a copy of their programs (a mutation touches one rank).
struct Job {
  PlanDirectory dir;
  std::vector<plan::ProgramSet> programs;
  std::string check() {
    std::vector<RankPrograms> ranks;
    for (size_t r = 0; r < dir.ranks.size(); ++r) ranks.push_back({&dir.ranks[r], &programs[r]});
    CheckResult summary;
    llvm::Error e = checkPlans(ranks, &summary);
    return e ? llvm::toString(std::move(e)) : "";
  }
  plan::Program &program(int rank, const std::string &name) {
    for (plan::Program &p : *programs[size_t(rank)].mutable_programs())
      if (p.name() == name) return p;
    ADD_FAILURE() << "no program " << name;
    return *programs[size_t(rank)].mutable_programs(0);
  }
};

Job compile(const std::string &name, const std::string &parallel, int world) {
  std::string cluster = tmpdir() + "/" + name + ".pbtxt", out = tmpdir() + "/plans_check_" + name;
  std::ofstream(cluster) << "name: \"" << name << "\"\nnodes: 1\ndevices_per_node: " << world
                         << "\ndevice { kind: CPU }\nparallel { " << parallel << " }\n";
  std::string command = runfile("apps/loomc") + " compile " + runfile("examples/models/gpt-tiny.pbtxt") +
                        " --cluster " + cluster + " --out " + out + " --quiet";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  Job job;
  llvm::Expected<PlanDirectory> dir = readPlanDirectory(out);
  if (!dir) {
    ADD_FAILURE() << llvm::toString(dir.takeError());
    return job;
  }
  job.dir = std::move(*dir);
  for (size_t r = 0; r < job.dir.ranks.size(); ++r) job.programs.push_back(job.dir.programsOf(int(r)));
  return job;
}

// The indices of `program`'s instructions with op `op` (and group `group` when given).
std::vector<int> find(const plan::Program &program, const std::string &op, const std::string &group = "") {
  std::vector<int> out;
  for (int i = 0; i < program.instructions_size(); ++i)
    if (program.instructions(i).op() == op && (group.empty() || planattr::str(program.instructions(i), "group") == group))
      out.push_back(i);
  return out;
}

// Removes instruction `index` from `program` (the events of later instructions renumbered; a
// wait on it dropped): the op is gone as if the compiler had never emitted it.
void erase(plan::Program &program, int index) {
  auto &list = *program.mutable_instructions();
  list.erase(list.begin() + index);
  for (plan::Instruction &in : list) {
    std::vector<int> waits;
    for (int w : in.wait_for())
      if (w != index) waits.push_back(w > index ? w - 1 : w);
    in.clear_wait_for();
    for (int w : waits) in.add_wait_for(w);
  }
}

void expectAll(const std::string &message, std::initializer_list<const char *> parts) {
  std::printf("refused: %s\n", message.c_str());  // the one line a user would see
  EXPECT_FALSE(message.empty()) << "the mutated plans passed the check";
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const char *p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
}

TEST(PlanCheck, CompiledPlansPass) {
  for (auto [name, parallel, world] :
       {std::make_tuple("t2p2d2", "tensor_parallel_size: 2 pipeline_parallel_size: 2 data_parallel_size: 2 "
                                  "micro_batch_size: 2 global_batch_size: 8",
                        8),
        std::make_tuple("t1p2d1v2", "pipeline_parallel_size: 2 virtual_pipeline_size: 2 micro_batch_size: 1 "
                                    "global_batch_size: 4",
                        2),
        std::make_tuple("t1p2d2z", "pipeline_parallel_size: 2 data_parallel_size: 2 micro_batch_size: 1 "
                                   "global_batch_size: 8 zero1: true",
                        4)}) {
    Job job = compile(name, parallel, world);
    EXPECT_EQ(job.check(), "") << name;
  }
}

TEST(PlanCheck, TwoCollectivesSwappedOnOneRank) {
  Job job = compile("swap", "tensor_parallel_size: 2 pipeline_parallel_size: 2 micro_batch_size: 2 global_batch_size: 4", 4);
  // Rank 3 (last stage, tp 1) swaps the cross-entropy's max and sums all-reduces.
  plan::Program &fwd = job.program(3, "forward_1");
  std::vector<int> tp = find(fwd, "all_reduce", "tp");
  int a = -1, b = -1;
  for (int i : tp) {
    const plan::Instruction &in = fwd.instructions(i);
    if (planattr::str(in, "reduce") == "max") a = i;
    if (a >= 0 && i > a && b < 0 && planattr::str(in, "reduce") == "sum") b = i;
  }
  ASSERT_TRUE(a >= 0 && b >= 0);
  plan::Instruction *x = fwd.mutable_instructions(a), *y = fwd.mutable_instructions(b);
  std::swap(*x->mutable_inputs(), *y->mutable_inputs());
  std::swap(*x->mutable_outputs(), *y->mutable_outputs());
  expectAll(job.check(), {"group tp", "rank 3 in forward_1 mb 0", "rank 2 in forward_1 mb 0", "all_reduce"});
}

TEST(PlanCheck, ADroppedSend) {
  Job job = compile("drop", "pipeline_parallel_size: 2 micro_batch_size: 1 global_batch_size: 2", 2);
  plan::Program &fwd = job.program(0, "forward_0");
  std::vector<int> sends = find(fwd, "send");
  ASSERT_FALSE(sends.empty());
  erase(fwd, sends[0]);  // no message goes out
  expectAll(job.check(), {"deadlock", "rank 1 in forward_1 mb 0", "recv@pp", "waits for tag"});
}

TEST(PlanCheck, AReceiveOfAnotherShape) {
  Job job = compile("shape", "pipeline_parallel_size: 2 micro_batch_size: 1 global_batch_size: 2", 2);
  plan::Program &fwd = job.program(1, "forward_1");
  std::vector<int> recvs = find(fwd, "recv");
  ASSERT_FALSE(recvs.empty());
  plan::Buffer *b = fwd.mutable_buffers(fwd.instructions(recvs[0]).outputs(0));
  b->set_shape(0, b->shape(0) * 2);
  expectAll(job.check(), {"rank 1 in forward_1 mb 0", "recv@pp", "receives", "sends"});
}

TEST(PlanCheck, TheEmbeddingAllReduceMovedIntoTheLastBackward) {
  Job job = compile("embed", "pipeline_parallel_size: 2 virtual_pipeline_size: 2 micro_batch_size: 1 global_batch_size: 4", 2);
  // Rank 1 (the last stage) sums the tied embedding's gradient in its last chunk's backward
  // instead of in its optimizer; rank 0 still sums it in its optimizer.
  plan::Program &opt = job.program(1, "optimizer");
  std::vector<int> embedding = find(opt, "all_reduce", "embedding");
  ASSERT_EQ(embedding.size(), 1u);
  plan::Instruction sync = opt.instructions(embedding[0]);
  erase(opt, embedding[0]);
  plan::Program &bwd = job.program(1, "backward_3");
  int gradient = -1;
  for (const plan::Binding &a : bwd.arguments())
    if (a.role() == plan::Binding::GRADIENT && a.name().find(".stage") != std::string::npos) gradient = a.buffer();
  ASSERT_GE(gradient, 0);
  sync.clear_inputs(), sync.clear_outputs(), sync.clear_wait_for();
  sync.add_inputs(gradient), sync.add_outputs(gradient);
  sync.set_last_micro_batch(true);
  *bwd.add_instructions() = sync;
  expectAll(job.check(), {"deadlock", "rank 1 in backward_3", "all_reduce@embedding", "waits for its group"});
}

TEST(PlanCheck, AScheduleEntryReordered) {
  Job job = compile("order", "pipeline_parallel_size: 2 micro_batch_size: 1 global_batch_size: 4 schedule: ONE_F_ONE_B", 2);
  // Rank 0 runs its first two forwards in the other order: its messages leave out of order.
  plan::RankPlan &rp = job.dir.ranks[0];
  ASSERT_EQ(rp.schedule(0).program(), "forward_0");
  ASSERT_EQ(rp.schedule(1).program(), "forward_0");
  std::swap(*rp.mutable_schedule(0), *rp.mutable_schedule(1));
  expectAll(job.check(), {"rank 1 in forward_1 mb 0", "receives tag", "next message is tag", "rank 0 in forward_0 mb 1"});
}

}  // namespace
}  // namespace loom
