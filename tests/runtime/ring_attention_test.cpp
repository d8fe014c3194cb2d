// Context parallelism's attention, block by block (runtime/cpu/Kernels.h AttentionBlock): the
// load-balanced ring (2 cp chunks of the sequence, rank i holding chunks i and 2cp - 1 - i, each
// step one rank's key/value chunks) reproduces the whole sequence's causal attention, forward
// and backward, with and without dropout; every rank computes the same number of blocks. Then
// the ring kernels themselves (ringAttentionForward / Backward, grouped-query heads), one thread
// per member exchanging through an in-memory ring, against the whole sequence.
#include <barrier>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cpu/HalfPrecision.h"
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
// Counts the bytes each member sends.
class ThreadRing {
 public:
  explicit ThreadRing(int c) : c_(c), mail_(size_t(c)), sent_(size_t(c), 0), sync_(c) {}
  RingExchange exchangeOf(int rank) {
    return [this, rank](const void *send, void *recv, int64_t bytes) {
      const char *from = static_cast<const char *>(send);
      mail_[size_t((rank + 1) % c_)].assign(from, from + bytes);
      sent_[size_t(rank)] += bytes;
      sync_.arrive_and_wait();
      if (int64_t(mail_[size_t(rank)].size()) != bytes) return Status::error("ring message of another size");
      std::copy(mail_[size_t(rank)].begin(), mail_[size_t(rank)].end(), static_cast<char *>(recv));
      sync_.arrive_and_wait();
      return Status::ok();
    };
  }
  int64_t sentBy(int rank) const { return sent_[size_t(rank)]; }

 private:
  int c_;
  std::vector<std::vector<char>> mail_;
  std::vector<int64_t> sent_;
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

// The whole sequence's q, k, v, g ([B, S, width]) and the results over it.
struct RingTensors {
  std::vector<float> q, k, v, g, out, lse, dq, dk, dv;
  std::vector<int64_t> bytesSent;  // per member, forward and backward together
};

// q, k, v, g filled (normal, seed 11), each value through `round` (the identity, or a 16-bit
// rounding for the 16-bit wire).
RingTensors ringInputs(const RingCase &rc, float (*round)(float)) {
  const int64_t S = rc.c * 2 * rc.chunk, H = rc.heads * rc.headDim, KW = rc.kvHeads * rc.headDim;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto filled = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float &x : v) x = round(normal(rng));
    return v;
  };
  RingTensors t;
  t.q = filled(rc.batch * S * H), t.k = filled(rc.batch * S * KW), t.v = filled(rc.batch * S * KW);
  t.g = filled(rc.batch * S * H);
  return t;
}

// The ring's results over t's inputs: c members as threads, each with its two chunks (r and
// 2c-1-r of each sample, the step driver's cut), placed back into whole-sequence order.
void runRing(const RingCase &rc, RingAttentionShape::Wire wire, RingTensors *t) {
  const int64_t C = rc.chunk, L = 2 * C, S = rc.c * L, hd = rc.headDim, H = rc.heads * hd, KW = rc.kvHeads * hd;
  const uint64_t seed = 99, stream = 3;
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
  t->out.assign(t->q.size(), 0.0f), t->dq.assign(t->q.size(), 0.0f);
  t->dk.assign(t->k.size(), 0.0f), t->dv.assign(t->v.size(), 0.0f);
  t->lse.assign(size_t(rc.batch * rc.heads * S), 0.0f);
  ThreadRing ring(rc.c);
  std::vector<std::thread> members;
  std::vector<std::string> failures(size_t(rc.c));
  for (int r = 0; r < rc.c; ++r)
    members.emplace_back([&, r] {
      RingAttentionShape s{rc.batch, rc.heads, rc.kvHeads, hd, L, 0, rc.heads / rc.kvHeads, rc.c, r, true,
                           rc.dropout, seed, stream, wire};
      std::vector<float> lq = cut(t->q, H, r), lk = cut(t->k, KW, r), lv = cut(t->v, KW, r), lg = cut(t->g, H, r);
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
      place(lo, H, r, &t->out), place(ldq, H, r, &t->dq), place(ldk, KW, r, &t->dk), place(ldv, KW, r, &t->dv);
      for (int64_t b = 0; b < rc.batch; ++b)  // statistics [B, heads, L] -> [B, heads, S]
        for (int64_t h = 0; h < rc.heads; ++h)
          for (int which = 0; which < 2; ++which)
            std::copy_n(ll.begin() + (b * rc.heads + h) * L + which * C, C,
                        t->lse.begin() + (b * rc.heads + h) * S + chunkOf(r, which) * C);
    });
  for (std::thread &m : members) m.join();
  for (const std::string &f : failures) EXPECT_EQ(f, "");
  t->bytesSent.clear();
  for (int r = 0; r < rc.c; ++r) t->bytesSent.push_back(ring.sentBy(r));
}

