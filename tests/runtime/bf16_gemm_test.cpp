// gemmBf16 (runtime/cpu/Gemm.h) against a double-precision product of the same bf16 values:
// every layout, tile edges, a bias, bf16 and fp32 results and fp32 accumulation (kF32Add), the
// same bits at 1, 2 and 3 threads.
// Built twice: on the processor's bf16 instructions where it has them, and (LOOM_FORCE_FP32_GEMM)
// with oneDNN held to AVX-512 without bf16, which takes the fp32 fallback.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/cpu/Gemm.h"
#include "runtime/cpu/HalfPrecision.h"
#include "runtime/cpu/Parallel.h"

#ifdef LOOM_FORCE_FP32_GEMM
// Before oneDNN first reads it (it does on the first ISA query).
static const int kHoldIsa = setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE", 1);
#endif

namespace loom::cpu {
namespace {

std::vector<uint16_t> randomBf16(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (uint16_t &x : v) x = floatToBf16(d(gen));
  return v;
}

struct Case {
  bool ta, tb;
  int64_t m, n, k;
  bool bias;
};

// C = op(A) op(B) (+ bias) in double, and sum |a b| per element (the error bound's scale).
void reference(const Case &c, const std::vector<uint16_t> &a, const std::vector<uint16_t> &b,
               const std::vector<uint16_t> &bias, std::vector<double> *out, std::vector<double> *scale) {
  out->assign(size_t(c.m * c.n), 0), scale->assign(size_t(c.m * c.n), 0);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double s = c.bias ? bf16ToFloat(bias[size_t(j)]) : 0, abs = std::fabs(s);
      for (int64_t p = 0; p < c.k; ++p) {
        double x = bf16ToFloat(a[size_t(c.ta ? p * c.m + i : i * c.k + p)]);
        double y = bf16ToFloat(b[size_t(c.tb ? j * c.k + p : p * c.n + j)]);
        s += x * y, abs += std::fabs(x * y);
      }
      (*out)[size_t(i * c.n + j)] = s, (*scale)[size_t(i * c.n + j)] = abs;
    }
}

constexpr float kBefore = -7.0f;

std::vector<uint32_t> run(const Case &c, const std::vector<uint16_t> &a, const std::vector<uint16_t> &b,
                          const std::vector<uint16_t> &bias, GemmOut out) {
  std::vector<uint32_t> bits(size_t(c.m * c.n));
  if (out != GemmOut::kBf16) {
    std::vector<float> y(size_t(c.m * c.n), kBefore);  // kF32 overwrites it, kF32Add adds to it
    gemmBf16(c.ta, c.tb, c.m, c.n, c.k, a.data(), c.ta ? c.m : c.k, b.data(), c.tb ? c.k : c.n,
             c.bias ? bias.data() : nullptr, y.data(), out, c.n);
    std::memcpy(bits.data(), y.data(), bits.size() * 4);
  } else {
    std::vector<uint16_t> y(size_t(c.m * c.n), 0xffff);
    gemmBf16(c.ta, c.tb, c.m, c.n, c.k, a.data(), c.ta ? c.m : c.k, b.data(), c.tb ? c.k : c.n,
             c.bias ? bias.data() : nullptr, y.data(), out, c.n);
    for (size_t i = 0; i < y.size(); ++i) bits[i] = y[i];
  }
  return bits;
}

float value(uint32_t bits, GemmOut out) {
  if (out == GemmOut::kBf16) return bf16ToFloat(uint16_t(bits));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(Bf16Gemm, MatchesTheProductAtEveryLayoutAndThreadCount) {
#ifdef LOOM_FORCE_FP32_GEMM
  ASSERT_FALSE(nativeBf16Gemm()) << "ONEDNN_MAX_CPU_ISA did not hold oneDNN below bf16";
#else
  std::printf("bf16 GEMM on %s\n", nativeBf16Gemm() ? "the processor's bf16 instructions" : "the fp32 fallback");
#endif
  const Case cases[] = {{false, false, 300, 270, 129, true},  {false, true, 64, 513, 200, false},
                        {true, false, 257, 96, 301, false},   {true, true, 33, 47, 17, true},
                        {false, false, 1, 1, 1, false},       {false, true, 520, 8, 1000, true}};
  for (const Case &c : cases)
    for (GemmOut out : {GemmOut::kF32, GemmOut::kBf16, GemmOut::kF32Add}) {
      auto a = randomBf16(size_t(c.m * c.k), 1), b = randomBf16(size_t(c.k * c.n), 2), bias = randomBf16(size_t(c.n), 3);
      std::vector<double> want, scale;
      reference(c, a, b, bias, &want, &scale);
      if (out == GemmOut::kF32Add)
        for (size_t i = 0; i < want.size(); ++i) want[i] += kBefore, scale[i] += std::fabs(kBefore);
      openblas_set_num_threads(1);
      std::vector<uint32_t> one = run(c, a, b, bias, out);
      for (size_t i = 0; i < one.size(); ++i) {
        // fp32 summation: at most about k ulps of the sum of |products|; a bf16 result also
        // carries its own rounding (half a bf16 ulp, 2^-9 relative).
        double bound = double(c.k + 2) * std::ldexp(1.0, -24) * scale[i];
        if (out == GemmOut::kBf16) bound += std::fabs(want[i]) * std::ldexp(1.0, -8);
        ASSERT_LE(std::fabs(value(one[i], out) - want[i]), bound)
            << "m=" << c.m << " n=" << c.n << " k=" << c.k << " element " << i;
      }
      for (int threads : {2, 3}) {
        openblas_set_num_threads(threads);
        ASSERT_EQ(kernelThreads(), threads);
        EXPECT_EQ(one, run(c, a, b, bias, out)) << "m=" << c.m << " n=" << c.n << " k=" << c.k << ": " << threads
                                                << " threads differ from 1";
      }
      openblas_set_num_threads(1);
    }
}

// An empty reduction gives the bias alone.
TEST(Bf16Gemm, EmptyReductionIsTheBias) {
  std::vector<uint16_t> bias = randomBf16(5, 4), none;
  std::vector<float> y(15, -1.0f);
  gemmBf16(false, false, 3, 5, 0, none.data(), 0, none.data(), 5, bias.data(), y.data(), GemmOut::kF32, 5);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(y[size_t(i)], bf16ToFloat(bias[size_t(i % 5)]));
}

}  // namespace
}  // namespace loom::cpu
