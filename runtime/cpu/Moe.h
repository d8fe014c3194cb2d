// Mixture-of-experts kernels on the CPU (issue 38's first piece; Mixtral's MoE MLP as Hugging
// Face's MixtralSparseMoeBlock computes it): the router's softmax, top-k and renormalisation with
// the load-balancing loss, and the experts' SwiGLU MLPs over the tokens routed to them, tokens
// grouped by expert so that each expert is one GEMM per matrix. Deterministic: ties in the
// top-k go to the lower expert index, and every sum runs in a fixed order.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::cpu {

// T tokens, each routed to k of E experts.
struct MoeRouting {
  int64_t tokens, experts, topK;
  bool renormalize;  // Mixtral: the chosen probabilities scaled to sum 1
};

// probs [T, E] = softmax(logits) (kept for the backward); chosen [T, k] the experts of the k
// largest probabilities, largest first (ties: the lower index); weights [T, k] their
// probabilities, renormalised when asked.
void moeRouteForward(const float *logits, const MoeRouting &r, float *probs, int32_t *chosen, float *weights);
// The load-balancing loss's statistics over a set of tokens: per expert the assignments to it
// among the tokens' k (before any capacity drop) and the sum of its probability, and the tokens.
struct MoeBalance {
  std::vector<double> counts, probSums;
  double tokens = 0;
};
// Over the r.tokens routed here.
MoeBalance moeBalanceOf(const float *probs, const int32_t *chosen, const MoeRouting &r);
// stats [2, E]: the counts, then the probability sums (loom.moe_routing_stats), possibly summed
// over the ranks that split a sequence; T = sum of the counts / k.
void moeWriteStats(const MoeBalance &b, float *stats);
MoeBalance moeBalanceFromStats(const float *stats, const MoeRouting &r);
// The load-balancing loss of Switch Transformer as Hugging Face's Mixtral computes it
// (load_balancing_loss_func): E * sum_e (count_e / T) * P_e, count_e the tokens that chose e
// among their k, P_e the mean over tokens of e's probability. Not scaled by a coefficient.
float moeLoadBalancingLoss(const MoeBalance &b);
// dlogits [T, E] of this rank's r.tokens from the weights' gradient dweights [T, k] and the
// load-balancing loss's gradient dAux (its coefficient times the loss's incoming gradient; the
// counts are constants) over the statistics `b` (of these tokens, or of a whole sequence they are
// a slice of: each token's probability counts 1 / b.tokens in P_e).
void moeRouteBackward(const float *probs, const int32_t *chosen, const float *dweights, float dAux,
                      const MoeBalance &b, const MoeRouting &r, float *dlogits);

// Expert capacity (Megatron-Core's get_capacity): ceil(factor * T * k / E) assignments per expert.
int64_t moeCapacity(double factor, int64_t tokens, int64_t topK, int64_t experts);
// kept [T, k]: chosen, with the assignments past an expert's capacity -1 (dropped): each expert
// keeps those with the largest weights, ties to the earlier token (Megatron-Core's "probs" drop
// policy). Returns how many were dropped.
int64_t moeDropOverCapacity(const int32_t *chosen, const float *weights, const MoeRouting &r, int64_t capacity,
                            int32_t *kept);

// The (token, choice) pairs grouped by expert: a stable counting sort, so each expert's pairs are
// in token order. begin[e] .. begin[e + 1] index `rows` (entries t * k + j); dropped pairs
// (chosen -1) are in no group.
void moeGroupByExpert(const int32_t *chosen, int64_t pairs, int64_t experts, std::vector<int64_t> *begin,
                      std::vector<int64_t> *rows);

// The experts' MLPs: x [T, H]; chosen [T, k] (-1: a dropped assignment, which adds nothing); expert e's gate and up [E, F, H] (Hugging Face's w1 and w3, rows
// per output feature), down [E, H, F] (w2). y[t] = sum_j weights[t, j] down_e(silu(gate_e x_t) *
// up_e x_t) with e = chosen[t, j], summed over j in order.
// In a 16-bit plan (`round` set: the plan dtype's rounding in place) the experts round where
// Megatron-Core's bf16 experts store their tensors: the gate and up projections, the activation
// silu(gate) * up and the down projection each rounded, and each pair's weighted output
// weight * out rounded before the sum over the token's choices (the caller rounds the sum). The
// backward rounds the gradients at the same points: the weighted output's (weight * g), the
// activation's (dA), the projections' (dG, dU) and the weights' (g . out).
struct MoeExperts {
  int64_t tokens, hidden, ffn, experts, topK;
  void (*round)(float *x, int64_t n) = nullptr;
  void rounded(float *x, int64_t n) const {
    if (round) round(x, n);
  }
  float rounded(float x) const {
    if (round) round(&x, 1);
    return x;
  }
  // y[0, hidden) += weight * out[0, hidden): one (token, choice) pair's share of its token's
  // output, each product rounded in a 16-bit plan.
  void addWeighted(float *y, float weight, const float *out) const {
    if (round)
      for (int64_t c = 0; c < hidden; ++c) y[c] += rounded(weight * out[c]);
    else
      for (int64_t c = 0; c < hidden; ++c) y[c] += weight * out[c];
  }
};
// The experts' weights (and their gradients) W: fp32, or bf16 bits (a bf16 plan's MoE kernels:
// the products on oneDNN's bf16 GEMM, runtime/cpu/Gemm.h, each activation operand a bf16 value
// that MoeExperts::round made, narrowed exactly; `round` must be the bf16 rounding then). The
// tokens' rows, outputs and their gradients are fp32 either way (bf16 values in a bf16 plan).
// Scratch: moeExpertsScratchFloats(m, backward, W is bf16).
int64_t moeExpertsScratchFloats(const MoeExperts &m, bool backward, bool bf16Weights);
template <typename W>
void moeExpertsForward(const float *x, const int32_t *chosen, const float *weights, const W *gate, const W *up,
                       const W *down, const MoeExperts &m, float *y, float *scratch);
// From g = dL/dy: dx [T, H], dweights [T, k], and the experts' weight gradients times gradScale
// (written, the same layouts as the weights; an expert no token chose gets zeros; bf16 ones
// rounded once from the scaled fp32 sums).
template <typename W>
void moeExpertsBackward(const float *x, const int32_t *chosen, const float *weights, const W *gate, const W *up,
                        const W *down, const float *g, const MoeExperts &m, float *dx, float *dweights, W *dgate,
                        W *dup, W *ddown, float gradScale, float *scratch);

}  // namespace loom::cpu
