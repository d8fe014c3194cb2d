// The CUDA kernels against the CPU kernels on the same inputs (fp32, relative error < 1e-5;
// dropout bit-identical: the same counter-based generator). Skipped, with a message saying
// so, where no GPU is present (CI); run by the GPU check script when one is lent.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/CudaKernels.h"
#include "tests/cuda/DeviceTest.h"

namespace loom {
namespace {

using CudaKernels = DeviceTest<>;

// Shapes for each path of the backward: a block per row (37 rows), runs of rows per block
// summing dgamma/dbeta in shared memory (3000 rows), per-element atomics when 2n floats do not
// fit in shared memory (n 6000).
TEST_F(CudaKernels, LayerNormForwardAndBackward) {
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{37, 300}, {3000, 64}, {5, 6000}}) {
    auto x = random(rows * n), gamma = random(n), beta = random(n), g = random(rows * n);
    std::vector<float> y(rows * n), dx(rows * n), dg(n), db(n);
    cpu::layerNormForward(x.data(), gamma.data(), beta.data(), y.data(), rows, n, 1e-5f);
    cpu::layerNormBackward(x.data(), gamma.data(), g.data(), dx.data(), dg.data(), db.data(), rows, n, 1e-5f);
    float *dy = zeros(rows * n), *ddx = zeros(rows * n), *ddg = zeros(n), *ddb = zeros(n);
    cuda::layerNormForward(up(x), up(gamma), up(beta), dy, rows, n, 1e-5f, 0);
    cuda::layerNormBackward(up(x), up(gamma), up(g), ddx, ddg, ddb, rows, n, 1e-5f, 0);
    EXPECT_LT(relErr(down(dy, rows * n), y), 1e-5) << rows << "x" << n;
    EXPECT_LT(relErr(down(ddx, rows * n), dx), 1e-5) << rows << "x" << n;
    EXPECT_LT(relErr(down(ddg, n), dg), 1e-5) << rows << "x" << n;
    EXPECT_LT(relErr(down(ddb, n), db), 1e-5) << rows << "x" << n;
  }
}

TEST_F(CudaKernels, BroadcastAddsAndTheirGradients) {
  int64_t batch = 3, seq = 29, hidden = 40, rows = batch * seq, positions = 50;
  auto x = random(rows * hidden), bias = random(hidden), table = random(positions * hidden);
  std::vector<float> withBias(x.size()), withPosition(x.size()), db(hidden), dpos(positions * hidden);
  for (size_t i = 0; i < x.size(); ++i) withBias[i] = x[i] + bias[i % hidden];
  cpu::addPositionForward(x.data(), table.data(), withPosition.data(), batch, seq, hidden);
  cpu::biasGrad(x.data(), db.data(), rows, hidden);
  cpu::positionBackward(x.data(), dpos.data(), batch, seq, hidden, positions);

  float *dy = zeros(x.size()), *dp = zeros(x.size()), *ddb = zeros(hidden), *ddpos = zeros(dpos.size());
  cuda::addBroadcast(up(x), up(bias), dy, int64_t(x.size()), hidden, 0);
  cuda::addBroadcast(up(x), up(table), dp, int64_t(x.size()), seq * hidden, 0);
  cuda::sumRows(up(x), ddb, rows, hidden, 0);
  cuda::sumRows(up(x), ddpos, batch, seq * hidden, 0);  // table rows beyond seq stay zero
  EXPECT_EQ(down(dy, x.size()), withBias);
  EXPECT_EQ(down(dp, x.size()), withPosition);
  EXPECT_LT(relErr(down(ddb, hidden), db), 1e-6);
  EXPECT_LT(relErr(down(ddpos, dpos.size()), dpos), 1e-6);
}

