// The CPU kernels split their rows, elements and reductions over the rank's threads; each must
// give the same bits whatever the thread count (fixed chunks, rows done alike), so 1 and 2
// threads (and 3, an uneven split) are compared bit for bit on shapes large enough to split.
// Built twice: as the processor runs it, and (LOOM_FORCE_AVX2, thread_count_avx2_test) with
// oneDNN held to AVX2, where the fp32 GEMM cuts C into fixed tiles of its own.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "runtime/cpu/Gemm.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Optimizer.h"
#include "runtime/cpu/Parallel.h"

#ifdef LOOM_FORCE_AVX2
// Before oneDNN first reads it: the fp32 GEMM's tiled path (runtime/cpu/Gemm.cpp) on a processor
// with AVX-512 too.
static const int kHoldIsa = setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
#endif

namespace loom::cpu {
namespace {

std::vector<float> randomVector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float &x : v) x = d(gen);
  return v;
}

// Runs `kernel` (which writes its outputs into the vector it returns) at 1, 2 and 3 threads.
void expectSameAtEveryThreadCount(const char *name, const std::function<std::vector<float>()> &kernel) {
  openblas_set_num_threads(1);
  std::vector<float> one = kernel();
  for (int threads : {2, 3}) {
    openblas_set_num_threads(threads);
    ASSERT_EQ(kernelThreads(), threads) << "OpenBLAS capped the thread count: the split would not be tested";
    std::vector<float> many = kernel();
    ASSERT_EQ(one.size(), many.size()) << name;
    EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float)))
        << name << ": " << threads << " threads differ from 1";
  }
  openblas_set_num_threads(1);
}

constexpr int64_t kRows = 300, kCols = 260;  // not multiples of the chunk or lane widths

TEST(ThreadCount, LayerNormAndRmsNorm) {
  auto x = randomVector(kRows * kCols, 1), g = randomVector(kRows * kCols, 2), gamma = randomVector(kCols, 3),
       beta = randomVector(kCols, 4);
  expectSameAtEveryThreadCount("layer norm", [&] {
    std::vector<float> y(x.size()), dx(x.size()), dgamma(kCols), dbeta(kCols);
    layerNormForward(x.data(), gamma.data(), beta.data(), y.data(), kRows, kCols, 1e-5f);
    layerNormBackward(x.data(), gamma.data(), g.data(), dx.data(), dgamma.data(), dbeta.data(), kRows, kCols, 1e-5f);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dgamma.begin(), dgamma.end());
    y.insert(y.end(), dbeta.begin(), dbeta.end());
    return y;
  });
  expectSameAtEveryThreadCount("rms norm", [&] {
    std::vector<float> y(x.size()), dx(x.size()), dgamma(kCols);
    rmsNormForward(x.data(), gamma.data(), y.data(), kRows, kCols, 1e-5f);
    rmsNormBackward(x.data(), gamma.data(), g.data(), dx.data(), dgamma.data(), kRows, kCols, 1e-5f);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dgamma.begin(), dgamma.end());
    return y;
  });
}

TEST(ThreadCount, ElementwiseBiasAndEmbedding) {
  const int64_t n = 5 * 16384 + 77;
  auto x = randomVector(n, 5), g = randomVector(n, 6);
  expectSameAtEveryThreadCount("gelu, swiglu, dropout", [&] {
    std::vector<float> y(n), dx(n), s(n), dgate(n), dup(n), d(n);
    geluForward(x.data(), y.data(), n);
    geluBackward(x.data(), g.data(), dx.data(), n);
    swigluForward(x.data(), g.data(), s.data(), n);
    swigluBackward(x.data(), g.data(), y.data(), dgate.data(), dup.data(), n);
    dropoutForward(x.data(), d.data(), n, 0.1f, 1234, 7);
    for (auto *v : {&dx, &s, &dgate, &dup, &d}) y.insert(y.end(), v->begin(), v->end());
    return y;
  });
  auto grad = randomVector(kRows * kCols, 7);
  std::vector<int32_t> tokens(kRows);
  for (int64_t t = 0; t < kRows; ++t) tokens[size_t(t)] = int32_t((t * 37) % 50);  // repeated rows
  expectSameAtEveryThreadCount("bias and embedding gradients", [&] {
    std::vector<float> db(kCols), dword(50 * kCols), dpos(100 * kCols);
    biasGrad(grad.data(), db.data(), kRows, kCols);
    embeddingBackward(tokens.data(), grad.data(), dword.data(), kRows, kCols, 0, 50);
    positionBackward(grad.data(), dpos.data(), 3, 100, kCols, 100);
    db.insert(db.end(), dword.begin(), dword.end());
    db.insert(db.end(), dpos.begin(), dpos.end());
    return db;
  });
}

