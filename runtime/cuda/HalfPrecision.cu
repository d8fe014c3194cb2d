#include "runtime/cuda/HalfPrecision.h"
#include "runtime/cuda/DeviceMath.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace loom::cuda {
namespace {


template <typename Half>
__device__ Half fromFloat(float v);
template <>
__device__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __half fromFloat<__half>(float v) { return __float2half_rn(v); }

template <typename Half>
__global__ void floatToHalfKernel(const float *in, Half *out, int64_t count) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = fromFloat<Half>(in[i]);
}

template <typename Half>
__global__ void halfToFloatKernel(const Half *in, float *out, int64_t count) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = float(in[i]);
}

}  // namespace

const char *halfTypeName(HalfType type) { return type == HalfType::kBf16 ? "bf16" : "fp16"; }

void floatToHalf(const float *in, void *out, int64_t count, HalfType type, cudaStream_t s) {
  if (type == HalfType::kBf16)
    floatToHalfKernel<<<blocks(count), kThreads, 0, s>>>(in, static_cast<__nv_bfloat16 *>(out), count);
  else
    floatToHalfKernel<<<blocks(count), kThreads, 0, s>>>(in, static_cast<__half *>(out), count);
}

void halfToFloat(const void *in, float *out, int64_t count, HalfType type, cudaStream_t s) {
  if (type == HalfType::kBf16)
    halfToFloatKernel<<<blocks(count), kThreads, 0, s>>>(static_cast<const __nv_bfloat16 *>(in), out, count);
  else
    halfToFloatKernel<<<blocks(count), kThreads, 0, s>>>(static_cast<const __half *>(in), out, count);
}

}  // namespace loom::cuda
