// The CUDA backend's GEMM precision and attention kernel choices (no CUDA headers: the
// compiler plans the backend's memory with them).
#pragma once

#include <string>

namespace loom::cuda {

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
// Bytes per GEMM operand element.
inline int operandBytes(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

// The attention core: Megatron's unfused path (cuBLAS batched GEMMs around our softmax;
// runtime/cuda/Attention.h), or the tiled one that never stores the scores
// (runtime/cuda/FlashAttention.h). Auto: unfused unless its scratch would pass 2 GiB.
enum class AttentionKernel { kAuto, kUnfused, kFlash };

}  // namespace loom::cuda
