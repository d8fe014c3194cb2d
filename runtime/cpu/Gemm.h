// The CPU backend's matrix product: every GEMM of the CPU kernels goes through here.
//
// oneDNN's sgemm (libdnnl, the library PyTorch's CPU backend is built on) rather than OpenBLAS's:
// measured on the 2-core development machine it runs the model's shapes 1.6-2x faster (it
// dispatches AVX-512 itself, while OpenBLAS follows OPENBLAS_CORETYPE, which that machine's
// image pins to Haswell's AVX2 kernel; with OpenBLAS choosing its own kernel, one thread,
// oneDNN measured 0.93-1.4x: ahead on three of four shapes, 7% behind on the demo's output-layer
// dW). Its results do not depend on the thread count (checked bit for bit
// by thread_count_test and the runtime's 1-vs-2-thread reproducibility test).
#pragma once

#include <cstdint>

namespace loom::cpu {

// Row-major C[m, n] = alpha * op(A) * op(B) + beta * C, op(X) = X^T when its flag is set;
// A is [m, k] (or [k, m] transposed), B is [k, n] (or [n, k]); on kernelThreads() threads.
void gemm(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

}  // namespace loom::cpu
