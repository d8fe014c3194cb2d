// The scale-mask-softmax between attention's two batched GEMMs (Megatron-LM's unfused path),
// with the CPU backend's math and dropout counter (runtime/cpu/Kernels.cpp): rows are the
// heads * S query rows of one batch item b, each of S scores already scaled by 1/sqrt(hd).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/HalfPrecision.h"

namespace loom::cuda {

// scores [heads, S, S] fp32 become the probabilities P in place (causal and key masks; a row
// with every key masked is all zeros); `dropped` (operand type of `p`) receives
// D = P keep / (1 - rate), keep from the counter ((b*heads + h)*S + i)*S + j. `lseOut`
// (nullable) receives each row's log-sum-exp at [b, h, i] of a [B, heads, S] array (+inf for a
// fully masked row); with `lseIn` (the backward) P = exp(scores - lse) from those statistics.
void attentionSoftmaxForward(float *scores, void *dropped, Precision p, const float *keyMask, int64_t b,
                             const cpu::AttentionShape &shape, float *lseOut, const float *lseIn, cudaStream_t s);
// From P and dD = g V^T (fp32, overwritten): dP = dD keep / (1 - rate) and
// dS = P (dP - rowsum(P dP)) / sqrt(hd), written to `ds` in the operand type of `p`.
void attentionSoftmaxBackward(const float *probs, float *dDropped, void *ds, Precision p, int64_t b,
                              const cpu::AttentionShape &shape, cudaStream_t s);

}  // namespace loom::cuda
