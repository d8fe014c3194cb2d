#include "runtime/cpu/Moe.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "runtime/cpu/Gemm.h"
#include "runtime/cpu/HalfPrecision.h"
#include "runtime/cpu/Parallel.h"

namespace loom::cpu {

void moeRouteForward(const float *logits, const MoeRouting &r, float *probs, int32_t *chosen, float *weights) {
  const int64_t E = r.experts, k = r.topK;
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < r.tokens; ++t) {
    const float *l = logits + t * E;
    float *p = probs + t * E;
    float mx = *std::max_element(l, l + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(l[e] - mx);
    for (int64_t e = 0; e < E; ++e) p[e] = float(p[e] / sum);
    for (int64_t e = 0; e < E; ++e) order[size_t(e)] = int32_t(e);
    // The k largest, largest first; equal probabilities in index order.
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    double chosenSum = 0;
    for (int64_t j = 0; j < k; ++j) chosenSum += p[order[size_t(j)]];
    for (int64_t j = 0; j < k; ++j) {
      chosen[t * k + j] = order[size_t(j)];
      weights[t * k + j] = r.renormalize ? float(p[order[size_t(j)]] / chosenSum) : p[order[size_t(j)]];
    }
  }
}

MoeBalance moeBalanceOf(const float *probs, const int32_t *chosen, const MoeRouting &r) {
  MoeBalance b;
  b.counts.assign(size_t(r.experts), 0.0), b.probSums.assign(size_t(r.experts), 0.0);
  b.tokens = double(r.tokens);
  for (int64_t t = 0; t < r.tokens; ++t) {
    for (int64_t j = 0; j < r.topK; ++j) b.counts[size_t(chosen[t * r.topK + j])] += 1.0;
    for (int64_t e = 0; e < r.experts; ++e) b.probSums[size_t(e)] += probs[t * r.experts + e];
  }
  return b;
}

void moeWriteStats(const MoeBalance &b, float *stats) {
  const size_t E = b.counts.size();
  for (size_t e = 0; e < E; ++e) stats[e] = float(b.counts[e]), stats[E + e] = float(b.probSums[e]);
}

MoeBalance moeBalanceFromStats(const float *stats, const MoeRouting &r) {
  MoeBalance b;
  double assignments = 0;
  for (int64_t e = 0; e < r.experts; ++e) {
    b.counts.push_back(stats[e]), b.probSums.push_back(stats[r.experts + e]);
    assignments += stats[e];
  }
  b.tokens = assignments / double(r.topK);
  return b;
}

float moeLoadBalancingLoss(const MoeBalance &b) {
  if (b.tokens <= 0) return 0.0f;
  double loss = 0;
  for (size_t e = 0; e < b.counts.size(); ++e) loss += (b.counts[e] / b.tokens) * (b.probSums[e] / b.tokens);
  return float(double(b.counts.size()) * loss);
}

void moeRouteBackward(const float *probs, const int32_t *chosen, const float *dweights, float dAux,
                      const MoeBalance &b, const MoeRouting &r, float *dlogits) {
  const int64_t E = r.experts, k = r.topK;
  // The aux loss: d/dp_te of E * sum_e share_e * (sum_t p_te) / T is E * share_e / T, the same
  // for every token.
  std::vector<double> dAuxDp(static_cast<size_t>(E), 0.0), dp(static_cast<size_t>(E));
  if (b.tokens > 0)
    for (int64_t e = 0; e < E; ++e)
      dAuxDp[size_t(e)] = double(dAux) * double(E) * (b.counts[size_t(e)] / b.tokens) / b.tokens;
  for (int64_t t = 0; t < r.tokens; ++t) {
    const float *p = probs + t * E;
    dp = dAuxDp;
    // The weights: w_j = p_cj / S (S = sum over the chosen) or w_j = p_cj.
    double S = 0, dot = 0;
    for (int64_t j = 0; j < k; ++j) S += p[chosen[t * k + j]], dot += double(dweights[t * k + j]) * p[chosen[t * k + j]];
    for (int64_t j = 0; j < k; ++j) {
      double dw = dweights[t * k + j];
      dp[size_t(chosen[t * k + j])] += r.renormalize ? dw / S - dot / (S * S) : dw;
    }
    // Through the softmax: dlogit_e = p_e (dp_e - sum_i p_i dp_i).
    double pdp = 0;
    for (int64_t e = 0; e < E; ++e) pdp += double(p[e]) * dp[size_t(e)];
    for (int64_t e = 0; e < E; ++e) dlogits[t * E + e] = float(double(p[e]) * (dp[size_t(e)] - pdp));
  }
}

int64_t moeCapacity(double factor, int64_t tokens, int64_t topK, int64_t experts) {
  return int64_t(std::ceil(factor * double(tokens) * double(topK) / double(experts)));
}

int64_t moeDropOverCapacity(const int32_t *chosen, const float *weights, const MoeRouting &r, int64_t capacity,
                            int32_t *kept) {
  const int64_t n = r.tokens * r.topK;
  std::copy_n(chosen, n, kept);
  // Each expert's assignments, largest weight first (ties: the earlier token), past the capacity
  // dropped.
  std::vector<std::vector<int64_t>> byExpert(static_cast<size_t>(r.experts));
  for (int64_t i = 0; i < n; ++i) byExpert[size_t(chosen[i])].push_back(i);
  int64_t dropped = 0;
  for (std::vector<int64_t> &pairs : byExpert) {
    if (int64_t(pairs.size()) <= capacity) continue;
    std::stable_sort(pairs.begin(), pairs.end(), [&](int64_t a, int64_t b) { return weights[a] > weights[b]; });
    for (size_t j = size_t(capacity); j < pairs.size(); ++j) kept[pairs[j]] = -1, ++dropped;
  }
  return dropped;
}

namespace {
float silu(float x) { return x / (1.0f + std::exp(-x)); }

// The experts' products: fp32 operands on the fp32 GEMM, bf16 ones on the bf16 GEMM (fp32
// accumulation). C = op(A) op(B), or C += it (accumulate); gemm's layouts.
void product(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
             const float *b, int64_t ldb, bool accumulate, float *c, int64_t ldc) {
  gemm(transposeA, transposeB, m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}
void product(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
             const uint16_t *b, int64_t ldb, bool accumulate, float *c, int64_t ldc) {
  gemmBf16(transposeA, transposeB, m, n, k, a, lda, b, ldb, nullptr, c, accumulate ? GemmOut::kF32Add : GemmOut::kF32,
           ldc);
}

// An activation operand of a product in the weights' storage: with fp32 weights the fp32 values
// themselves; with bf16 weights their bf16 copy in `space` (they are bf16 values, the input's or
// ones MoeExperts::round rounded, so narrowing them is exact).
template <typename W>
const W *operandOf(const float *values, int64_t n, uint16_t *space) {
  if constexpr (std::is_same_v<W, float>) {
    return values;
  } else {
    narrowToBf16(values, space, n);
    return space;
  }
}
// One operandOf made earlier (the values or their copy in `space`).
template <typename W>
const W *madeOperand(const float *values, const uint16_t *space) {
  if constexpr (std::is_same_v<W, float>)
    return values;
  else
    return space;
}

// A weight gradient's product: C = op(A) op(B) stored, a bf16 C rounded once from the fp32 sum.
void productInto(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                 const float *b, int64_t ldb, float *c, int64_t ldc) {
  product(transposeA, transposeB, m, n, k, a, lda, b, ldb, false, c, ldc);
}
void productInto(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                 const uint16_t *b, int64_t ldb, uint16_t *c, int64_t ldc) {
  gemmBf16(transposeA, transposeB, m, n, k, a, lda, b, ldb, nullptr, c, GemmOut::kBf16, ldc);
}

// An expert's weight gradient [m, n] = op(A) op(B) times `scale` into `to`: an fp32 one scaled in
// place; a bf16 one rounded once from the fp32 sum (scaled first in `sum`, [m, n] floats, when
// the scale is not 1).
template <typename W>
void weightGradient(int64_t m, int64_t n, int64_t k, const W *a, int64_t lda, const W *b, int64_t ldb, float scale,
                    W *to, float *sum) {
  if (std::is_same_v<W, float> || scale == 1.0f) {
    productInto(true, false, m, n, k, a, lda, b, ldb, to, n);
    if constexpr (std::is_same_v<W, float>)
      if (scale != 1.0f)
        for (int64_t i = 0; i < m * n; ++i) to[i] *= scale;
    return;
  }
  product(true, false, m, n, k, a, lda, b, ldb, false, sum, n);
  for (int64_t i = 0; i < m * n; ++i) sum[i] *= scale;
  narrowToBf16(sum, reinterpret_cast<uint16_t *>(to), m * n);
}

// body(e) for each expert, the experts split over the rank's threads in contiguous parts.
template <typename Body>
void forEachExpert(int64_t experts, const Body &body) {
  parallelFor(experts, 1, [&](int64_t first, int64_t last) {
    for (int64_t e = first; e < last; ++e) body(e);
  });
}

// The bf16 copies' place in the scratch (elements, after the fp32 scratch), and with bf16
// weights the backward's fp32 sum of one expert's weight gradient.
struct Bf16Operands {
  uint16_t *xs, *as, *gy, *dg, *du;
  float *weightGrad;
};
int64_t fp32ScratchFloats(const MoeExperts &m, bool backward) {
  int64_t n = m.tokens * m.topK;
  return 3 * n * m.hidden + 3 * n * m.ffn + (backward ? 3 * n * m.ffn + 3 * n * m.hidden : 0);
}
Bf16Operands bf16Operands(const MoeExperts &m, float *scratch) {
  const int64_t n = m.tokens * m.topK, H = m.hidden, F = m.ffn;
  float *weightGrad = scratch + fp32ScratchFloats(m, true);
  uint16_t *xs = reinterpret_cast<uint16_t *>(weightGrad + F * H);
  uint16_t *as = xs + n * H, *gy = as + n * F, *dg = gy + n * H, *du = dg + n * F;
  return {xs, as, gy, dg, du, weightGrad};
}
}  // namespace

void moeGroupByExpert(const int32_t *chosen, int64_t pairs, int64_t experts, std::vector<int64_t> *begin,
                      std::vector<int64_t> *rows) {
  begin->assign(size_t(experts + 1), 0);
  for (int64_t i = 0; i < pairs; ++i)
    if (chosen[i] >= 0) ++(*begin)[size_t(chosen[i]) + 1];
  for (int64_t e = 0; e < experts; ++e) (*begin)[size_t(e + 1)] += (*begin)[size_t(e)];
  std::vector<int64_t> next(begin->begin(), begin->end() - 1);
  rows->resize(size_t(begin->back()));
  for (int64_t i = 0; i < pairs; ++i)
    if (chosen[i] >= 0) (*rows)[size_t(next[size_t(chosen[i])]++)] = i;
}


// Scratch (floats): the gathered rows X_e [n, H], gate and up outputs [n, F] each, the activation
// [n, F], each pair's expert output [T k, H] and an expert's output rows [n, H]; backward also dA,
// dG, dU [n, F], the pairs' input gradients [T k, H], the outputs' gradients and an expert's input
// gradient rows [n, H] each. With bf16 weights (their products on the bf16 GEMM) an expert's
// weight-gradient sum [F, H] and bf16 copies of X_e, A, the outputs' gradients, dG and dU (laid
// out for the backward in either direction, which runs the forward first).
int64_t moeExpertsScratchFloats(const MoeExperts &m, bool backward, bool bf16Weights) {
  if (!bf16Weights) return fp32ScratchFloats(m, backward);
  const int64_t n = m.tokens * m.topK, bf16Elements = 2 * n * m.hidden + 3 * n * m.ffn;
  return fp32ScratchFloats(m, true) + m.ffn * m.hidden + (bf16Elements + 1) / 2;
}

template <typename W>
void moeExpertsForward(const float *x, const int32_t *chosen, const float *weights, const W *gate, const W *up,
                       const W *down, const MoeExperts &m, float *y, float *scratch) {
  const int64_t H = m.hidden, F = m.ffn, k = m.topK, n = m.tokens * k;
  float *xs = scratch, *gs = xs + n * H, *us = gs + n * F, *as = us + n * F, *pairs = as + n * F, *out = pairs + n * H;
  const Bf16Operands half = bf16Operands(m, scratch);
  std::vector<int64_t> begin, rows;
  moeGroupByExpert(chosen, m.tokens * m.topK, m.experts, &begin, &rows);
  int64_t kept = int64_t(rows.size());
  for (int64_t i = 0; i < kept; ++i) std::copy_n(x + (rows[size_t(i)] / k) * H, H, xs + i * H);
  const W *xsW = operandOf<W>(xs, kept * H, half.xs);
  // The experts side by side on the rank's threads (each writes its own rows; a GEMM inside a
  // part runs on its thread, with the same bits), as Megatron-Core's grouped GEMM runs them.
  forEachExpert(m.experts, [&](int64_t e) {
    int64_t r0 = begin[size_t(e)], cnt = begin[size_t(e + 1)] - r0;
    if (cnt == 0) return;
    product(false, true, cnt, F, H, xsW + r0 * H, H, gate + e * F * H, H, false, gs + r0 * F, F);
    product(false, true, cnt, F, H, xsW + r0 * H, H, up + e * F * H, H, false, us + r0 * F, F);
    m.rounded(gs + r0 * F, cnt * F), m.rounded(us + r0 * F, cnt * F);
    for (int64_t i = r0 * F; i < (r0 + cnt) * F; ++i) as[i] = silu(gs[i]) * us[i];
    m.rounded(as + r0 * F, cnt * F);
    // The expert's outputs, then into their (token, choice) slots.
    const W *asW = operandOf<W>(as + r0 * F, cnt * F, half.as + r0 * F);
    product(false, true, cnt, H, F, asW, F, down + e * H * F, F, false, out + r0 * H, H);
    m.rounded(out + r0 * H, cnt * H);
    for (int64_t i = 0; i < cnt; ++i) std::copy_n(out + (r0 + i) * H, H, pairs + rows[size_t(r0 + i)] * H);
  });
  for (int64_t t = 0; t < m.tokens; ++t) {
    float *yt = y + t * H;
    std::fill(yt, yt + H, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      if (chosen[t * k + j] < 0) continue;  // dropped: adds nothing
      m.addWeighted(yt, weights[t * k + j], pairs + (t * k + j) * H);
    }
  }
}

template <typename W>
void moeExpertsBackward(const float *x, const int32_t *chosen, const float *weights, const W *gate, const W *up,
                        const W *down, const float *g, const MoeExperts &m, float *dx, float *dweights, W *dgate,
                        W *dup, W *ddown, float gradScale, float *scratch) {
  const int64_t H = m.hidden, F = m.ffn, k = m.topK, n = m.tokens * k;
  // The forward again (its scratch: X_e, G, U, A and the pairs' outputs; with bf16 weights the
  // bf16 copies of X_e and A).
  moeExpertsForward(x, chosen, weights, gate, up, down, m, dx, scratch);
  float *xs = scratch, *gs = xs + n * H, *us = gs + n * F, *as = us + n * F, *pairs = as + n * F;
  float *da = pairs + 2 * n * H, *dgs = da + n * F, *dus = dgs + n * F, *dpairs = dus + n * F, *gy = dpairs + n * H;
  float *dxs = gy + n * H;
  const Bf16Operands half = bf16Operands(m, scratch);
  std::vector<int64_t> begin, rows;
  moeGroupByExpert(chosen, m.tokens * m.topK, m.experts, &begin, &rows);
  const W *xsW = madeOperand<W>(xs, half.xs), *asW = madeOperand<W>(as, half.as);
  // dweights[t, j] = g_t . out_tj; the pair's output gradient w_tj g_t, in expert order. A
  // dropped pair's weight gets no gradient here (its output was not added).
  std::fill(dweights, dweights + n, 0.0f);
  for (int64_t i = 0; i < int64_t(rows.size()); ++i) {
    int64_t pair = rows[size_t(i)], t = pair / k;
    const float *gt = g + t * H, *pr = pairs + pair * H;
    double dot = 0;
    for (int64_t c = 0; c < H; ++c) dot += double(gt[c]) * double(pr[c]);
    dweights[pair] = m.rounded(float(dot));
    for (int64_t c = 0; c < H; ++c) gy[i * H + c] = weights[pair] * gt[c];
    m.rounded(gy + i * H, H);
  }
  const W *gyW = operandOf<W>(gy, int64_t(rows.size()) * H, half.gy);
  // A bf16 weight gradient scaled by other than 1 goes through one fp32 sum in the scratch: those
  // are made after the experts' parallel part, one expert at a time (each GEMM on every thread).
  const bool scaledBf16 = !std::is_same_v<W, float> && gradScale != 1.0f;
  auto weightGradients = [&](int64_t e, int64_t r0, int64_t cnt) {
    weightGradient(H, F, cnt, gyW + r0 * H, H, asW + r0 * F, F, gradScale, ddown + e * H * F, half.weightGrad);
    const W *dgW = madeOperand<W>(dgs + r0 * F, half.dg + r0 * F), *duW = madeOperand<W>(dus + r0 * F, half.du + r0 * F);
    weightGradient(F, H, cnt, dgW, F, xsW + r0 * H, H, gradScale, dgate + e * F * H, half.weightGrad);
    weightGradient(F, H, cnt, duW, F, xsW + r0 * H, H, gradScale, dup + e * F * H, half.weightGrad);
  };
  forEachExpert(m.experts, [&](int64_t e) {
    int64_t r0 = begin[size_t(e)], cnt = begin[size_t(e + 1)] - r0;
    if (cnt == 0) {  // no row chose it: zero gradients
      for (W *w : {dgate, dup, ddown}) std::fill(w + e * F * H, w + (e + 1) * F * H, W(0));
      return;
    }
    const W *gye = gyW + r0 * H;
    // down: Y = A D^T -> dA = gY D, dD = gY^T A.
    product(false, false, cnt, F, H, gye, H, down + e * H * F, F, false, da + r0 * F, F);
    m.rounded(da + r0 * F, cnt * F);
    // A = silu(G) U: dU = dA silu(G), dG = dA U silu'(G), silu'(x) = s (1 + x (1 - s)).
    for (int64_t i = r0 * F; i < (r0 + cnt) * F; ++i) {
      float s = 1.0f / (1.0f + std::exp(-gs[i]));
      dus[i] = da[i] * gs[i] * s;
      dgs[i] = da[i] * us[i] * s * (1.0f + gs[i] * (1.0f - s));
    }
    m.rounded(dus + r0 * F, cnt * F), m.rounded(dgs + r0 * F, cnt * F);
    const W *dgW = operandOf<W>(dgs + r0 * F, cnt * F, half.dg + r0 * F);
    const W *duW = operandOf<W>(dus + r0 * F, cnt * F, half.du + r0 * F);
    if (!scaledBf16) weightGradients(e, r0, cnt);
    float *dxe = dxs + r0 * H;  // this expert's input gradient rows
    product(false, false, cnt, H, F, dgW, F, gate + e * F * H, H, false, dxe, H);
    product(false, false, cnt, H, F, duW, F, up + e * F * H, H, true, dxe, H);
    for (int64_t i = 0; i < cnt; ++i) std::copy_n(dxe + i * H, H, dpairs + rows[size_t(r0 + i)] * H);
  });
  if (scaledBf16)
    for (int64_t e = 0; e < m.experts; ++e)
      if (int64_t r0 = begin[size_t(e)], cnt = begin[size_t(e + 1)] - r0; cnt > 0) weightGradients(e, r0, cnt);
  for (int64_t t = 0; t < m.tokens; ++t) {  // dx_t: the sum over its kept choices, in order
    float *d = dx + t * H;
    std::fill(d, d + H, 0.0f);
    for (int64_t j = 0; j < k; ++j)
      if (chosen[t * k + j] >= 0)
        for (int64_t c = 0; c < H; ++c) d[c] += dpairs[(t * k + j) * H + c];
  }
}

template void moeExpertsForward<float>(const float *, const int32_t *, const float *, const float *, const float *,
                                       const float *, const MoeExperts &, float *, float *);
template void moeExpertsForward<uint16_t>(const float *, const int32_t *, const float *, const uint16_t *,
                                          const uint16_t *, const uint16_t *, const MoeExperts &, float *, float *);
template void moeExpertsBackward<float>(const float *, const int32_t *, const float *, const float *, const float *,
                                        const float *, const float *, const MoeExperts &, float *, float *, float *,
                                        float *, float *, float, float *);
template void moeExpertsBackward<uint16_t>(const float *, const int32_t *, const float *, const uint16_t *,
                                           const uint16_t *, const uint16_t *, const float *, const MoeExperts &,
                                           float *, float *, uint16_t *, uint16_t *, uint16_t *, float, float *);

}  // namespace loom::cpu
