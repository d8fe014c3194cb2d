// fp32 CPU kernels of the loom ops, forward and backward side by side. Shapes are given as
// rows x columns of the flattened tensors; all buffers are dense, row-major. GEMMs go through
// OpenBLAS; the rest is plain loops. Each function's math is stated above it.
//
// The memory-bound ones also come for bf16 operands (uint16_t bits, every operand bf16): the
// same fp32 arithmetic on rows widened in cache and each output rounded once, so the values are
// those of the fp32 kernel run on widened copies and rounded after (runtime/cpu/RowStorage.h).
#pragma once

#include <cstdint>
#include <functional>

#include "support/Status.h"

namespace loom::cpu {

// y[M,N] = x[M,K] W + bias, W stored [K,N] or, with transposeW, [N,K].
void linearForward(const float *x, const float *w, const float *bias, float *y, int64_t m,
                   int64_t k, int64_t n, bool transposeW);
// dW = x^T g  ([K,N], or [N,K] = g^T x with transposeW); accumulate adds into dW.
void linearWeightGrad(const float *x, const float *g, float *dw, int64_t m, int64_t k, int64_t n,
                      bool transposeW, bool accumulate = false);
// db[N] = sum over rows of g[M,N].
void biasGrad(const float *g, float *db, int64_t m, int64_t n);
void biasGrad(const uint16_t *g, uint16_t *db, int64_t m, int64_t n);

// Layer norm over rows of length n: y = (x - mean) * rstd * gamma + beta.
void layerNormForward(const float *x, const float *gamma, const float *beta, float *y, int64_t rows,
                      int64_t n, float eps);
void layerNormForward(const uint16_t *x, const uint16_t *gamma, const uint16_t *beta, uint16_t *y, int64_t rows,
                      int64_t n, float eps);
// dx, dgamma, dbeta with the statistics recomputed from x.
void layerNormBackward(const float *x, const float *gamma, const float *g, float *dx, float *dgamma,
                       float *dbeta, int64_t rows, int64_t n, float eps);
void layerNormBackward(const uint16_t *x, const uint16_t *gamma, const uint16_t *g, uint16_t *dx, uint16_t *dgamma,
                       uint16_t *dbeta, int64_t rows, int64_t n, float eps);

// GeLU, tanh approximation: 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi).
void geluForward(const float *x, float *y, int64_t count);
void geluBackward(const float *x, const float *g, float *dx, int64_t count);
void geluForward(const uint16_t *x, uint16_t *y, int64_t count);
void geluBackward(const uint16_t *x, const uint16_t *g, uint16_t *dx, int64_t count);

// tanh and its gradient g (1 - tanh(x)^2) (BERT's pooler), fp32 or bf16 storage.
void tanhForward(const float *x, float *y, int64_t count);
void tanhBackward(const float *x, const float *g, float *dx, int64_t count);
void tanhForward(const uint16_t *x, uint16_t *y, int64_t count);
void tanhBackward(const uint16_t *x, const uint16_t *g, uint16_t *dx, int64_t count);

// Inverted dropout: y = x * keep / (1 - rate), keep = uniform(seed, stream, i) >= rate.
// Element i's mask from counter counterBase + i.
void dropoutForward(const float *x, float *y, int64_t count, float rate, uint64_t seed, uint64_t stream,
                    uint64_t counterBase = 0);
void dropoutForward(const uint16_t *x, uint16_t *y, int64_t count, float rate, uint64_t seed, uint64_t stream,
                    uint64_t counterBase = 0);

// Attention core over qkv [B,S,3*heads*hd] laid out per head [heads,3,hd]; out [B,S,heads*hd].
// keyMask [B,S] (nullable): 0 masks that key. Dropout on probabilities with (seed, stream).
struct AttentionShape {
  int64_t batch, seq, heads, headDim;
  bool causal;
  float dropout;
  uint64_t seed, stream;
};
// `scratch`: attentionScratchFloats(seq, backward) floats the caller provides (a 64-query block's
// probabilities per head group, and backward two more such blocks), so the kernels allocate
// nothing.
// `lse` [B,heads,S]: the softmax statistics (loom.attention's lse result), each query row's
// log-sum-exp of its scaled, masked scores (+inf when every key is masked); the forward
// writes them when `lse` is not null, the backward computes the probabilities from them.
int64_t attentionScratchFloats(int64_t seq, bool backward);
void attentionForward(const float *qkv, const float *keyMask, float *out, float *lse, const AttentionShape &s,
                      float *scratch);
void attentionBackward(const float *qkv, const float *keyMask, const float *g, const float *lse, float *dqkv,
                       const AttentionShape &s, float *scratch);
// The same over bf16 qkv, out, g and dqkv with FlashAttention's rounding points: the scores
// and softmax in fp32, the probabilities (and in the backward dS) rounded to bf16 for the
// products that read them, every product a bf16 GEMM (runtime/cpu/Kernels.cpp has the steps).
int64_t attentionScratchFloatsBf16(int64_t seq, int64_t headDim, bool backward);
void attentionForwardBf16(const uint16_t *qkv, const float *keyMask, uint16_t *out, float *lse, const AttentionShape &s,
                          float *scratch);
void attentionBackwardBf16(const uint16_t *qkv, const float *keyMask, const uint16_t *g, const float *lse,
                           uint16_t *dqkv, const AttentionShape &s, float *scratch);

// Context parallelism's ring attention, block by block: one head's query chunk against one key
// chunk of the same `len` rows (q, k, v rows `ld` apart). causal: the diagonal block (query i
// sees keys 0..i); else every key (a chunk before the queries'). Dropout on the probabilities
// with the whole sequence's counters: P[i][j]'s is counterBase + i * counterLd + j (counterBase
// at the block's corner of the whole head, counterLd its sequence length).
struct AttentionBlock {
  const float *q, *k, *v;
  int64_t ld, len, headDim;
  bool causal;
  float dropout;
  uint64_t seed, stream, counterBase;
  int64_t counterLd;
};
int64_t attentionBlockScratchFloats(int64_t len, bool backward);
// The block's output (rows ldo apart) and its rows' log-sum-exp.
void attentionBlockForward(const AttentionBlock &b, float *out, int64_t ldo, float *lse, float *scratch);
// out, lse (rows ldo apart; lse -inf: nothing yet) combined with a block's part and partLse:
// lse' = log(e^lse + e^partLse), out' = out e^(lse - lse') + part e^(partLse - lse') (the
// softmax over the union of the keys; a part's +inf row saw no key and is skipped).
void mergeAttentionBlock(float *out, float *lse, int64_t ldo, const float *part, const float *partLse, int64_t ldp,
                         int64_t rows, int64_t headDim);
// delta[i] = rowsum(g * out) over a head's rows (FlashAttention-2's D: the softmax backward's
// rowsum(P * dP) over all of a row's keys, from the merged output).
void attentionRowDots(const float *g, const float *out, int64_t ld, int64_t rows, int64_t headDim, float *delta);
// The block's gradients from the merged lse and delta of its query rows: dq (rows ldd apart, as
// dk and dv) added to, dk and dv added to.
void attentionBlockBackward(const AttentionBlock &b, const float *g, int64_t ldg, const float *lse, const float *delta,
                            float *dq, float *dk, float *dv, int64_t ldd, float *scratch);

// Context parallelism's attention over all-gathered keys and values (Megatron-Core's
// cp_comm_type "all_gather"; c members, this one at `rank`): the rank's queries are its chunks
// `rank` and 2c-1-rank of C = S / 2c tokens each, the keys and values all 2c chunks in the
// all-gather's member order (member j's chunks j and 2c-1-j at rows 2jC and 2jC + C). Causal
// by global position; dropout with the whole sequence's counters (the masks of c = 1).
// Scratch: contextAttentionScratchFloats(C, headDim, backward).
int64_t contextAttentionScratchFloats(int64_t chunk, int64_t headDim, bool backward);
// qkv [B, S, 3 heads hd] gathered (s.seq = S); out [B, S/c, heads hd]; lse [B, heads, S/c]
// (nullable forward). dqkv: the gathered shape, 0 at the other members' query rows.
void contextAttentionForward(const float *qkv, float *out, float *lse, const AttentionShape &s, int c, int rank,
                             float *scratch);
void contextAttentionBackward(const float *qkv, const float *g, const float *lse, float *dqkv,
                              const AttentionShape &s, int c, int rank, float *scratch);

// Grouped-query attention over q [B,S,heads*hd] and k, v [B,S,kvHeads*hd]: local query head h
// uses KV head (firstHead + h) / headsPerKv (firstHead: the global index of this rank's first
// query head when k and v hold every KV head; 0 when they are split alike). Causal or not,
// dropout on the probabilities as in attentionForward.
struct GroupedAttentionShape {
  int64_t batch, seq, heads, kvHeads, headDim;
  int64_t firstHead, headsPerKv;
  bool causal;
  float dropout;
  uint64_t seed, stream;
  int64_t kvHeadOf(int64_t h) const;
};
// lse [B,heads,S] as attentionForward/Backward's.
void groupedAttentionForward(const float *q, const float *k, const float *v, float *out, float *lse,
                             const GroupedAttentionShape &s, float *scratch);
void groupedAttentionBackward(const float *q, const float *k, const float *v, const float *g, const float *lse,
                              float *dq, float *dk, float *dv, const GroupedAttentionShape &s, float *scratch);
// Context parallelism's grouped form (contextAttentionForward's chunks): q [B, S/c, heads hd]
// (s.seq = S/c), k and v [B, S, kvHeads hd] gathered.
void contextGroupedAttentionForward(const float *q, const float *k, const float *v, float *out, float *lse,
                                    const GroupedAttentionShape &s, int c, int rank, float *scratch);
void contextGroupedAttentionBackward(const float *q, const float *k, const float *v, const float *g, const float *lse,
                                     float *dq, float *dk, float *dv, const GroupedAttentionShape &s, int c, int rank,
                                     float *scratch);
// The same over bf16 q, k, v, out, g, dq, dk, dv with attentionForwardBf16's rounding points; a
// KV head's dK and dV summed over its query heads in fp32 (in the scratch) and rounded once.
int64_t groupedAttentionScratchFloatsBf16(const GroupedAttentionShape &s, bool backward);
void groupedAttentionForwardBf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *out, float *lse,
                                 const GroupedAttentionShape &s, float *scratch);
