// Context parallelism's attention, block by block (runtime/cpu/Kernels.h AttentionBlock): the
// load-balanced ring (2 cp chunks of the sequence, rank i holding chunks i and 2cp - 1 - i, each
// step one rank's key/value chunks) reproduces the whole sequence's causal attention, forward
// and backward, with and without dropout; every rank computes the same number of blocks. Then
// the ring kernels themselves (ringAttentionForward / Backward, grouped-query heads), one thread
// per member exchanging through an in-memory ring, against the whole sequence.
#include <barrier>
#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cpu/Kernels.h"

namespace loom::cpu {
namespace {

struct Case {
  int64_t batch, heads, headDim, cp, chunk;
  float dropout;
};

void PrintTo(const Case &c, std::ostream *os) {
  *os << "batch " << c.batch << " heads " << c.heads << " hd " << c.headDim << " cp " << c.cp << " chunk " << c.chunk
      << " dropout " << c.dropout;
}

double relErr(const std::vector<float> &got, const std::vector<float> &want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

class RingAttention : public ::testing::TestWithParam<Case> {};

TEST_P(RingAttention, ReproducesTheWholeSequence) {
  const Case c = GetParam();
  const int64_t S = 2 * c.cp * c.chunk, hd = c.headDim, H = c.heads, ld = 3 * H * hd, ldo = H * hd;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(size_t(c.batch * S * ld)), g(size_t(c.batch * S * ldo));
  for (float &x : qkv) x = normal(rng);
  for (float &x : g) x = normal(rng);
  const uint64_t seed = 1234, stream = 5;

  // The reference: the whole sequence at once.
  AttentionShape shape{c.batch, S, H, hd, /*causal=*/true, c.dropout, seed, stream};
  std::vector<float> scratch(size_t(attentionScratchFloats(S, true)));
  std::vector<float> out(size_t(c.batch * S * ldo)), lse(size_t(c.batch * H * S)), dqkv(qkv.size());
  attentionForward(qkv.data(), nullptr, out.data(), lse.data(), shape, scratch.data());
  attentionBackward(qkv.data(), nullptr, g.data(), lse.data(), dqkv.data(), shape, scratch.data());

  // The ring, rank by rank: each rank's two query chunks against every rank's two key chunks in
  // ring order (its own first), the blocks the causal mask leaves merged by their statistics.
  std::vector<float> ringOut(out.size()), ringLse(lse.size()), ringDqkv(qkv.size(), 0.0f);
  std::vector<float> blockScratch(size_t(attentionBlockScratchFloats(c.chunk, true)));
  std::vector<float> part(size_t(c.chunk * hd)), partLse(size_t(c.chunk)), delta(size_t(c.chunk));
  std::vector<double> blocksPerRank(size_t(c.cp), 0.0);
  auto chunksOf = [&](int64_t rank) { return std::vector<int64_t>{rank, 2 * c.cp - 1 - rank}; };
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const uint64_t headBase = uint64_t((b * H + h) * S) * uint64_t(S);
      auto block = [&](int64_t qc, int64_t kc) {
        const float *q = qkv.data() + (b * S + qc * c.chunk) * ld + h * 3 * hd;
        const float *k = qkv.data() + (b * S + kc * c.chunk) * ld + h * 3 * hd + hd;
        return AttentionBlock{q,      k + 0,     k + hd,    ld,
                              c.chunk, hd,       qc == kc,  c.dropout,
                              seed,   stream,    headBase + uint64_t(qc * c.chunk) * uint64_t(S) + uint64_t(kc * c.chunk),
                              S};
      };
      for (int64_t rank = 0; rank < c.cp; ++rank)
        for (int64_t qc : chunksOf(rank)) {
          float *o = ringOut.data() + (b * S + qc * c.chunk) * ldo + h * hd;
          float *l = ringLse.data() + (b * H + h) * S + qc * c.chunk;
          std::fill(l, l + c.chunk, -std::numeric_limits<float>::infinity());
          for (int64_t step = 0; step < c.cp; ++step)
            for (int64_t kc : chunksOf((rank - step + c.cp) % c.cp)) {
              if (kc > qc) continue;  // keys after every query of the chunk
              if (b == 0 && h == 0) blocksPerRank[size_t(rank)] += kc == qc ? 0.5 : 1.0;
              attentionBlockForward(block(qc, kc), part.data(), hd, partLse.data(), blockScratch.data());
              mergeAttentionBlock(o, l, ldo, part.data(), partLse.data(), hd, c.chunk, hd);
            }
          // Backward from the merged statistics (dK and dV go back to the keys' owner: added in place here).
          attentionRowDots(g.data() + (b * S + qc * c.chunk) * ldo + h * hd, o, ldo, c.chunk, hd, delta.data());
          float *dq = ringDqkv.data() + (b * S + qc * c.chunk) * ld + h * 3 * hd;
          for (int64_t step = 0; step < c.cp; ++step)
            for (int64_t kc : chunksOf((rank - step + c.cp) % c.cp)) {
              if (kc > qc) continue;
              float *dk = ringDqkv.data() + (b * S + kc * c.chunk) * ld + h * 3 * hd + hd;
              attentionBlockBackward(block(qc, kc), g.data() + (b * S + qc * c.chunk) * ldo + h * hd, ldo, l,
                                     delta.data(), dq, dk, dk + hd, ld, blockScratch.data());
            }
        }
    }
  EXPECT_LT(relErr(ringOut, out), 1e-5);
  EXPECT_LT(relErr(ringLse, lse), 1e-6);
  EXPECT_LT(relErr(ringDqkv, dqkv), 1e-5);
  // The causal load balance: 2 cp - 1 full blocks and 2 diagonal halves on every rank.
  for (int64_t rank = 0; rank < c.cp; ++rank) EXPECT_EQ(blocksPerRank[size_t(rank)], double(2 * c.cp)) << rank;
}

INSTANTIATE_TEST_SUITE_P(Layouts, RingAttention,
                         ::testing::Values(Case{1, 2, 8, 2, 8, 0.0f}, Case{2, 3, 16, 2, 70, 0.0f},
                                           Case{1, 2, 8, 4, 16, 0.0f}, Case{2, 2, 8, 2, 24, 0.1f},
                                           Case{1, 1, 32, 3, 66, 0.2f}));

// c members as threads; exchange: every member's `send` to the next one's `recv`, all at once.
class ThreadRing {
 public:
  explicit ThreadRing(int c) : c_(c), mail_(size_t(c)), sync_(c) {}
  RingExchange exchangeOf(int rank) {
    return [this, rank](const float *send, float *recv, int64_t count) {
      mail_[size_t((rank + 1) % c_)].assign(send, send + count);
      sync_.arrive_and_wait();
      std::copy(mail_[size_t(rank)].begin(), mail_[size_t(rank)].end(), recv);
      sync_.arrive_and_wait();
      return Status::ok();
    };
  }

