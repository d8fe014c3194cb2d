#include "runtime/cpu/Gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include <cstdio>
#include <cstdlib>

#include "runtime/cpu/Parallel.h"

// OpenMP's runtime calls, declared here rather than through <omp.h>: GCC ships that header,
// clang only with libomp-dev, and the library that answers is libgomp either way (oneDNN's).
extern "C" int omp_get_max_threads(void);
extern "C" void omp_set_num_threads(int);

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

}  // namespace loom::cpu
