// 16-bit storage for the CPU executor: bf16 and fp16 values widened to fp32 (exact) and fp32
// rounded to them (to nearest, ties to even: what torch's .to(torch.bfloat16) / .half() and
// the GPUs' conversion instructions do). The CPU kernels compute in fp32; a 16-bit operand is
// widened before a kernel and its outputs rounded after it (runtime/Executor.cpp).
#pragma once

#include <cstdint>
#include <cstring>

#include "protos/plan.pb.h"

namespace loom::cpu {

inline float bf16ToFloat(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t floatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                         // round to nearest even
  return uint16_t(u >> 16);
}

inline float f16ToFloat(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return float(v);
}

inline uint16_t floatToF16(float f) {
  _Float16 v = _Float16(f);  // IEEE round to nearest even; beyond 65504 becomes inf
  uint16_t h;
  std::memcpy(&h, &v, 2);
  return h;
}

inline bool isHalf(plan::DType d) { return d == plan::BF16 || d == plan::F16; }

// n 16-bit values of `dtype` into fp32, and back (rounded).
inline void widen(plan::DType dtype, const uint16_t *from, float *to, int64_t n) {
  if (dtype == plan::BF16)
    for (int64_t i = 0; i < n; ++i) to[i] = bf16ToFloat(from[i]);
  else
    for (int64_t i = 0; i < n; ++i) to[i] = f16ToFloat(from[i]);
}
inline void narrow(plan::DType dtype, const float *from, uint16_t *to, int64_t n) {
  if (dtype == plan::BF16)
    for (int64_t i = 0; i < n; ++i) to[i] = floatToBf16(from[i]);
  else
    for (int64_t i = 0; i < n; ++i) to[i] = floatToF16(from[i]);
}

}  // namespace loom::cpu
