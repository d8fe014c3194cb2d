// Kernels over an operand's storage type T: `float` (an fp32 buffer, read and written in place)
// or `uint16_t` (bf16 bits). A bf16 operand is widened a row (or a block of elements) at a time
// into a small per-thread fp32 buffer, the fp32 arithmetic runs on it unchanged, and a bf16
// result is rounded once when its row is done. The values are those of the fp32 kernel run on
// widened copies of the whole tensors and rounded after (the executor's widened path: widening
// is exact and every row's arithmetic is the same), without the tensor-sized copies; with
// T = float the code is the fp32 kernel's, the same bits as before.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "runtime/cpu/HalfPrecision.h"

namespace loom::cpu {

// Elements per block of an elementwise kernel's bf16 operands (a few KiB each: in L1 / L2).
constexpr int64_t kRowStorageBlock = 2048;

// fp32 views of rows of storage T: `slots` rows of up to n floats each, per thread (`Tag`
// separates nested users on one thread, e.g. a kernel's widened parameters and its rows).
template <typename T, int Tag = 0>
class RowViews {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, uint16_t>, "fp32 or bf16 storage");

 public:
  static constexpr bool kWide = std::is_same_v<T, float>;
  RowViews(int slots, int64_t n) : n_(n) {
    if constexpr (!kWide) {
      static thread_local std::vector<float> store;
      if (store.size() < size_t(slots * n)) store.resize(size_t(slots * n));
      base_ = store.data();
    }
  }
  // Row `row` (count elements, count <= n) as fp32: itself, or widened into slot `slot`.
  // A null row (an absent optional operand) stays null.
  const float *in(int slot, const T *row, int64_t count) const {
    if constexpr (kWide) {
      return row;
    } else {
      if (!row) return nullptr;
      float *to = base_ + slot * n_;
      widenBf16Row(row, to, count);
      return to;
    }
  }
  const float *in(int slot, const T *row) const { return in(slot, row, n_); }
  // Where to compute an output row: itself, or slot `slot` (then `put` rounds it into the row).
  float *out(int slot, T *row) const {
    if constexpr (kWide)
      return row;
    else
      return base_ + slot * n_;
  }
  void put(int slot, T *row, int64_t count) const {
    if constexpr (!kWide) narrowBf16Row(base_ + slot * n_, row, count);
  }
  void put(int slot, T *row) const { put(slot, row, n_); }

 private:
  int64_t n_;
  float *base_ = nullptr;
};

}  // namespace loom::cpu
