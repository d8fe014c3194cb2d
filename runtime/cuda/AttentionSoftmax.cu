#include "runtime/cuda/AttentionSoftmax.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/cuda/DeviceMath.cuh"

namespace loom::cuda {
namespace {

template <typename T>
__device__ T store(float v);
template <>
__device__ float store<float>(float v) { return v; }
template <>
__device__ __nv_bfloat16 store<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __half store<__half>(float v) { return __float2half_rn(v); }

struct RowOf {
  int64_t S, i;
  uint64_t dropBase;  // dropout counter of (i, j = 0)
  const float *keyMask;
};

__device__ RowOf rowOf(const cpu::AttentionShape &s, int64_t b, const float *keyMask) {
  int64_t S = s.seq, h = blockIdx.x / S, i = blockIdx.x % S;
  return {S, i, uint64_t(((b * s.heads + h) * S + i) * S), keyMask ? keyMask + b * S : nullptr};
}

__device__ float keepScale(const cpu::AttentionShape &s, const RowOf &r, int64_t j) {
  if (s.dropout <= 0) return 1.0f;
  return philoxUniform(s.seed, s.stream, r.dropBase + uint64_t(j)) >= s.dropout ? 1.0f / (1.0f - s.dropout) : 0.0f;
}

// lseOut (nullable): where this batch item's rows' log-sum-exp go; with lseIn the
// probabilities are exp(s - lse) from those statistics (the backward), without reductions.
template <typename T>
__global__ void softmaxForwardKernel(float *scores, T *dropped, const float *keyMask, int64_t b,
                                     cpu::AttentionShape s, float *lseOut, const float *lseIn) {
  __shared__ float shared[kThreads];
  RowOf r = rowOf(s, b, keyMask);
  float *x = scores + int64_t(blockIdx.x) * r.S;
  T *d = dropped + int64_t(blockIdx.x) * r.S;
  auto masked = [&](int64_t j) { return (s.causal && j > r.i) || (r.keyMask && r.keyMask[j] == 0.0f); };
  int64_t row = b * s.heads * r.S + blockIdx.x;  // [B, heads, S]
  if (lseIn) {  // +inf for a row with every key masked: all zeros
    float lse = lseIn[row];
    for (int64_t j = threadIdx.x; j < r.S; j += kThreads) {
      float p = masked(j) ? 0.0f : expf(x[j] - lse);
      x[j] = p;
      d[j] = store<T>(p * keepScale(s, r, j));
    }
    return;
  }
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < r.S; j += kThreads)
    if (!masked(j)) mx = fmaxf(mx, x[j]);
  mx = blockMax(mx, shared);
  if (mx == -INFINITY) {  // every key masked: the row attends to nothing (uniform across the block)
    for (int64_t j = threadIdx.x; j < r.S; j += kThreads) x[j] = 0.0f, d[j] = store<T>(0.0f);
    if (lseOut && threadIdx.x == 0) lseOut[row] = INFINITY;
    return;
  }
  float sum = 0;
  for (int64_t j = threadIdx.x; j < r.S; j += kThreads) sum += (x[j] = masked(j) ? 0.0f : expf(x[j] - mx));
  sum = blockSum(sum, shared);
  if (lseOut && threadIdx.x == 0) lseOut[row] = mx + logf(sum);
  float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < r.S; j += kThreads) {
    float p = x[j] * inv;
    x[j] = p;
    d[j] = store<T>(p * keepScale(s, r, j));
  }
}

template <typename T>
__global__ void softmaxBackwardKernel(const float *probs, float *dDropped, T *ds, int64_t b, cpu::AttentionShape s) {
  __shared__ float shared[kThreads];
  RowOf r = rowOf(s, b, nullptr);
  const float *p = probs + int64_t(blockIdx.x) * r.S;
  float *dp = dDropped + int64_t(blockIdx.x) * r.S;
  T *out = ds + int64_t(blockIdx.x) * r.S;
  float dot = 0;
  for (int64_t j = threadIdx.x; j < r.S; j += kThreads) {
    dp[j] *= keepScale(s, r, j);
    dot += p[j] * dp[j];
  }
  dot = blockSum(dot, shared);
  float scale = rsqrtf(float(s.headDim));
  for (int64_t j = threadIdx.x; j < r.S; j += kThreads) out[j] = store<T>(p[j] * (dp[j] - dot) * scale);
}

int rows(const cpu::AttentionShape &s) { return int(s.heads * s.seq); }

}  // namespace

void attentionSoftmaxForward(float *scores, void *dropped, Precision p, const float *keyMask, int64_t b,
                             const cpu::AttentionShape &shape, float *lseOut, const float *lseIn, cudaStream_t s) {
  if (rows(shape) == 0) return;
  if (p == Precision::kFp32)
    softmaxForwardKernel<<<rows(shape), kThreads, 0, s>>>(scores, static_cast<float *>(dropped), keyMask, b, shape,
                                                           lseOut, lseIn);
  else if (p == Precision::kBf16)
    softmaxForwardKernel<<<rows(shape), kThreads, 0, s>>>(scores, static_cast<__nv_bfloat16 *>(dropped), keyMask, b,
                                                           shape, lseOut, lseIn);
  else
    softmaxForwardKernel<<<rows(shape), kThreads, 0, s>>>(scores, static_cast<__half *>(dropped), keyMask, b, shape,
                                                           lseOut, lseIn);
}

void attentionSoftmaxBackward(const float *probs, float *dDropped, void *ds, Precision p, int64_t b,
                              const cpu::AttentionShape &shape, cudaStream_t s) {
  if (rows(shape) == 0) return;
  if (p == Precision::kFp32)
    softmaxBackwardKernel<<<rows(shape), kThreads, 0, s>>>(probs, dDropped, static_cast<float *>(ds), b, shape);
  else if (p == Precision::kBf16)
    softmaxBackwardKernel<<<rows(shape), kThreads, 0, s>>>(probs, dDropped, static_cast<__nv_bfloat16 *>(ds), b, shape);
  else
    softmaxBackwardKernel<<<rows(shape), kThreads, 0, s>>>(probs, dDropped, static_cast<__half *>(ds), b, shape);
}

}  // namespace loom::cuda
