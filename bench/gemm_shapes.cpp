// Loom's fp32 GEMM (runtime/cpu/Gemm.h) on a Transformer's own GEMM shapes against oneDNN's
// threaded sgemm on the same operands: the three products of each linear layer (forward
// Y = X W^T, dX = dY W, dW = dY^T X) at T tokens, best of several runs each. Where Loom cuts C
// into fixed single-threaded tiles (processors without AVX-512; ONEDNN_MAX_CPU_ISA=AVX2
// reproduces that path on one with it) this shows what the tiles cost per shape.
// --precision bf16: Loom's bf16 GEMM (fixed single-threaded tiles of oneDNN's matmul, bf16
// operands, the forward and dX rounded to bf16, dW in fp32 as a 16-bit plan's main gradients)
// against one oneDNN matmul of the whole product on its own threads.
// usage: gemm_shapes [--threads 2] [--tokens 1024] [--hidden 768] [--ffn 3072] [--vocab 50304]
//                    [--precision fp32|bf16]
// prints one line per product: "<name>\t<m>x<n>x<k>\t<Loom GFLOP/s>\t<oneDNN GFLOP/s>\t<ratio>"
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/cpu/Gemm.h"
#include "runtime/cpu/HalfPrecision.h"
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
cl::opt<std::string> precision("precision", cl::desc("fp32 or bf16"), cl::init("fp32"), cl::cat(category));
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
  bool weightGradient() const { return transposeA; }  // dW = dY^T X: the only product with A transposed
};

// One oneDNN matmul of the whole bf16 product on its own (OpenMP) threads: what Loom's tiles
// give up for results that do not depend on the thread count.
class WholeBf16Matmul {
 public:
  WholeBf16Matmul(const Product &p, const uint16_t *a, const uint16_t *b, void *c, bool f32Out) {
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    dnnl::memory::desc ad(dims{p.m, p.k}, dt::bf16, p.transposeA ? dims{1, p.lda()} : dims{p.lda(), 1});
    dnnl::memory::desc bd(dims{p.k, p.n}, dt::bf16, p.transposeB ? dims{1, p.ldb()} : dims{p.ldb(), 1});
    dnnl::memory::desc cd(dims{p.m, p.n}, f32Out ? dt::f32 : dt::bf16, dims{p.n, 1});
    primitive_ = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), engine_));
    args_ = {{DNNL_ARG_SRC, dnnl::memory(ad, engine_, const_cast<uint16_t *>(a))},
             {DNNL_ARG_WEIGHTS, dnnl::memory(bd, engine_, const_cast<uint16_t *>(b))},
             {DNNL_ARG_DST, dnnl::memory(cd, engine_, c)}};
  }
  void run() {
    primitive_.execute(stream_, args_);
    stream_.wait();
  }

 private:
  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  dnnl::matmul primitive_;
  std::unordered_map<int, dnnl::memory> args_;
};
}  // namespace

int main(int argc, char **argv) {
  if (!loom::parseCommandLine(argc, argv,
                              "gemm_shapes: Loom's fp32 or bf16 GEMM on a Transformer's linear-layer shapes against oneDNN's "
                              "threaded sgemm or matmul (GFLOP/s, best of --repeats)\n"
                              "  gemm_shapes [--threads 2] [--tokens 1024] [--hidden 768] [--ffn 3072] [--vocab 50304]\n"
                              "              [--precision fp32|bf16]\n",
                              {&category}))
    return 2;
  if (precision != "fp32" && precision != "bf16") {
    std::fprintf(stderr, "gemm_shapes: error: --precision must be fp32 or bf16, not '%s'\n", precision.c_str());
    return 1;
  }
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
  bool bf16 = precision == "bf16";
  if (bf16 && !loom::cpu::nativeBf16Gemm())
    std::printf("note: this processor has no bf16 instructions: Loom widens bf16 to its fp32 GEMM\n");
  for (const Product &p : products) {
    if (bf16) {
      std::vector<uint16_t> a(size_t(p.m * p.k), loom::cpu::floatToBf16(0.25f)),
          b(size_t(p.k * p.n), loom::cpu::floatToBf16(0.5f));
      std::vector<float> c(size_t(p.m * p.n));  // room for either result type
      bool f32Out = p.weightGradient();
      loom::cpu::GemmOut out = f32Out ? loom::cpu::GemmOut::kF32 : loom::cpu::GemmOut::kBf16;
      double flops = 2.0 * double(p.m) * double(p.n) * double(p.k);
      double loom = bestGflops(flops, [&] {
        loom::cpu::gemmBf16(p.transposeA, p.transposeB, p.m, p.n, p.k, a.data(), p.lda(), b.data(), p.ldb(), nullptr,
                            c.data(), out, p.n);
      });
      omp_set_num_threads(threads);
      WholeBf16Matmul whole(p, a.data(), b.data(), c.data(), f32Out);
      double onednn = bestGflops(flops, [&] { whole.run(); });
      std::printf("%s\t%lldx%lldx%lld\t%.1f\t%.1f\t%.2f\n", p.name.c_str(), (long long)p.m, (long long)p.n,
                  (long long)p.k, loom, onednn, loom / onednn);
      continue;
    }
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