void groupedAttentionBackwardBf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *g,
                                  const float *lse, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                                  const GroupedAttentionShape &s, float *scratch);

// Context parallelism's ring attention (Megatron-Core's cp_comm_type "p2p"): the rank's
// queries are its chunks `rank` and 2c-1-rank (local = 2C tokens), its keys and values the same
// tokens packed [B, local, kvHeads hd]; the other members' travel round the ring through
// `exchange` (send `send` to the next member, receive the previous member's into `recv`, count
// floats each; run on its own thread beside the step's blocks). Query head h reads KV head
// (firstHead + h) / headsPerKv (GPT: kvHeads = heads, headsPerKv = 1). Causal by global
// position; dropout with the whole sequence's counters (the masks of c = 1).
struct RingAttentionShape {
  int64_t batch, heads, kvHeads, headDim, local;
  int64_t firstHead, headsPerKv;
  int c, rank;
  bool causal;
  float dropout;
  uint64_t seed, stream;
  // How the keys and values travel: fp32, or in the plan's 16-bit dtype (they are 16-bit values
  // widened, so narrowing them for the wire is exact: the same bits as fp32 messages at half the
  // bytes). The backward's dK | dV accumulators are fp32 partial sums and travel as fp32.
  enum class Wire { kF32, kBf16, kF16 } keyWire = Wire::kF32;
  int64_t kvHeadOf(int64_t h) const;
};
// One ring step's message: `bytes` from send to the next member, as many from the previous one
// into recv.
using RingExchange = std::function<Status(const void *send, void *recv, int64_t bytes)>;
// Scratch of either direction; with packedKeys 4 x B x local x kvHeads hd floats more that the
// caller may use past the kernel's own (the last 4 kv floats): GPT's packed K | V, dK | dV.
int64_t ringAttentionScratchFloats(const RingAttentionShape &s, bool backward, bool packedKeys);
// q: head h's queries of sample b at q + b local ldq + h qHeadStride, rows ldq apart; out
// [B, local, heads hd]; lse [B, heads, local] (nullable).
Status ringAttentionForward(const float *q, int64_t ldq, int64_t qHeadStride, const float *k, const float *v,
                            float *out, float *lse, const RingAttentionShape &s, float *scratch,
                            const RingExchange &exchange);
