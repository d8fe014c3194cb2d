// Loom's CPU attention kernels (runtime/cpu/Kernels.h) on a Transformer's attention shape:
// forward and backward, fp32 and bf16, best of several runs each, in milliseconds and in
// GFLOP/s of the products attention needs (the causal half only when --causal: q k^T and P v
// forward; the recomputed q k^T, dV, dP, dQ and dK backward).
// usage: attention_shapes [--threads 2] [--batch 1] [--seq 1024] [--heads 12] [--head-dim 64]
//                         [--precision fp32|bf16|both]
// prints one line per kernel: "<kernel>\t<ms>\t<GFLOP/s>"
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/HalfPrecision.h"
#include "runtime/cpu/Kernels.h"
#include "support/CommandLine.h"

namespace cl = llvm::cl;

cl::OptionCategory category("attention_shapes options");
cl::opt<int> threads("threads", cl::desc("kernel threads"), cl::value_desc("N"), cl::init(2), cl::cat(category));
cl::opt<int> batch("batch", cl::desc("micro-batch"), cl::value_desc("B"), cl::init(1), cl::cat(category));
cl::opt<int> seq("seq", cl::desc("sequence length"), cl::value_desc("S"), cl::init(1024), cl::cat(category));
cl::opt<int> heads("heads", cl::desc("attention heads"), cl::value_desc("N"), cl::init(12), cl::cat(category));
cl::opt<int> headDim("head-dim", cl::desc("head size"), cl::value_desc("D"), cl::init(64), cl::cat(category));
cl::opt<bool> causal("causal", cl::desc("causal mask (GPT)"), cl::init(true), cl::cat(category));
cl::opt<std::string> precision("precision", cl::desc("fp32, bf16 or both"), cl::init("both"), cl::cat(category));
cl::opt<int> repeats("repeats", cl::desc("runs per kernel (the best counts)"), cl::value_desc("N"), cl::init(5),
                     cl::cat(category));

namespace {
double bestMs(const std::function<void()> &run) {
  double best = 1e30;
  for (int rep = 0; rep < repeats; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}
}  // namespace

int main(int argc, char **argv) {
  if (!loom::parseCommandLine(argc, argv,
                              "attention_shapes: Loom's CPU attention kernels, fp32 and bf16, forward and backward "
                              "(ms and GFLOP/s, best of --repeats)\n"
                              "  attention_shapes [--threads 2] [--batch 1] [--seq 1024] [--heads 12] [--head-dim 64]\n",
                              {&category}))
    return 2;
  if (precision != "fp32" && precision != "bf16" && precision != "both") {
    std::fprintf(stderr, "attention_shapes: error: --precision must be fp32, bf16 or both, not '%s'\n",
                 precision.c_str());
    return 1;
  }
  if (threads < 1 || batch < 1 || seq < 1 || heads < 1 || headDim < 1 || repeats < 1) {
    std::fprintf(stderr, "attention_shapes: error: the sizes, --threads and --repeats must be positive\n");
    return 1;
  }
  openblas_set_num_threads(threads);  // Loom's kernel threads (runtime/cpu/Parallel.h)
  loom::cpu::AttentionShape s{batch, seq, heads, headDim, causal, 0.0f, 1, 0};
  int64_t B = batch, S = seq, H = heads * headDim;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(size_t(B * S * 3 * H)), g(size_t(B * S * H)), out(g.size()), lse(size_t(B * heads * S)),
      dqkv(qkv.size());
  for (float &x : qkv) x = normal(rng);
  for (float &x : g) x = normal(rng) * 0.01f;
  std::vector<uint16_t> qkv16(qkv.size()), g16(g.size()), out16(g.size()), dqkv16(qkv.size());
  loom::cpu::narrowToBf16(qkv.data(), qkv16.data(), int64_t(qkv.size()));
  loom::cpu::narrowToBf16(g.data(), g16.data(), int64_t(g.size()));
  std::vector<float> scratch(size_t(std::max({loom::cpu::attentionScratchFloats(S, true),
                                              loom::cpu::attentionScratchFloatsBf16(S, headDim, true)})));
  // Each product is 2 * S * S * hd per head, half of it with the causal mask.
  double product = 2.0 * double(B * heads) * double(S) * double(S) * double(headDim) * (causal ? 0.5 : 1.0);
  auto forward32 = [&] { loom::cpu::attentionForward(qkv.data(), nullptr, out.data(), lse.data(), s, scratch.data()); };
  auto forward16 = [&] {
    loom::cpu::attentionForwardBf16(qkv16.data(), nullptr, out16.data(), lse.data(), s, scratch.data());
  };
  struct Kernel {
    const char *name;
    double products;
    std::function<void()> run, before;  // before: the forward whose statistics the backward reads
  };
  std::vector<Kernel> kernels = {
      {"fp32 forward", 2, forward32, nullptr},
      {"fp32 backward", 5,
       [&] {
         loom::cpu::attentionBackward(qkv.data(), nullptr, g.data(), lse.data(), dqkv.data(), s, scratch.data());
       },
       forward32},
      {"bf16 forward", 2, forward16, nullptr},
      {"bf16 backward", 5,
       [&] {
         loom::cpu::attentionBackwardBf16(qkv16.data(), nullptr, g16.data(), lse.data(), dqkv16.data(), s,
                                          scratch.data());
       },
       forward16},
  };
  std::printf("kernel\tms\tGFLOP/s\n");
  for (const Kernel &k : kernels) {
    if (precision != "both" && precision != std::string(k.name, 4)) continue;
    if (k.before) k.before();
    double ms = bestMs(k.run);
    std::printf("%s\t%.2f\t%.1f\n", k.name, ms, k.products * product / ms / 1e6);
  }
  return 0;
}
