// The CPU's memory-bound kernels over bf16 operands (runtime/cpu/RowStorage.h) against the
// fp32 kernels run on widened copies and rounded after, bit for bit: the values a bf16 plan
// got from the executor's widened path before these kernels existed. Odd sizes (not multiples
// of the lanes or of the blocks), more rows than one thread's part, and 1 and 3 threads.
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/HalfPrecision.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Parallel.h"

namespace loom::cpu {
namespace {

using Bf16 = std::vector<uint16_t>;
using Fp32 = std::vector<float>;

Bf16 randomBf16(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  Bf16 out(n);
  for (auto &v : out) v = floatToBf16(d(rng));
  return out;
}

Fp32 wide(const Bf16 &x) {
  Fp32 out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = bf16ToFloat(x[i]);
  return out;
}

Bf16 rounded(const Fp32 &x) {
  Bf16 out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = floatToBf16(x[i]);
  return out;
}

// Equal bits, or the first index where they differ.
void expectSameBits(const Bf16 &got, const Fp32 &reference, const std::string &what) {
  Bf16 want = rounded(reference);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], want[i]) << what << ": element " << i << " of " << got.size() << ": bf16 kernel "
                               << bf16ToFloat(got[i]) << ", fp32 kernel rounded " << bf16ToFloat(want[i]);
}

class Bf16Kernels : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    openblas_set_num_threads(GetParam());  // the kernels' thread count (runtime/cpu/Parallel.h)
    ASSERT_EQ(kernelThreads(), GetParam());
  }
  void TearDown() override { openblas_set_num_threads(1); }
};

constexpr int64_t kRows = 301, kCols = 77;  // odd: lanes' tails, parts of uneven size
constexpr int64_t kCount = kRows * kCols;

TEST_P(Bf16Kernels, LayerNormForwardAndBackward) {
  Bf16 x = randomBf16(kCount, 1, 3.0f), gamma = randomBf16(kCols, 2), beta = randomBf16(kCols, 3),
       g = randomBf16(kCount, 4);
  Bf16 y(kCount), dx(kCount), dgamma(kCols), dbeta(kCols);
  layerNormForward(x.data(), gamma.data(), beta.data(), y.data(), kRows, kCols, 1e-5f);
  layerNormBackward(x.data(), gamma.data(), g.data(), dx.data(), dgamma.data(), dbeta.data(), kRows, kCols, 1e-5f);
  Fp32 yw(kCount), dxw(kCount), dgw(kCols), dbw(kCols);
  layerNormForward(wide(x).data(), wide(gamma).data(), wide(beta).data(), yw.data(), kRows, kCols, 1e-5f);
  layerNormBackward(wide(x).data(), wide(gamma).data(), wide(g).data(), dxw.data(), dgw.data(), dbw.data(), kRows,
                    kCols, 1e-5f);
  expectSameBits(y, yw, "layer_norm");
  expectSameBits(dx, dxw, "layer_norm_grad dx");
  expectSameBits(dgamma, dgw, "layer_norm_grad dgamma");
  expectSameBits(dbeta, dbw, "layer_norm_grad dbeta");
}

TEST_P(Bf16Kernels, RmsNormForwardAndBackward) {
  Bf16 x = randomBf16(kCount, 5, 2.0f), gamma = randomBf16(kCols, 6), g = randomBf16(kCount, 7);
  Bf16 y(kCount), dx(kCount), dgamma(kCols);
  rmsNormForward(x.data(), gamma.data(), y.data(), kRows, kCols, 1e-6f);
  rmsNormBackward(x.data(), gamma.data(), g.data(), dx.data(), dgamma.data(), kRows, kCols, 1e-6f);
  Fp32 yw(kCount), dxw(kCount), dgw(kCols);
  rmsNormForward(wide(x).data(), wide(gamma).data(), yw.data(), kRows, kCols, 1e-6f);
  rmsNormBackward(wide(x).data(), wide(gamma).data(), wide(g).data(), dxw.data(), dgw.data(), kRows, kCols, 1e-6f);
  expectSameBits(y, yw, "rms_norm");
  expectSameBits(dx, dxw, "rms_norm_grad dx");
  expectSameBits(dgamma, dgw, "rms_norm_grad dgamma");
}

