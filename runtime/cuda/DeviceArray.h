// A device pointer with the type of its elements: the CUDA kernels read and write fp32, bf16 or
// fp16 storage and compute in fp32 registers (issue 34: a 16-bit plan's activations, stashes
// and messages are bf16 or fp16 in memory, Megatron-LM's mixed precision; the arithmetic of a
// kernel is the same for every storage type, so an fp32 plan's results do not change).
// No CUDA headers: the executor and the plan-side arithmetic include it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::cuda {

enum class ElementType : uint8_t { kF32, kBf16, kF16 };

inline int elementBytes(ElementType t) { return t == ElementType::kF32 ? 4 : 2; }
inline const char *elementTypeName(ElementType t) {
  return t == ElementType::kF32 ? "fp32" : t == ElementType::kBf16 ? "bf16" : "fp16";
}

// A read-only operand: `data` holds elements of `type`. An fp32 pointer converts implicitly.
struct In {
  const void *data = nullptr;
  ElementType type = ElementType::kF32;
  In() = default;
  In(std::nullptr_t) {}
  In(const float *p) : data(p) {}
  In(const void *p, ElementType t) : data(p), type(t) {}
  // The operand `elements` further on.
  In at(int64_t elements) const { return {static_cast<const char *>(data) + elements * elementBytes(type), type}; }
};

// A written operand (results are rounded to `type` to nearest even once, after the fp32 math).
struct Out {
  void *data = nullptr;
  ElementType type = ElementType::kF32;
  Out() = default;
  Out(std::nullptr_t) {}
  Out(float *p) : data(p) {}
  Out(void *p, ElementType t) : data(p), type(t) {}
  Out at(int64_t elements) const { return {static_cast<char *>(data) + elements * elementBytes(type), type}; }
  operator In() const { return {data, type}; }
};

}  // namespace loom::cuda
