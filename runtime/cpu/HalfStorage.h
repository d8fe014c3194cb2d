// The plan's 16-bit dtypes on the CPU: which buffers are 16-bit, and their bulk conversions
// by dtype (runtime/cpu/HalfPrecision.h has the roundings).
#pragma once

#include <cstdint>

#include "protos/plan.pb.h"
#include "runtime/cpu/HalfPrecision.h"

namespace loom::cpu {

inline bool isHalf(plan::DType d) { return d == plan::BF16 || d == plan::F16; }

// n 16-bit values of `dtype` into fp32, and back (rounded).
inline void widen(plan::DType dtype, const uint16_t *from, float *to, int64_t n) {
  dtype == plan::BF16 ? widenBf16(from, to, n) : widenF16(from, to, n);
}
inline void narrow(plan::DType dtype, const float *from, uint16_t *to, int64_t n) {
  dtype == plan::BF16 ? narrowToBf16(from, to, n) : narrowToF16(from, to, n);
}

}  // namespace loom::cpu