TEST(ThreadCount, Rotary) {
  // 2 x 150 rows of 4 heads of 64: rows split over the threads; the tables are per thread.
  constexpr int64_t batch = 2, seq = 150, heads = 4, headDim = 64;
  auto x = randomVector(batch * seq * heads * headDim, 9);
  expectSameAtEveryThreadCount("rotary", [&] {
    std::vector<float> y(x.size()), back(x.size());
    rotary(x.data(), y.data(), batch, seq, heads, headDim, 10000.0f, false);
    rotary(y.data(), back.data(), batch, seq, heads, headDim, 10000.0f, true);
    y.insert(y.end(), back.begin(), back.end());
    return y;
  });
}

// The GEMMs (oneDNN's, runtime/cpu/Gemm) at the demo's output-layer shapes, trimmed (its
// forward, dX and dW), each also checked against a double-precision product.
TEST(ThreadCount, GemmLinearAndWeightGrad) {
  const int64_t m = 96, k = 128, n = 3000;
  auto x = randomVector(m * k, 10), w = randomVector(n * k, 11, 0.02f), bias = randomVector(n, 12),
       g = randomVector(m * n, 13);
  std::vector<float> first;
  expectSameAtEveryThreadCount("linear, its dX and dW", [&] {
    std::vector<float> y(m * n), dx(m * k), dw(n * k);
    linearForward(x.data(), w.data(), bias.data(), y.data(), m, k, n, /*transposeW=*/true);
    linearForward(g.data(), w.data(), nullptr, dx.data(), m, n, k, /*transposeW=*/false);  // dX = g W
    linearWeightGrad(x.data(), g.data(), dw.data(), m, k, n, /*transposeW=*/true, /*accumulate=*/false);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    if (first.empty()) first = y;
    return y;
  });
  // y = x W^T + b, dx = g W, dW = g^T x, against double sums (relative to the terms' size).
  auto expectClose = [&](const char *what, int64_t rows, int64_t cols, int64_t inner, size_t offset,
                         const std::function<double(int64_t, int64_t, int64_t)> &term, const float *add) {
    for (int64_t r = 0; r < rows; r += 7)
      for (int64_t c = 0; c < cols; c += 5) {
        double sum = add ? add[c] : 0.0, scale = 0;
        for (int64_t i = 0; i < inner; ++i) sum += term(r, c, i), scale += std::abs(term(r, c, i));
        ASSERT_NEAR(first[offset + r * cols + c], sum, 1e-5 * (scale + 1)) << what << " [" << r << ", " << c << "]";
      }
  };
  expectClose("y", m, n, k, 0, [&](int64_t r, int64_t c, int64_t i) { return double(x[r * k + i]) * w[c * k + i]; },
              bias.data());
  expectClose("dx", m, k, n, m * n, [&](int64_t r, int64_t c, int64_t i) { return double(g[r * n + i]) * w[i * k + c]; },
              nullptr);
  expectClose("dW", n, k, m, m * n + m * k,
              [&](int64_t r, int64_t c, int64_t i) { return double(g[i * n + r]) * x[i * k + c]; }, nullptr);
}