 private:
  int c_;
  std::vector<std::vector<float>> mail_;
  std::barrier<> sync_;
};

struct RingCase {
  int64_t batch, heads, kvHeads, headDim, chunk;
  int c;
  float dropout;
};

void PrintTo(const RingCase &c, std::ostream *os) {
  *os << "batch " << c.batch << " heads " << c.heads << "/" << c.kvHeads << " hd " << c.headDim << " c " << c.c
      << " chunk " << c.chunk << " dropout " << c.dropout;
}

class RingAttentionKernel : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingAttentionKernel, ThreadsOfTheRingReproduceTheWholeSequence) {
  const RingCase rc = GetParam();
  const int64_t C = rc.chunk, L = 2 * C, S = rc.c * L, hd = rc.headDim, H = rc.heads * hd, KW = rc.kvHeads * hd;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto filled = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float &x : v) x = normal(rng);
    return v;
  };
  std::vector<float> q = filled(rc.batch * S * H), k = filled(rc.batch * S * KW), v = filled(rc.batch * S * KW),
                     g = filled(rc.batch * S * H);
  const uint64_t seed = 99, stream = 3;
  GroupedAttentionShape whole{rc.batch, S, rc.heads, rc.kvHeads, hd, 0, rc.heads / rc.kvHeads, true, rc.dropout, seed,
                              stream};
  std::vector<float> scratch(size_t(attentionScratchFloats(S, true)));
  std::vector<float> out(q.size()), lse(size_t(rc.batch * rc.heads * S)), dq(q.size()), dk(k.size()), dv(v.size());
  groupedAttentionForward(q.data(), k.data(), v.data(), out.data(), lse.data(), whole, scratch.data());
  groupedAttentionBackward(q.data(), k.data(), v.data(), g.data(), lse.data(), dq.data(), dk.data(), dv.data(), whole,
                           scratch.data());

  // Member r's rows: chunks r and 2c-1-r of each sample (the step driver's cut).
  auto chunkOf = [&](int r, int which) { return which == 0 ? r : 2 * rc.c - 1 - r; };
  auto cut = [&](const std::vector<float> &x, int64_t width, int r) {
    std::vector<float> local(size_t(rc.batch * L * width));
    for (int64_t b = 0; b < rc.batch; ++b)
      for (int which = 0; which < 2; ++which)
        std::copy_n(x.begin() + (b * S + chunkOf(r, which) * C) * width, C * width,
                    local.begin() + (b * L + which * C) * width);
    return local;
  };
  auto place = [&](const std::vector<float> &local, int64_t width, int r, std::vector<float> *x) {
    for (int64_t b = 0; b < rc.batch; ++b)
      for (int which = 0; which < 2; ++which)
        std::copy_n(local.begin() + (b * L + which * C) * width, C * width,
                    x->begin() + (b * S + chunkOf(r, which) * C) * width);
  };
  std::vector<float> ringOut(out.size()), ringLse(lse.size()), ringDq(dq.size()), ringDk(dk.size()), ringDv(dv.size());
  ThreadRing ring(rc.c);
  std::vector<std::thread> members;
  std::vector<std::string> failures(size_t(rc.c));
  for (int r = 0; r < rc.c; ++r)
    members.emplace_back([&, r] {
      RingAttentionShape s{rc.batch, rc.heads, rc.kvHeads, hd, L, 0, rc.heads / rc.kvHeads, rc.c, r, true,
                           rc.dropout, seed, stream};
      std::vector<float> lq = cut(q, H, r), lk = cut(k, KW, r), lv = cut(v, KW, r), lg = cut(g, H, r);
      std::vector<float> lo(lq.size()), ll(size_t(rc.batch * rc.heads * L)), ldq(lq.size()), ldk(lk.size()),
          ldv(lv.size());
      std::vector<float> work(size_t(std::max(ringAttentionScratchFloats(s, false, false),
                                              ringAttentionScratchFloats(s, true, false))));
      Status st = ringAttentionForward(lq.data(), H, hd, lk.data(), lv.data(), lo.data(), ll.data(), s, work.data(),
                                       ring.exchangeOf(r));
      if (st.isOk())
        st = ringAttentionBackward(lq.data(), H, hd, lk.data(), lv.data(), lg.data(), lo.data(), ll.data(), ldq.data(),
                                   ldk.data(), ldv.data(), s, work.data(), ring.exchangeOf(r));
      if (!st.isOk()) failures[size_t(r)] = st.message();
      place(lo, H, r, &ringOut), place(ldq, H, r, &ringDq), place(ldk, KW, r, &ringDk), place(ldv, KW, r, &ringDv);
      for (int64_t b = 0; b < rc.batch; ++b)  // statistics [B, heads, L] -> [B, heads, S]
        for (int64_t h = 0; h < rc.heads; ++h)
          for (int which = 0; which < 2; ++which)
            std::copy_n(ll.begin() + (b * rc.heads + h) * L + which * C, C,
                        ringLse.begin() + (b * rc.heads + h) * S + chunkOf(r, which) * C);
    });
  for (std::thread &t : members) t.join();
  for (const std::string &f : failures) EXPECT_EQ(f, "");
  EXPECT_LT(relErr(ringOut, out), 1e-5);
  EXPECT_LT(relErr(ringLse, lse), 1e-6);
  EXPECT_LT(relErr(ringDq, dq), 1e-5);
  EXPECT_LT(relErr(ringDk, dk), 1e-5);
  EXPECT_LT(relErr(ringDv, dv), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Layouts, RingAttentionKernel,
                         ::testing::Values(RingCase{1, 2, 2, 8, 8, 2, 0.0f}, RingCase{2, 4, 2, 16, 12, 3, 0.1f},
                                           RingCase{1, 4, 1, 8, 16, 4, 0.0f}, RingCase{2, 2, 1, 8, 20, 2, 0.2f}));

}  // namespace
}  // namespace loom::cpu
