// The CUDA attention core against cpu::attentionForward/Backward on the same inputs: causal or
// not, with a key mask, with dropout (the same counter, so the same entries dropped), and a
// row whose keys are all masked; in fp32 (relative L2 error < 1e-5 on out and dqkv), bf16 and
// fp16 operands (within their rounding: 3e-2 and 5e-3); the tiled (flash) kernel in fp32 at
// three head sizes; each forward's softmax statistics (lse) against the CPU's, and each backward
// reads the statistics its own forward wrote; the tiled kernel on bf16 and fp16 storage against
// itself in fp32 on the same values, rounded once. An empty shape, and a head too wide for the
// tiled kernel, are refused with a message (that case runs everywhere). The rest skips, with a
// message saying so, where no GPU is present (CI); the GPU check script runs it.
#include <gtest/gtest.h>

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/Attention.h"
#include "runtime/cuda/FlashAttention.h"
#include "tests/cuda/DeviceTest.h"

namespace loom {
namespace {

struct Case {
  const char *name;
  bool causal, keyMask;
  float dropout;
};

// A case's inputs and the CPU's results on them. Key mask: batch 0's tail from 60% of the
// sequence masked (padding); without causal masking, batch 1 has nothing to attend to.
struct Reference {
  std::vector<float> qkv, g, mask, out, dqkv, lse;
};

// The statistics within `tolerance`; rows with every key masked are +inf in both.
void expectStatistics(std::vector<float> got, std::vector<float> want, double tolerance, const std::string &what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    if (std::isinf(want[i])) {
      EXPECT_TRUE(std::isinf(got[i]) && got[i] > 0) << what << ": lse row " << i << " is " << got[i] << ", not +inf";
      got[i] = want[i] = 0.0f;
    }
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) err += double(got[i] - want[i]) * (got[i] - want[i]), norm += double(want[i]) * want[i];
  EXPECT_LT(std::sqrt(err / std::max(norm, 1e-30)), tolerance) << what << ": lse";
}

Reference reference(const Case &c, const cpu::AttentionShape &shape, std::vector<float> qkv, std::vector<float> g) {
  int64_t tokens = shape.batch * shape.seq, S = shape.seq;
  Reference r{std::move(qkv), std::move(g), std::vector<float>(tokens, 1.0f), {}, {}, {}};
  if (c.keyMask) {
    for (int64_t j = S * 3 / 5; j < S; ++j) r.mask[j] = 0.0f;
    if (!c.causal)
      for (int64_t j = 0; j < S; ++j) r.mask[S + j] = 0.0f;
  }
  const float *mask = c.keyMask ? r.mask.data() : nullptr;
  r.out.resize(r.g.size()), r.dqkv.resize(r.qkv.size()), r.lse.resize(size_t(shape.batch * shape.heads * S));
  std::vector<float> scratch(size_t(cpu::attentionScratchFloats(shape.seq, true)));
  cpu::attentionForward(r.qkv.data(), mask, r.out.data(), r.lse.data(), shape, scratch.data());
  cpu::attentionBackward(r.qkv.data(), mask, r.g.data(), r.lse.data(), r.dqkv.data(), shape, scratch.data());
  return r;
}

class CudaAttention : public DeviceTest<::testing::TestWithParam<std::tuple<Case, cuda::Precision>>> {
 protected:
  void TearDown() override {
    if (blas_) cublasDestroy(blas_);
    DeviceTest::TearDown();
  }
  cublasHandle_t blas_ = nullptr;
};

double tolerance(cuda::Precision p) {
  return p == cuda::Precision::kFp32 ? 1e-5 : p == cuda::Precision::kBf16 ? 3e-2 : 5e-3;
}

TEST_P(CudaAttention, MatchesCpuForwardAndBackward) {
  const auto &[c, precision] = GetParam();
  cpu::AttentionShape shape{/*batch=*/2, /*seq=*/67, /*heads=*/3, /*headDim=*/16, c.causal, c.dropout, 99, 5};
  Reference r = reference(c, shape, random(shape.batch * shape.seq * 3 * shape.heads * shape.headDim),
                          random(shape.batch * shape.seq * shape.heads * shape.headDim));
  const std::vector<float> &qkv = r.qkv, &g = r.g, &out = r.out, &dqkv = r.dqkv;
  float *dOut = zeros(out.size()), *dDqkv = zeros(dqkv.size()), *dLse = zeros(r.lse.size());
  const float *devMask = c.keyMask ? up(r.mask) : nullptr;
  ASSERT_EQ(cublasCreate(&blas_), CUBLAS_STATUS_SUCCESS);
  void *scratch = alloc(cuda::attentionScratchBytes(shape, precision, /*backward=*/true));
  ASSERT_LE(cuda::attentionScratchBytes(shape, precision, false), cuda::attentionScratchBytes(shape, precision, true));
  Status s = cuda::attentionForward(blas_, precision, up(qkv), devMask, dOut, dLse, shape, scratch, nullptr);
  ASSERT_TRUE(s.isOk()) << s.message();
  s = cuda::attentionBackward(blas_, precision, up(qkv), devMask, up(g), dLse, dDqkv, shape, scratch, nullptr);
  ASSERT_TRUE(s.isOk()) << s.message();
  expectStatistics(down(dLse, r.lse.size()), r.lse, tolerance(precision), c.name);
  EXPECT_LT(relErr(down(dOut, out.size()), out), tolerance(precision)) << c.name;
  EXPECT_LT(relErr(down(dDqkv, dqkv.size()), dqkv), tolerance(precision)) << c.name;
}

INSTANTIATE_TEST_SUITE_P(
    Masks, CudaAttention,
    ::testing::Combine(::testing::Values(Case{"plain", false, false, 0.0f}, Case{"causal", true, false, 0.0f},
                                         Case{"key_mask", false, true, 0.0f},
                                         Case{"causal_key_mask_dropout", true, true, 0.1f},
                                         Case{"dropout", false, false, 0.2f}),
                       ::testing::Values(cuda::Precision::kFp32, cuda::Precision::kBf16, cuda::Precision::kFp16)),
    [](const auto &info) {
      return std::string(std::get<0>(info.param).name) + "_" + cuda::precisionName(std::get<1>(info.param));
    });

// The tiled kernel against the CPU in fp32 for the same cases, and head sizes off the warp
// width (40) and at the limit (128) with a sequence that is no multiple of the tiles.
class FlashAttention : public DeviceTest<::testing::TestWithParam<Case>> {};

TEST_P(FlashAttention, MatchesCpuForwardAndBackward) {
  const Case &c = GetParam();
  for (auto [seq, heads, headDim] : {std::tuple<int64_t, int64_t, int64_t>{67, 3, 16}, {45, 2, 40}, {70, 1, 128}}) {
    cpu::AttentionShape shape{/*batch=*/2, seq, heads, headDim, c.causal, c.dropout, 99, 5};
    Reference r = reference(c, shape, random(shape.batch * seq * 3 * heads * headDim),
                            random(shape.batch * seq * heads * headDim));
    const std::vector<float> &qkv = r.qkv, &g = r.g, &out = r.out, &dqkv = r.dqkv;
    float *dOut = zeros(out.size()), *dDqkv = zeros(dqkv.size()), *dLse = zeros(r.lse.size());
    const float *devMask = c.keyMask ? up(r.mask) : nullptr;
    void *scratch = alloc(cuda::flashAttentionScratchBytes(shape));
    Status s = cuda::flashAttentionForward(up(qkv), devMask, dOut, dLse, shape, nullptr);
    ASSERT_TRUE(s.isOk()) << s.message();
    s = cuda::flashAttentionBackward(up(qkv), devMask, up(g), dDqkv, shape, scratch, nullptr);
    ASSERT_TRUE(s.isOk()) << s.message();
    EXPECT_LT(relErr(down(dOut, out.size()), out), 1e-5) << c.name << " hd " << headDim;
    expectStatistics(down(dLse, r.lse.size()), r.lse, 1e-5, std::string(c.name) + " hd " + std::to_string(headDim));
    EXPECT_LT(relErr(down(dDqkv, dqkv.size()), dqkv), 1e-5) << c.name << " hd " << headDim;
  }
}

INSTANTIATE_TEST_SUITE_P(Masks, FlashAttention,
                         ::testing::Values(Case{"plain", false, false, 0.0f}, Case{"causal", true, false, 0.0f},
                                           Case{"key_mask", false, true, 0.0f},
                                           Case{"causal_key_mask_dropout", true, true, 0.1f},
                                           Case{"dropout", false, false, 0.2f}),
                         [](const auto &info) { return std::string(info.param.name); });

// 16-bit storage: the tiled kernel reads bf16 or fp16 qkv and g into its fp32 tiles and writes
// out and dqkv in that type, each its own fp32 result on the same values (the operands widened)
// rounded once (within one 16-bit ulp: the results are sums over keys or queries); lse, fp32,
// is the fp32 run's.
using FlashAttentionStorage = DeviceTest<>;

TEST_F(FlashAttentionStorage, Bf16AndFp16StorageIsFp32MathRoundedOnce) {
  for (cuda::ElementType t : {cuda::ElementType::kBf16, cuda::ElementType::kF16})
    for (const Case &c : {Case{"key_mask", false, true, 0.0f}, Case{"causal_key_mask_dropout", true, true, 0.1f}}) {
      cpu::AttentionShape shape{/*batch=*/2, /*seq=*/45, /*heads=*/2, /*headDim=*/40, c.causal, c.dropout, 99, 5};
      int64_t S = shape.seq, tokens = shape.batch * S, rows = shape.batch * shape.heads * S;
      int64_t nq = tokens * 3 * shape.heads * shape.headDim, no = tokens * shape.heads * shape.headDim;
      std::vector<float> mask(tokens, 1.0f);  // as reference(): batch 1 attends to nothing without causal
      for (int64_t j = S * 3 / 5; j < S; ++j) mask[j] = 0.0f;
      if (!c.causal)
        for (int64_t j = 0; j < S; ++j) mask[S + j] = 0.0f;
      const float *devMask = up(mask);
      auto qkv = randomHalf(nq, t), g = randomHalf(no, t);
      float *qkv32 = up(qkv.values), *g32 = up(g.values);
      cuda::Out out = halves(no, t), dqkv = halves(nq, t);
      float *out32 = zeros(no), *dqkv32 = zeros(nq), *lse = zeros(rows), *lse32 = zeros(rows);
      void *scratch = alloc(cuda::flashAttentionScratchBytes(shape));
      void *scratch32 = alloc(cuda::flashAttentionScratchBytes(shape));
      std::string what = std::string(c.name) + " " + cuda::elementTypeName(t);
      Status s = cuda::flashAttentionForward(qkv.in, devMask, out, lse, shape, nullptr);
      ASSERT_TRUE(s.isOk()) << s.message();
      s = cuda::flashAttentionForward(qkv32, devMask, out32, lse32, shape, nullptr);
      ASSERT_TRUE(s.isOk()) << s.message();
      s = cuda::flashAttentionBackward(qkv.in, devMask, g.in, dqkv, shape, scratch, nullptr);
      ASSERT_TRUE(s.isOk()) << s.message();
      s = cuda::flashAttentionBackward(qkv32, devMask, g32, dqkv32, shape, scratch32, nullptr);
      ASSERT_TRUE(s.isOk()) << s.message();
      expectRoundedOnce(out, out32, size_t(no), 1, what + " out");
      expectStatistics(down(lse, rows), down(lse32, rows), 1e-6, what);
      expectRoundedOnce(dqkv, dqkv32, size_t(nq), 1, what + " dqkv");
    }
}

// Grouped-query attention against the CPU: KV heads shared by 2 query heads, multi-query (one
// KV head), and a rank's slice of the query heads over all KV heads (replicated KV heads), with
// and without dropout, in the three precisions.
class GroupedAttention : public DeviceTest<::testing::TestWithParam<cuda::Precision>> {
 protected:
  void TearDown() override {
    if (blas_) cublasDestroy(blas_);
    DeviceTest::TearDown();
  }
  cublasHandle_t blas_ = nullptr;
};

TEST_P(GroupedAttention, MatchesCpuForwardAndBackward) {
  cuda::Precision precision = GetParam();
  ASSERT_EQ(cublasCreate(&blas_), CUBLAS_STATUS_SUCCESS);
  //                 heads, kvHeads, firstHead, headsPerKv, dropout
  for (auto [heads, kvHeads, first, perKv, dropout] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, float>{4, 2, 0, 2, 0.0f}, {4, 1, 0, 4, 0.1f}, {2, 2, 2, 2, 0.0f}}) {
    cpu::GroupedAttentionShape shape{2, 67, heads, kvHeads, 16, first, perKv, true, dropout, 99, 5};
    int64_t qn = shape.batch * shape.seq * heads * 16, kvn = shape.batch * shape.seq * kvHeads * 16;
    auto q = random(qn), k = random(kvn), v = random(kvn), g = random(qn);
    int64_t rows = shape.batch * heads * shape.seq;
    std::vector<float> out(qn), dq(qn), dk(kvn), dv(kvn), lse(rows);
    std::vector<float> cpuScratch(size_t(cpu::attentionScratchFloats(shape.seq, true)));
    cpu::groupedAttentionForward(q.data(), k.data(), v.data(), out.data(), lse.data(), shape, cpuScratch.data());
    cpu::groupedAttentionBackward(q.data(), k.data(), v.data(), g.data(), lse.data(), dq.data(), dk.data(), dv.data(),
                                  shape, cpuScratch.data());
    float *dOut = zeros(qn), *ddq = zeros(qn), *ddk = zeros(kvn), *ddv = zeros(kvn), *dLse = zeros(rows);
    void *scratch = alloc(cuda::groupedAttentionScratchBytes(shape, precision, /*backward=*/true));
    Status s = cuda::groupedAttentionForward(blas_, precision, up(q), up(k), up(v), dOut, dLse, shape, scratch, nullptr);
    ASSERT_TRUE(s.isOk()) << s.message();
    s = cuda::groupedAttentionBackward(blas_, precision, up(q), up(k), up(v), up(g), dLse, ddq, ddk, ddv, shape, scratch,
                                       nullptr);
    ASSERT_TRUE(s.isOk()) << s.message();
    std::string what = std::to_string(heads) + " heads / " + std::to_string(kvHeads) + " KV from " + std::to_string(first);
    EXPECT_LT(relErr(down(dOut, qn), out), tolerance(precision)) << what;
    expectStatistics(down(dLse, rows), lse, tolerance(precision), what);
    EXPECT_LT(relErr(down(ddq, qn), dq), tolerance(precision)) << what;
    EXPECT_LT(relErr(down(ddk, kvn), dk), tolerance(precision)) << what;
    EXPECT_LT(relErr(down(ddv, kvn), dv), tolerance(precision)) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, GroupedAttention,
                         ::testing::Values(cuda::Precision::kFp32, cuda::Precision::kBf16, cuda::Precision::kFp16),
                         [](const auto &info) { return std::string(cuda::precisionName(info.param)); });

// Refused before anything reaches the device: runs without a GPU too.
TEST(CudaAttentionLimits, AnEmptyShapeIsRefusedWithAMessage) {
  cpu::AttentionShape shape{1, 0, 1, 8, true, 0.0f, 1, 1};
  Status s = cuda::attentionForward(nullptr, cuda::Precision::kBf16, nullptr, nullptr, nullptr, nullptr, shape, nullptr,
                                    nullptr);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("empty shape"), std::string::npos) << s.message();
  cpu::AttentionShape wide{1, 8, 1, 256, true, 0.0f, 1, 1};
  s = cuda::flashAttentionForward(nullptr, nullptr, nullptr, nullptr, wide, nullptr);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("head size 256"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace loom
