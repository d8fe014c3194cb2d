// The CUDA attention kernels' scratch, carved from one buffer (no CUDA headers: sizes are
// arithmetic the compiler plans with and the kernels carve by).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/Precision.h"

namespace loom::cuda {

inline size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Consecutive 256-byte-aligned pieces of a scratch buffer at `base`; with a null base it only
// adds up their sizes (the scratch a call needs).
struct Carver {
  char *base;
  size_t bytes = 0;
  void *take(size_t n) {
    void *here = base ? base + bytes : nullptr;
    bytes += aligned(n);
    return here;
  }
};

// What both attention cores carve after their 16-bit operands: the fp32 scores /
// probabilities, the operand-typed D (or dS), and in the backward the fp32 dD.
template <typename Out>
void carveScores(Carver &c, size_t square, size_t operandBytes, bool backward, Out &out) {
  out.scores = static_cast<float *>(c.take(square * 4));
  out.dropped = c.take(square * operandBytes);
  if (backward) out.dDropped = static_cast<float *>(c.take(square * 4));
  out.bytes = c.bytes;
}

// The unfused attention's scratch for one call, carved in this order: 16-bit copies of qkv
// (and g), then the fp32 scores / probabilities, the operand-typed D (or dS), and in the
// backward the fp32 dD.
struct AttentionScratch {
  void *qkv = nullptr, *g = nullptr, *dropped = nullptr;
  float *scores = nullptr, *dDropped = nullptr;
  size_t bytes = 0;
};

// operandsNative: qkv and g are already of p's 16-bit type (a 16-bit plan): no copies.
inline AttentionScratch carveAttention(const cpu::AttentionShape &s, Precision p, bool backward, void *base,
                                       bool operandsNative = false) {
  size_t e = size_t(operandBytes(p)), tokens = size_t(s.batch * s.seq), width = size_t(s.heads * s.headDim);
  size_t square = size_t(s.heads * s.seq * s.seq);
  Carver c{static_cast<char *>(base)};
  AttentionScratch out;
  if (p != Precision::kFp32 && !operandsNative) {
    out.qkv = c.take(tokens * 3 * width * e);
    if (backward) out.g = c.take(tokens * width * e);
  }
  carveScores(c, square, e, backward, out);
  return out;
}

// Grouped-query attention alike: 16-bit q, k, v (and g), the scores of the local query heads.
struct GroupedAttentionScratch {
  void *q = nullptr, *k = nullptr, *v = nullptr, *g = nullptr, *dropped = nullptr;
  float *scores = nullptr, *dDropped = nullptr;
  size_t bytes = 0;
};

inline GroupedAttentionScratch carveGroupedAttention(const cpu::GroupedAttentionShape &s, Precision p, bool backward,
                                                     void *base, bool operandsNative = false) {
  size_t e = size_t(operandBytes(p)), tokens = size_t(s.batch * s.seq);
  size_t qWidth = size_t(s.heads * s.headDim), kvWidth = size_t(s.kvHeads * s.headDim);
  size_t square = size_t(s.heads * s.seq * s.seq);
  Carver c{static_cast<char *>(base)};
  GroupedAttentionScratch out;
  if (p != Precision::kFp32 && !operandsNative) {
    out.q = c.take(tokens * qWidth * e);
    out.k = c.take(tokens * kvWidth * e);
    out.v = c.take(tokens * kvWidth * e);
    if (backward) out.g = c.take(tokens * qWidth * e);
  }
  carveScores(c, square, e, backward, out);
  return out;
}

// The tiled kernel's backward: per-row max, sum and Delta = g.out.
inline size_t flashAttentionScratchBytes(const cpu::AttentionShape &s) {
  return size_t(3 * s.batch * s.heads * s.seq) * sizeof(float);
}

constexpr size_t kUnfusedScratchLimit = size_t(2) << 30;
constexpr size_t kLtWorkspaceBytes = 32 << 20;  // cuBLASLt's split-K / stream-K workspace

inline bool useFlash(const cpu::AttentionShape &s, Precision p, AttentionKernel kernel) {
  if (kernel != AttentionKernel::kAuto) return kernel == AttentionKernel::kFlash;
  return s.headDim <= 128 && carveAttention(s, p, /*backward=*/true, nullptr).bytes > kUnfusedScratchLimit;
}

}  // namespace loom::cuda
