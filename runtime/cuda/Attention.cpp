#include "runtime/cuda/Attention.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "runtime/cuda/AttentionSoftmax.h"
#include "runtime/cuda/ScratchLayout.h"

namespace loom::cuda {
namespace {

// Row-major c[M,N] = alpha op(a)[M,K] op(b)[K,N] for `batch` matrices at strides sa, sb, sc
// (elements); a stored [K,M] when ta, b stored [N,K] when tb; operands of precision p, c fp32
// or p's 16-bit type (a 16-bit plan's output, rounded once).
// Column-major cuBLAS computes c^T = op(b)^T op(a)^T.
struct Operand {
  const void *data;
  int64_t ld, stride;
  bool transposed;
};

cudaDataType cudaTypeOf(ElementType t) {
  return t == ElementType::kF32 ? CUDA_R_32F : t == ElementType::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
}

Status batchedGemm(cublasHandle_t h, Precision p, int64_t m, int64_t n, int64_t k, float alpha, Operand a, Operand b,
                   Out c, int64_t ldc, int64_t strideC, int64_t batch, float beta = 0.0f) {
  cudaDataType type = p == Precision::kFp32 ? CUDA_R_32F : p == Precision::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
  cublasStatus_t st = cublasGemmStridedBatchedEx(
      h, b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k),
      &alpha, b.data, type, int(b.ld), b.stride, a.data, type, int(a.ld), a.stride, &beta, c.data, cudaTypeOf(c.type),
      int(ldc), strideC, int(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status::error("cuBLAS batched GEMM in attention (" + std::string(precisionName(p)) + "): status " +
                       std::to_string(int(st)));
}

const void *offset(const void *base, int64_t elements, Precision p) {
  return static_cast<const char *>(base) + elements * operandBytes(p);
}

ElementType operandTypeOf(Precision p) {
  return p == Precision::kFp32 ? ElementType::kF32 : p == Precision::kBf16 ? ElementType::kBf16 : ElementType::kF16;
}

// The tensors are all fp32 (rounded into scratch for 16-bit GEMMs) or all of the GEMMs' own
// type (a 16-bit plan: read in place, no scratch copies carved).
Status begin(cublasHandle_t blas, const cpu::AttentionShape &s, cudaStream_t stream, Precision p,
             std::initializer_list<ElementType> types) {
  if (s.batch <= 0 || s.seq <= 0 || s.heads <= 0 || s.headDim <= 0)
    return Status::error("CUDA attention: empty shape (batch, seq, heads or head size is 0)");
  for (ElementType t : types)
    if (t != *types.begin() || (t != ElementType::kF32 && t != operandTypeOf(p)))
      return Status::error(std::string("CUDA attention: a ") + elementTypeName(t) + " tensor among " +
                           elementTypeName(*types.begin()) + " ones with " + precisionName(p) + " GEMMs");
  if (cublasSetStream(blas, stream) != CUBLAS_STATUS_SUCCESS) return Status::error("CUDA attention: cublasSetStream failed");
  return Status::ok();
}

// The tensor as a GEMM operand: itself when of the GEMMs' type, else (fp32 into 16-bit GEMMs)
// rounded into `copy`.
const void *operand(In x, int64_t count, Precision p, void *copy, cudaStream_t s) {
  if (x.type == operandTypeOf(p)) return x.data;
  floatToHalf(static_cast<const float *>(x.data), copy, count, halfTypeOf(p), s);
  return copy;
}

Status launched(const char *what) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::ok();
  return Status::error(std::string("CUDA attention ") + what + ": " + cudaGetErrorString(err));
}

// The softmax kernels' view of a grouped attention (they see only the local query heads).
cpu::AttentionShape softmaxShapeOf(const cpu::GroupedAttentionShape &s) {
  return {s.batch, s.seq, s.heads, s.headDim, s.causal, s.dropout, s.seed, s.stream};
}

// Runs of consecutive local query heads that read one KV head: (first head, count, KV head).
struct HeadRun {
  int64_t first, count, kv;
};
std::vector<HeadRun> headRuns(const cpu::GroupedAttentionShape &s) {
  std::vector<HeadRun> runs;
  for (int64_t h = 0; h < s.heads; ++h) {
    int64_t kv = s.kvHeadOf(h);
    if (!runs.empty() && runs.back().kv == kv)
      ++runs.back().count;
    else
      runs.push_back({h, 1, kv});
  }
  return runs;
}

}  // namespace

size_t groupedAttentionScratchBytes(const cpu::GroupedAttentionShape &shape, Precision p, bool backward,
                                    bool operandsNative) {
  return carveGroupedAttention(shape, p, backward, nullptr, operandsNative).bytes;
}

// Per batch item: S = Q K^T / sqrt(hd) as one batched GEMM per run of query heads sharing a
// KV head (the K operand's batch stride 0), the softmax over all local heads, O = D V alike.
Status groupedAttentionForward(cublasHandle_t blas, Precision p, In q, In k, In v, Out out, float *lse,
                               const cpu::GroupedAttentionShape &s, void *scratch, cudaStream_t stream) {
  cpu::AttentionShape sm = softmaxShapeOf(s);
  LOOM_RETURN_IF_ERROR(begin(blas, sm, stream, p, {q.type, k.type, v.type, out.type}));
  GroupedAttentionScratch w = carveGroupedAttention(s, p, false, scratch, q.type != ElementType::kF32);
  int64_t S = s.seq, hd = s.headDim, ldq = s.heads * hd, ldkv = s.kvHeads * hd;
  const void *qx = operand(q, s.batch * S * ldq, p, w.q, stream), *kx = operand(k, s.batch * S * ldkv, p, w.k, stream),
             *vx = operand(v, s.batch * S * ldkv, p, w.v, stream);
  float scale = 1.0f / std::sqrt(float(hd));
  std::vector<HeadRun> runs = headRuns(s);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (const HeadRun &r : runs)
      LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, S, hd, scale, {offset(qx, b * S * ldq + r.first * hd, p), ldq, hd, false},
                                       {offset(kx, b * S * ldkv + r.kv * hd, p), ldkv, 0, true},
                                       w.scores + r.first * S * S, S, S * S, r.count));
    attentionSoftmaxForward(w.scores, w.dropped, p, nullptr, b, sm, lse, nullptr, stream);
    for (const HeadRun &r : runs)
      LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, hd, S, 1.0f, {offset(w.dropped, r.first * S * S, p), S, S * S, false},
                                       {offset(vx, b * S * ldkv + r.kv * hd, p), ldkv, 0, false},
                                       out.at(b * S * ldq + r.first * hd), ldq, hd, r.count));
  }
  return launched("forward (grouped)");
}

