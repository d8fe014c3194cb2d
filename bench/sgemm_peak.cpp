// This machine's fp32 GEMM limit: OpenBLAS sgemm on square matrices with N threads, best of
// several runs. usage: sgemm_peak [--threads 2] [--size 2048]  (prints GFLOP/s)
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/control/CommandLine.h"

namespace cl = llvm::cl;

cl::OptionCategory category("sgemm_peak options");
cl::opt<int> threads("threads", cl::desc("OpenBLAS threads"), cl::value_desc("N"), cl::init(2), cl::cat(category));
cl::opt<int> size("size", cl::desc("the matrices' order"), cl::value_desc("N"), cl::init(2048), cl::cat(category));

int main(int argc, char **argv) {
  if (!loom::parseCommandLine(argc, argv,
                              "sgemm_peak: this machine's fp32 GEMM limit (OpenBLAS sgemm, square, best of 5; prints "
                              "GFLOP/s)\n  sgemm_peak [--threads 2] [--size 2048]\n",
                              {&category}))
    return 2;
  int n = size;
  if (threads < 1 || n < 1) {
    std::fprintf(stderr, "sgemm_peak: error: --threads and --size must be positive\n");
    return 1;
  }
  openblas_set_num_threads(threads);
  std::vector<float> a(size_t(n) * n, 1.0f), b(size_t(n) * n, 0.5f), c(size_t(n) * n);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  std::printf("%.2f\n", best);
  return 0;
}