// Operands whose rows are 4 KiB apart (k = 1024 and n = 2048 floats): where the fp32 GEMM is cut
// into tiles (no AVX-512; thread_count_avx2_test holds oneDNN to AVX2) their panels are copied to
// another stride first. Every role is copied here: A (x in y = x W^T), A transposed (g in
// dW = g^T x), B transposed (W in y) and B (W in dx = g W, x in dW). The products must not depend
// on the thread count, nor on the copies: the same operands at a stride that needs none give the
// same bits.
TEST(ThreadCount, GemmOperandsWithFourKibStrides) {
  const int64_t m = 40, k = 1024, n = 2048, pad = 16;
  auto x = randomVector(m * k, 20), w = randomVector(n * k, 21, 0.02f), g = randomVector(m * n, 22);
  // The same matrices with rows of k + pad (n + pad) floats.
  auto padded = [](const std::vector<float> &v, int64_t rows, int64_t cols, int64_t extra) {
    std::vector<float> out(size_t(rows * (cols + extra)), 0.0f);
    for (int64_t r = 0; r < rows; ++r) std::copy(&v[r * cols], &v[r * cols] + cols, &out[r * (cols + extra)]);
    return out;
  };
  auto xp = padded(x, m, k, pad), wp = padded(w, n, k, pad), gp = padded(g, m, n, pad);
  auto products = [&](bool paddedOperands) {
    const float *X = paddedOperands ? xp.data() : x.data(), *W = paddedOperands ? wp.data() : w.data(),
                *G = paddedOperands ? gp.data() : g.data();
    int64_t ldk = paddedOperands ? k + pad : k, ldn = paddedOperands ? n + pad : n;
    std::vector<float> y(m * n), dx(m * k), dw(n * k);
    gemm(false, true, m, n, k, 1.0f, X, ldk, W, ldk, 0.0f, y.data(), n);    // y = x W^T
    gemm(false, false, m, k, n, 1.0f, G, ldn, W, ldk, 0.0f, dx.data(), k);  // dx = g W
    gemm(true, false, n, k, m, 1.0f, G, ldn, X, ldk, 0.0f, dw.data(), k);   // dW = g^T x
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  std::vector<float> strided;
  expectSameAtEveryThreadCount("4 KiB strides", [&] { return strided = products(false); });
  std::vector<float> unstrided = products(true);
  EXPECT_EQ(0, std::memcmp(strided.data(), unstrided.data(), strided.size() * sizeof(float)))
      << "the products of 4 KiB-strided operands differ from the same operands at another stride";
  for (int64_t r = 0; r < m; r += 7)  // y against a double sum
    for (int64_t c = 0; c < n; c += 97) {
      double sum = 0, scale = 0;
      for (int64_t i = 0; i < k; ++i) sum += double(x[r * k + i]) * w[c * k + i], scale += std::abs(x[r * k + i] * w[c * k + i]);
      ASSERT_NEAR(strided[r * n + c], sum, 1e-5 * (scale + 1)) << "y [" << r << ", " << c << "]";
    }
}

TEST(ThreadCount, CrossEntropy) {
  const int64_t tokens = 70, cols = 1000, valid = 990;
  auto logits = randomVector(tokens * cols, 8, 3.0f);
  std::vector<int32_t> labels(tokens);
  for (int64_t t = 0; t < tokens; ++t) labels[size_t(t)] = int32_t((t * 131) % valid);
  expectSameAtEveryThreadCount("cross-entropy", [&] {
    std::vector<float> mx(tokens), sum(tokens), target(tokens), lse(tokens), d(tokens * cols);
    crossEntropyLocalMax(logits.data(), mx.data(), tokens, cols, 0, valid);
    crossEntropyLocalSums(logits.data(), labels.data(), mx.data(), sum.data(), target.data(), tokens, cols, 0, valid);
    crossEntropyLogSumExp(mx.data(), sum.data(), lse.data(), tokens);
    crossEntropyBackward(logits.data(), labels.data(), nullptr, lse.data(), 1.0f, d.data(), tokens, cols, 0, valid);
    d.push_back(crossEntropyLoss(mx.data(), sum.data(), target.data(), nullptr, tokens));
    return d;
  });
}

TEST(ThreadCount, OptimizerNormAndAdamW) {
  const int64_t n = 3 * 65536 + 1001;
  auto param = randomVector(n, 9), grad = randomVector(n, 10, 0.01f);
  std::vector<planattr::FlatSegment> segments(2);
  segments[0].offset = 0, segments[0].count = 70000, segments[0].norm = true, segments[0].decay = true;
  segments[1].offset = 70000, segments[1].count = n - 70000, segments[1].norm = true;
  expectSameAtEveryThreadCount("grad norm and adamw", [&] {
    std::vector<float> m(n, 0.0f), v(n, 0.0f), out(n);
    float squares = sumSquares(grad.data(), segments, FlatRange{0, n}, true);
    AdamWHyper h;
    h.lr = 1e-3f, h.weightDecay = 0.1f;
    for (int step = 1; step <= 2; ++step) {
      h.step = float(step);
      adamwFlat(param.data(), grad.data(), m.data(), v.data(), out.data(), segments, FlatRange{0, n}, h);
    }
    out.push_back(squares);
    out.insert(out.end(), m.begin(), m.end());
    return out;
  });
}

TEST(ThreadCount, PoolRunsEveryPartOnceOnItsOwnThread) {
  openblas_set_num_threads(3);
  for (int round = 0; round < 200; ++round) {
    std::vector<int> hits(1000, 0);
    std::vector<std::thread::id> owner(3);
    parallelFor(1000, 1, [&](int64_t b, int64_t e) {
      for (int part = 0; part < 3; ++part)
        if (1000 * part / 3 == b) owner[size_t(part)] = std::this_thread::get_id();
      for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];
    });
    for (int h : hits) ASSERT_EQ(h, 1);
    EXPECT_NE(owner[0], owner[1]);
    EXPECT_NE(owner[1], owner[2]);
    EXPECT_EQ(owner[0], std::this_thread::get_id());
  }
  // A split inside a part runs on that part's thread (no deadlock on the one pool).
  std::vector<int> hits(100, 0);
  parallelFor(4, 1, [&](int64_t b, int64_t e) {
    for (int64_t outer = b; outer < e; ++outer)
      parallelFor(25, 1, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) ++hits[size_t(outer * 25 + i)];
      });
  });
  for (int h : hits) EXPECT_EQ(h, 1);
  openblas_set_num_threads(1);
}

}  // namespace
}  // namespace loom::cpu
