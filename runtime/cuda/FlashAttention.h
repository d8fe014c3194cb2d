// The attention core without the S x S scores in memory (the memory-efficient, tiled form of
// Dao et al., "FlashAttention", NeurIPS 2022, and its backward of FlashAttention-2, section 3.1):
// keys and values stream through shared memory in tiles of 32 while each query row keeps a
// running max, sum and output (online softmax); the backward recomputes the probabilities from
// per-row statistics. fp32 on CUDA cores, the CPU backend's math and dropout counter
// (cpu::attentionForward/Backward, runtime/cpu/Kernels.h), same layouts as
// runtime/cuda/Attention.h. No atomics: dQ is computed per query row, dK and dV per key row,
// so results are the same from run to run.
//
// Where it pays: sequences whose scores would not fit (the unfused path keeps heads x S x S of
// one batch item); for moderate S the unfused path's tensor-core GEMMs are faster. Head size
// up to 128 (refused with a message beyond).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "support/Status.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/DeviceArray.h"
#include "runtime/cuda/ScratchLayout.h"

namespace loom::cuda {

// The backward's scratch: flashAttentionScratchBytes (runtime/cuda/ScratchLayout.h: 3 floats
// per query row of every head: max, sum, and rowsum(P dP)); the forward needs none.

// lse (nullable): each query row's log-sum-exp (loom.attention's statistics, [B,heads,S]). The
// backward does not read them: its statistics pass also needs Delta = g . out, and
// attention_grad is not given the output, so it recomputes m, l and Delta together.
// qkv, out, g and dqkv are typed (fp32 or the 16-bit storage of a 16-bit plan; fp32 arithmetic).
Status flashAttentionForward(In qkv, const float *keyMask, Out out, float *lse, const cpu::AttentionShape &shape,
                             cudaStream_t s);
// dqkv is written whole.
Status flashAttentionBackward(In qkv, const float *keyMask, In g, Out dqkv, const cpu::AttentionShape &shape,
                              void *scratch, cudaStream_t s);

}  // namespace loom::cuda
