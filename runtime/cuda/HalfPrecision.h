// The 16-bit storage types of mixed precision (bf16 and fp16; accumulation stays fp32) and
// conversions between them and fp32 on a stream. Pointers are device pointers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace loom::cuda {

enum class HalfType { kBf16, kFp16 };

const char *halfTypeName(HalfType type);

// How the CUDA backend multiplies an fp32 plan: in fp32 throughout, or with the GEMM operands
// (linear, weight gradient, attention's batched GEMMs) rounded to bf16 or fp16 and fp32
// accumulation and outputs, as torch.autocast does; every other op stays fp32.
enum class Precision { kFp32, kBf16, kFp16 };

inline const char *precisionName(Precision p) {
  return p == Precision::kFp32 ? "fp32" : p == Precision::kBf16 ? "bf16" : "fp16";
}
inline bool parsePrecision(const std::string &name, Precision *out) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16})
    if (name == precisionName(p)) return *out = p, true;
  return false;
}
inline HalfType halfTypeOf(Precision p) { return p == Precision::kFp16 ? HalfType::kFp16 : HalfType::kBf16; }
// Bytes per GEMM operand element.
inline int operandBytes(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

// Round to nearest even, as cuda_bf16.h / cuda_fp16.h do.
void floatToHalf(const float *in, void *out, int64_t count, HalfType type, cudaStream_t s);
void halfToFloat(const void *in, float *out, int64_t count, HalfType type, cudaStream_t s);

}  // namespace loom::cuda
