// The attention core on the GPU as Megatron-LM's unfused path (Shoeybi et al. 2019, and
// Korthikanti et al. 2022 section 4 for what it stores): per batch item, S = Q K^T / sqrt(hd)
// and O = D V as batched GEMMs over the heads through cuBLAS (tensor cores in bf16/fp16,
// fp32 accumulation), our scale-mask-softmax and dropout between them
// (runtime/cuda/AttentionSoftmax.h). Layout and math are cpu::attentionForward/Backward's
// (runtime/cpu/Kernels.h): qkv [B,S,3*heads*hd] with each head's [3,hd] together, out
// [B,S,heads*hd], optional key mask [B,S], causal masking, the same dropout counter.
// The forward writes each query row's log-sum-exp (`lse` [B,heads,S], loom.attention's
// statistics) and the backward recomputes the scores and takes the probabilities as
// exp(s - lse), as the CPU backend does.
//
// The S x S scores of one batch item live in a caller-provided scratch (attentionScratchBytes),
// so memory grows with heads * S^2, not batch * heads * S^2; a tiled flash-style kernel (Dao et
// al. 2022) that never stores them is the next step for long sequences.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "support/Status.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/DeviceArray.h"
#include "runtime/cuda/HalfPrecision.h"

namespace loom::cuda {

// Scratch bytes (device) the forward or backward pass needs for `shape` at precision p (with
// 16-bit copies of the operands unless they are already 16-bit: operandsNative).
size_t attentionScratchBytes(const cpu::AttentionShape &shape, Precision p, bool backward,
                             bool operandsNative = false);

// `blas` is bound to stream s here. qkv, g, out and dqkv are typed (runtime/cuda/DeviceArray.h):
// fp32 (an fp32 plan: GEMM operands rounded into scratch at precision p, fp32 outputs) or p's
// 16-bit type (a 16-bit plan: read in place, outputs rounded once); keyMask and lse are fp32.
// out and dqkv are written whole. lse: nullable in the forward, required in the backward.
Status attentionForward(cublasHandle_t blas, Precision p, In qkv, const float *keyMask, Out out, float *lse,
                        const cpu::AttentionShape &shape, void *scratch, cudaStream_t s);
Status attentionBackward(cublasHandle_t blas, Precision p, In qkv, const float *keyMask, In g, const float *lse,
                         Out dqkv, const cpu::AttentionShape &shape, void *scratch, cudaStream_t s);

// Grouped-query attention (cpu::groupedAttentionForward/Backward's layout and math): q
// [B,S,heads*hd], k and v [B,S,kvHeads*hd]; dk and dv (fp32: sums over the query heads of a
// KV head) are zeroed and accumulated here.
size_t groupedAttentionScratchBytes(const cpu::GroupedAttentionShape &shape, Precision p, bool backward,
                                    bool operandsNative = false);
Status groupedAttentionForward(cublasHandle_t blas, Precision p, In q, In k, In v, Out out, float *lse,
                               const cpu::GroupedAttentionShape &shape, void *scratch, cudaStream_t s);
Status groupedAttentionBackward(cublasHandle_t blas, Precision p, In q, In k, In v, In g, const float *lse, Out dq,
                                float *dk, float *dv, const cpu::GroupedAttentionShape &shape, void *scratch,
                                cudaStream_t s);

}  // namespace loom::cuda
