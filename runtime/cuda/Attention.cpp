#include "runtime/cuda/Attention.h"

#include <cmath>
#include <string>

#include "runtime/cuda/AttentionSoftmax.h"

namespace loom::cuda {
namespace {

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The scratch of one call, carved in this order: 16-bit copies of qkv (and g), then the
// fp32 scores / probabilities, the operand-typed D (or dS), and in the backward the fp32 dD.
struct Scratch {
  void *qkv = nullptr, *g = nullptr, *dropped = nullptr;
  float *scores = nullptr, *dDropped = nullptr;
  size_t bytes = 0;
};

Scratch carve(const cpu::AttentionShape &s, Precision p, bool backward, void *base) {
  size_t e = size_t(operandBytes(p)), tokens = size_t(s.batch * s.seq), width = size_t(s.heads * s.headDim);
  size_t square = size_t(s.heads * s.seq * s.seq);
  char *at = static_cast<char *>(base);
  Scratch out;
  auto take = [&](size_t bytes) {
    void *here = at ? at + out.bytes : nullptr;
    out.bytes += aligned(bytes);
    return here;
  };
  if (p != Precision::kFp32) {
    out.qkv = take(tokens * 3 * width * e);
    if (backward) out.g = take(tokens * width * e);
  }
  out.scores = static_cast<float *>(take(square * 4));
  out.dropped = take(square * e);
  if (backward) out.dDropped = static_cast<float *>(take(square * 4));
  return out;
}

// Row-major c[M,N] = alpha op(a)[M,K] op(b)[K,N] for `batch` matrices at strides sa, sb, sc
// (elements); a stored [K,M] when ta, b stored [N,K] when tb; operands of precision p, c fp32.
// Column-major cuBLAS computes c^T = op(b)^T op(a)^T.
struct Operand {
  const void *data;
  int64_t ld, stride;
  bool transposed;
};

Status batchedGemm(cublasHandle_t h, Precision p, int64_t m, int64_t n, int64_t k, float alpha, Operand a, Operand b,
                   float *c, int64_t ldc, int64_t strideC, int64_t batch) {
  cudaDataType type = p == Precision::kFp32 ? CUDA_R_32F : p == Precision::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
  float beta = 0.0f;
  cublasStatus_t st = cublasGemmStridedBatchedEx(
      h, b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k),
      &alpha, b.data, type, int(b.ld), b.stride, a.data, type, int(a.ld), a.stride, &beta, c, CUDA_R_32F, int(ldc),
      strideC, int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status::error("cuBLAS batched GEMM in attention (" + std::string(precisionName(p)) + "): status " +
                       std::to_string(int(st)));
}

const void *offset(const void *base, int64_t elements, Precision p) {
  return static_cast<const char *>(base) + elements * operandBytes(p);
}

Status begin(cublasHandle_t blas, const cpu::AttentionShape &s, cudaStream_t stream) {
  if (s.batch <= 0 || s.seq <= 0 || s.heads <= 0 || s.headDim <= 0)
    return Status::error("CUDA attention: empty shape (batch, seq, heads or head size is 0)");
  if (cublasSetStream(blas, stream) != CUBLAS_STATUS_SUCCESS) return Status::error("CUDA attention: cublasSetStream failed");
  return Status::ok();
}

// The fp32 tensor as a GEMM operand: itself in fp32, else rounded into `copy`.
const void *operand(const float *x, int64_t count, Precision p, void *copy, cudaStream_t s) {
  if (p == Precision::kFp32) return x;
  floatToHalf(x, copy, count, halfTypeOf(p), s);
  return copy;
}

Status launched(const char *what) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::ok();
  return Status::error(std::string("CUDA attention ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

size_t attentionScratchBytes(const cpu::AttentionShape &shape, Precision p, bool backward) {
  return carve(shape, p, backward, nullptr).bytes;
}

Status attentionForward(cublasHandle_t blas, Precision p, const float *qkv, const float *keyMask, float *out,
                        const cpu::AttentionShape &s, void *scratch, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(begin(blas, s, stream));
  Scratch w = carve(s, p, false, scratch);
  int64_t S = s.seq, hd = s.headDim, ld = 3 * s.heads * hd, width = s.heads * hd;
  const void *x = operand(qkv, s.batch * S * ld, p, w.qkv, stream);
  float scale = 1.0f / std::sqrt(float(hd));
  for (int64_t b = 0; b < s.batch; ++b) {
    const void *q = offset(x, b * S * ld, p), *k = offset(q, hd, p), *v = offset(q, 2 * hd, p);
    LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, S, hd, scale, {q, ld, 3 * hd, false}, {k, ld, 3 * hd, true},
                                     w.scores, S, S * S, s.heads));
    attentionSoftmaxForward(w.scores, w.dropped, p, keyMask, b, s, stream);
    LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, hd, S, 1.0f, {w.dropped, S, S * S, false}, {v, ld, 3 * hd, false},
                                     out + b * S * width, width, hd, s.heads));
  }
  return launched("forward");
}

// dV = D^T g, dD = g V^T, dS from the softmax backward (with 1/sqrt(hd)), dQ = dS K, dK = dS^T Q.
Status attentionBackward(cublasHandle_t blas, Precision p, const float *qkv, const float *keyMask, const float *g,
                         float *dqkv, const cpu::AttentionShape &s, void *scratch, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(begin(blas, s, stream));
  Scratch w = carve(s, p, true, scratch);
  int64_t S = s.seq, hd = s.headDim, ld = 3 * s.heads * hd, width = s.heads * hd;
  const void *x = operand(qkv, s.batch * S * ld, p, w.qkv, stream);
  const void *gx = operand(g, s.batch * S * width, p, w.g, stream);
  float scale = 1.0f / std::sqrt(float(hd));
  for (int64_t b = 0; b < s.batch; ++b) {
    const void *q = offset(x, b * S * ld, p), *k = offset(q, hd, p), *v = offset(q, 2 * hd, p);
    const void *gb = offset(gx, b * S * width, p);
    float *dq = dqkv + b * S * ld, *dk = dq + hd, *dv = dq + 2 * hd;
    LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, S, hd, scale, {q, ld, 3 * hd, false}, {k, ld, 3 * hd, true},
                                     w.scores, S, S * S, s.heads));
    attentionSoftmaxForward(w.scores, w.dropped, p, keyMask, b, s, stream);
    LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, hd, S, 1.0f, {w.dropped, S, S * S, true}, {gb, width, hd, false}, dv,
                                     ld, 3 * hd, s.heads));
    LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, S, hd, 1.0f, {gb, width, hd, false}, {v, ld, 3 * hd, true},
                                     w.dDropped, S, S * S, s.heads));
    attentionSoftmaxBackward(w.scores, w.dDropped, w.dropped, p, b, s, stream);  // dS replaces D
    LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, hd, S, 1.0f, {w.dropped, S, S * S, false}, {k, ld, 3 * hd, false}, dq,
                                     ld, 3 * hd, s.heads));
    LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, hd, S, 1.0f, {w.dropped, S, S * S, true}, {q, ld, 3 * hd, false}, dk,
                                     ld, 3 * hd, s.heads));
  }
  return launched("backward");
}

}  // namespace loom::cuda
