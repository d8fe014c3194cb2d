#include "runtime/cpu/HalfPrecision.h"

#include "runtime/cpu/Parallel.h"

namespace loom::cpu {
namespace {

// Branch-free forms of the scalar conversions (the compiler vectorises these loops).
#define LOOM_HALF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

LOOM_HALF_CLONES void widenBf16Range(const uint16_t *__restrict from, float *__restrict to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = uint32_t(from[i]) << 16;
    std::memcpy(&to[i], &u, 4);
  }
}

LOOM_HALF_CLONES void narrowBf16Range(const float *__restrict from, uint16_t *__restrict to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &from[i], 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u;
    to[i] = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

// x rounded to bf16 in place (floatToBf16's rounding, NaN kept a quiet NaN), branch-free.
LOOM_HALF_CLONES void roundThroughBf16Range(float *__restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    uint32_t rounded = ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) << 16;
    uint32_t nan = ((u >> 16) | 0x40u) << 16;
    uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
    std::memcpy(&x[i], &r, 4);
  }
}

void widenF16Range(const uint16_t *from, float *to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) to[i] = f16ToFloat(from[i]);
}

void narrowF16Range(const float *from, uint16_t *to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) to[i] = floatToF16(from[i]);
}

// Conversions are memory-bound: parts of at least 64 K elements.
template <typename From, typename To>
void split(const From *from, To *to, int64_t n, void (*range)(const From *, To *, int64_t)) {
  parallelFor(n, 65536, [&](int64_t lo, int64_t hi) { range(from + lo, to + lo, hi - lo); });
}

}  // namespace

void widenBf16(const uint16_t *from, float *to, int64_t n) { split(from, to, n, widenBf16Range); }
void narrowToBf16(const float *from, uint16_t *to, int64_t n) { split(from, to, n, narrowBf16Range); }
void widenBf16Row(const uint16_t *from, float *to, int64_t n) { widenBf16Range(from, to, n); }
void narrowBf16Row(const float *from, uint16_t *to, int64_t n) { narrowBf16Range(from, to, n); }
void widenF16Row(const uint16_t *from, float *to, int64_t n) { widenF16Range(from, to, n); }
void narrowF16Row(const float *from, uint16_t *to, int64_t n) { narrowF16Range(from, to, n); }
void widenF16(const uint16_t *from, float *to, int64_t n) { split(from, to, n, widenF16Range); }
void narrowToF16(const float *from, uint16_t *to, int64_t n) { split(from, to, n, narrowF16Range); }
void roundThroughBf16(float *x, int64_t n) { roundThroughBf16Range(x, n); }
void roundThroughF16(float *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = f16ToFloat(floatToF16(x[i]));
}

}  // namespace loom::cpu
