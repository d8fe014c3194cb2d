// The attention core on the GPU, fp32, with cpu::attentionForward/Backward's layout and math
// (runtime/cpu/Kernels.h): qkv [B,S,3*heads*hd] per head [heads,3,hd], out [B,S,heads*hd],
// optional key mask [B,S], causal masking, dropout on the probabilities from the same counter
// (index ((b*heads + h)*S + i)*S + j) so both backends drop the same entries.
//
// One block per (batch, head, query row) with that row's probabilities in shared memory (S
// floats forward, 2S backward, within 48 KB: S up to about 12000 forward and 6000 backward;
// longer sequences are refused with a message). This is the correctness reference for
// the GPU; a tiled flash-style kernel (Dao et al. 2022) is the performance path still to come.
#pragma once

#include <cuda_runtime.h>

#include "runtime/Status.h"
#include "runtime/cpu/Kernels.h"

namespace loom::cuda {

Status attentionForward(const float *qkv, const float *keyMask, float *out, const cpu::AttentionShape &shape,
                        cudaStream_t s);
// dqkv is written whole (zeroed here first: dK and dV are accumulated across query rows).
Status attentionBackward(const float *qkv, const float *keyMask, const float *g, float *dqkv,
                         const cpu::AttentionShape &shape, cudaStream_t s);

}  // namespace loom::cuda
