// 16-bit storage for the CPU backend: bf16 and fp16 values widened to fp32 (exact) and fp32
// rounded to them (to nearest, ties to even: what torch's .to(torch.bfloat16) / .half() and
// the GPUs' conversion instructions do). The kernels compute in fp32 registers; a 16-bit
// buffer is read through these (runtime/cpu/HalfKernels.cpp reads and writes it natively, the
// executor widens the operands of the other kernels: runtime/Executor.cpp).
#pragma once

#include <cstdint>
#include <cstring>

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

// n values at a time, vectorised and split over the rank's threads (elements are independent,
// so the bits do not depend on the split).
void widenBf16(const uint16_t *from, float *to, int64_t n);
void narrowToBf16(const float *from, uint16_t *to, int64_t n);
void widenF16(const uint16_t *from, float *to, int64_t n);
void narrowToF16(const float *from, uint16_t *to, int64_t n);
// The same on the calling thread alone (a row inside a kernel's own parallel part).
void widenBf16Row(const uint16_t *from, float *to, int64_t n);
void narrowBf16Row(const float *from, uint16_t *to, int64_t n);
void widenF16Row(const uint16_t *from, float *to, int64_t n);
void narrowF16Row(const float *from, uint16_t *to, int64_t n);
// x[0, n) rounded to bf16 (fp16) and kept as fp32, in place on the calling thread: what storing
// them in the 16-bit dtype and reading them back gives.
void roundThroughBf16(float *x, int64_t n);
void roundThroughF16(float *x, int64_t n);

}  // namespace loom::cpu
