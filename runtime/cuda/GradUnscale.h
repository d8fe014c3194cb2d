// The device half of fp16 dynamic loss scaling (the host half is runtime/LossScaler.h):
// gradients are multiplied by 1/scale in place and any inf or NaN among them is flagged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom::cuda {

// g *= unscale; *foundNonFinite is set to 1 if any g was inf or NaN (it is never cleared
// here, so one flag can gather every gradient buffer of a step; zero it before the first).
void unscaleGradients(float *g, int64_t count, float unscale, int32_t *foundNonFinite, cudaStream_t s);

}  // namespace loom::cuda
