// The CUDA executor against the CPU executor on every program of gpt-tiny and bert-tiny
// compiled by loomc for one rank (forward and backward with the same arguments: fp32 results
// within 1e-4 relative L2; bf16 plans within their rounding). Needs a GPU; without one, what runs is the check that creating the executor fails
// with a one-line CUDA error instead of crashing.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "plan/InstructionSet.h"
#include "protos/plan.pb.h"
#include "runtime/Executor.h"
#include "runtime/cuda/CudaExecutor.h"
#include "runtime/ThreadCollectives.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/NcclGroup.h"
#include "runtime/cuda/ProgressEvents.h"
#include "runtime/cpu/HalfStorage.h"
#include "tests/cuda/TestPlans.h"

namespace loom {
namespace {

// Deterministic arguments: token ids below 50 (every test vocabulary is larger), BERT's token
// types and sentence-order labels 0 or 1, BERT's attention_mask with a quarter of the keys
// padded (never a sample's first), other masks of ones, everything else normal(0, 0.5).
std::vector<HostTensor> argumentsFor(const plan::Program &program, std::mt19937 &rng) {
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<HostTensor> args;
  for (const plan::Binding &binding : program.arguments()) {
    const plan::Buffer &b = program.buffers(binding.buffer());
    HostTensor t;
    t.shape.assign(b.shape().begin(), b.shape().end());
    if (b.dtype() == plan::I32) {
      t.isInt = true;
      t.ints.resize(size_t(t.numel()));
      uint32_t below = binding.name() == "token_types" || binding.name() == "sop_labels" ? 2 : 50;
      for (int32_t &v : t.ints) v = int32_t(rng() % below);
    } else {
      t.data.resize(size_t(t.numel()));
      bool mask = binding.name().find("mask") != std::string::npos;
      bool keys = binding.name() == "attention_mask" && t.shape.size() == 2;
      for (size_t i = 0; i < t.data.size(); ++i)
        t.data[i] = keys ? (i % size_t(t.shape[1]) == 0 || rng() % 4 != 0 ? 1.0f : 0.0f) : mask ? 1.0f : normal(rng);
    }
    args.push_back(std::move(t));
  }
  return args;
}

// An executor for `rank`'s plan, with communicators for a world of one (the grad-sync
// program's all-reduces run through NCCL). gtest assertions on failure.
void makeExecutor(const plan::RankPlan &rank, cuda::CudaExecutorOptions options, std::unique_ptr<cuda::NcclGroups> *groups,
                  std::unique_ptr<cuda::CudaExecutor> *executor) {
  Status s = cuda::NcclGroups::create(nullptr, rank, 1000, groups);
  ASSERT_TRUE(s.isOk()) << s.message();
  options.groups = groups->get();
  s = cuda::CudaExecutor::create(options, executor);
  ASSERT_TRUE(s.isOk()) << s.message();
}

double relErr(const std::vector<float> &got, const std::vector<float> &want) {
  double d = 0, n = 0;
  for (size_t i = 0; i < got.size(); ++i) d += std::pow(got[i] - want[i], 2), n += std::pow(want[i], 2);
  return std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
}

// What the CUDA backend has kernels for, checked without a device: every op of the
// instruction set but those listed here, whose plans it refuses at load in one line (a new op
// without a CUDA kernel, or a kernel for a listed one, changes this list on purpose); and every
// program of gpt-tiny's and bert-tiny's plans, fp32 and bf16, loads.
TEST(CudaExecutor, KernelsCoverTheInstructionSetButTheListedOps) {
  std::vector<std::string> missing;
  for (const isa::OpDecl &d : isa::instructionSet()) {
    plan::Program p;
    p.set_name("p");
    p.add_instructions()->set_op(d.name);
    if (!cuda::checkCudaKernels(p).isOk()) missing.push_back(d.name);
  }
  // Mixture of experts and context parallelism's ring attention: CPU-only (loomc refuses both
  // for GPU clusters in one line: config/ConfigLoader.cpp; a plan compiled for a CPU cluster
  // and run with --device cuda is refused at load, below).
  EXPECT_EQ(missing, (std::vector<std::string>{"moe", "moe_grad", "moe_routing_stats", "ring_attention",
                                               "ring_attention_grad", "ring_grouped_attention",
                                               "ring_grouped_attention_grad", "expert_parallel_moe",
                                               "expert_parallel_moe_grad"}));
  // Context parallelism's all-gather form uses ops with CUDA kernels, but chunked: refused by
  // the instruction's context_parallel_group, whatever the cluster the plan was compiled for.
  {
    plan::Program p;
    p.set_name("forward_0");
    p.add_instructions()->set_op("gelu");
    plan::Instruction *in = p.add_instructions();
    in->set_op("attention");
    plan::Attribute *a = in->add_attributes();
    a->set_name("context_parallel_group"), a->set_s("cp0");
    Status s = cuda::checkCudaKernels(p);
    ASSERT_FALSE(s.isOk());
    EXPECT_EQ(s.message(),
              "forward_0: instruction 1: the CUDA backend has no context-parallel kernel for op 'attention' (context "
              "parallelism runs on CPU clusters)");
  }
  plan::RankPlan rank;
  plan::ProgramSet programs;
  for (int model = 0; model < 4; ++model) {
    if (model < 2)
      model == 0 ? test::loadGptTinyPlan(&rank, &programs) : test::loadGptTinyBf16Plan(&rank, &programs);
    else
      test::loadBertTinyPlan(&rank, &programs, /*bf16=*/model == 3);
    if (HasFatalFailure()) return;
    for (const plan::Program &program : programs.programs()) {
      Status s = cuda::checkCudaKernels(program);
      EXPECT_TRUE(s.isOk()) << s.message();
    }
  }
}

TEST(CudaExecutor, WithoutADeviceCreationFailsWithAMessage) {
  const char *why = "";
  if (cuda::deviceAvailable(&why)) GTEST_SKIP() << "a CUDA device is present: this case is for machines without one";
  std::unique_ptr<cuda::CudaExecutor> executor;
  Status s = cuda::CudaExecutor::create({}, &executor);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.message().rfind("CUDA", 0), 0u) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
}

// What the device is at, not what the host queued: an instruction issued behind a kernel that
// keeps the stream busy is reported in flight until the kernel ends, then complete.
TEST(CudaExecutor, ProgressReportsWhatTheDeviceIsAt) {
  const char *why = "";
  if (!cuda::deviceAvailable(&why)) GTEST_SKIP() << "no CUDA device (" << why << "): skipping the progress check";
  plan::Program program;
  program.set_name("forward_0");
  for (const char *op : {"linear", "gelu"}) {
    plan::Instruction *in = program.add_instructions();
    in->set_op(op), in->set_stream(plan::COMPUTE), in->set_layer(2);
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  Progress progress;
  {
    cuda::ProgressEvents events;
    cuda::spinOnDevice(1.0, stream);
    ASSERT_TRUE(events.issue(&progress, program, 3, 0, /*run=*/0, stream).isOk());
    ASSERT_TRUE(events.issue(&progress, program, 3, 1, 0, stream).isOk());
    Progress::Report r = progress.report();  // the host is here at once; the device is in its first second
    EXPECT_EQ(r.completed, 0);
    EXPECT_FALSE(r.idle);
    EXPECT_EQ(r.where, "forward_0 mb 3 at instruction 0 (linear, layer 2)");
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    r = progress.report();
    EXPECT_EQ(r.completed, 2);
    EXPECT_TRUE(r.idle);
    cuda::spinOnDevice(0.5, stream);
    ASSERT_TRUE(events.issue(&progress, program, 4, 0, 1, stream).isOk());
  }  // destroyed with an instruction pending: the progress no longer asks its events
  EXPECT_TRUE(progress.report().idle);
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
}

// fp32 within 1e-4 (with either attention kernel); bf16 and fp16 GEMM operands (autocast)
// within their rounding.
struct Numerics {
  cuda::Precision precision;
  cuda::AttentionKernel attention;
  const char *name;
};
class CudaExecutorPrecision : public ::testing::TestWithParam<Numerics> {};

// Every program of (rank, programs) on the CUDA executor with `options` against the CPU
// executor, each result within `tolerance` (relative L2).
void expectEveryProgramMatchesTheCpu(const plan::RankPlan &rank, const plan::ProgramSet &programs,
                                     const cuda::CudaExecutorOptions &options, double tolerance) {
  std::unique_ptr<cuda::NcclGroups> groups;
  std::unique_ptr<cuda::CudaExecutor> executor;
  makeExecutor(rank, options, &groups, &executor);
  if (::testing::Test::HasFatalFailure()) return;
  Status s = Status::ok();
  ThreadWorld world(ParallelLayout{});
  std::unique_ptr<Collectives> collectives = world.forRank(0);
  std::mt19937 rng(3);
  for (const plan::Program &program : programs.programs()) {
    // Each executor gets its own copy: the CPU executor updates in-out arguments in place (the
    // loss program zeroes loss_sum, the optimizer the gradients), as a step driver expects.
    const std::vector<HostTensor> args = argumentsFor(program, rng);
    std::vector<HostTensor> cpuArgs = args, gpuArgs = args;
    std::vector<const HostTensor *> cpuPtrs, gpuPtrs;
    for (size_t a = 0; a < args.size(); ++a) cpuPtrs.push_back(&cpuArgs[a]), gpuPtrs.push_back(&gpuArgs[a]);
    ExecutionContext ctx;
    ctx.collectives = collectives.get();
    std::vector<HostTensor> want, got;
    ASSERT_TRUE(executeProgram(program, cpuPtrs, want, ctx).isOk()) << program.name();
    s = executor->run(program, gpuPtrs, got, ctx);
    ASSERT_TRUE(s.isOk()) << s.message();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_LT(relErr(got[i].data, want[i].data), tolerance) << program.name() << " result "
                                                               << program.results(i).name() << " ("
                                                               << cuda::precisionName(options.precision) << ")";
  }
}

TEST_P(CudaExecutorPrecision, MatchesTheCpuExecutorOnEveryProgramOfGptTiny) {
  const cuda::Precision precision = GetParam().precision;
  const double tolerance = precision == cuda::Precision::kFp32 ? 1e-4 : precision == cuda::Precision::kBf16 ? 3e-2 : 5e-3;
  const char *why = "";
  if (!cuda::deviceAvailable(&why)) GTEST_SKIP() << "no CUDA device (" << why << "): skipping the executor check";
  plan::RankPlan rank;
  plan::ProgramSet programs;
  test::loadGptTinyPlan(&rank, &programs);
  if (HasFatalFailure()) return;
  cuda::CudaExecutorOptions options;
  options.precision = precision, options.attention = GetParam().attention;
  expectEveryProgramMatchesTheCpu(rank, programs, options, tolerance);
}

// BERT's ops (token types, padded keys in both attention kernels, tanh, the two-class loss) on
// the GPU against the CPU, fp32 within 1e-4.
TEST(CudaExecutor, MatchesTheCpuExecutorOnEveryProgramOfBertTiny) {
  const char *why = "";
  if (!cuda::deviceAvailable(&why)) GTEST_SKIP() << "no CUDA device (" << why << "): skipping the BERT executor check";
  plan::RankPlan rank;
  plan::ProgramSet programs;
  test::loadBertTinyPlan(&rank, &programs);
  if (HasFatalFailure()) return;
  for (cuda::AttentionKernel attention : {cuda::AttentionKernel::kUnfused, cuda::AttentionKernel::kFlash}) {
    cuda::CudaExecutorOptions options;
    options.precision = cuda::Precision::kFp32, options.attention = attention;
    expectEveryProgramMatchesTheCpu(rank, programs, options, 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Precisions, CudaExecutorPrecision,
    ::testing::Values(Numerics{cuda::Precision::kFp32, cuda::AttentionKernel::kUnfused, "fp32"},
                      Numerics{cuda::Precision::kFp32, cuda::AttentionKernel::kFlash, "fp32_flash"},
                      Numerics{cuda::Precision::kBf16, cuda::AttentionKernel::kAuto, "bf16"},
                      Numerics{cuda::Precision::kFp16, cuda::AttentionKernel::kAuto, "fp16"}),
    [](const auto &info) { return std::string(info.param.name); });


// Every program of a 16-bit plan on the CUDA executor against the CPU executor's bf16
// execution: both round every 16-bit result once at the same points, from the same
// (bf16-exact) arguments, so they differ where a GEMM's or a reduction's summation order moves
// a value across a rounding boundary, compounded through the program: within 3e-2 (the
// autocast case's bound above).
void expectEveryProgramOfABf16PlanMatchesTheCpu(const plan::RankPlan &rank, const plan::ProgramSet &programs) {
  std::unique_ptr<cuda::NcclGroups> groups;
  std::unique_ptr<cuda::CudaExecutor> executor;
  cuda::CudaExecutorOptions options;
  options.precision = cuda::Precision::kBf16;
  makeExecutor(rank, options, &groups, &executor);
  if (::testing::Test::HasFatalFailure()) return;
  Status s = Status::ok();
  ThreadWorld world(ParallelLayout{});
  std::unique_ptr<Collectives> collectives = world.forRank(0);
  std::mt19937 rng(5);
  int sixteenBit = 0;
  for (const plan::Program &program : programs.programs()) {
    std::vector<HostTensor> args = argumentsFor(program, rng);
    // 16-bit arguments rounded to bf16 here: both executors then read the same values.
    std::vector<std::vector<uint16_t>> halves(args.size());
    std::vector<ArgumentView> cpuViews;
    std::vector<HostTensor> cpuArgs = args;
    for (size_t a = 0; a < args.size(); ++a) {
      const plan::Buffer &b = program.buffers(program.arguments(int(a)).buffer());
      ArgumentView v = ArgumentView::of(cpuArgs[a]);
      if (b.dtype() == plan::BF16) {
        ++sixteenBit;
        halves[a].resize(args[a].data.size());
        cpu::narrow(plan::BF16, args[a].data.data(), halves[a].data(), int64_t(halves[a].size()));
        cpu::widen(plan::BF16, halves[a].data(), args[a].data.data(), int64_t(halves[a].size()));
        v = ArgumentView{};
        v.h = halves[a].data(), v.count = int64_t(halves[a].size());
      }
      cpuViews.push_back(v);
    }
    std::vector<HostTensor> gpuArgs = args;
    std::vector<const HostTensor *> gpuPtrs;
    for (HostTensor &t : gpuArgs) gpuPtrs.push_back(&t);
    ExecutionContext ctx;
    ctx.collectives = collectives.get();
    std::vector<std::vector<float>> want(size_t(program.results_size()));
    s = executeProgram(program, cpuViews, [&](int i, const float *data, int64_t n) { want[size_t(i)].assign(data, data + n); },
                       ctx);
    ASSERT_TRUE(s.isOk()) << program.name() << ": " << s.message();
    std::vector<HostTensor> got;
    s = executor->run(program, gpuPtrs, got, ctx);
    ASSERT_TRUE(s.isOk()) << s.message();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_LT(relErr(got[i].data, want[i]), 3e-2) << program.name() << " result " << program.results(int(i)).name();
  }
  EXPECT_GT(sixteenBit, 0) << "the bf16 plan has no 16-bit arguments";
}

TEST(CudaExecutorBf16Plan, MatchesTheCpuExecutorOnEveryProgramOfGptTiny) {
  const char *why = "";
  if (!cuda::deviceAvailable(&why)) GTEST_SKIP() << "no CUDA device (" << why << "): skipping the bf16 plan check";
  plan::RankPlan rank;
  plan::ProgramSet programs;
  test::loadGptTinyBf16Plan(&rank, &programs);
  if (HasFatalFailure()) return;
  expectEveryProgramOfABf16PlanMatchesTheCpu(rank, programs);
}

TEST(CudaExecutorBf16Plan, MatchesTheCpuExecutorOnEveryProgramOfBertTiny) {
  const char *why = "";
  if (!cuda::deviceAvailable(&why)) GTEST_SKIP() << "no CUDA device (" << why << "): skipping the BERT bf16 plan check";
  plan::RankPlan rank;
  plan::ProgramSet programs;
  test::loadBertTinyPlan(&rank, &programs, /*bf16=*/true);
  if (HasFatalFailure()) return;
  expectEveryProgramOfABf16PlanMatchesTheCpu(rank, programs);
}

}  // namespace
}  // namespace loom
