#include "runtime/cpu/Gemm.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/cpu/Parallel.h"

namespace loom::cpu {

void gemm(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // oneDNN (built on OpenMP here) takes its thread count from the calling thread's OpenMP
  // setting; keep it equal to the rank's kernel threads.
  int threads = kernelThreads();
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  dnnl_status_t status =
      dnnl_sgemm(transposeA ? 'T' : 'N', transposeB ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) {
    // Only a caller's wrong shapes or leading dimensions get here: a bug, not an input error.
    std::fprintf(stderr, "loom: internal error: oneDNN sgemm refused m=%lld n=%lld k=%lld (status %d)\n",
                 (long long)m, (long long)n, (long long)k, int(status));
    std::abort();
  }
}

const char *gemmLibrary() {
  static const std::string name = [] {
    const dnnl_version_t *v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  }();
  return name.c_str();
}

}  // namespace loom::cpu
