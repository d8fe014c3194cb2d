// The CPU executor on hand-built one-instruction programs: reduce_scatter's average along every
// dimension; a cross_entropy_grad that a plan of another format (or a corrupt one) gives
// without its log-sum-exp, or with one of the wrong size, is refused with a one-line error
// naming the op, instead of reading past a buffer.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "protos/plan.pb.h"
#include "runtime/Executor.h"
#include "runtime/ThreadCollectives.h"
#include "runtime/cpu/CpuKernelContext.h"

namespace loom {
namespace {

int addBuffer(plan::Program &p, std::vector<int64_t> shape, plan::DType dtype, int firstUse) {
  plan::Buffer *b = p.add_buffers();
  b->set_id(p.buffers_size() - 1);
  int64_t n = 1;
  for (int64_t d : shape) b->add_shape(d), n *= d;
  b->set_dtype(dtype);
  b->set_bytes(4 * n);
  b->set_kind(firstUse < 0 ? plan::Buffer::ARGUMENT : plan::Buffer::ACTIVATION);
  b->set_first_use(firstUse);
  b->set_last_use(0);
  return b->id();
}

// cross_entropy_grad over zero logits [2, 3, 5] (every label 1), with an lse of `lseTokens`
// values log 5 (the true one for 6 tokens), as an operand or left out.
Status runGrad(int64_t lseTokens, bool withLse, std::vector<HostTensor> *results = nullptr) {
  plan::Program p;
  p.set_name("backward_0");
  int logits = addBuffer(p, {2, 3, 5}, plan::F32, -1), labels = addBuffer(p, {2, 3}, plan::I32, -1);
  int lse = addBuffer(p, {lseTokens}, plan::F32, -1), out = addBuffer(p, {2, 3, 5}, plan::F32, 0);
  std::vector<int> args = {logits, labels, lse};
  for (int a : args) p.add_arguments()->set_buffer(a);
  p.add_results()->set_buffer(out);
  p.set_workspace_bytes(p.buffers(out).bytes());
  plan::Instruction *in = p.add_instructions();
  in->set_op("cross_entropy_grad");
  in->set_stream(plan::COMPUTE);
  in->add_inputs(logits), in->add_inputs(labels);
  if (withLse) in->add_inputs(lse);
  in->add_outputs(out);
  plan::Attribute *valid = in->add_attributes();
  valid->set_name("valid_vocab");
  valid->set_i(5);
  HostTensor l = HostTensor::zeros({2, 3, 5}), y{{2, 3}}, s{{lseTokens}};
  y.isInt = true, y.ints.assign(6, 1);
  s.data.assign(size_t(lseTokens), std::log(5.0f));
  std::vector<HostTensor> own;
  return executeProgram(p, {&l, &y, &s}, results ? *results : own, ExecutionContext{});
}

TEST(ExecutorPlan, CrossEntropyGradReadsTheKeptLogSumExp) {
  std::vector<HostTensor> results;
  Status s = runGrad(6, true, &results);
  ASSERT_TRUE(s.isOk()) << s.message();
  // (softmax - onehot) / tokens: (1/5 - [label == 1]) / 6.
  ASSERT_EQ(results.size(), 1u);
  for (int64_t i = 0; i < 30; ++i)
    EXPECT_NEAR(results[0].data[size_t(i)], (0.2f - (i % 5 == 1 ? 1.0f : 0.0f)) / 6.0f, 1e-6) << i;
}

TEST(ExecutorPlan, CrossEntropyGradWithoutItsLogSumExpIsRefused) {
  Status s = runGrad(6, false);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("backward_0 instruction 0 (cross_entropy_grad): no input 'lse' (corrupt plan)"), std::string::npos) << s.message();
}

TEST(ExecutorPlan, CrossEntropyGradWithAWrongSizedLogSumExpIsRefused) {
  Status s = runGrad(4, true);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("cross_entropy_grad: wrong lse (corrupt plan)"), std::string::npos) << s.message();
}

