// The CUDA kernels against the CPU kernels on the same inputs (fp32, relative error < 1e-5;
// dropout bit-identical: the same counter-based generator); on bf16 and fp16 storage, against
// themselves in fp32 on the same values, each result rounded once (bit for bit elementwise,
// within one 16-bit ulp after a row's reduction). Skipped, with a message saying so, where no
// GPU is present (CI); run by the GPU check script when one is lent.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/CudaKernels.h"
#include "tests/cuda/DeviceTest.h"

namespace loom {
namespace {

class CudaKernels : public DeviceTest<> {
 protected:
  void expectStorageRoundedOnce(cuda::ElementType t);
};

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

// GeLU (the MLP's) and tanh (BERT's pooler): elementwise, forward and backward.
TEST_F(CudaKernels, ActivationsForwardAndBackward) {
  struct Activation {
    const char *name;
    void (*cpuForward)(const float *, float *, int64_t);
    void (*cpuBackward)(const float *, const float *, float *, int64_t);
    void (*cudaForward)(cuda::In, cuda::Out, int64_t, cudaStream_t);
    void (*cudaBackward)(cuda::In, cuda::In, cuda::Out, int64_t, cudaStream_t);
  };
  for (const Activation &a : {Activation{"gelu", cpu::geluForward, cpu::geluBackward, cuda::geluForward, cuda::geluBackward},
                              Activation{"tanh", cpu::tanhForward, cpu::tanhBackward, cuda::tanhForward, cuda::tanhBackward}}) {
    int64_t n = 10000;
    auto x = random(n, 3), g = random(n);
    std::vector<float> y(n), dx(n);
    a.cpuForward(x.data(), y.data(), n);
    a.cpuBackward(x.data(), g.data(), dx.data(), n);
    float *dy = zeros(n), *ddx = zeros(n);
    a.cudaForward(up(x), dy, n, 0);
    a.cudaBackward(up(x), up(g), ddx, n, 0);
    EXPECT_LT(relErr(down(dy, n), y), 1e-5) << a.name;
    EXPECT_LT(relErr(down(ddx, n), dx), 1e-5) << a.name;
  }
}

// BERT's segment embeddings on a sequence-parallel slice (rows 5..12 of 20): each row plus its
// type's table row; the table's gradient, each type's rows summed (a type outside the table
// gives NaN rows, not another row).
TEST_F(CudaKernels, TokenTypesForwardAndBackward) {
  int64_t batch = 3, seq = 20, first = 5, rows = 8, hidden = 40, tableRows = 2;
  std::vector<int32_t> types(batch * seq);
  for (int32_t &t : types) t = int32_t(rng_() % 2);
  auto x = random(batch * rows * hidden), table = random(tableRows * hidden), g = random(batch * rows * hidden);
  std::vector<float> y(x.size()), dtable(tableRows * hidden, 0.0f);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < rows; ++s)
      for (int64_t h = 0; h < hidden; ++h) {
        int64_t at = (b * rows + s) * hidden + h, type = types[b * seq + first + s];
        y[at] = x[at] + table[type * hidden + h];
        dtable[type * hidden + h] += g[at];
      }
  float *dy = zeros(x.size()), *ddt = zeros(dtable.size());
  int32_t *dtypes = up(types);
  cuda::addTokenType(up(x), dtypes, up(table), dy, batch, rows, seq, first, hidden, tableRows, 0);
  cuda::tokenTypeGrad(dtypes, up(g), ddt, batch, rows, seq, first, hidden, tableRows, 0);
  EXPECT_EQ(down(dy, x.size()), y);
  EXPECT_LT(relErr(down(ddt, dtable.size()), dtable), 1e-6);

