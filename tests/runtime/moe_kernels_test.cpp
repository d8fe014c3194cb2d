// The MoE kernels (runtime/cpu/Moe.h) against a per-token reference written from Hugging Face's
// MixtralSparseMoeBlock and load_balancing_loss_func, and their backward against directional
// derivatives of the forward.
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cpu/HalfPrecision.h"
#include "runtime/cpu/Moe.h"

namespace loom::cpu {
namespace {

std::vector<float> randomVector(std::mt19937 &rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float &x : v) x = normal(rng);
  return v;
}

double dot(const std::vector<float> &a, const std::vector<float> &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// (f(p + eps v) - f(p - eps v)) / 2 eps for the scalar f of the vector p.
double directional(std::vector<float> &p, const std::vector<float> &v, const std::function<double()> &f) {
  const float eps = 1e-2f;
  std::vector<float> saved = p;
  for (size_t i = 0; i < p.size(); ++i) p[i] = saved[i] + eps * v[i];
  double up = f();
  for (size_t i = 0; i < p.size(); ++i) p[i] = saved[i] - eps * v[i];
  double down = f();
  p = saved;
  return (up - down) / (2 * eps);
}

TEST(MoeRoute, TopKRenormalisedWithTiesToTheLowerExpert) {
  // Token 0: experts 1 and 3 tie for first; token 1: 0 and 2 tie for second.
  std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, 3.0f, 1.0f, 1.0f, -1.0f};
  MoeRouting r{2, 4, 2, true};
  std::vector<float> probs(8), weights(4);
  std::vector<int32_t> chosen(4);
  moeRouteForward(logits.data(), r, probs.data(), chosen.data(), weights.data());
  EXPECT_EQ(chosen, (std::vector<int32_t>{1, 3, 0, 1}));
  EXPECT_FLOAT_EQ(weights[0], 0.5f);
  EXPECT_NEAR(weights[2] + weights[3], 1.0f, 1e-6);
  EXPECT_NEAR(weights[2] / weights[3], std::exp(2.0f), 1e-4);
  // Hugging Face's loss: E * sum_e (tokens choosing e / T) * mean_t p_te.
  double want = 0;
  for (int e = 0; e < 4; ++e) {
    double count = 0, mean = (probs[size_t(e)] + probs[size_t(4 + e)]) / 2;
    for (int32_t c : chosen) count += c == e;
    want += count / 2 * mean;
  }
  EXPECT_NEAR(moeLoadBalancingLoss(moeBalanceOf(probs.data(), chosen.data(), r)), 4 * want, 1e-6);
}

TEST(MoeRoute, BackwardIsTheDerivativeOfTheForward) {
  std::mt19937 rng(3);
  for (bool renormalize : {true, false}) {
    MoeRouting r{6, 5, 2, renormalize};
    std::vector<float> logits = randomVector(rng, 30), dweights = randomVector(rng, 12), dir = randomVector(rng, 30);
    const float dAux = 0.7f;
    std::vector<float> probs(30), weights(12), dlogits(30);
    std::vector<int32_t> chosen(12), fixed;
    moeRouteForward(logits.data(), r, probs.data(), chosen.data(), weights.data());
    fixed = chosen;
    moeRouteBackward(probs.data(), chosen.data(), dweights.data(), dAux, moeBalanceOf(probs.data(), chosen.data(), r), r,
                     dlogits.data());
    auto loss = [&] {
      moeRouteForward(logits.data(), r, probs.data(), chosen.data(), weights.data());
      EXPECT_EQ(chosen, fixed);  // the step stays inside the same routing
      return dot(dweights, weights) + dAux * moeLoadBalancingLoss(moeBalanceOf(probs.data(), chosen.data(), r));
    };
    EXPECT_NEAR(directional(logits, dir, loss), dot(dlogits, dir), 2e-3) << "renormalize " << renormalize;
  }
}

// Sequence parallelism: two ranks each route half of the tokens; their statistics summed (the
// all-reduce of loom.moe_routing_stats) give the whole sequence's loss, and each half's gradient
// over the summed statistics is the whole's restricted to its tokens.
TEST(MoeRoute, SummedStatisticsOfTwoHalvesAreTheWholeSequences) {
  std::mt19937 rng(5);
  const int64_t T = 8, E = 4, k = 2;
  std::vector<float> logits = randomVector(rng, T * E), dweights = randomVector(rng, T * k);
  MoeRouting whole{T, E, k, true}, half{T / 2, E, k, true};
  std::vector<float> probs(T * E), weights(T * k), dlogits(T * E);
  std::vector<int32_t> chosen(T * k);
  moeRouteForward(logits.data(), whole, probs.data(), chosen.data(), weights.data());
  MoeBalance all = moeBalanceOf(probs.data(), chosen.data(), whole);
  moeRouteBackward(probs.data(), chosen.data(), dweights.data(), 0.9f, all, whole, dlogits.data());
  std::vector<float> summed(2 * E, 0.0f), stats(2 * E);
  for (int64_t h = 0; h < 2; ++h) {
    moeWriteStats(moeBalanceOf(probs.data() + h * (T / 2) * E, chosen.data() + h * (T / 2) * k, half), stats.data());
    for (int64_t i = 0; i < 2 * E; ++i) summed[size_t(i)] += stats[size_t(i)];
  }
  MoeBalance fromStats = moeBalanceFromStats(summed.data(), half);
  EXPECT_DOUBLE_EQ(fromStats.tokens, double(T));
  EXPECT_NEAR(moeLoadBalancingLoss(fromStats), moeLoadBalancingLoss(all), 1e-6);
  // A half's own statistics are not the whole's: the test would not tell them apart otherwise.
  MoeBalance own = moeBalanceOf(probs.data(), chosen.data(), half);
  EXPECT_GT(std::abs(moeLoadBalancingLoss(own) - moeLoadBalancingLoss(all)), 1e-4);
  for (int64_t h = 0; h < 2; ++h) {
    std::vector<float> part(size_t(T / 2 * E));
    moeRouteBackward(probs.data() + h * (T / 2) * E, chosen.data() + h * (T / 2) * k, dweights.data() + h * (T / 2) * k,
                     0.9f, fromStats, half, part.data());
    for (int64_t i = 0; i < T / 2 * E; ++i) EXPECT_NEAR(part[size_t(i)], dlogits[size_t(h * (T / 2) * E + i)], 1e-6);
  }
}

TEST(MoeCapacity, EachExpertKeepsItsLargestWeightsTiesToTheEarlierToken) {
  EXPECT_EQ(moeCapacity(1.0, 64, 2, 4), 32);
  EXPECT_EQ(moeCapacity(1.25, 10, 1, 4), 4);  // ceil(3.125)
  EXPECT_EQ(moeCapacity(0.5, 6, 2, 4), 2);    // ceil(1.5)
  // 5 tokens, top-1 of 2 experts: expert 0 chosen by tokens 0, 1, 3, 4 with weights .9 .6 .6 .7,
  // expert 1 by token 2. Capacity 2: expert 0 keeps tokens 0 (.9) and 4 (.7); 1 and 3 tie at .6
  // and both fall past the capacity.
  MoeRouting r{5, 2, 1, false};
  std::vector<int32_t> chosen = {0, 0, 1, 0, 0}, kept(5);
  std::vector<float> weights = {0.9f, 0.6f, 0.8f, 0.6f, 0.7f};
  EXPECT_EQ(moeDropOverCapacity(chosen.data(), weights.data(), r, 2, kept.data()), 2);
  EXPECT_EQ(kept, (std::vector<int32_t>{0, -1, 1, -1, 0}));
  // Capacity 3: of the tie, the earlier token (1) is kept.
  EXPECT_EQ(moeDropOverCapacity(chosen.data(), weights.data(), r, 3, kept.data()), 1);
  EXPECT_EQ(kept, (std::vector<int32_t>{0, 0, 1, -1, 0}));
}

struct Block {
  MoeExperts m;
  std::vector<float> x, weights, gate, up, down;
  std::vector<int32_t> chosen;
};

Block randomBlock(std::mt19937 &rng, MoeExperts m) {
  Block b{m, randomVector(rng, size_t(m.tokens * m.hidden)), {}, randomVector(rng, size_t(m.experts * m.ffn * m.hidden), 0.3f),
          randomVector(rng, size_t(m.experts * m.ffn * m.hidden), 0.3f),
          randomVector(rng, size_t(m.experts * m.hidden * m.ffn), 0.3f), {}};
  // Routing from random logits (expert E - 1 never chosen when there are more than 2 k experts).
  MoeRouting r{m.tokens, m.experts, m.topK, true};
  std::vector<float> logits = randomVector(rng, size_t(m.tokens * m.experts)), probs(logits.size());
  if (m.experts > 2 * m.topK)
    for (int64_t t = 0; t < m.tokens; ++t) logits[size_t(t * m.experts + m.experts - 1)] = -30.0f;
  b.weights.resize(size_t(m.tokens * m.topK)), b.chosen.resize(b.weights.size());
  moeRouteForward(logits.data(), r, probs.data(), b.chosen.data(), b.weights.data());
  return b;
}

TEST(MoeExpertsKernel, ForwardMatchesThePerTokenReference) {
  std::mt19937 rng(5);
  MoeExperts m{9, 6, 10, 5, 2};
  Block b = randomBlock(rng, m);
  std::vector<float> y(size_t(m.tokens * m.hidden)), scratch(size_t(moeExpertsScratchFloats(m, false, false)));
  moeExpertsForward(b.x.data(), b.chosen.data(), b.weights.data(), b.gate.data(), b.up.data(), b.down.data(), m,
                    y.data(), scratch.data());
  for (int64_t t = 0; t < m.tokens; ++t)
    for (int64_t c = 0; c < m.hidden; ++c) {
      double want = 0;
      for (int64_t j = 0; j < m.topK; ++j) {
        int64_t e = b.chosen[size_t(t * m.topK + j)];
        double out = 0;
        for (int64_t f = 0; f < m.ffn; ++f) {
          double g = 0, u = 0;
          for (int64_t h = 0; h < m.hidden; ++h) {
            g += double(b.gate[size_t((e * m.ffn + f) * m.hidden + h)]) * b.x[size_t(t * m.hidden + h)];
            u += double(b.up[size_t((e * m.ffn + f) * m.hidden + h)]) * b.x[size_t(t * m.hidden + h)];
          }
          out += double(b.down[size_t((e * m.hidden + c) * m.ffn + f)]) * (g / (1 + std::exp(-g))) * u;
        }
        want += b.weights[size_t(t * m.topK + j)] * out;
      }
      EXPECT_NEAR(y[size_t(t * m.hidden + c)], want, 1e-4 * (1 + std::abs(want))) << t << " " << c;
    }
}

// A 16-bit plan's experts (MoeExperts::round) store what Megatron-Core's bf16 experts store: with
// one choice per token (weight 1) each output is the expert's rounded down projection, a bf16
// value, and it is the fp32 forward's output within the roundings (the gate, up, activation and
// down roundings, a few bf16 ulps); without `round` the outputs are fp32 values.
TEST(MoeExpertsKernel, SixteenBitExpertsRoundTheirOutputs) {
  std::mt19937 rng(7);
  MoeExperts wide{9, 6, 10, 5, 1};
  Block b = randomBlock(rng, wide);
  MoeExperts narrow = wide;
  narrow.round = roundThroughBf16;
  std::vector<float> y32(b.x.size()), y16(b.x.size()), scratch(size_t(moeExpertsScratchFloats(wide, false, false)));
  moeExpertsForward(b.x.data(), b.chosen.data(), b.weights.data(), b.gate.data(), b.up.data(), b.down.data(), wide,
                    y32.data(), scratch.data());
  moeExpertsForward(b.x.data(), b.chosen.data(), b.weights.data(), b.gate.data(), b.up.data(), b.down.data(), narrow,
                    y16.data(), scratch.data());
  int64_t fp32Only = 0;
  for (size_t i = 0; i < y16.size(); ++i) {
    EXPECT_EQ(y16[i], bf16ToFloat(floatToBf16(y16[i]))) << i;
    EXPECT_NEAR(y16[i], y32[i], 3e-2 * (1 + std::abs(y32[i]))) << i;
    fp32Only += y32[i] != bf16ToFloat(floatToBf16(y32[i]));
  }
  EXPECT_GT(fp32Only, int64_t(y32.size()) / 2);
}

// A bf16 plan's experts run their products on bf16 weights (the bf16 GEMM, fp32 accumulation):
// the values of the fp32 kernel on widened copies with the same roundings, but for the GEMMs'
// order of summation, which flips a rounding now and then (so nearly every output is the same
// bits, every one within a few bf16 ulps); the weight gradients rounded once from their fp32
// sums times the scale (expert parallelism's 1 / members).
TEST(MoeExpertsKernel, Bf16WeightsGiveTheWidenedPathsValues) {
  std::mt19937 rng(11);
  MoeExperts m{24, 16, 32, 4, 2};
  m.round = roundThroughBf16;
  Block b = randomBlock(rng, m);
  for (std::vector<float> *v : {&b.x, &b.gate, &b.up, &b.down}) roundThroughBf16(v->data(), int64_t(v->size()));
  roundThroughBf16(b.weights.data(), int64_t(b.weights.size()));
  auto bits = [](const std::vector<float> &v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = floatToBf16(v[i]);
    return h;
  };
  std::vector<uint16_t> gate16 = bits(b.gate), up16 = bits(b.up), down16 = bits(b.down);
  std::vector<float> g = randomVector(rng, size_t(m.tokens * m.hidden));
  roundThroughBf16(g.data(), int64_t(g.size()));
  const float scale = 0.5f;
  // The widened path: fp32 weights (bf16 values), gradients rounded after.
  std::vector<float> y32(b.x.size()), dx32(b.x.size()), dw32(b.weights.size()), dgate32(b.gate.size()),
      dup32(b.up.size()), ddown32(b.down.size()), scratch32(size_t(moeExpertsScratchFloats(m, true, false)));
  moeExpertsForward(b.x.data(), b.chosen.data(), b.weights.data(), b.gate.data(), b.up.data(), b.down.data(), m,
                    y32.data(), scratch32.data());
  moeExpertsBackward(b.x.data(), b.chosen.data(), b.weights.data(), b.gate.data(), b.up.data(), b.down.data(), g.data(),
                     m, dx32.data(), dw32.data(), dgate32.data(), dup32.data(), ddown32.data(), scale, scratch32.data());
  // bf16 weights.
  std::vector<float> y16(b.x.size()), dx16(b.x.size()), dw16(b.weights.size()),
      scratch16(size_t(moeExpertsScratchFloats(m, true, true)));
  std::vector<uint16_t> dgate16(b.gate.size()), dup16(b.up.size()), ddown16(b.down.size());
  moeExpertsForward(b.x.data(), b.chosen.data(), b.weights.data(), gate16.data(), up16.data(), down16.data(), m,
                    y16.data(), scratch16.data());
  moeExpertsBackward(b.x.data(), b.chosen.data(), b.weights.data(), gate16.data(), up16.data(), down16.data(), g.data(),
                     m, dx16.data(), dw16.data(), dgate16.data(), dup16.data(), ddown16.data(), scale,
                     scratch16.data());
  auto compare = [](const char *name, const std::vector<float> &want, const std::vector<float> &got) {
    size_t same = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 2e-2 * (std::abs(want[i]) + 1e-2)) << name << " " << i;
      same += got[i] == want[i];
    }
    EXPECT_GT(same, want.size() * 9 / 10) << name << ": " << same << " of " << want.size() << " the same bits";
  };
  auto widened = [](const std::vector<uint16_t> &h) {
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); ++i) v[i] = bf16ToFloat(h[i]);
    return v;
  };
  auto rounded = [](std::vector<float> v) {
    roundThroughBf16(v.data(), int64_t(v.size()));
    return v;
  };
  compare("y", rounded(y32), rounded(y16));
  compare("dx", rounded(dx32), rounded(dx16));
  compare("dweights", dw32, dw16);
  compare("dgate", rounded(dgate32), widened(dgate16));
  compare("dup", rounded(dup32), widened(dup16));
  compare("ddown", rounded(ddown32), widened(ddown16));
}

