// Loom's fp32 GEMM (runtime/cpu/Gemm.h) on a Transformer's own GEMM shapes against oneDNN's
// threaded sgemm on the same operands: the three products of each linear layer (forward
// Y = X W^T, dX = dY W, dW = dY^T X) at T tokens, best of several runs each. Where Loom cuts C
// into fixed single-threaded tiles (processors without AVX-512; ONEDNN_MAX_CPU_ISA=AVX2
// reproduces that path on one with it) this shows what the tiles cost per shape.
// usage: gemm_shapes [--threads 2] [--tokens 1024] [--hidden 768] [--ffn 3072] [--vocab 50304]
// prints one line per product: "<name>\t<m>x<n>x<k>\t<Loom GFLOP/s>\t<oneDNN GFLOP/s>\t<ratio>"
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "runtime/cpu/Gemm.h"
#include "support/CommandLine.h"

namespace cl = llvm::cl;

cl::OptionCategory category("gemm_shapes options");
cl::opt<int> threads("threads", cl::desc("GEMM threads"), cl::value_desc("N"), cl::init(2), cl::cat(category));
cl::opt<int> tokens("tokens", cl::desc("tokens per micro-batch (b x s)"), cl::value_desc("T"), cl::init(1024),
                    cl::cat(category));
cl::opt<int> hidden("hidden", cl::desc("hidden size"), cl::value_desc("H"), cl::init(768), cl::cat(category));
cl::opt<int> ffn("ffn", cl::desc("MLP size"), cl::value_desc("F"), cl::init(3072), cl::cat(category));
cl::opt<int> vocab("vocab", cl::desc("padded vocabulary (0: no output layer)"), cl::value_desc("V"), cl::init(50304),
                   cl::cat(category));
cl::opt<int> repeats("repeats", cl::desc("runs per product (the best counts)"), cl::value_desc("N"), cl::init(5),
                     cl::cat(category));

namespace {
double bestGflops(double flops, const std::function<void()> &multiply) {
  double best = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    multiply();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / s / 1e9);
  }
  return best;
}

struct Product {
  std::string name;
  bool transposeA, transposeB;
  int64_t m, n, k;
  int64_t lda() const { return transposeA ? m : k; }
  int64_t ldb() const { return transposeB ? k : n; }
};
}  // namespace

int main(int argc, char **argv) {
  if (!loom::parseCommandLine(argc, argv,
                              "gemm_shapes: Loom's fp32 GEMM on a Transformer's linear-layer shapes against oneDNN's "
                              "threaded sgemm (GFLOP/s, best of --repeats)\n"
                              "  gemm_shapes [--threads 2] [--tokens 1024] [--hidden 768] [--ffn 3072] [--vocab 50304]\n",
                              {&category}))
    return 2;
  if (threads < 1 || tokens < 1 || hidden < 1 || ffn < 1 || vocab < 0 || repeats < 1) {
    std::fprintf(stderr, "gemm_shapes: error: the sizes, --threads and --repeats must be positive\n");
    return 1;
  }
  openblas_set_num_threads(threads);  // Loom's kernel threads (runtime/cpu/Parallel.h)
  int64_t T = tokens, H = hidden, F = ffn, V = vocab;
  // Each linear layer [out, in] (Megatron's layout: Y = X W^T): forward, input gradient, weight gradient.
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> layers = {
      {"qkv", {3 * H, H}}, {"proj", {H, H}}, {"fc", {F, H}}, {"fc2", {H, F}}};
  if (V > 0) layers.push_back({"logits", {V, H}});
  std::vector<Product> products;
  for (auto &[name, shape] : layers) {
    auto [out, in] = shape;
    products.push_back({name + " fwd", false, true, T, out, in});
    products.push_back({name + " dX", false, false, T, in, out});
    products.push_back({name + " dW", true, false, out, in, T});
  }
  std::printf("product\tm x n x k\tLoom GFLOP/s\toneDNN threaded GFLOP/s\tLoom / oneDNN\n");
  for (const Product &p : products) {
    std::vector<float> a(size_t(p.m * p.k), 0.25f), b(size_t(p.k * p.n), 0.5f), c(size_t(p.m * p.n));
    double flops = 2.0 * double(p.m) * double(p.n) * double(p.k);
    double loom = bestGflops(flops, [&] {
      loom::cpu::gemm(p.transposeA, p.transposeB, p.m, p.n, p.k, 1.0f, a.data(), p.lda(), b.data(), p.ldb(), 0.0f,
                      c.data(), p.n);
    });
    omp_set_num_threads(threads);
    double onednn = bestGflops(flops, [&] {
      dnnl_sgemm(p.transposeA ? 'T' : 'N', p.transposeB ? 'T' : 'N', p.m, p.n, p.k, 1.0f, a.data(), p.lda(), b.data(),
                 p.ldb(), 0.0f, c.data(), p.n);
    });
    std::printf("%s\t%lldx%lldx%lld\t%.1f\t%.1f\t%.2f\n", p.name.c_str(), (long long)p.m, (long long)p.n,
                (long long)p.k, loom, onednn, loom / onednn);
  }
  return 0;
}
