// The 16-bit storage types of mixed precision (bf16 and fp16; accumulation stays fp32) and
// conversions between them and fp32 on a stream. Pointers are device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "runtime/cuda/Precision.h"

namespace loom::cuda {

enum class HalfType { kBf16, kFp16 };

const char *halfTypeName(HalfType type);

inline HalfType halfTypeOf(Precision p) { return p == Precision::kFp16 ? HalfType::kFp16 : HalfType::kBf16; }

// Round to nearest even, as cuda_bf16.h / cuda_fp16.h do.
void floatToHalf(const float *in, void *out, int64_t count, HalfType type, cudaStream_t s);
void halfToFloat(const void *in, float *out, int64_t count, HalfType type, cudaStream_t s);

}  // namespace loom::cuda