float identity(float x) { return x; }
float roundBf16(float x) { return bf16ToFloat(floatToBf16(x)); }
float roundF16(float x) { return f16ToFloat(floatToF16(x)); }

class RingAttentionKernel : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingAttentionKernel, ThreadsOfTheRingReproduceTheWholeSequence) {
  const RingCase rc = GetParam();
  const int64_t S = rc.c * 2 * rc.chunk, hd = rc.headDim;
  RingTensors t = ringInputs(rc, identity);
  GroupedAttentionShape whole{rc.batch, S, rc.heads, rc.kvHeads, hd, 0, rc.heads / rc.kvHeads, true, rc.dropout, 99, 3};
  std::vector<float> scratch(size_t(attentionScratchFloats(S, true)));
  std::vector<float> out(t.q.size()), lse(size_t(rc.batch * rc.heads * S)), dq(t.q.size()), dk(t.k.size()),
      dv(t.v.size());
  groupedAttentionForward(t.q.data(), t.k.data(), t.v.data(), out.data(), lse.data(), whole, scratch.data());
  groupedAttentionBackward(t.q.data(), t.k.data(), t.v.data(), t.g.data(), lse.data(), dq.data(), dk.data(), dv.data(),
                           whole, scratch.data());
  runRing(rc, RingAttentionShape::Wire::kF32, &t);
  EXPECT_LT(relErr(t.out, out), 1e-5);
  EXPECT_LT(relErr(t.lse, lse), 1e-6);
  EXPECT_LT(relErr(t.dq, dq), 1e-5);
  EXPECT_LT(relErr(t.dk, dk), 1e-5);
  EXPECT_LT(relErr(t.dv, dv), 1e-5);
}

// A 16-bit plan's keys and values travel in 16 bits: the same bits as fp32 messages (they are
// 16-bit values), their bytes halved; the dK | dV accumulators stay fp32.
TEST_P(RingAttentionKernel, SixteenBitKeysTravelExactlyAtHalfTheBytes) {
  const RingCase rc = GetParam();
  using Wire = RingAttentionShape::Wire;
  const int64_t kv = rc.batch * 2 * rc.chunk * rc.kvHeads * rc.headDim;  // one member's K (or V) floats
  for (auto [wire, round] : {std::pair{Wire::kBf16, &roundBf16}, std::pair{Wire::kF16, &roundF16}}) {
    RingTensors wide = ringInputs(rc, round), narrow = wide;
    runRing(rc, Wire::kF32, &wide);
    runRing(rc, wire, &narrow);
    for (auto [a, b] : {std::pair{&wide.out, &narrow.out}, {&wide.lse, &narrow.lse}, {&wide.dq, &narrow.dq},
                        {&wide.dk, &narrow.dk}, {&wide.dv, &narrow.dv}})
      EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0) << int(wire);
    // Forward and backward each pass K | V c - 1 times; the backward passes dK | dV c times.
    for (int r = 0; r < rc.c; ++r) {
      EXPECT_EQ(wide.bytesSent[size_t(r)], (4 * (rc.c - 1) + 2 * rc.c) * kv * 4) << r;
      EXPECT_EQ(narrow.bytesSent[size_t(r)], (4 * (rc.c - 1) * kv * 2) + 2 * rc.c * kv * 4) << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, RingAttentionKernel,
                         ::testing::Values(RingCase{1, 2, 2, 8, 8, 2, 0.0f}, RingCase{2, 4, 2, 16, 12, 3, 0.1f},
                                           RingCase{1, 4, 1, 8, 16, 4, 0.0f}, RingCase{2, 2, 1, 8, 20, 2, 0.2f}));

}  // namespace
}  // namespace loom::cpu
