// This machine's fp32 GEMM limit: sgemm on square matrices with N threads, best of several
// runs, from each library a system here may use: OpenBLAS (PyTorch's CPU matmul on Debian) and
// oneDNN (Loom's CPU kernels). The MFU's limit is the better of the two.
// usage: sgemm_peak [--threads 2] [--size 2048]
// prints one line per library: "<GFLOP/s>\t<library and version>\t<kernel>"
#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "support/CommandLine.h"

namespace cl = llvm::cl;

cl::OptionCategory category("sgemm_peak options");
cl::opt<int> threads("threads", cl::desc("GEMM threads"), cl::value_desc("N"), cl::init(2), cl::cat(category));
cl::opt<int> size("size", cl::desc("the matrices' order"), cl::value_desc("N"), cl::init(2048), cl::cat(category));

namespace {
double bestGflops(int n, const std::function<void()> &multiply) {
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    multiply();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}
}  // namespace

int main(int argc, char **argv) {
  if (!loom::parseCommandLine(argc, argv,
                              "sgemm_peak: this machine's fp32 GEMM limit (OpenBLAS's and oneDNN's sgemm, square, "
                              "best of 5; prints GFLOP/s, library, kernel per line)\n"
                              "  sgemm_peak [--threads 2] [--size 2048]\n",
                              {&category}))
    return 2;
  int n = size;
  if (threads < 1 || n < 1) {
    std::fprintf(stderr, "sgemm_peak: error: --threads and --size must be positive\n");
    return 1;
  }
  std::vector<float> a(size_t(n) * n, 1.0f), b(size_t(n) * n, 0.5f), c(size_t(n) * n);
  openblas_set_num_threads(threads);
  double openblas = bestGflops(n, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  omp_set_num_threads(threads);
  double onednn = bestGflops(n, [&] {
    dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  const dnnl_version_t *v = dnnl_version();
  std::printf("%.2f\tOpenBLAS\t%s kernel\n", openblas, openblas_get_corename());
  std::printf("%.2f\toneDNN %d.%d.%d\tits own dispatch\n", onednn, v->major, v->minor, v->patch);
  return 0;
}