// g and out (the forward's result) [B, local, heads hd]; dq laid out as q (written, its head
// columns only); dk, dv packed as k, v (written: this member's keys' complete gradients).
Status ringAttentionBackward(const float *q, int64_t ldq, int64_t qHeadStride, const float *k, const float *v,
                             const float *g, const float *out, const float *lse, float *dq, float *dk, float *dv,
                             const RingAttentionShape &s, float *scratch, const RingExchange &exchange);

// RMS norm over rows of length n: y = x / sqrt(mean(x^2) + eps) * gamma; the backward
// recomputes the statistic.
void rmsNormForward(const float *x, const float *gamma, float *y, int64_t rows, int64_t n, float eps);
void rmsNormBackward(const float *x, const float *gamma, const float *g, float *dx, float *dgamma, int64_t rows,
                     int64_t n, float eps);
void rmsNormForward(const uint16_t *x, const uint16_t *gamma, uint16_t *y, int64_t rows, int64_t n, float eps);
void rmsNormBackward(const uint16_t *x, const uint16_t *gamma, const uint16_t *g, uint16_t *dx, uint16_t *dgamma,
                     int64_t rows, int64_t n, float eps);

// Rotary embedding (rotate-half) of x [B,S,heads*hd] at positions 0..S-1 (or positions[s],
// context parallelism's chunks) with frequencies theta^(-2j/hd); `inverse` rotates by the
// opposite angle (the gradient).
void rotary(const float *x, float *y, int64_t batch, int64_t seq, int64_t heads, int64_t headDim, float theta,
            bool inverse, const int64_t *positions = nullptr);