// reduce_scatter with "avg" (the sum divided by the group), along dim 0 (the members' blocks
// contiguous) and along dim 1 (interleaved, re-laid out before the collective) alike: two ranks
// in a thread world, rank r's input x_r[i] = (r + 1)(i + 1) over [2, 4].
TEST(ExecutorPlan, ReduceScatterAveragesAlongEveryDimension) {
  for (int64_t dim : {0, 1}) {
    ThreadWorld world({.t = 2});
    std::vector<std::vector<HostTensor>> results(2);
    std::vector<Status> status(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back([&, r] {
        std::unique_ptr<Collectives> collectives = world.forRank(r);
        plan::Program p;
        p.set_name("backward_0");
        int x = addBuffer(p, {2, 4}, plan::F32, -1);
        int y = dim == 0 ? addBuffer(p, {1, 4}, plan::F32, 0) : addBuffer(p, {2, 2}, plan::F32, 0);
        p.add_arguments()->set_buffer(x);
        p.add_results()->set_buffer(y);
        p.set_workspace_bytes(p.buffers(y).bytes());
        plan::Instruction *in = p.add_instructions();
        in->set_op("reduce_scatter");
        in->set_stream(plan::TP);
        in->add_inputs(x), in->add_outputs(y);
        auto attr = [&](const char *name) {
          plan::Attribute *a = in->add_attributes();
          a->set_name(name);
          return a;
        };
        attr("group")->set_s("tp");
        attr("group_size")->set_i(2);
        attr("dim")->set_i(dim);
        attr("reduce")->set_s("avg");
        HostTensor input{{2, 4}};
        for (int i = 0; i < 8; ++i) input.data.push_back(float((r + 1) * (i + 1)));
        ExecutionContext ctx;
        ctx.collectives = collectives.get();
        status[size_t(r)] = executeProgram(p, {&input}, results[size_t(r)], ctx);
      });
    for (std::thread &t : ranks) t.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(status[size_t(r)].isOk()) << "dim " << dim << " rank " << r << ": " << status[size_t(r)].message();
      ASSERT_EQ(results[size_t(r)].size(), 1u);
      const std::vector<float> &got = results[size_t(r)][0].data;
      ASSERT_EQ(got.size(), 4u);
      for (int j = 0; j < 4; ++j) {
        // The element of x this slot holds: row r (dim 0), or row j / 2, columns 2r, 2r + 1 (dim 1).
        int i = dim == 0 ? 4 * r + j : 4 * (j / 2) + 2 * r + j % 2;
        EXPECT_FLOAT_EQ(got[size_t(j)], 1.5f * float(i + 1)) << "dim " << dim << " rank " << r << " slot " << j;
      }
    }
  }
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// The CPU backend has a kernel for every declared op; a backend without one refuses the plan
// at load in one line naming the op and the backend.
TEST(KernelRegistry, TheCpuBackendCoversTheInstructionSet) {
  for (const isa::OpDecl &d : isa::instructionSet())
    EXPECT_NE(cpu::cpuKernels().find(d.id), nullptr) << "no CPU kernel for " << d.name;
}

TEST(KernelRegistry, AMissingKernelIsRefusedAtLoad) {
  plan::Program p;
  p.set_name("forward_0");
  p.add_instructions()->set_op("gelu");
  cpu::CpuKernelRegistry partial("CPU");
  cpu::registerStepKernels(partial);
  Status s = partial.covers(p);
  EXPECT_EQ(s.message(), "forward_0: instruction 0: the CPU backend has no kernel for op 'gelu'");
  p.mutable_instructions(0)->set_op("matmul");
  EXPECT_EQ(cpu::cpuKernels().covers(p).message(), "forward_0: instruction 0: unknown op 'matmul'");
}

}  // namespace
}  // namespace loom
