#include "runtime/Collectives.h"

#include <algorithm>

#include "runtime/cpu/HalfPrecision.h"

namespace loom {
namespace {

// 16-bit values through fp32 (exact), the result rounded once.
template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void reduceHalf(ReduceOp op, uint16_t *acc, const uint16_t *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float a = Widen(acc[i]), b = Widen(x[i]);
    acc[i] = Narrow(op == ReduceOp::kMax ? std::max(a, b) : a + b);
  }
}

template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void divideHalf(uint16_t *data, int64_t n, float divisor) {
  for (int64_t i = 0; i < n; ++i) data[i] = Narrow(Widen(data[i]) / divisor);
}

}  // namespace

size_t elementBytes(plan::DType dtype) {
  switch (dtype) {
    case plan::F32: return 4;
    case plan::BF16:
    case plan::F16: return 2;
    default: return 0;
  }
}

void reduceElements(plan::DType dtype, ReduceOp op, void *acc, const void *x, int64_t n) {
  auto *a16 = static_cast<uint16_t *>(acc);
  auto *x16 = static_cast<const uint16_t *>(x);
  if (dtype == plan::BF16) return reduceHalf<cpu::bf16ToFloat, cpu::floatToBf16>(op, a16, x16, n);
  if (dtype == plan::F16) return reduceHalf<cpu::f16ToFloat, cpu::floatToF16>(op, a16, x16, n);
  auto *a = static_cast<float *>(acc);
  auto *b = static_cast<const float *>(x);
  for (int64_t i = 0; i < n; ++i) a[i] = op == ReduceOp::kMax ? std::max(a[i], b[i]) : a[i] + b[i];
}

void divideElements(plan::DType dtype, void *data, int64_t n, float divisor) {
  auto *d16 = static_cast<uint16_t *>(data);
  if (dtype == plan::BF16) return divideHalf<cpu::bf16ToFloat, cpu::floatToBf16>(d16, n, divisor);
  if (dtype == plan::F16) return divideHalf<cpu::f16ToFloat, cpu::floatToF16>(d16, n, divisor);
  auto *d = static_cast<float *>(data);
  for (int64_t i = 0; i < n; ++i) d[i] /= divisor;
}

}  // namespace loom
