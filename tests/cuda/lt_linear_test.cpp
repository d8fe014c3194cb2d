// The cuBLASLt linear (bf16 and fp16 operands, fp32 accumulation, bias and bias+GeLU
// epilogues, W stored either way; forward, dX and accumulated dW) against the CPU linear
// kernels on the same rounded inputs: the
// operands are rounded to 16 bits on the device and read back, so the two sides multiply the
// same numbers and differ only in summation order (relative L2 error < 1e-5; 1e-4 with
// the GeLU epilogue). Skipped, with a
// message saying so, where no GPU is present (CI); run by the GPU check script when one is lent.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/HalfPrecision.h"
#include "runtime/cuda/LtLinear.h"
#include "tests/cuda/DeviceTest.h"

namespace loom {
namespace {

using cuda::HalfType;
using cuda::LinearEpilogue;

class LtLinearTest : public DeviceTest<::testing::TestWithParam<std::tuple<HalfType, LinearEpilogue, bool>>> {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    Status s = cuda::LtLinear::create(32 << 20, &lt_);
    ASSERT_TRUE(s.isOk()) << s.message();
  }
  // Rounds host values to 16 bits on the device: returns the 16-bit buffer and, in `rounded`,
  // the fp32 values it holds.
  void *toHalf(const std::vector<float> &host, HalfType type, std::vector<float> *rounded) {
    void *half = alloc(host.size() * 2);
    float *back = static_cast<float *>(alloc(host.size() * sizeof(float)));
    cuda::floatToHalf(up(host), half, int64_t(host.size()), type, nullptr);
    cuda::halfToFloat(half, back, int64_t(host.size()), type, nullptr);
    *rounded = down(back, host.size());
    return half;
  }
  std::unique_ptr<cuda::LtLinear> lt_;
};

TEST_P(LtLinearTest, MatchesCpuLinear) {
  auto [type, epilogue, transposeW] = GetParam();
  cuda::LinearShape shape{/*m=*/96, /*k=*/256, /*n=*/200, transposeW, type, epilogue};
  std::vector<float> x, w, bias = random(shape.n);
  void *dx = toHalf(random(shape.m * shape.k), type, &x);
  void *dw = toHalf(random(shape.k * shape.n), type, &w);
  // The output 64 bytes into its allocation, as arena buffers are (the memory plan's unit):
  // cuBLASLt must not pick a kernel that assumes 256-byte alignment.
  float *dy = static_cast<float *>(alloc(shape.m * shape.n * sizeof(float) + 64)) + 16;
  Status s = lt_->forward(shape, dx, dw, up(bias), dy, nullptr);
  ASSERT_TRUE(s.isOk()) << s.message();
  std::vector<float> got = down(dy, shape.m * shape.n), want(got.size());

  bool withBias = epilogue != LinearEpilogue::kNone;
  cpu::linearForward(x.data(), w.data(), withBias ? bias.data() : nullptr, want.data(), shape.m, shape.k, shape.n,
                     transposeW);
  if (epilogue == LinearEpilogue::kBiasGelu) cpu::geluForward(want.data(), want.data(), int64_t(want.size()));
  // cuBLASLt's GeLU epilogue evaluates tanh its own way: allow it 1e-4.
  double tolerance = epilogue == LinearEpilogue::kBiasGelu ? 1e-4 : 1e-5;
  EXPECT_LT(relErr(got, want), tolerance) << cuda::halfTypeName(type);
}

TEST_P(LtLinearTest, InputAndWeightGradientsMatchCpu) {
  auto [type, epilogue, transposeW] = GetParam();
  cuda::LinearShape shape{/*m=*/96, /*k=*/256, /*n=*/200, transposeW, type, epilogue};
  std::vector<float> x, w, g;
  void *dx16 = toHalf(random(shape.m * shape.k), type, &x);
  void *dw16 = toHalf(random(shape.k * shape.n), type, &w);
  void *dg16 = toHalf(random(shape.m * shape.n), type, &g);

  float *dx = static_cast<float *>(alloc(x.size() * sizeof(float)));
  Status s = lt_->inputGrad(shape, dg16, dw16, dx, nullptr);
  ASSERT_TRUE(s.isOk()) << s.message();
  std::vector<float> wantDx(x.size());  // dX = g W^T: a linear of g by W read the other way
  cpu::linearForward(g.data(), w.data(), nullptr, wantDx.data(), shape.m, shape.n, shape.k, !transposeW);
  EXPECT_LT(relErr(down(dx, x.size()), wantDx), 1e-5) << "dX, " << cuda::halfTypeName(type);

  // The weight gradient accumulates into an fp32 buffer that already holds a gradient.
  std::vector<float> earlier = random(w.size()), wantDw = earlier;
  float *dw = up(earlier);
  s = lt_->weightGrad(shape, dx16, dg16, dw, /*accumulate=*/true, nullptr);
  ASSERT_TRUE(s.isOk()) << s.message();
  cpu::linearWeightGrad(x.data(), g.data(), wantDw.data(), shape.m, shape.k, shape.n, transposeW, true);
  EXPECT_LT(relErr(down(dw, w.size()), wantDw), 1e-5) << "dW, " << cuda::halfTypeName(type);
}

TEST_P(LtLinearTest, RejectsAnEmptyShapeNamingIt) {
  auto [type, epilogue, transposeW] = GetParam();
  cuda::LinearShape shape{0, 16, 16, transposeW, type, epilogue};
  Status s = lt_->forward(shape, nullptr, nullptr, nullptr, nullptr, nullptr);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("m=0"), std::string::npos) << s.message();
}

