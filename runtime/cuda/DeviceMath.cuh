// Device helpers shared by the CUDA kernels: the counter-based generator of runtime/cpu/Philox.h
// and block-wide reductions. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "runtime/cuda/DeviceArray.h"

namespace loom::cuda {

// Element i of a typed operand, widened to fp32 (exact), and a value rounded into one (round
// to nearest even, as the CPU backend's runtime/cpu/HalfPrecision.h). The type is the same for
// every thread of a launch, so the branch costs no divergence.
__device__ inline float load(In a, int64_t i) {
  if (a.type == ElementType::kF32) return static_cast<const float *>(a.data)[i];
  if (a.type == ElementType::kBf16) return __bfloat162float(static_cast<const __nv_bfloat16 *>(a.data)[i]);
  return __half2float(static_cast<const __half *>(a.data)[i]);
}
__device__ inline void store(Out a, int64_t i, float v) {
  if (a.type == ElementType::kF32)
    static_cast<float *>(a.data)[i] = v;
  else if (a.type == ElementType::kBf16)
    static_cast<__nv_bfloat16 *>(a.data)[i] = __float2bfloat16_rn(v);
  else
    static_cast<__half *>(a.data)[i] = __float2half_rn(v);
}

constexpr int kThreads = 256;  // threads per block of every kernel here (the reductions need it)

// Blocks of kThreads covering n elements, one thread each; at least one (an empty grid is a
// launch error, and the kernels skip indices >= n).
inline int blocks(int64_t n) { return n > 0 ? int((n + kThreads - 1) / kThreads) : 1; }

// Philox4x32-10, as runtime/cpu/Philox.h: the same (key, counter) -> the same bits.
__device__ inline float philoxUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint32_t c0 = uint32_t(index), c1 = uint32_t(index >> 32), c2 = uint32_t(stream), c3 = uint32_t(stream >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n1 = uint32_t(p1), n2 = uint32_t(p0 >> 32) ^ c3 ^ k1,
             n3 = uint32_t(p0);
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  return float(c0 >> 8) * (1.0f / 16777216.0f);
}

// Block-wide sum of one float per thread (blockDim.x == kThreads).
__device__ inline float blockSum(float v, float *shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  float total = shared[0];
  __syncthreads();
  return total;
}

__device__ inline float blockMax(float v, float *shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  float total = shared[0];
  __syncthreads();
  return total;
}

}  // namespace loom::cuda
