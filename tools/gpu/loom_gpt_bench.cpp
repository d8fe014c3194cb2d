// Loom's side of the GPU check (issue 7): trains a GPT from plans compiled by loomc for one
// GPU (the check's 1.3B model: examples/models/gpt-1.3b.pbtxt on examples/clusters/h200-1.pbtxt)
// with the CUDA trainer, and prints tokens/s and MFU against the bf16 GEMM rate it measures in
// the same run (cuBLAS, n^3 bf16, as tools/gpu/torch_gpt_bench.py measures it through PyTorch).
// FLOPs per step are PTD-P's count (train/TrainingLoop.h), the count the PyTorch script uses.
//
// usage: loom-gpt-bench --plans DIR [--precision bf16|fp16|fp32] [--attention auto|unfused|flash]
//                       [--steps 6] [--gemm-size 8192] [--result FILE]
//        (FILE receives "tokens_per_s <n>" for the ratio)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "plan/PlanVersion.h"
#include "protos/plan.pb.h"
#include "data/DataSource.h"
#include "support/Checksum.h"
#include "runtime/ThreadCollectives.h"
#include "train/TrainingLoop.h"
#include "support/CommandLine.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/CudaBackend.h"
#include "train/Trainer.h"
#include "runtime/cuda/NcclGroup.h"

namespace {

loom::Status readFile(const std::string &path, std::string *out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return loom::Status::error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return loom::Status::ok();
}

loom::Status loadPlan(const std::string &dir, loom::plan::RankPlan *plan, loom::plan::ProgramSet *programs) {
  std::string bytes, pbytes;
  LOOM_RETURN_IF_ERROR(readFile(dir + "/rank_0.plan.pb", &bytes));
  if (!plan->ParseFromString(bytes) || plan->world_size() <= 0)
    return loom::Status::error(dir + "/rank_0.plan.pb: corrupt plan (not a RankPlan)");
  if (std::string why = loom::planVersionError(plan->plan_version(), dir + "/rank_0.plan.pb"); !why.empty())
    return loom::Status::error(why);
  if (plan->world_size() != 1)
    return loom::Status::error(dir + ": a plan for " + std::to_string(plan->world_size()) +
                               " ranks; this benchmark runs one GPU (compile for a one-device cluster)");
  LOOM_RETURN_IF_ERROR(readFile(dir + "/" + plan->programs_file(), &pbytes));
  if (loom::checksum64(pbytes) != plan->programs_checksum())
    return loom::Status::error(plan->programs_file() + ": checksum mismatch (corrupt, or from another compile)");
  if (!programs->ParseFromString(pbytes)) return loom::Status::error(plan->programs_file() + ": corrupt program file");
  return loom::Status::ok();
}

// The mean bf16 GEMM rate over `reps` n^3 products after three warm-ups (FLOP/s).
loom::Status bf16GemmRate(int n, int reps, double *rate) {
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return loom::Status::error("cuBLAS: cannot create a handle");
  void *a = nullptr, *b = nullptr, *c = nullptr;
  size_t bytes = size_t(n) * n * sizeof(__nv_bfloat16);
  cudaError_t err = cudaMalloc(&a, bytes);
  if (err == cudaSuccess) err = cudaMalloc(&b, bytes);
  if (err == cudaSuccess) err = cudaMalloc(&c, bytes);
  if (err == cudaSuccess) err = cudaMemset(a, 0x3c, bytes);  // bf16 0x3c3c ~ 0.0115: finite operands
  if (err == cudaSuccess) err = cudaMemset(b, 0x3c, bytes);
  loom::Status st = loom::Status::ok();
  if (err != cudaSuccess) st = loom::Status::error(std::string("CUDA GEMM benchmark: ") + cudaGetErrorString(err));
  float alpha = 1, beta = 0;
  auto gemm = [&] {
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta, c,
                        CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  for (int i = 0; i < 3 && st.isOk(); ++i)
    if (gemm() != CUBLAS_STATUS_SUCCESS) st = loom::Status::error("cuBLAS bf16 GEMM failed");
  cudaDeviceSynchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps && st.isOk(); ++i)
    if (gemm() != CUBLAS_STATUS_SUCCESS) st = loom::Status::error("cuBLAS bf16 GEMM failed");
  cudaDeviceSynchronize();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *rate = 2.0 * n * double(n) * n * reps / seconds;
  cudaFree(a), cudaFree(b), cudaFree(c);
  cublasDestroy(h);
  return st;
}

}  // namespace

constexpr char kUsage[] =
    "loom-gpt-bench: Loom's side of the GPU check (the trainer on the CUDA backend, one GPU).\n"
    "  loom-gpt-bench --plans DIR [--precision bf16] [--steps N] [--attention auto] [--lr LR]\n"
    "                 [--gemm-size N] [--result FILE]\n";

namespace cl = llvm::cl;

cl::OptionCategory category("loom-gpt-bench options");
cl::opt<std::string> plansDir("plans", cl::desc("plans compiled for one GPU (loomc compile ... --out DIR), required"),
                              cl::value_desc("DIR"), cl::cat(category));
cl::opt<std::string> precisionFlag("precision", cl::desc("fp32, bf16 or fp16"), cl::value_desc("P"), cl::init("bf16"),
                                   cl::cat(category));
cl::opt<std::string> attentionFlag("attention", cl::desc("auto, unfused or flash"), cl::value_desc("KERNEL"),
                                   cl::init("auto"), cl::cat(category));
cl::opt<int64_t> stepsFlag("steps", cl::desc("iterations (at least 2: the first warms up)"), cl::value_desc("N"),
                           cl::init(6), cl::cat(category));
