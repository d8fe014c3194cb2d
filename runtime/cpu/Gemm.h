// The CPU backend's matrix products: every GEMM of the CPU kernels goes through here.
//
// fp32: oneDNN's sgemm (libdnnl, the library PyTorch's CPU backend is built on) rather than
// OpenBLAS's: measured on the 2-core development machine it runs the model's shapes 1.6-2x
// faster (it dispatches AVX-512 itself, while OpenBLAS follows OPENBLAS_CORETYPE, which that
// machine's image pins to Haswell's AVX2 kernel; with OpenBLAS choosing its own kernel, one
// thread, oneDNN measured 0.93-1.4x: ahead on three of four shapes, 7% behind on the demo's
// output-layer dW). Its results do not depend on the thread count (checked bit for bit by
// thread_count_test and the runtime's 1-vs-2-thread reproducibility test).
//
// bf16: oneDNN's matmul primitive with bf16 operands and fp32 accumulation (AVX512-BF16's
// dot-product instructions, or AMX tiles, where the processor has them). oneDNN splits a
// product's reduction over its threads when it sees fit, so its bits would follow the thread
// count; instead C is cut into fixed tiles (their shape depends on m, n and k only) and each
// tile is one single-threaded matmul, the tiles spread over the rank's threads.
// Where the processor has no bf16 instructions the operands are widened to fp32 (exactly) and
// multiplied by the fp32 GEMM: the same products, summed in another order.
#pragma once

#include <cstdint>

namespace loom::cpu {

// Row-major C[m, n] = alpha * op(A) * op(B) + beta * C, op(X) = X^T when its flag is set;
// A is [m, k] (or [k, m] transposed), B is [k, n] (or [n, k]); on kernelThreads() threads.
void gemm(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

// The bf16 product's result: bf16 (rounded once from the fp32 sum), fp32, or added to the fp32
// C (C += the product's fp32 sum: an fp32 accumulator over several products).
enum class GemmOut { kBf16, kF32, kF32Add };

// Row-major C[m, n] = op(A) * op(B) (+ bias[n]) with A, B and bias in bf16 (bit patterns),
// accumulated in fp32 and stored as `out` says (bias null: none). Layouts as gemm's.
void gemmBf16(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
              const uint16_t *b, int64_t ldb, const uint16_t *bias, void *c, GemmOut out, int64_t ldc);

// Whether gemmBf16 runs on the processor's bf16 instructions (false: the fp32 fallback).
bool nativeBf16Gemm();

}  // namespace loom::cpu