TEST_P(Bf16Kernels, ElementwiseActivationsAndDropout) {
  // More elements than one block of a part (runtime/cpu/RowStorage.h), not a multiple of it.
  constexpr int64_t n = 3 * 16384 + 4097;
  Bf16 x = randomBf16(n, 8, 2.0f), u = randomBf16(n, 9), g = randomBf16(n, 10);
  Bf16 y(n), dx(n), s(n), dgate(n), dup(n), d(n);
  geluForward(x.data(), y.data(), n);
  geluBackward(x.data(), g.data(), dx.data(), n);
  swigluForward(x.data(), u.data(), s.data(), n);
  swigluBackward(x.data(), u.data(), g.data(), dgate.data(), dup.data(), n);
  dropoutForward(x.data(), d.data(), n, 0.25f, 1234, 7);
  Fp32 yw(n), dxw(n), sw(n), dgw(n), duw(n), dw(n);
  geluForward(wide(x).data(), yw.data(), n);
  geluBackward(wide(x).data(), wide(g).data(), dxw.data(), n);
  swigluForward(wide(x).data(), wide(u).data(), sw.data(), n);
  swigluBackward(wide(x).data(), wide(u).data(), wide(g).data(), dgw.data(), duw.data(), n);
  dropoutForward(wide(x).data(), dw.data(), n, 0.25f, 1234, 7);
  expectSameBits(y, yw, "gelu");
  expectSameBits(dx, dxw, "gelu_grad");
  expectSameBits(s, sw, "swiglu");
  expectSameBits(dgate, dgw, "swiglu_grad dgate");
  expectSameBits(dup, duw, "swiglu_grad dup");
  expectSameBits(d, dw, "dropout");
}

TEST_P(Bf16Kernels, RotaryAndBiasGrad) {
  constexpr int64_t batch = 3, seq = 37, heads = 4, hd = 16, count = batch * seq * heads * hd;
  Bf16 x = randomBf16(count, 11);
  for (bool inverse : {false, true}) {
    Bf16 y(count);
    Fp32 yw(count);
    rotary(x.data(), y.data(), batch, seq, heads, hd, 10000.0f, inverse);
    rotary(wide(x).data(), yw.data(), batch, seq, heads, hd, 10000.0f, inverse);
    expectSameBits(y, yw, inverse ? "rotary inverse" : "rotary");
  }
  Bf16 g = randomBf16(kCount, 12), db(kCols);
  Fp32 dbw(kCols);
  biasGrad(g.data(), db.data(), kRows, kCols);
  biasGrad(wide(g).data(), dbw.data(), kRows, kCols);
  expectSameBits(db, dbw, "bias_grad");
}

TEST_P(Bf16Kernels, BiasAndPositionAdds) {
  constexpr int64_t batch = 3, seq = 101, hidden = kCols, positions = 128;
  Bf16 x = randomBf16(kCount, 13), bias = randomBf16(kCols, 14);
  Bf16 y(kCount);
  Fp32 yw(kCount);
  addBiasForward(x.data(), bias.data(), y.data(), kRows, kCols);
  addBiasForward(wide(x).data(), wide(bias).data(), yw.data(), kRows, kCols);
  expectSameBits(y, yw, "add_bias");
  Bf16 h = randomBf16(batch * seq * hidden, 15), pos = randomBf16(positions * hidden, 16), out(h.size());
  Fp32 outw(h.size());
  addPositionForward(h.data(), pos.data(), out.data(), batch, seq, hidden);
  addPositionForward(wide(h).data(), wide(pos).data(), outw.data(), batch, seq, hidden);
  expectSameBits(out, outw, "add_position");
  Bf16 dpos(positions * hidden, 0x7fc0);  // rows beyond seq must come back zero
  Fp32 dposw(dpos.size(), 1.0f);
  positionBackward(h.data(), dpos.data(), batch, seq, hidden, positions);
  positionBackward(wide(h).data(), dposw.data(), batch, seq, hidden, positions);
  expectSameBits(dpos, dposw, "position_grad");
}

