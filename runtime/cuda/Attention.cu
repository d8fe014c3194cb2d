// Per query row i of one (b, h), with scale = 1/sqrt(hd):
//   forward:  P_ij = softmax_j(scale q_i.k_j, masked), D_ij = P_ij keep_ij / (1 - rate),
//             out_i = sum_j D_ij v_j;
//   backward: dV_j += D_ij g_i, dP_ij = (g_i.v_j) keep_ij / (1 - rate),
//             dS_ij = P_ij (dP_ij - sum_j P_ij dP_ij), dQ_i = scale sum_j dS_ij k_j,
//             dK_j += scale dS_ij q_i  (dK, dV gathered over rows with atomics).
#include "runtime/cuda/Attention.h"

#include <cmath>
#include <string>

#include "runtime/cuda/DeviceMath.cuh"

namespace loom::cuda {
namespace {

struct Row {
  const float *q, *k, *v;  // this row's q; the head's first k and v (stride ld between tokens)
  int64_t ld, S, i;
  uint64_t dropBase;       // counter of (i, j = 0)
};

__device__ Row rowOf(const float *qkv, const cpu::AttentionShape &s) {
  int64_t S = s.seq, i = blockIdx.x % S, bh = blockIdx.x / S, h = bh % s.heads, b = bh / s.heads;
  int64_t hd = s.headDim, ld = 3 * s.heads * hd;
  const float *head = qkv + b * S * ld + h * 3 * hd;
  return {head + i * ld, head + hd, head + 2 * hd, ld, S, i, uint64_t(bh * S + i) * uint64_t(S)};
}

// Fills p[0..S) with row i's probabilities (before dropout); false when every key is masked
// (the row then attends to nothing and p is all zeros).
__device__ bool rowProbabilities(const Row &r, const float *keyMask, const cpu::AttentionShape &s, float *p,
                                 float *shared) {
  int64_t b = blockIdx.x / r.S / s.heads;
  float scale = rsqrtf(float(s.headDim)), mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < r.S; j += kThreads) {
    bool masked = (s.causal && j > r.i) || (keyMask && keyMask[b * r.S + j] == 0.0f);
    float dot = 0;
    if (!masked)
      for (int64_t d = 0; d < s.headDim; ++d) dot += r.q[d] * r.k[j * r.ld + d];
    p[j] = masked ? -INFINITY : dot * scale;
    mx = fmaxf(mx, p[j]);
  }
  mx = blockMax(mx, shared);
  if (mx == -INFINITY) {
    for (int64_t j = threadIdx.x; j < r.S; j += kThreads) p[j] = 0.0f;
    __syncthreads();
    return false;
  }
  float sum = 0;
  for (int64_t j = threadIdx.x; j < r.S; j += kThreads) sum += (p[j] = expf(p[j] - mx));
  float inv = 1.0f / blockSum(sum, shared);
  for (int64_t j = threadIdx.x; j < r.S; j += kThreads) p[j] *= inv;
  __syncthreads();
  return true;
}

__device__ float keepScale(const Row &r, const cpu::AttentionShape &s, int64_t j) {
  if (s.dropout <= 0) return 1.0f;
  return philoxUniform(s.seed, s.stream, r.dropBase + uint64_t(j)) >= s.dropout ? 1.0f / (1.0f - s.dropout) : 0.0f;
}

__global__ void attentionForwardKernel(const float *qkv, const float *keyMask, float *out, cpu::AttentionShape s) {
  extern __shared__ float p[];  // S probabilities, then kThreads reduction slots
  float *shared = p + s.seq;
  Row r = rowOf(qkv, s);
  rowProbabilities(r, keyMask, s, p, shared);
  for (int64_t j = threadIdx.x; j < r.S; j += kThreads) p[j] *= keepScale(r, s, j);
  __syncthreads();
  int64_t bh = blockIdx.x / r.S, h = bh % s.heads, b = bh / s.heads;
  float *o = out + (b * r.S + r.i) * s.heads * s.headDim + h * s.headDim;
  for (int64_t d = threadIdx.x; d < s.headDim; d += kThreads) {
    float acc = 0;
    for (int64_t j = 0; j < r.S; ++j) acc += p[j] * r.v[j * r.ld + d];
    o[d] = acc;
  }
}

__global__ void attentionBackwardKernel(const float *qkv, const float *keyMask, const float *g, float *dqkv,
                                        cpu::AttentionShape s) {
  extern __shared__ float p[];  // S probabilities, S gradients, then kThreads reduction slots
  float *dp = p + s.seq, *shared = dp + s.seq;
  Row r = rowOf(qkv, s);
  rowProbabilities(r, keyMask, s, p, shared);
  int64_t bh = blockIdx.x / r.S, h = bh % s.heads, b = bh / s.heads, hd = s.headDim;
  const float *gi = g + (b * r.S + r.i) * s.heads * hd + h * hd;
  float *dq = dqkv + (r.q - qkv), *dk = dqkv + (r.k - qkv), *dv = dqkv + (r.v - qkv);
  float dot = 0;
  for (int64_t j = threadIdx.x; j < r.S; j += kThreads) {
    float keep = keepScale(r, s, j), gv = 0;
    for (int64_t d = 0; d < hd; ++d) {
      gv += gi[d] * r.v[j * r.ld + d];
      if (p[j] * keep != 0.0f) atomicAdd(&dv[j * r.ld + d], p[j] * keep * gi[d]);
    }
    dp[j] = gv * keep;
    dot += p[j] * dp[j];
  }
  dot = blockSum(dot, shared);
  float scale = rsqrtf(float(hd));
  for (int64_t j = threadIdx.x; j < r.S; j += kThreads) {
    dp[j] = p[j] * (dp[j] - dot) * scale;  // dS_ij, with the 1/sqrt(hd) of both dQ and dK
    if (dp[j] != 0.0f)
      for (int64_t d = 0; d < hd; ++d) atomicAdd(&dk[j * r.ld + d], dp[j] * r.q[d]);
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < hd; d += kThreads) {
    float acc = 0;
    for (int64_t j = 0; j < r.S; ++j) acc += dp[j] * r.k[j * r.ld + d];
    dq[d] = acc;
  }
}

Status launchShape(const cpu::AttentionShape &s, int rowsOfS, size_t *sharedBytes, int *grid) {
  *sharedBytes = (size_t(rowsOfS) * s.seq + kThreads) * sizeof(float);
  if (*sharedBytes > 48 * 1024)
    return Status::error("CUDA attention: seq " + std::to_string(s.seq) +
                         " needs more shared memory than this kernel uses (48 KB); the tiled kernel is not written yet");
  *grid = int(s.batch * s.heads * s.seq);
  if (*grid <= 0) return Status::error("CUDA attention: empty shape (batch, heads or seq is 0)");
  return Status::ok();
}

Status launched(const char *what) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::ok();
  return Status::error(std::string("CUDA attention ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

Status attentionForward(const float *qkv, const float *keyMask, float *out, const cpu::AttentionShape &shape,
                        cudaStream_t s) {
  size_t bytes;
  int grid;
  LOOM_RETURN_IF_ERROR(launchShape(shape, 1, &bytes, &grid));
  attentionForwardKernel<<<grid, kThreads, bytes, s>>>(qkv, keyMask, out, shape);
  return launched("forward");
}

Status attentionBackward(const float *qkv, const float *keyMask, const float *g, float *dqkv,
                         const cpu::AttentionShape &shape, cudaStream_t s) {
  size_t bytes;
  int grid;
  LOOM_RETURN_IF_ERROR(launchShape(shape, 2, &bytes, &grid));
  cudaError_t err = cudaMemsetAsync(dqkv, 0, size_t(shape.batch * shape.seq * 3 * shape.heads * shape.headDim) *
                                                 sizeof(float), s);
  if (err != cudaSuccess) return Status::error(std::string("CUDA attention backward: ") + cudaGetErrorString(err));
  attentionBackwardKernel<<<grid, kThreads, bytes, s>>>(qkv, keyMask, g, dqkv, shape);
  return launched("backward");
}

}  // namespace loom::cuda