  types[first + 2] = 2;  // sample 0, row 2
  cuda::addTokenType(up(x), up(types), up(table), dy, batch, rows, seq, first, hidden, tableRows, 0);
  std::vector<float> bad = down(dy, x.size());
  EXPECT_TRUE(std::isnan(bad[2 * hidden]));
  EXPECT_FALSE(std::isnan(bad[3 * hidden]));
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


// A 16-bit plan's kernels read and write bf16 or fp16 storage and compute in fp32: on 16-bit
// operands each kernel gives its own fp32 result on the same values (the operands widened)
// rounded once to the storage type. Elementwise kernels bit for bit; where a row is reduced
// first (layer norm), within one 16-bit ulp. Outputs that stay fp32 (the norm parameter
// gradients, the loss statistics) are the fp32 run's.
void CudaKernels::expectStorageRoundedOnce(cuda::ElementType t) {
  CudaKernels &k = *this;
  using Backward = void (*)(cuda::In, cuda::In, cuda::Out, int64_t, cudaStream_t);
  for (auto [backward, name] : {std::pair<Backward, const char *>{cuda::geluBackward, "geluBackward"},
                                {cuda::tanhBackward, "tanhBackward"}}) {  // the activations' backwards
    int64_t n = 10000;
    auto x = k.randomHalf(n, t, 3), g = k.randomHalf(n, t);
    cuda::Out dx = k.halves(n, t);
    float *dx32 = k.zeros(n);
    backward(x.in, g.in, dx, n, 0);
    backward(k.up(x.values), k.up(g.values), dx32, n, 0);
    k.expectRoundedOnce(dx, dx32, n, 0, name);
  }
  {  // segment embeddings and their gradient (a sum over rows in a fixed order, rounded once)
    int64_t batch = 4, seq = 16, rows = 16, hidden = 24, n = batch * rows * hidden;
    std::vector<int32_t> types(batch * seq);
    for (int32_t &v : types) v = int32_t(k.rng_() % 2);
    int32_t *dtypes = k.up(types);
    auto x = k.randomHalf(n, t), table = k.randomHalf(2 * hidden, t), g = k.randomHalf(n, t);
    cuda::Out y = k.halves(n, t), dtable = k.halves(2 * hidden, t);
    float *y32 = k.zeros(n), *dtable32 = k.zeros(2 * hidden);
    cuda::addTokenType(x.in, dtypes, table.in, y, batch, rows, seq, 0, hidden, 2, 0);
    cuda::addTokenType(k.up(x.values), dtypes, k.up(table.values), y32, batch, rows, seq, 0, hidden, 2, 0);
    cuda::tokenTypeGrad(dtypes, g.in, dtable, batch, rows, seq, 0, hidden, 2, 0);
    cuda::tokenTypeGrad(dtypes, k.up(g.values), dtable32, batch, rows, seq, 0, hidden, 2, 0);
    k.expectRoundedOnce(y, y32, n, 0, "addTokenType");
    k.expectRoundedOnce(dtable, dtable32, 2 * hidden, 0, "tokenTypeGrad");
  }
  {  // add_bias, and accumulate in place (y is x)
    int64_t rows = 87, hidden = 40, n = rows * hidden;
    auto x = k.randomHalf(n, t), bias = k.randomHalf(hidden, t);
    cuda::Out y = k.halves(n, t), inPlace(k.up(x.bits), t);
    float *y32 = k.zeros(n);
    cuda::addBroadcast(x.in, bias.in, y, n, hidden, 0);
    cuda::addBroadcast(inPlace, bias.in, inPlace, n, hidden, 0);
    cuda::addBroadcast(k.up(x.values), k.up(bias.values), y32, n, hidden, 0);
    k.expectRoundedOnce(y, y32, n, 0, "addBroadcast");
    k.expectRoundedOnce(inPlace, y32, n, 0, "addBroadcast in place");
  }
  {  // SwiGLU's backward: two outputs
    int64_t n = 10000;
    auto gate = k.randomHalf(n, t, 3), upv = k.randomHalf(n, t), g = k.randomHalf(n, t);
    cuda::Out dgate = k.halves(n, t), dup = k.halves(n, t);
    float *dgate32 = k.zeros(n), *dup32 = k.zeros(n);
    cuda::swigluBackward(gate.in, upv.in, g.in, dgate, dup, n, 0);
    cuda::swigluBackward(k.up(gate.values), k.up(upv.values), k.up(g.values), dgate32, dup32, n, 0);
    k.expectRoundedOnce(dgate, dgate32, n, 0, "swigluBackward dgate");
    k.expectRoundedOnce(dup, dup32, n, 0, "swigluBackward dup");
  }
  {  // embedding: the word row (0 outside the shard) plus the position row
    int64_t tokens = 64, seq = 16, hidden = 32, rows = 100;
    std::vector<int32_t> tok(tokens);
    for (int32_t &v : tok) v = int32_t(k.rng_() % 200);  // half outside the shard [50, 150)
    auto word = k.randomHalf(rows * hidden, t), pos = k.randomHalf(seq * hidden, t);
    cuda::Out y = k.halves(tokens * hidden, t);
    float *y32 = k.zeros(tokens * hidden);
    int32_t *dtok = k.up(tok);
    cuda::embeddingForward(dtok, word.in, pos.in, y, tokens, seq, hidden, 50, rows, 0);
    cuda::embeddingForward(dtok, k.up(word.values), k.up(pos.values), y32, tokens, seq, hidden, 50, rows, 0);
    k.expectRoundedOnce(y, y32, tokens * hidden, 0, "embeddingForward");
  }
  {  // cross entropy: fp32 statistics from 16-bit logits, 16-bit dlogits
    int64_t tokens = 24, cols = 300, valid = 290;
    auto logits = k.randomHalf(tokens * cols, t, 2);
    std::vector<int32_t> labels(tokens);
    for (int32_t &l : labels) l = int32_t(k.rng_() % valid);
    std::vector<float> mask(tokens, 1.0f);
    mask[3] = 0;
    int32_t *dlabels = k.up(labels);
    float *logits32 = k.up(logits.values);
    float *mx = k.zeros(tokens), *sum = k.zeros(tokens), *target = k.zeros(tokens);
    float *mx32 = k.zeros(tokens), *sum32 = k.zeros(tokens), *target32 = k.zeros(tokens);
    cuda::crossEntropyLocalMax(logits.in, mx, tokens, cols, 0, valid, 0);
    cuda::crossEntropyLocalSums(logits.in, dlabels, mx, sum, target, tokens, cols, 0, valid, 0);
    cuda::crossEntropyLocalMax(logits32, mx32, tokens, cols, 0, valid, 0);
    cuda::crossEntropyLocalSums(logits32, dlabels, mx32, sum32, target32, tokens, cols, 0, valid, 0);
    EXPECT_EQ(k.down(mx, tokens), k.down(mx32, tokens));
    EXPECT_EQ(k.down(target, tokens), k.down(target32, tokens));
    std::vector<float> sums = k.down(sum32, tokens), lse(tokens);
    EXPECT_LT(k.relErr(k.down(sum, tokens), sums), 1e-6);
    cpu::crossEntropyLogSumExp(k.down(mx32, tokens).data(), sums.data(), lse.data(), tokens);
    float *dlse = k.up(lse), *dmask = k.up(mask);
    cuda::Out d = k.halves(tokens * cols, t);
    float *d32 = k.zeros(tokens * cols);
    cuda::crossEntropyBackward(logits.in, dlabels, dmask, dlse, 0.5f / 23, d, tokens, cols, 0, valid, 0);
    cuda::crossEntropyBackward(logits32, dlabels, dmask, dlse, 0.5f / 23, d32, tokens, cols, 0, valid, 0);
    k.expectRoundedOnce(d, d32, tokens * cols, 0, "crossEntropyBackward");
  }
  // Layer norm (a row's moments first): a block per row, rows wider than the block, and the
  // backward's runs of rows per block.
  for (auto [rows, n] : {std::pair<int64_t, int64_t>{37, 300}, {5, 6000}, {3000, 64}}) {
    std::string shape = std::to_string(rows) + "x" + std::to_string(n);
    auto x = k.randomHalf(rows * n, t), gamma = k.randomHalf(n, t), beta = k.randomHalf(n, t),
         g = k.randomHalf(rows * n, t);
    float *x32 = k.up(x.values), *gamma32 = k.up(gamma.values), *g32 = k.up(g.values);
    cuda::Out y = k.halves(rows * n, t), dx = k.halves(rows * n, t);
    float *y32 = k.zeros(rows * n), *dx32 = k.zeros(rows * n);
    float *dg = k.zeros(n), *db = k.zeros(n), *dg32 = k.zeros(n), *db32 = k.zeros(n);
    cuda::layerNormForward(x.in, gamma.in, beta.in, y, rows, n, 1e-5f, 0);
    cuda::layerNormForward(x32, gamma32, k.up(beta.values), y32, rows, n, 1e-5f, 0);
    cuda::layerNormBackward(x.in, gamma.in, g.in, dx, dg, db, rows, n, 1e-5f, 0);
    cuda::layerNormBackward(x32, gamma32, g32, dx32, dg32, db32, rows, n, 1e-5f, 0);
    k.expectRoundedOnce(y, y32, rows * n, 1, "layerNormForward " + shape);
    k.expectRoundedOnce(dx, dx32, rows * n, 1, "layerNormBackward dx " + shape);
    // Summed with atomics, in no fixed order.
    EXPECT_LT(k.relErr(k.down(dg, n), k.down(dg32, n)), 1e-5) << shape;
    EXPECT_LT(k.relErr(k.down(db, n), k.down(db32, n)), 1e-5) << shape;
  }
}

TEST_F(CudaKernels, Bf16StorageIsFp32MathRoundedOnce) { expectStorageRoundedOnce(cuda::ElementType::kBf16); }

TEST_F(CudaKernels, Fp16StorageIsFp32MathRoundedOnce) { expectStorageRoundedOnce(cuda::ElementType::kF16); }

// The plan's cast: fp32 into bf16 / fp16 rounded to nearest even (ties included, overflow to
// infinity), the other way exact, and between the 16-bit types through fp32.
TEST_F(CudaKernels, ConvertElementsRoundsToNearestEven) {
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  std::vector<float> x = random(5000, 4);
  float inf = std::numeric_limits<float>::infinity();
  // Ties between two bf16 values (to the even one), just above and below them, fp16 ties, the
  // fp16 overflow and subnormal ranges, signed zeros, infinities.
  for (float v : {bits(0x3F808000u), bits(0x3F818000u), bits(0x3F808001u), bits(0x3F807FFFu), bits(0xBF818000u),
                  1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 65504.0f, 65520.0f, 70000.0f, -1e6f, 1e-6f, 3e-8f,
                  0.0f, -0.0f, inf, -inf, 3.0e38f})
    x.push_back(v);
  size_t n = x.size();
  float *x32 = up(x);
  for (cuda::ElementType t : {cuda::ElementType::kBf16, cuda::ElementType::kF16}) {
    const char *name = cuda::elementTypeName(t);
    cuda::Out h = halves(n, t);
    cuda::convertElements(x32, h, int64_t(n), 0);
    EXPECT_EQ(downBits(h.data, n), narrow(x, t)) << "fp32 -> " << name;
    float *back = zeros(n);
    cuda::convertElements(h, back, int64_t(n), 0);
    EXPECT_EQ(down(back, n), widen(narrow(x, t), t)) << name << " -> fp32";
    cuda::ElementType other = t == cuda::ElementType::kBf16 ? cuda::ElementType::kF16 : cuda::ElementType::kBf16;
    cuda::Out same = halves(n, t), across = halves(n, other);
    cuda::convertElements(h, same, int64_t(n), 0);
    cuda::convertElements(h, across, int64_t(n), 0);
    EXPECT_EQ(downBits(same.data, n), narrow(x, t)) << name << " -> " << name;
    EXPECT_EQ(downBits(across.data, n), narrow(widen(narrow(x, t), t), other))
        << name << " -> " << cuda::elementTypeName(other);
  }
  float *copy = zeros(n);
  cuda::convertElements(x32, copy, int64_t(n), 0);
  EXPECT_EQ(down(copy, n), x) << "fp32 -> fp32";
}

}  // namespace
}  // namespace loom