// A 16-bit plan's products with very few output columns (bert-tiny's sentence-order head: n = 2,
// rows 4 bytes apart) with a 16-bit output and bias, and their gradients: cuBLASLt must find an
// algorithm for them (LtLinear fails in one line when its heuristic returns none) and compute
// them as the CPU does, each 16-bit output within its one rounding.
TEST_P(LtLinearTest, SixteenBitOutputsWithFewColumns) {
  auto [type, epilogue, transposeW] = GetParam();
  if (epilogue == LinearEpilogue::kBiasGelu) GTEST_SKIP() << "no GeLU after the heads this covers";
  cuda::ElementType element = type == HalfType::kBf16 ? cuda::ElementType::kBf16 : cuda::ElementType::kF16;
  double rounding = type == HalfType::kBf16 ? 1e-2 : 2e-3;  // one rounding of each 16-bit output
  for (int64_t n : {2, 3}) {
    cuda::LinearShape shape{/*m=*/64, /*k=*/32, n, transposeW, type, epilogue};
    std::vector<float> x, w, bias, g;
    void *x16 = toHalf(random(shape.m * shape.k), type, &x);
    void *w16 = toHalf(random(shape.k * shape.n), type, &w);
    void *bias16 = toHalf(random(shape.n), type, &bias);
    void *g16 = toHalf(random(shape.m * shape.n), type, &g);
    void *y16 = alloc(size_t(shape.m * shape.n) * 2);
    bool withBias = epilogue != LinearEpilogue::kNone;
    Status s = lt_->forward(shape, x16, w16, cuda::In(bias16, element), cuda::Out(y16, element), nullptr);
    ASSERT_TRUE(s.isOk()) << "n = " << n << ": " << s.message();
    float *y = static_cast<float *>(alloc(size_t(shape.m * shape.n) * sizeof(float)));
    cuda::halfToFloat(y16, y, shape.m * shape.n, type, nullptr);
    std::vector<float> want(size_t(shape.m * shape.n));
    cpu::linearForward(x.data(), w.data(), withBias ? bias.data() : nullptr, want.data(), shape.m, shape.k, shape.n,
                       transposeW);
    EXPECT_LT(relErr(down(y, want.size()), want), rounding) << "y, n = " << n << ", " << cuda::halfTypeName(type);

    void *dx16 = alloc(size_t(shape.m * shape.k) * 2);
    s = lt_->inputGrad(shape, g16, w16, cuda::Out(dx16, element), nullptr);
    ASSERT_TRUE(s.isOk()) << "n = " << n << ": " << s.message();
    float *dx = static_cast<float *>(alloc(x.size() * sizeof(float)));
    cuda::halfToFloat(dx16, dx, int64_t(x.size()), type, nullptr);
    std::vector<float> wantDx(x.size());
    cpu::linearForward(g.data(), w.data(), nullptr, wantDx.data(), shape.m, shape.n, shape.k, !transposeW);
    EXPECT_LT(relErr(down(dx, x.size()), wantDx), rounding) << "dX, n = " << n << ", " << cuda::halfTypeName(type);

    float *dw = zeros(w.size());
    s = lt_->weightGrad(shape, x16, g16, dw, /*accumulate=*/false, nullptr);
    ASSERT_TRUE(s.isOk()) << "n = " << n << ": " << s.message();
    std::vector<float> wantDw(w.size(), 0.0f);
    cpu::linearWeightGrad(x.data(), g.data(), wantDw.data(), shape.m, shape.k, shape.n, transposeW, false);
    EXPECT_LT(relErr(down(dw, w.size()), wantDw), 1e-5) << "dW, n = " << n << ", " << cuda::halfTypeName(type);
  }
}

INSTANTIATE_TEST_SUITE_P(
    TypesEpiloguesLayouts, LtLinearTest,
    ::testing::Combine(::testing::Values(HalfType::kBf16, HalfType::kFp16),
                       ::testing::Values(LinearEpilogue::kNone, LinearEpilogue::kBias, LinearEpilogue::kBiasGelu),
                       ::testing::Bool()));

}  // namespace
}  // namespace loom