void rotary(const uint16_t *x, uint16_t *y, int64_t batch, int64_t seq, int64_t heads, int64_t headDim, float theta,
            bool inverse, const int64_t *positions = nullptr);

// y = silu(gate) * up; the backward gives dgate and dup.
void swigluForward(const float *gate, const float *up, float *y, int64_t count);
void swigluBackward(const float *gate, const float *up, const float *g, float *dgate, float *dup, int64_t count);
void swigluForward(const uint16_t *gate, const uint16_t *up, uint16_t *y, int64_t count);
void swigluBackward(const uint16_t *gate, const uint16_t *up, const uint16_t *g, uint16_t *dgate, uint16_t *dup,
                    int64_t count);

// out[t, :] = word[tokens[t] - rowStart, :] for tokens inside [rowStart, rowStart + rows),
// else 0; then + position[t % seq, :] when position is given.
void embeddingForward(const int32_t *tokens, const float *word, const float *position, float *out,
                      int64_t tokenCount, int64_t seq, int64_t hidden, int64_t rowStart, int64_t rows);
// dword[rows, hidden] = scatter-add of g rows at tokens inside the shard (zeroed first).
void embeddingBackward(const int32_t *tokens, const float *g, float *dword, int64_t tokenCount,
                       int64_t hidden, int64_t rowStart, int64_t rows);
// dposition[positions, hidden]: row s (or rowOf[s]) the sum over the batch of g[b, s], the
// other rows zero.
void positionBackward(const float *g, float *dposition, int64_t batch, int64_t seq, int64_t hidden,
                      int64_t positions, const int64_t *rowOf = nullptr);
void positionBackward(const uint16_t *g, uint16_t *dposition, int64_t batch, int64_t seq, int64_t hidden,
                      int64_t positions, const int64_t *rowOf = nullptr);
// out[b,s,:] = x[b,s,:] + position[s,:] (or position[positions[s], :]); in place allowed.
void addPositionForward(const float *x, const float *position, float *out, int64_t batch, int64_t seq,
                        int64_t hidden, const int64_t *positions = nullptr);
void addPositionForward(const uint16_t *x, const uint16_t *position, uint16_t *out, int64_t batch, int64_t seq,
                        int64_t hidden, const int64_t *positions = nullptr);
// y[r, :] = x[r, :] + bias over rows of n.
void addBiasForward(const float *x, const float *bias, float *y, int64_t rows, int64_t n);
void addBiasForward(const uint16_t *x, const uint16_t *bias, uint16_t *y, int64_t rows, int64_t n);

// Cross-entropy pieces, per token t over the columns [colStart, colStart + cols) this rank
// holds of a vocabulary whose first validVocab columns are real (the rest is padding).
// Local statistics, to be combined across a vocab-parallel group (max, then sums):
void crossEntropyLocalMax(const float *logits, float *rowMax, int64_t tokens, int64_t cols,
                          int64_t colStart, int64_t validVocab);
// sumExp[t] = sum_j exp(logit_j - max[t]); target[t] = logit of the label if held here, else 0.
void crossEntropyLocalSums(const float *logits, const int32_t *labels, const float *rowMax,
                           float *sumExp, float *target, int64_t tokens, int64_t cols,
                           int64_t colStart, int64_t validVocab);
// loss = sum_t mask_t (log sumExp_t + max_t - target_t) / sum_t mask_t (mask nullable: ones).
float crossEntropyLoss(const float *rowMax, const float *sumExp, const float *target,
                       const float *mask, int64_t tokens);
// lse[t] = max[t] + log sumExp[t]: the statistics the backward keeps (loom.cross_entropy's lse).
void crossEntropyLogSumExp(const float *rowMax, const float *sumExp, float *lse, int64_t tokens);
// dlogits = g * mask_t / sum(mask) * (exp(logit - lse_t) - onehot(label)), padding columns 0:
// the softmax from the kept log-sum-exp, one pass over this shard's logits.
void crossEntropyBackward(const float *logits, const int32_t *labels, const float *mask,
                          const float *lse, float gradLoss, float *dlogits, int64_t tokens,
                          int64_t cols, int64_t colStart, int64_t validVocab);
// The same for some of a batch's tokens (its rows taken a few at a time), the batch's mask
// summing to maskCount (crossEntropyMaskCount: sum(mask), or the token count without one).
double crossEntropyMaskCount(const float *mask, int64_t tokens);
void crossEntropyBackwardRows(const float *logits, const int32_t *labels, const float *mask, const float *lse,
                              float gradLoss, double maskCount, float *dlogits, int64_t tokens, int64_t cols,
                              int64_t colStart, int64_t validVocab);

}  // namespace loom::cpu