TEST(MoeExpertsKernel, BackwardIsTheDerivativeOfTheForward) {
  for (bool drop : {false, true}) {
  std::mt19937 rng(9);
  MoeExperts m{7, 4, 6, 5, 2};
  Block b = randomBlock(rng, m);
  // Dropped assignments (capacity) add nothing: their weights get no gradient.
  if (drop) b.chosen[1] = b.chosen[4] = b.chosen[9] = -1;
  std::vector<float> g = randomVector(rng, size_t(m.tokens * m.hidden));
  std::vector<float> dx(b.x.size()), dweights(b.weights.size()), dgate(b.gate.size()), dup(b.up.size()),
      ddown(b.down.size()), y(b.x.size()), scratch(size_t(moeExpertsScratchFloats(m, true, false)));
  moeExpertsBackward(b.x.data(), b.chosen.data(), b.weights.data(), b.gate.data(), b.up.data(), b.down.data(), g.data(),
                     m, dx.data(), dweights.data(), dgate.data(), dup.data(), ddown.data(), 1.0f, scratch.data());
  auto loss = [&] {
    moeExpertsForward(b.x.data(), b.chosen.data(), b.weights.data(), b.gate.data(), b.up.data(), b.down.data(), m,
                      y.data(), scratch.data());
    return dot(g, y);
  };
  struct Arg {
    const char *name;
    std::vector<float> *value;
    const std::vector<float> *grad;
  } args[] = {{"x", &b.x, &dx},        {"weights", &b.weights, &dweights}, {"gate", &b.gate, &dgate},
              {"up", &b.up, &dup},      {"down", &b.down, &ddown}};
  for (const Arg &a : args) {
    std::vector<float> dir = randomVector(rng, a.value->size());
    double want = directional(*a.value, dir, loss), got = dot(*a.grad, dir);
    EXPECT_NEAR(got, want, 2e-3 * (1 + std::abs(want))) << a.name << (drop ? " with drops" : "");
  }
  // Expert E - 1 was chosen by no token: its weights' gradients are zero.
  for (int64_t i = (m.experts - 1) * m.ffn * m.hidden; i < m.experts * m.ffn * m.hidden; ++i)
    ASSERT_EQ(dgate[size_t(i)], 0.0f);
  if (drop)
    for (int pair : {1, 4, 9}) EXPECT_EQ(dweights[size_t(pair)], 0.0f) << pair;
  }
}

}  // namespace
}  // namespace loom::cpu