// As attentionBackward; a KV head's dK and dV sum over its query heads (GEMMs with beta 1
// into zeroed outputs, one query head at a time).
Status groupedAttentionBackward(cublasHandle_t blas, Precision p, In q, In k, In v, In g, const float *lse, Out dq,
                                float *dk, float *dv, const cpu::GroupedAttentionShape &s, void *scratch,
                                cudaStream_t stream) {
  cpu::AttentionShape sm = softmaxShapeOf(s);
  LOOM_RETURN_IF_ERROR(begin(blas, sm, stream, p, {q.type, k.type, v.type, g.type, dq.type}));
  GroupedAttentionScratch w = carveGroupedAttention(s, p, true, scratch, q.type != ElementType::kF32);
  int64_t S = s.seq, hd = s.headDim, ldq = s.heads * hd, ldkv = s.kvHeads * hd;
  const void *qx = operand(q, s.batch * S * ldq, p, w.q, stream), *kx = operand(k, s.batch * S * ldkv, p, w.k, stream),
             *vx = operand(v, s.batch * S * ldkv, p, w.v, stream), *gx = operand(g, s.batch * S * ldq, p, w.g, stream);
  cudaMemsetAsync(dk, 0, size_t(s.batch * S * ldkv) * sizeof(float), stream);
  cudaMemsetAsync(dv, 0, size_t(s.batch * S * ldkv) * sizeof(float), stream);
  float scale = 1.0f / std::sqrt(float(hd));
  std::vector<HeadRun> runs = headRuns(s);
  for (int64_t b = 0; b < s.batch; ++b) {
    int64_t qb = b * S * ldq, kvb = b * S * ldkv;
    for (const HeadRun &r : runs)
      LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, S, hd, scale, {offset(qx, qb + r.first * hd, p), ldq, hd, false},
                                       {offset(kx, kvb + r.kv * hd, p), ldkv, 0, true}, w.scores + r.first * S * S, S,
                                       S * S, r.count));
    attentionSoftmaxForward(w.scores, w.dropped, p, nullptr, b, sm, nullptr, lse, stream);
    for (int64_t h = 0; h < s.heads; ++h)  // dV += D^T g
      LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, hd, S, 1.0f, {offset(w.dropped, h * S * S, p), S, S * S, true},
                                       {offset(gx, qb + h * hd, p), ldq, hd, false}, dv + kvb + s.kvHeadOf(h) * hd,
                                       ldkv, hd, 1, 1.0f));
    for (const HeadRun &r : runs)  // dD = g V^T
      LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, S, hd, 1.0f, {offset(gx, qb + r.first * hd, p), ldq, hd, false},
                                       {offset(vx, kvb + r.kv * hd, p), ldkv, 0, true}, w.dDropped + r.first * S * S, S,
                                       S * S, r.count));
    attentionSoftmaxBackward(w.scores, w.dDropped, w.dropped, p, b, sm, stream);  // dS replaces D
    for (const HeadRun &r : runs)  // dQ = dS K
      LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, hd, S, 1.0f, {offset(w.dropped, r.first * S * S, p), S, S * S, false},
                                       {offset(kx, kvb + r.kv * hd, p), ldkv, 0, false}, dq.at(qb + r.first * hd), ldq,
                                       hd, r.count));
    for (int64_t h = 0; h < s.heads; ++h)  // dK += dS^T Q
      LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, hd, S, 1.0f, {offset(w.dropped, h * S * S, p), S, S * S, true},
                                       {offset(qx, qb + h * hd, p), ldq, hd, false}, dk + kvb + s.kvHeadOf(h) * hd,
                                       ldkv, hd, 1, 1.0f));
  }
  return launched("backward (grouped)");
}