TEST_F(CudaKernels, GeluForwardAndBackward) {
  int64_t n = 10000;
  auto x = random(n, 3), g = random(n);
  std::vector<float> y(n), dx(n);
  cpu::geluForward(x.data(), y.data(), n);
  cpu::geluBackward(x.data(), g.data(), dx.data(), n);
  float *dy = zeros(n), *ddx = zeros(n);
  cuda::geluForward(up(x), dy, n, 0);
  cuda::geluBackward(up(x), up(g), ddx, n, 0);
  EXPECT_LT(relErr(down(dy, n), y), 1e-5);
  EXPECT_LT(relErr(down(ddx, n), dx), 1e-5);
}

// The LLaMA family's kernels: RMSNorm (block per row, shared-memory and atomic dgamma paths),
// rotary embeddings and their inverse, SwiGLU.
TEST_F(CudaKernels, RmsNormForwardAndBackward) {
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{37, 300}, {3000, 64}, {5, 12000}}) {
    auto x = random(rows * n), gamma = random(n), g = random(rows * n);
    std::vector<float> y(rows * n), dx(rows * n), dg(n);
    cpu::rmsNormForward(x.data(), gamma.data(), y.data(), rows, n, 1e-5f);
    cpu::rmsNormBackward(x.data(), gamma.data(), g.data(), dx.data(), dg.data(), rows, n, 1e-5f);
    float *dy = zeros(rows * n), *ddx = zeros(rows * n), *ddg = zeros(n);
    cuda::rmsNormForward(up(x), up(gamma), dy, rows, n, 1e-5f, 0);
    cuda::rmsNormBackward(up(x), up(gamma), up(g), ddx, ddg, rows, n, 1e-5f, 0);
    EXPECT_LT(relErr(down(dy, rows * n), y), 1e-5) << rows << "x" << n;
    EXPECT_LT(relErr(down(ddx, rows * n), dx), 1e-5) << rows << "x" << n;
    EXPECT_LT(relErr(down(ddg, n), dg), 1e-5) << rows << "x" << n;
  }
}

TEST_F(CudaKernels, RotaryAndItsInverse) {
  int64_t batch = 2, seq = 300, heads = 3, hd = 16, n = batch * seq * heads * hd;
  auto x = random(n);
  for (bool inverse : {false, true}) {
    std::vector<float> y(n);
    cpu::rotary(x.data(), y.data(), batch, seq, heads, hd, 500000.0f, inverse);
    float *dy = zeros(n);
    cuda::rotary(up(x), dy, batch, seq, heads, hd, 500000.0f, inverse, 0);
    EXPECT_LT(relErr(down(dy, n), y), 1e-5) << (inverse ? "inverse" : "forward");
  }
}

TEST_F(CudaKernels, SwigluForwardAndBackward) {
  int64_t n = 10000;
  auto gate = random(n, 3), upv = random(n), g = random(n);
  std::vector<float> y(n), dgate(n), dup(n);
  cpu::swigluForward(gate.data(), upv.data(), y.data(), n);
  cpu::swigluBackward(gate.data(), upv.data(), g.data(), dgate.data(), dup.data(), n);
  float *dy = zeros(n), *ddg = zeros(n), *ddu = zeros(n);
  cuda::swigluForward(up(gate), up(upv), dy, n, 0);
  cuda::swigluBackward(up(gate), up(upv), up(g), ddg, ddu, n, 0);
  EXPECT_LT(relErr(down(dy, n), y), 1e-5);
  EXPECT_LT(relErr(down(ddg, n), dgate), 1e-5);
  EXPECT_LT(relErr(down(ddu, n), dup), 1e-5);
}

TEST_F(CudaKernels, DropoutMasksAreTheCpuMasks) {
  int64_t n = 5000;
  auto x = random(n);
  std::vector<float> y(n);
  cpu::dropoutForward(x.data(), y.data(), n, 0.1f, 42, 7);
  float *dy = zeros(n);
  cuda::dropoutForward(up(x), dy, n, 0.1f, 42, 7, 0);
  std::vector<float> got = down(dy, n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i] == 0, y[i] == 0) << i;
  EXPECT_LT(relErr(got, y), 1e-6);
}

