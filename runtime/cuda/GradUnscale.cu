#include "runtime/cuda/GradUnscale.h"
#include "runtime/cuda/DeviceMath.cuh"

namespace loom::cuda {
namespace {


__global__ void unscaleKernel(float *g, int64_t count, float unscale, int32_t *foundNonFinite) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  float v = g[i];
  if (!isfinite(v)) *foundNonFinite = 1;  // a racy store of the same value: any writer wins
  g[i] = v * unscale;
}

}  // namespace

void unscaleGradients(float *g, int64_t count, float unscale, int32_t *foundNonFinite, cudaStream_t s) {
  unscaleKernel<<<blocks(count), kThreads, 0, s>>>(g, count, unscale, foundNonFinite);
}

}  // namespace loom::cuda
