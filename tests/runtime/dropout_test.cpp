// Dropout from the counter-based generator: the keep fraction is 1 - rate, kept values are
// scaled by 1 / (1 - rate), and masks depend only on (seed, stream, index): the same from any
// thread, in any order, and different across streams and seeds.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "runtime/cpu/Kernels.h"

namespace loom::cpu {
namespace {

TEST(Dropout, KeepsOneMinusRateAndScales) {
  const int64_t n = 200000;
  std::vector<float> x(n, 2.0f), y(n);
  dropoutForward(x.data(), y.data(), n, 0.1f, 7, 3);
  int64_t kept = 0;
  for (float v : y) {
    if (v != 0) {
      ++kept;
      EXPECT_FLOAT_EQ(v, 2.0f / 0.9f);
    }
  }
  EXPECT_NEAR(double(kept) / n, 0.9, 0.005);
}

TEST(Dropout, MasksDependOnlyOnSeedStreamAndIndex) {
  const int64_t n = 4096;
  std::vector<float> x(n, 1.0f), whole(n), pieces(n), other(n), otherSeed(n);
  dropoutForward(x.data(), whole.data(), n, 0.5f, 11, 5);
  // Computed by 4 threads, each on a quarter: the same mask (the kernel's index is global,
  // so each quarter is computed as a prefix of the full range and the quarter copied).
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> tmp(n);
      dropoutForward(x.data(), tmp.data(), (t + 1) * n / 4, 0.5f, 11, 5);
      std::copy(tmp.begin() + t * n / 4, tmp.begin() + (t + 1) * n / 4, pieces.begin() + t * n / 4);
    });
  for (auto &t : threads) t.join();
  EXPECT_EQ(whole, pieces);
  dropoutForward(x.data(), other.data(), n, 0.5f, 11, 6);
  dropoutForward(x.data(), otherSeed.data(), n, 0.5f, 12, 5);
  EXPECT_NE(whole, other);
  EXPECT_NE(whole, otherSeed);
}

}  // namespace
}  // namespace loom::cpu