cl::opt<double> lrFlag("lr", cl::desc("learning rate"), cl::value_desc("LR"), cl::init(1e-4), cl::cat(category));
cl::opt<int64_t> gemmSizeFlag("gemm-size", cl::desc("order of the bf16 GEMM that measures the peak"),
                              cl::value_desc("N"), cl::init(8192), cl::cat(category));
cl::opt<std::string> resultFile("result", cl::desc("write \"tokens_per_s <n>\" to FILE"), cl::value_desc("FILE"),
                                cl::cat(category));

int main(int argc, char **argv) {
  if (!loom::parseCommandLine(argc, argv, kUsage, {&category})) return 2;
  auto fail = [](const std::string &msg) {
    std::fprintf(stderr, "loom-gpt-bench: error: %s\n", msg.c_str());
    return 1;
  };
  if (!plansDir.getNumOccurrences()) return fail("--plans DIR is required (loomc compile ... --out DIR for one GPU)");
  loom::cuda::Precision precision;
  if (!loom::cuda::parsePrecision(precisionFlag, &precision))
    return fail("--precision " + precisionFlag + ": expected fp32, bf16 or fp16");
  loom::cuda::AttentionKernel attention;
  if (!loom::cuda::parseAttentionKernel(attentionFlag, &attention))
    return fail("--attention " + attentionFlag + ": expected auto, unfused or flash");
  int64_t steps = stepsFlag, gemmSize = gemmSizeFlag;
  double lr = lrFlag;
  if (steps < 2) return fail("--steps must be at least 2 (the first step warms up)");
  const char *why = "";
  if (!loom::cuda::deviceAvailable(&why)) return fail(std::string("no CUDA device: ") + why);

  loom::plan::RankPlan plan;
  loom::plan::ProgramSet programs;
  loom::Status s = loadPlan(plansDir, &plan, &programs);
  if (!s.isOk()) return fail(s.message());

  double peak = 0;
  s = bf16GemmRate(int(gemmSize), 10, &peak);
  if (!s.isOk()) return fail(s.message());
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("machine: %s; bf16 GEMM %lld^3: %.1f TFLOP/s (measured)\n", prop.name, (long long)gemmSize, peak / 1e12);

  loom::ThreadWorld world(loom::ParallelLayout{});
  std::unique_ptr<loom::Collectives> collectives = world.forRank(0);
  std::unique_ptr<loom::cuda::NcclGroups> groups;
  s = loom::cuda::NcclGroups::create(nullptr, plan, 10000, &groups);
  if (!s.isOk()) return fail(s.message());
  loom::SyntheticData data(plan.seq_length(), plan.vocab_size(), 1);
  loom::cuda::CudaExecutorOptions options;
  options.precision = precision;
  options.attention = attention;
  options.groups = groups.get();
  std::unique_ptr<loom::cuda::CudaBackend> backend;
  s = loom::cuda::CudaBackend::create(options, programs, &backend);
  if (!s.isOk()) return fail(s.message());
  loom::TrainerOptions topt;
  topt.lossScaling = precision == loom::cuda::Precision::kFp16;
  std::unique_ptr<loom::Trainer> trainer;
  s = loom::Trainer::create(plan, programs, std::move(backend), collectives.get(), &data, topt, &trainer);
  if (!s.isOk()) return fail(s.message());

  // The whole iteration (forward, backward, gradient sync, norm, clipping, AdamW), timed from
  // outside with the device drained, as the training loop times it.
  std::vector<double> seconds, losses;
  int64_t skipped = 0;
  for (int64_t it = 1; it <= steps; ++it) {
    loom::StepResult r;
    double norm = 0;
    bool skip = false;
    auto started = std::chrono::steady_clock::now();
    s = trainer->computeGradients(it - 1, &r);
    if (s.isOk()) s = trainer->optimizerStep(it - skipped, lr, 1.0, &norm, &skip);
    if (!s.isOk()) return fail("step " + std::to_string(it) + ": " + s.message());
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    skipped += skip;
    std::printf("step %lld: %.1f ms, loss %.4f, grad norm %.3f%s\n", (long long)it, elapsed * 1e3, r.loss, norm,
                skip ? " (skipped: fp16 overflow)" : "");
    std::fflush(stdout);
    seconds.push_back(elapsed);
    losses.push_back(r.loss);
  }
  for (double l : losses)
    if (!std::isfinite(l)) return fail("the loss is not finite");
  double step = *std::min_element(seconds.begin() + 1, seconds.end());
  double tokensPerS = double(plan.global_batch_size()) * plan.seq_length() / step;
  double flops = loom::modelFlopsPerStep(plan) / step;
  size_t freeBytes = 0, totalBytes = 0;
  cudaMemGetInfo(&freeBytes, &totalBytes);
  std::printf("Loom GPT %.2fB params, seq %d, micro-batch %d, %s, %s attention: %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% of measured "
              "bf16 GEMM; loss %.3f -> %.3f; device memory in use %.1f GiB\n",
              plan.parameter_count() / 1e9, plan.seq_length(), plan.micro_batch_size(),
              loom::cuda::precisionName(precision), attentionFlag.c_str(), tokensPerS, flops / 1e12, 100 * flops / peak, losses.front(),
              losses.back(), (totalBytes - freeBytes) / double(1 << 30));
  if (resultFile.getNumOccurrences()) {
    std::ofstream out(resultFile);
    out << "tokens_per_s " << tokensPerS << "\n";
    if (!out) return fail(resultFile + ": cannot write");
  }
  return 0;
}