size_t attentionScratchBytes(const cpu::AttentionShape &shape, Precision p, bool backward, bool operandsNative) {
  return carveAttention(shape, p, backward, nullptr, operandsNative).bytes;
}

Status attentionForward(cublasHandle_t blas, Precision p, In qkv, const float *keyMask, Out out, float *lse,
                        const cpu::AttentionShape &s, void *scratch, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(begin(blas, s, stream, p, {qkv.type, out.type}));
  AttentionScratch w = carveAttention(s, p, false, scratch, qkv.type != ElementType::kF32);
  int64_t S = s.seq, hd = s.headDim, ld = 3 * s.heads * hd, width = s.heads * hd;
  const void *x = operand(qkv, s.batch * S * ld, p, w.qkv, stream);
  float scale = 1.0f / std::sqrt(float(hd));
  for (int64_t b = 0; b < s.batch; ++b) {
    const void *q = offset(x, b * S * ld, p), *k = offset(q, hd, p), *v = offset(q, 2 * hd, p);
    LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, S, hd, scale, {q, ld, 3 * hd, false}, {k, ld, 3 * hd, true},
                                     w.scores, S, S * S, s.heads));
    attentionSoftmaxForward(w.scores, w.dropped, p, keyMask, b, s, lse, nullptr, stream);
    LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, hd, S, 1.0f, {w.dropped, S, S * S, false}, {v, ld, 3 * hd, false},
                                     out.at(b * S * width), width, hd, s.heads));
  }
  return launched("forward");
}

// dV = D^T g, dD = g V^T, dS from the softmax backward (with 1/sqrt(hd)), dQ = dS K, dK = dS^T Q.
Status attentionBackward(cublasHandle_t blas, Precision p, In qkv, const float *keyMask, In g, const float *lse,
                         Out dqkv, const cpu::AttentionShape &s, void *scratch, cudaStream_t stream) {
  LOOM_RETURN_IF_ERROR(begin(blas, s, stream, p, {qkv.type, g.type, dqkv.type}));
  AttentionScratch w = carveAttention(s, p, true, scratch, qkv.type != ElementType::kF32);
  int64_t S = s.seq, hd = s.headDim, ld = 3 * s.heads * hd, width = s.heads * hd;
  const void *x = operand(qkv, s.batch * S * ld, p, w.qkv, stream);
  const void *gx = operand(g, s.batch * S * width, p, w.g, stream);
  float scale = 1.0f / std::sqrt(float(hd));
  for (int64_t b = 0; b < s.batch; ++b) {
    const void *q = offset(x, b * S * ld, p), *k = offset(q, hd, p), *v = offset(q, 2 * hd, p);
    const void *gb = offset(gx, b * S * width, p);
    Out dq = dqkv.at(b * S * ld), dk = dq.at(hd), dv = dq.at(2 * hd);
    LOOM_RETURN_IF_ERROR(batchedGemm(blas, p, S, S, hd, scale, {q, ld, 3 * hd, false}, {k, ld, 3 * hd, true},
                                     w.scores, S, S * S, s.heads));
    attentionSoftmaxForward(w.scores, w.dropped, p, keyMask, b, s, nullptr, lse, stream);
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