TEST_F(CudaKernels, EmbeddingForwardAndBackward) {
  int64_t tokens = 64, seq = 16, hidden = 32, rows = 100;
  std::vector<int32_t> tok(tokens);
  for (int32_t &t : tok) t = int32_t(rng_() % 200);  // half outside the shard [50, 150)
  auto word = random(rows * hidden), pos = random(seq * hidden), g = random(tokens * hidden);
  std::vector<float> y(tokens * hidden), dw(rows * hidden);
  cpu::embeddingForward(tok.data(), word.data(), pos.data(), y.data(), tokens, seq, hidden, 50, rows);
  cpu::embeddingBackward(tok.data(), g.data(), dw.data(), tokens, hidden, 50, rows);
  float *dy = zeros(tokens * hidden), *ddw = zeros(rows * hidden);
  cuda::embeddingForward(up(tok), up(word), up(pos), dy, tokens, seq, hidden, 50, rows, 0);
  cuda::embeddingBackward(up(tok), up(g), ddw, tokens, hidden, 50, rows, 0);
  EXPECT_LT(relErr(down(dy, tokens * hidden), y), 1e-6);
  EXPECT_LT(relErr(down(ddw, rows * hidden), dw), 1e-5);
}

TEST_F(CudaKernels, CrossEntropyOverAPaddedVocabulary) {
  int64_t tokens = 24, cols = 300, valid = 290;
  auto logits = random(tokens * cols, 2);
  std::vector<int32_t> labels(tokens);
  for (int32_t &l : labels) l = int32_t(rng_() % valid);
  std::vector<float> mask(tokens, 1.0f), mx(tokens), sum(tokens), target(tokens), lse(tokens), d(tokens * cols);
  mask[3] = 0;
  cpu::crossEntropyLocalMax(logits.data(), mx.data(), tokens, cols, 0, valid);
  cpu::crossEntropyLocalSums(logits.data(), labels.data(), mx.data(), sum.data(), target.data(), tokens, cols, 0, valid);
  cpu::crossEntropyLogSumExp(mx.data(), sum.data(), lse.data(), tokens);
  cpu::crossEntropyBackward(logits.data(), labels.data(), mask.data(), lse.data(), 0.5f, d.data(), tokens, cols, 0,
                            valid);
  float *dl = up(logits), *dmx = zeros(tokens), *dsum = zeros(tokens), *dtarget = zeros(tokens),
        *dd = zeros(tokens * cols);
  int32_t *dlabels = up(labels);
  cuda::crossEntropyLocalMax(dl, dmx, tokens, cols, 0, valid, 0);
  cuda::crossEntropyLocalSums(dl, dlabels, dmx, dsum, dtarget, tokens, cols, 0, valid, 0);
  cuda::crossEntropyBackward(dl, dlabels, up(mask), up(lse), 0.5f / 23, dd, tokens, cols, 0, valid, 0);
  EXPECT_LT(relErr(down(dmx, tokens), mx), 1e-6);
  EXPECT_LT(relErr(down(dsum, tokens), sum), 1e-5);
  EXPECT_LT(relErr(down(dtarget, tokens), target), 1e-6);
  EXPECT_LT(relErr(down(dd, tokens * cols), d), 1e-5);
}

TEST_F(CudaKernels, AdamW) {
  int64_t n = 1000;
  auto p = random(n), g = random(n);
  std::vector<float> m(n, 0.0f), v(n, 0.0f), ref = p;
  // The CPU reference, written out (AdamW with bias correction, decoupled decay).
  for (int64_t i = 0; i < n; ++i) {
    double mi = 0.1 * g[i], vi = 0.05 * double(g[i]) * g[i];
    double update = (mi / 0.1) / (std::sqrt(vi / 0.05) + 1e-8) + 0.1 * ref[i];
    ref[i] = float(ref[i] - 1e-3 * update);
  }
  float *dp = up(p), *dm = up(m), *dv = up(v);
  cuda::adamwUpdate(dp, up(g), dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, true, 0);
  EXPECT_LT(relErr(down(dp, n), ref), 1e-5);
}

}  // namespace
}  // namespace loom