// Grouped-query attention in bf16 (FlashAttention's rounding points, KV gradients summed per
// half of the heads in fp32): the same bits at 1 and 3 threads, and close to the fp32 kernel
// (a bf16 ulp is 2^-8; relative L2 error of each output under 2e-2).
TEST(Bf16GroupedAttention, SameBitsAtEveryThreadCountAndCloseToFp32) {
  GroupedAttentionShape s{2, 70, 4, 2, 16, 0, 2, true, 0.0f, 0, 0};
  int64_t nq = s.batch * s.seq * s.heads * s.headDim, nkv = s.batch * s.seq * s.kvHeads * s.headDim;
  Bf16 q = randomBf16(size_t(nq), 21), k = randomBf16(size_t(nkv), 22), v = randomBf16(size_t(nkv), 23),
       g = randomBf16(size_t(nq), 24);
  struct Out {
    Bf16 out, dq, dk, dv;
    Fp32 lse;
  };
  auto run = [&](int threads) {
    openblas_set_num_threads(threads);
    Out o{Bf16(size_t(nq)), Bf16(size_t(nq)), Bf16(size_t(nkv)), Bf16(size_t(nkv)), Fp32(size_t(s.batch * s.heads * s.seq))};
    Fp32 scratch(size_t(std::max(groupedAttentionScratchFloatsBf16(s, false), groupedAttentionScratchFloatsBf16(s, true))));
    groupedAttentionForwardBf16(q.data(), k.data(), v.data(), o.out.data(), o.lse.data(), s, scratch.data());
    groupedAttentionBackwardBf16(q.data(), k.data(), v.data(), g.data(), o.lse.data(), o.dq.data(), o.dk.data(),
                                 o.dv.data(), s, scratch.data());
    openblas_set_num_threads(1);
    return o;
  };
  Out one = run(1), three = run(3);
  EXPECT_EQ(one.out, three.out);
  EXPECT_EQ(one.dq, three.dq);
  EXPECT_EQ(one.dk, three.dk);
  EXPECT_EQ(one.dv, three.dv);
  Fp32 out(static_cast<size_t>(nq)), lse(one.lse.size()), dq(static_cast<size_t>(nq)), dk(static_cast<size_t>(nkv)),
      dv(static_cast<size_t>(nkv));
  Fp32 scratch(size_t(attentionScratchFloats(s.seq, true)));
  groupedAttentionForward(wide(q).data(), wide(k).data(), wide(v).data(), out.data(), lse.data(), s, scratch.data());
  groupedAttentionBackward(wide(q).data(), wide(k).data(), wide(v).data(), wide(g).data(), lse.data(), dq.data(),
                           dk.data(), dv.data(), s, scratch.data());
  auto relative = [](const Bf16 &got, const Fp32 &want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      double d = double(bf16ToFloat(got[i])) - want[i];
      num += d * d, den += double(want[i]) * want[i];
    }
    return std::sqrt(num / den);
  };
  EXPECT_LT(relative(one.out, out), 2e-2);
  EXPECT_LT(relative(one.dq, dq), 2e-2);
  EXPECT_LT(relative(one.dk, dk), 2e-2);
  EXPECT_LT(relative(one.dv, dv), 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Threads, Bf16Kernels, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int> &p) { return std::to_string(p.param) + "threads"; });

}  // namespace
}  // namespace loom::cpu
