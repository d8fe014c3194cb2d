#include "runtime/cpu/Kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <thread>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "plan/Layout.h"
#include "runtime/cpu/FastExp.h"
#include "runtime/cpu/Gemm.h"
#include "runtime/cpu/HalfPrecision.h"
#include "runtime/cpu/Parallel.h"
#include "runtime/cpu/Philox.h"
#include "runtime/cpu/RowStorage.h"

namespace loom::cpu {

// The hot non-GEMM loops (softmax rows, the vocabulary loops, elementwise activations, row
// reductions) are compiled for AVX-512, AVX2 and baseline x86-64 and picked at run time; no FMA
// contraction under ISO C++ and fixed lane orders, so every variant gives the same bits.
// Reductions keep 8 float lanes: a plain `sum +=` loop does not vectorise without -ffast-math.
#define LOOM_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

void linearForward(const float *x, const float *w, const float *bias, float *y, int64_t m, int64_t k,
                   int64_t n, bool transposeW) {
  if (bias) {
    for (int64_t r = 0; r < m; ++r) std::memcpy(y + r * n, bias, n * sizeof(float));
  }
  gemm(false, transposeW, m, n, k, 1.0f, x, k, w, transposeW ? k : n, bias ? 1.0f : 0.0f, y, n);
}

void linearWeightGrad(const float *x, const float *g, float *dw, int64_t m, int64_t k, int64_t n,
                      bool transposeW, bool accumulate) {
  float beta = accumulate ? 1.0f : 0.0f;
  if (transposeW)  // dW[N,K] = g^T x
    gemm(true, false, n, k, m, 1.0f, g, n, x, k, beta, dw, k);
  else  // dW[K,N] = x^T g
    gemm(true, false, k, n, m, 1.0f, x, k, g, n, beta, dw, n);
}

// Each thread sums its own columns over every row in row order: the same sums whatever the split.
template <typename T>
void biasGradOf(const T *g, T *db, int64_t m, int64_t n) {
  parallelFor(n, std::max<int64_t>(16, grainFor(m)), [&](int64_t c0, int64_t c1) {
    RowViews<T> rows(2, c1 - c0);
    float *sum = rows.out(1, db + c0);
    std::fill(sum, sum + (c1 - c0), 0.0f);
    for (int64_t r = 0; r < m; ++r) {
      const float *gr = rows.in(0, g + r * n + c0);
      for (int64_t c = 0; c < c1 - c0; ++c) sum[c] += gr[c];
    }
    rows.put(1, db + c0);
  });
}
void biasGrad(const float *g, float *db, int64_t m, int64_t n) { biasGradOf(g, db, m, n); }
void biasGrad(const uint16_t *g, uint16_t *db, int64_t m, int64_t n) { biasGradOf(g, db, m, n); }

namespace {
// Row reductions in 8 float lanes (they vectorise), the lanes and the tail combined in double:
// a fixed order, so every ISA variant and thread count gives the same bits.
LOOM_VECTOR_CLONES
float laneSum(const float *x, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += x[i + k];
  double sum = 0;
  for (int k = 0; k < 8; ++k) sum += lanes[k];
  for (; i < n; ++i) sum += x[i];
  return float(sum);
}

// sum (x - c)^2, and sum x * y, likewise.
LOOM_VECTOR_CLONES
float laneSquaredDeviation(const float *x, int64_t n, float c) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += (x[i + k] - c) * (x[i + k] - c);
  double sum = 0;
  for (int k = 0; k < 8; ++k) sum += lanes[k];
  for (; i < n; ++i) sum += double(x[i] - c) * (x[i] - c);
  return float(sum);
}

LOOM_VECTOR_CLONES
float laneDot(const float *x, const float *y, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += x[i + k] * y[i + k];
  double sum = 0;
  for (int k = 0; k < 8; ++k) sum += lanes[k];
  for (; i < n; ++i) sum += double(x[i]) * y[i];
  return float(sum);
}

// Mean and 1 / sqrt(variance + eps) of one row (two passes).
void rowStatistics(const float *xr, int64_t n, float eps, float *mean, float *rstd) {
  float m = laneSum(xr, n) / float(n);
  *mean = m;
  *rstd = 1.0f / std::sqrt(laneSquaredDeviation(xr, n, m) / float(n) + eps);
}

// Rows per chunk of the per-column gradient sums (dgamma, dbeta): fixed, so the sums' order
// is the same for any thread count; each chunk's partial sums are added in chunk order.
constexpr int64_t kRowChunk = 32;

// Per-thread scratch that grows to the largest size asked and is then reused (no allocation
// inside the step once the first step has run).
float *scratch(std::vector<float> &buffer, size_t count) {
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// out[i] = sum over chunks c (in order) of partial[c * ld + i], i < n.
void addChunks(const float *partial, int64_t chunks, int64_t ld, int64_t n, float *out) {
  parallelFor(n, std::max<int64_t>(16, grainFor(chunks)), [&](int64_t i0, int64_t i1) {
    std::fill(out + i0, out + i1, 0.0f);
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t i = i0; i < i1; ++i) out[i] += partial[c * ld + i];
  });
}
}  // namespace

namespace {
// A kernel's parameter vectors (gamma, beta) as fp32, widened once per call (bf16) on the
// calling thread.
template <typename T>
struct WideParams {
  RowViews<T, 1> views;
  const float *a, *b;
  WideParams(int64_t n, const T *first, const T *second = nullptr)
      : views(2, n), a(views.in(0, first)), b(views.in(1, second)) {}
};

// fp32 partial sums per column (dgamma, dbeta) into an fp32 or bf16 result, rounded once.
template <typename T>
void addChunksInto(const float *partial, int64_t chunks, int64_t ld, int64_t n, T *out) {
  if constexpr (std::is_same_v<T, float>) {
    addChunks(partial, chunks, ld, n, out);
  } else {
    static thread_local std::vector<float> sumBuffer;
    float *sum = scratch(sumBuffer, size_t(n));
    addChunks(partial, chunks, ld, n, sum);
    narrowToBf16(sum, out, n);
  }
}

template <typename T>
void layerNormForwardOf(const T *x, const T *gamma, const T *beta, T *y, int64_t rows, int64_t n, float eps) {
  WideParams<T> p(n, gamma, beta);
  parallelFor(rows, grainFor(n), [&](int64_t r0, int64_t r1) {
    RowViews<T> views(2, n);
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = views.in(0, x + r * n);
      float mean, rstd;
      rowStatistics(xr, n, eps, &mean, &rstd);
      float *yr = views.out(1, y + r * n);
      for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] - mean) * rstd * p.a[i] + p.b[i];
      views.put(1, y + r * n);
    }
  });
}
}  // namespace

void layerNormForward(const float *x, const float *gamma, const float *beta, float *y, int64_t rows, int64_t n,
                      float eps) {
  layerNormForwardOf(x, gamma, beta, y, rows, n, eps);
}
void layerNormForward(const uint16_t *x, const uint16_t *gamma, const uint16_t *beta, uint16_t *y, int64_t rows,
                      int64_t n, float eps) {
  layerNormForwardOf(x, gamma, beta, y, rows, n, eps);
}

// dx = rstd (dy - mean(dy) - xhat mean(dy xhat)), dy = g gamma; dgamma = sum g xhat, dbeta = sum g.
namespace {
// One row of the layer-norm backward: dx, and the row's terms added to the chunk's dgamma and
// dbeta sums. Restrict pointers and 8 float lanes so both loops vectorise (the lane order is
// fixed: every ISA variant gives the same bits).
LOOM_VECTOR_CLONES
void layerNormGradRow(const float *__restrict xr, const float *__restrict gamma, const float *__restrict gr,
                      float *__restrict dxr, float *__restrict pg, float *__restrict pb, float *__restrict xhat,
                      int64_t n, float mean, float rstd) {
  float lanesDy[8] = {0, 0, 0, 0, 0, 0, 0, 0}, lanesDyXhat[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) {
      float xh = (xr[i + k] - mean) * rstd, dy = gr[i + k] * gamma[i + k];
      xhat[i + k] = xh;
      lanesDy[k] += dy;
      lanesDyXhat[k] += dy * xh;
    }
  double sumDy = 0, sumDyXhat = 0;
  for (int k = 0; k < 8; ++k) sumDy += lanesDy[k], sumDyXhat += lanesDyXhat[k];
  for (; i < n; ++i) {
    float xh = (xr[i] - mean) * rstd, dy = gr[i] * gamma[i];
    xhat[i] = xh;
    sumDy += dy;
    sumDyXhat += double(dy) * xh;
  }
  float meanDy = float(sumDy / n), meanDyXhat = float(sumDyXhat / n);
  for (int64_t j = 0; j < n; ++j) {
    float xh = xhat[j];
    pg[j] += gr[j] * xh;
    pb[j] += gr[j];
    dxr[j] = rstd * (gr[j] * gamma[j] - meanDy - xh * meanDyXhat);
  }
}
}  // namespace

namespace {
template <typename T>
void layerNormBackwardOf(const T *x, const T *gamma, const T *g, T *dx, T *dgamma, T *dbeta, int64_t rows, int64_t n,
                         float eps) {
  static thread_local std::vector<float> partialBuffer;
  WideParams<T> p(n, gamma);
  int64_t chunks = chunkCount(rows, kRowChunk);
  float *partial = scratch(partialBuffer, size_t(chunks * 2 * n));  // per chunk: dgamma then dbeta
  parallelChunks(rows, kRowChunk, [&](int64_t c, int64_t r0, int64_t r1) {
    static thread_local std::vector<float> xhatBuffer;
    float *pg = partial + c * 2 * n, *pb = pg + n, *xhat = scratch(xhatBuffer, size_t(n));
    std::fill(pg, pg + 2 * n, 0.0f);
    RowViews<T> views(3, n);
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = views.in(0, x + r * n), *gr = views.in(1, g + r * n);
      float mean, rstd;
      rowStatistics(xr, n, eps, &mean, &rstd);
      layerNormGradRow(xr, p.a, gr, views.out(2, dx + r * n), pg, pb, xhat, n, mean, rstd);
      views.put(2, dx + r * n);
    }
  }, n);
  addChunksInto(partial, chunks, 2 * n, n, dgamma);
  addChunksInto(partial + n, chunks, 2 * n, n, dbeta);
}
}  // namespace

void layerNormBackward(const float *x, const float *gamma, const float *g, float *dx, float *dgamma, float *dbeta,
                       int64_t rows, int64_t n, float eps) {
  layerNormBackwardOf(x, gamma, g, dx, dgamma, dbeta, rows, n, eps);
}
void layerNormBackward(const uint16_t *x, const uint16_t *gamma, const uint16_t *g, uint16_t *dx, uint16_t *dgamma,
                       uint16_t *dbeta, int64_t rows, int64_t n, float eps) {
  layerNormBackwardOf(x, gamma, g, dx, dgamma, dbeta, rows, n, eps);
}

namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
}

namespace {
LOOM_VECTOR_CLONES
void geluRange(const float *x, float *y, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + fastTanh(kGeluC * (v + 0.044715f * v * v * v)));
  }
}

LOOM_VECTOR_CLONES
void geluGradRange(const float *x, const float *g, float *dx, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    float v = x[i];
    float t = fastTanh(kGeluC * (v + 0.044715f * v * v * v));
    float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluC * (1.0f + 3 * 0.044715f * v * v);
    dx[i] = g[i] * d;
  }
}
}  // namespace

namespace {
// body(x, y, count, first) over [0, count) split over the threads, each operand as fp32: fp32
// storage in place, bf16 widened a block at a time and the outputs rounded (elementwise: the
// same values either way and for any split). `first` is the block's first element.
template <int Inputs, int Outputs, typename T, typename Body>
void elementwise(int64_t count, const std::array<const T *, Inputs> &in, const std::array<T *, Outputs> &out,
                 const Body &body) {
  parallelFor(count, kMinPartElements, [&](int64_t lo, int64_t hi) {
    constexpr bool wide = std::is_same_v<T, float>;
    int64_t block = wide ? std::max<int64_t>(1, hi - lo) : kRowStorageBlock;
    RowViews<T> views(Inputs + Outputs, block);
    for (int64_t b0 = lo; b0 < hi; b0 += block) {
      int64_t n = std::min(block, hi - b0);
      std::array<const float *, Inputs> x;
      std::array<float *, Outputs> y;
      for (int j = 0; j < Inputs; ++j) x[size_t(j)] = views.in(j, in[size_t(j)] + b0, n);
      for (int j = 0; j < Outputs; ++j) y[size_t(j)] = views.out(Inputs + j, out[size_t(j)] + b0);
      body(x, y, n, b0);
      for (int j = 0; j < Outputs; ++j) views.put(Inputs + j, out[size_t(j)] + b0, n);
    }
  });
}

template <typename T>
void geluOf(const T *x, T *y, int64_t count) {
  elementwise<1, 1, T>(count, {x}, {y}, [](auto &in, auto &out, int64_t n, int64_t) { geluRange(in[0], out[0], 0, n); });
}

template <typename T>
void geluGradOf(const T *x, const T *g, T *dx, int64_t count) {
  elementwise<2, 1, T>(count, {x, g}, {dx},
                       [](auto &in, auto &out, int64_t n, int64_t) { geluGradRange(in[0], in[1], out[0], 0, n); });
}

template <typename T>
void tanhOf(const T *x, T *y, int64_t count) {
  elementwise<1, 1, T>(count, {x}, {y}, [](auto &in, auto &out, int64_t n, int64_t) {
    for (int64_t i = 0; i < n; ++i) out[0][i] = std::tanh(in[0][i]);
  });
}

template <typename T>
void tanhGradOf(const T *x, const T *g, T *dx, int64_t count) {
  elementwise<2, 1, T>(count, {x, g}, {dx}, [](auto &in, auto &out, int64_t n, int64_t) {
    for (int64_t i = 0; i < n; ++i) {
      float t = std::tanh(in[0][i]);
      out[0][i] = in[1][i] * (1.0f - t * t);
    }
  });
}

}  // namespace

void tanhForward(const float *x, float *y, int64_t count) { tanhOf(x, y, count); }
void tanhForward(const uint16_t *x, uint16_t *y, int64_t count) { tanhOf(x, y, count); }
void tanhBackward(const float *x, const float *g, float *dx, int64_t count) { tanhGradOf(x, g, dx, count); }
void tanhBackward(const uint16_t *x, const uint16_t *g, uint16_t *dx, int64_t count) { tanhGradOf(x, g, dx, count); }

void geluForward(const float *x, float *y, int64_t count) { geluOf(x, y, count); }
void geluForward(const uint16_t *x, uint16_t *y, int64_t count) { geluOf(x, y, count); }

// d/dx: 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2), t = tanh(c (x + 0.044715 x^3)).
void geluBackward(const float *x, const float *g, float *dx, int64_t count) { geluGradOf(x, g, dx, count); }
void geluBackward(const uint16_t *x, const uint16_t *g, uint16_t *dx, int64_t count) { geluGradOf(x, g, dx, count); }

namespace {
// Philox's 32x32->64-bit products vectorise with AVX2 (about 1.6x here); the same values either
// way (integer arithmetic), the variant chosen at load time. Elements [0, n) of a block whose
// first element is element `first` of the tensor (the mask's counter).
__attribute__((target_clones("avx2", "default")))
void dropoutRange(const float *x, float *y, int64_t n, int64_t first, float rate, uint64_t seed, uint64_t stream) {
  float scale = 1.0f / (1.0f - rate);
  for (int64_t i = 0; i < n; ++i)
    y[i] = philoxUniform(seed, stream, uint64_t(first + i)) >= rate ? x[i] * scale : 0.0f;
}

template <typename T>
void dropoutOf(const T *x, T *y, int64_t count, float rate, uint64_t seed, uint64_t stream, uint64_t counterBase) {
  elementwise<1, 1, T>(count, {x}, {y}, [&](auto &in, auto &out, int64_t n, int64_t first) {
    dropoutRange(in[0], out[0], n, int64_t(counterBase) + first, rate, seed, stream);
  });
}
}  // namespace

void dropoutForward(const float *x, float *y, int64_t count, float rate, uint64_t seed, uint64_t stream,
                    uint64_t counterBase) {
  dropoutOf(x, y, count, rate, seed, stream, counterBase);
}
void dropoutForward(const uint16_t *x, uint16_t *y, int64_t count, float rate, uint64_t seed, uint64_t stream,
                    uint64_t counterBase) {
  dropoutOf(x, y, count, rate, seed, stream, counterBase);
}

namespace {


// One (batch, head) of attention: q, k, v rows `ldq`, `ldk`, `ldv` floats apart. The queries go
// in blocks of kBlock rows, and each block's scores, softmax and products run before the next
// block's, so a block's rows of P (kBlock x S floats, S apart: blockFloats) stay in cache between
// its passes instead of a whole S x S head going through memory once per pass (FlashAttention's
// tiling of the queries, Dao et al. 2022, section 3.1, without its online softmax: each block
// still sees all of its keys at once). With a causal mask a block's scores, softmax and products
// cover only the keys up to its last query (the masked part is neither computed nor read: P is
// 0 there).
constexpr int64_t kBlock = 64;
int64_t blockFloats(int64_t S) { return std::min(kBlock, S) * S; }

struct Head {
  const float *q, *k, *v;
  int64_t ldq, ldk, ldv;
  // bf16 attention (attentionForwardBf16): q, k, v in bf16 (q, k, v above unused), same strides.
  const uint16_t *q16, *k16, *v16;
  const float *keyMask;  // this batch row's [S] key mask, or null
  int64_t S, hd;
  bool causal;
  float dropout;
  uint64_t seed, stream, counterBase;  // the dropout mask's counter of P[i][j]: base + i * counterLd + j
  int64_t counterLd = 0;               // 0: S (a whole head); a ring block's: the whole sequence's
  // Keys row i sees: all, or up to i with the causal mask.
  int64_t keysOf(int64_t i) const { return causal ? i + 1 : S; }
  // Columns the block of queries starting at i0 needs.
  int64_t blockKeys(int64_t i0) const { return causal ? std::min(S, i0 + kBlock) : S; }
  // Columns of row i that its block's products read: the row's keys, then zeros up to here.
  int64_t rowColumns(int64_t i) const { return blockKeys(i - i % kBlock); }
};

// row[0, n) = softmax(row[0, n)) in place (max and sum in 8 lanes); returns the row's
// log-sum-exp (max + log(sum)), or +inf when every entry is -inf (a fully masked row, left
// for the caller to zero).
LOOM_VECTOR_CLONES
float softmaxRow(float *row, int64_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  float lanes[8] = {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) lanes[k] = row[j + k] > lanes[k] ? row[j + k] : lanes[k];
  float mx = ninf;
  for (int k = 0; k < 8; ++k) mx = lanes[k] > mx ? lanes[k] : mx;
  for (; j < n; ++j) mx = row[j] > mx ? row[j] : mx;
  if (mx == ninf) return std::numeric_limits<float>::infinity();
  float sums[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (j = 0; j + 8 <= n; j += 8)
    for (int k = 0; k < 8; ++k) sums[k] += (row[j + k] = fastExp(row[j + k] - mx));
  float sum = 0;
  for (int k = 0; k < 8; ++k) sum += sums[k];
  for (; j < n; ++j) sum += (row[j] = fastExp(row[j] - mx));
  float inv = 1.0f / sum;
  for (j = 0; j < n; ++j) row[j] *= inv;
  return mx + std::log(sum);
}

// row[0, n) = exp(row - lse): the probabilities from the forward's statistics in one pass
// (masked keys, -inf, give 0; a fully masked row has lse = +inf and gives 0 throughout).
LOOM_VECTOR_CLONES
void probabilitiesRow(float *row, int64_t n, float lse) {
  for (int64_t j = 0; j < n; ++j) row[j] = fastExp(row[j] - lse);
}

// r[0, n) = p * (r - sum(p * r)): the softmax's backward over one row (the sum by laneDot).
LOOM_VECTOR_CLONES
void softmaxGradRow(const float *p, float *r, int64_t n) {
  float dot = laneDot(p, r, n);
  for (int64_t j = 0; j < n; ++j) r[j] = p[j] * (r[j] - dot);
}

// r[0, n) = p * (r - dot) with the row's rowsum(P * dP) given (a ring block's rows).
LOOM_VECTOR_CLONES
void softmaxGradRowGiven(const float *p, float *r, int64_t n, float dot) {
  for (int64_t j = 0; j < n; ++j) r[j] = p[j] * (r[j] - dot);
}

// Rows [i0, i0 + rows) of the query block starting at i0: body(i, row) for each, row i at
// p + (i - i0) * S, split over the threads (each row's work independent).
template <typename Body>
void blockRows(const Head &h, int64_t i0, int64_t rows, float *p, Body body) {
  parallelFor(rows, grainFor(h.S), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) body(i0 + r, p + r * h.S);
  });
}

// The block's scores s = q k^T / sqrt(hd) over its keys (masks are applied per row by maskKeys
// and the causal bound), row i at p + (i - i0) * S.
void blockScores(const Head &h, int64_t i0, int64_t rows, float *p) {
  float scale = 1.0f / std::sqrt(float(h.hd));
  int64_t cols = h.blockKeys(i0);
  if (!h.q16) {
    gemm(false, true, rows, cols, h.hd, scale, h.q + i0 * h.ldq, h.ldq, h.k, h.ldk, 0.0f, p, h.S);
    return;
  }
  // bf16 q and k: exact products summed in fp32, then scaled.
  gemmBf16(false, true, rows, cols, h.hd, h.q16 + i0 * h.ldq, h.ldq, h.k16, h.ldk, nullptr, p, GemmOut::kF32, h.S);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) p[r * h.S + j] *= scale;
}

// The key mask's -inf on row[0, n).
void maskKeys(const Head &h, float *row, int64_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  if (h.keyMask)
    for (int64_t j = 0; j < n; ++j)
      if (h.keyMask[j] == 0.0f) row[j] = ninf;
}

// P = softmax(q k^T / sqrt(hd) + masks), computed over each row's visible keys (then 0 up to
// the row's block width). In the forward (statistics null) by the softmax, writing each row's
// log-sum-exp to `lse` when it is not null; in the backward from the forward's statistics,
// P = exp(s - lse) in one pass (FlashAttention's backward, Dao et al. 2022, section 3.1).
// One query block's rows of P (row i at p + (i - i0) * S; lse and statistics indexed by i).
void blockProbs(const Head &h, int64_t i0, int64_t rows, float *p, float *lse, const float *statistics) {
  blockScores(h, i0, rows, p);
  blockRows(h, i0, rows, p, [&](int64_t i, float *row) {
    int64_t n = h.keysOf(i), zeroFrom = n;
    maskKeys(h, row, n);
    if (statistics) {
      probabilitiesRow(row, n, statistics[i]);
    } else {
      float rowLse = softmaxRow(row, n);
      if (lse) lse[i] = rowLse;
      if (std::isinf(rowLse)) zeroFrom = 0;  // fully masked: the row attends to nothing
    }
    std::fill(row + zeroFrom, row + h.rowColumns(i), 0.0f);
  });
}

// x *= keep / (1 - rate) over each row's visible keys, the keep mask from P's counters (the
// masked part is 0 in P and in every gradient that meets it).
__attribute__((target_clones("avx2", "default")))
void dropoutRow(float *row, int64_t n, uint64_t base, float rate, uint64_t seed, uint64_t stream) {
  float scale = 1.0f / (1.0f - rate);
  for (int64_t j = 0; j < n; ++j) row[j] = philoxUniform(seed, stream, base + uint64_t(j)) >= rate ? row[j] * scale : 0.0f;
}

// The block's rows of x (row i at x + (i - i0) * S) through dropout, P[i][j]'s counter
// counterBase + i * counterLd + j.
void blockDropout(const Head &h, int64_t i0, int64_t rows, float *x) {
  if (h.dropout <= 0) return;
  blockRows(h, i0, rows, x, [&](int64_t i, float *row) {
    dropoutRow(row, h.keysOf(i), h.counterBase + uint64_t(i * (h.counterLd ? h.counterLd : h.S)), h.dropout, h.seed,
               h.stream);
  });
}

// The block's rows of D = dropout(P): P itself without dropout, else P's visible part copied
// into d and dropped out there.
float *blockDropped(const Head &h, int64_t i0, int64_t rows, float *p, float *d) {
  if (h.dropout <= 0) return p;
  for (int64_t r = 0; r < rows; ++r) std::copy(p + r * h.S, p + r * h.S + h.rowColumns(i0 + r), d + r * h.S);
  blockDropout(h, i0, rows, d);
  return d;
}

// dP = dD * keep / (1 - rate) over one row, the keep mask read from D = P * keep / (1 - rate)
// instead of regenerated from the counters: where P != 0, D != 0 exactly when kept (the scale
// is >= 1, so nothing underflows); where P == 0 the softmax backward gives 0 whatever dP is.
LOOM_VECTOR_CLONES
void keptRow(const float *d, float *dp, int64_t n, float scale) {
  for (int64_t j = 0; j < n; ++j) dp[j] = d[j] != 0.0f ? dp[j] * scale : 0.0f;
}

// The block's rows of dS = P (dP - rowsum(P dP)) in place of dp (row i at dp + (i - i0) * S):
// first dD -> dP through the dropout mask read from D (keptRow), then the softmax's backward with
// each row's rowsum given (delta, a ring block's) or summed here, zeros past the row's keys up to
// its block width; then done(i, row) on the row's thread (the bf16 form rounds it there).
template <typename Done>
void blockSoftmaxGrad(const Head &h, int64_t i0, int64_t rows, const float *p, const float *d, float *dp,
                      const float *delta, Done done) {
  blockRows(h, i0, rows, dp, [&](int64_t i, float *r) {
    const float *pr = p + (i - i0) * h.S;
    int64_t n = h.keysOf(i);
    if (h.dropout > 0) keptRow(d + (i - i0) * h.S, r, n, 1.0f / (1.0f - h.dropout));  // dD -> dP
    if (delta)
      softmaxGradRowGiven(pr, r, n, delta[i]);
    else
      softmaxGradRow(pr, r, n);
    std::fill(r + n, r + h.rowColumns(i), 0.0f);
    done(i, r);
  });
}

// A head's scratch (floats): a block's P; backward also its D (dropout) and dP.
int64_t headScratchFloats(int64_t seq, bool backward) { return (backward ? 3 : 1) * blockFloats(seq); }

// out = dropout(P) v; lse (nullable): the head's [S] softmax statistics. p: headScratchFloats.
void headForward(const Head &h, float *out, int64_t ldo, float *lse, float *p) {
  for (int64_t i0 = 0; i0 < h.S; i0 += kBlock) {
    int64_t rows = std::min(kBlock, h.S - i0), cols = h.blockKeys(i0);
    blockProbs(h, i0, rows, p, lse, nullptr);
    blockDropout(h, i0, rows, p);
    gemm(false, false, rows, h.hd, cols, 1.0f, p, h.S, h.v, h.ldv, 0.0f, out + i0 * ldo, ldo);
  }
}

// With P the probabilities (from the forward's statistics `lse`) and D = P * keep / (1 - rate):
//   dV += D^T g, dD = g V^T, dP = dD * keep / (1 - rate), dS = P * (dP - rowsum(P * dP)),
//   dQ = dS K / sqrt(hd), dK += dS^T Q / sqrt(hd).
// dq is written (added to with accumulateDq); dk and dv are added to (the caller zeroes them),
// block after block. Without dropout D is P. delta (nullable): each row's rowsum(P * dP) over
// all its keys, given when this head sees only some of them (a ring block: rowsum(dO * O) of
// the whole row, FlashAttention-2's D); else summed here over the row. scratch:
// headScratchFloats(S, true).
void headBackward(const Head &h, const float *g, int64_t ldg, const float *lse, float *dq, float *dk, float *dv,
                  int64_t ldd, int64_t ldkv, float *scratch, const float *delta = nullptr, bool accumulateDq = false) {
  float scale = 1.0f / std::sqrt(float(h.hd));
  float *p = scratch, *dropped = p + blockFloats(h.S), *dp = dropped + blockFloats(h.S);
  for (int64_t i0 = 0; i0 < h.S; i0 += kBlock) {
    int64_t rows = std::min(kBlock, h.S - i0), cols = h.blockKeys(i0);
    const float *gi = g + i0 * ldg;
    blockProbs(h, i0, rows, p, nullptr, lse);
    float *d = blockDropped(h, i0, rows, p, dropped);
    gemm(true, false, cols, h.hd, rows, 1.0f, d, h.S, gi, ldg, 1.0f, dv, ldkv);
    gemm(false, true, rows, cols, h.hd, 1.0f, gi, ldg, h.v, h.ldv, 0.0f, dp, h.S);
    blockSoftmaxGrad(h, i0, rows, p, d, dp, delta, [](int64_t, float *) {});
    gemm(false, false, rows, h.hd, cols, scale, dp, h.S, h.k, h.ldk, accumulateDq ? 1.0f : 0.0f, dq + i0 * ldd, ldd);
    gemm(true, false, cols, h.hd, rows, scale, dp, h.S, h.q + i0 * h.ldq, h.ldq, 1.0f, dk, ldkv);
  }
}

// Rows of `count` floats, `ld` apart: zeroed.
void zeroRows(float *x, int64_t rows, int64_t count, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) std::fill(x + r * ld, x + r * ld + count, 0.0f);
}

Head attentionHead(const float *qkv, const float *keyMask, const AttentionShape &s, int64_t b, int64_t h) {
  int64_t hd = s.headDim, ld = 3 * s.heads * hd, S = s.seq;
  const float *q = qkv + b * S * ld + h * 3 * hd;
  return Head{q,       q + hd,   q + 2 * hd, ld, ld, ld, nullptr, nullptr, nullptr, keyMask ? keyMask + b * S : nullptr,
              S,       hd,       s.causal,   s.dropout, s.seed, s.stream, uint64_t((b * s.heads + h) * S) * uint64_t(S)};
}

// The (batch, head) pairs in two halves, each half's heads in order on one thread with its own
// part of the scratch (kHeadGroups of them) and single-threaded GEMMs: a head's GEMMs are too
// small (64-row blocks of S x hd) to gain from splitting each over the threads, so the heads are
// split instead. `splittable(i)`: whether items i - 1 and i may run apart (they write no
// common output). Each head computes exactly what it did alone (per-row loops, thread-count-
// invariant GEMMs), so the split changes no bit.
constexpr int64_t kHeadGroups = 2;

template <typename Body>
void inHeadGroups(int64_t items, int64_t scratchPerGroup, float *scratch, bool splittable, const Body &body) {
  if (items < kHeadGroups || !splittable) {
    for (int64_t i = 0; i < items; ++i) body(i, scratch);
    return;
  }
  parallelFor(kHeadGroups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t i = items * g / kHeadGroups; i < items * (g + 1) / kHeadGroups; ++i)
        body(i, scratch + g * scratchPerGroup);
  });
}

}  // namespace

int64_t attentionScratchFloats(int64_t seq, bool backward) { return kHeadGroups * headScratchFloats(seq, backward); }

void attentionForward(const float *qkv, const float *keyMask, float *out, float *lse, const AttentionShape &s,
                      float *scratch) {
  int64_t H = s.heads * s.headDim, S = s.seq;
  inHeadGroups(s.batch * s.heads, headScratchFloats(S, false), scratch, true, [&](int64_t i, float *p) {
    int64_t b = i / s.heads, h = i % s.heads;
    headForward(attentionHead(qkv, keyMask, s, b, h), out + b * S * H + h * s.headDim, H,
                lse ? lse + (b * s.heads + h) * S : nullptr, p);
  });
}

void attentionBackward(const float *qkv, const float *keyMask, const float *g, const float *lse, float *dqkv,
                       const AttentionShape &s, float *scratch) {
  int64_t hd = s.headDim, ld = 3 * s.heads * hd, H = s.heads * hd, S = s.seq;
  inHeadGroups(s.batch * s.heads, headScratchFloats(S, true), scratch, true, [&](int64_t i, float *p) {
    int64_t b = i / s.heads, h = i % s.heads;
    float *dq = dqkv + b * S * ld + h * 3 * hd, *dk = dq + hd, *dv = dq + 2 * hd;
    zeroRows(dk, S, hd, ld), zeroRows(dv, S, hd, ld);
    headBackward(attentionHead(qkv, keyMask, s, b, h), g + b * S * H + h * hd, H, lse + (b * s.heads + h) * S, dq, dk,
                 dv, ld, ld, p);
  });
}

// Context parallelism's ring attention, one block at a time (Liu et al., "Ring Attention",
// 2023; Megatron-Core's context parallelism): a query chunk against one key chunk of the same
// length, the keys before the queries (a full block) or the same positions (the causal
// diagonal). Each block is a whole head of the kernels above over `len` rows; its dropout
// counters are those of the whole sequence's head (counterBase at the block's corner,
// counterLd the whole sequence).
namespace {
Head blockHead(const AttentionBlock &b) {
  Head h{b.q,   b.k,       b.v,      b.ld,   b.ld,   b.ld,          nullptr, nullptr, nullptr, nullptr,
         b.len, b.headDim, b.causal, b.dropout, b.seed, b.stream, b.counterBase};
  h.counterLd = b.counterLd;
  return h;
}
}  // namespace

int64_t attentionBlockScratchFloats(int64_t len, bool backward) { return headScratchFloats(len, backward); }

void attentionBlockForward(const AttentionBlock &b, float *out, int64_t ldo, float *lse, float *scratch) {
  headForward(blockHead(b), out, ldo, lse, scratch);
}

void attentionBlockBackward(const AttentionBlock &b, const float *g, int64_t ldg, const float *lse,
                            const float *delta, float *dq, float *dk, float *dv, int64_t ldd, float *scratch) {
  headBackward(blockHead(b), g, ldg, lse, dq, dk, dv, ldd, ldd, scratch, delta, /*accumulateDq=*/true);
}

void mergeAttentionBlock(float *out, float *lse, int64_t ldo, const float *part, const float *partLse, int64_t ldp,
                         int64_t rows, int64_t headDim) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < rows; ++i) {
    float pl = partLse[i];
    if (pl == inf) continue;  // the block's row saw no key
    float *o = out + i * ldo;
    const float *x = part + i * ldp;
    if (lse[i] == -inf) {  // the row's first block
      std::copy(x, x + headDim, o);
      lse[i] = pl;
      continue;
    }
    float m = std::max(lse[i], pl);
    float merged = m + std::log(std::exp(lse[i] - m) + std::exp(pl - m));
    float a = std::exp(lse[i] - merged), c = std::exp(pl - merged);
    for (int64_t j = 0; j < headDim; ++j) o[j] = a * o[j] + c * x[j];
    lse[i] = merged;
  }
}

void attentionRowDots(const float *g, const float *out, int64_t ld, int64_t rows, int64_t headDim, float *delta) {
  for (int64_t i = 0; i < rows; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < headDim; ++j) sum += double(g[i * ld + j]) * double(out[i * ld + j]);
    delta[i] = float(sum);
  }
}

// Context parallelism over all-gathered keys and values (Megatron-Core's cp_comm_type
// "all_gather"): this rank's queries are its two chunks of C tokens (global chunks `rank` and
// 2c-1-rank), the keys and values the whole sequence as the all-gather left it, 2c chunks in
// member order (member j's chunks j and 2c-1-j at rows 2jC and 2jC + C). Each query chunk meets
// the key chunks at or before it, one block each (the diagonal one causal), and the blocks are
// merged by their log-sum-exp; the backward runs the same blocks from the merged statistics and
// each row's rowsum(dO * O) (FlashAttention-2's D, with O recomputed). The dropout counters
// are the whole sequence's, so the masks are those of c = 1.
namespace {

// Query chunk qi of `chunks`' rank (rows from q) against chunk `which` of `member` (rows from k,
// v) of one head, C rows each: the diagonal block causal, the dropout counters the whole
// sequence's (headBase: the head's corner of its S x S counters). Both context-parallel forms
// (the gathered keys and the ring) build their blocks here.
Head chunkPairHead(const ContextChunks &chunks, const float *q, int64_t ldq, const float *k, const float *v,
                   int64_t ldkv, int64_t hd, int qi, int member, int which, bool causal, float dropout, uint64_t seed,
                   uint64_t stream, uint64_t headBase) {
  int64_t C = chunks.chunk(), S = chunks.seq, gq = chunks.chunkOf(chunks.rank, qi), gk = chunks.chunkOf(member, which);
  Head h{q, k, v, ldq, ldkv, ldkv, nullptr, nullptr, nullptr, nullptr, C, hd, causal && gk == gq, dropout, seed, stream,
         headBase + uint64_t(gq * C) * uint64_t(S) + uint64_t(gk * C)};
  h.counterLd = S;
  return h;
}
// Whether query chunk qi of the rank sees any key of chunk `which` of `member`.
bool chunkPairVisible(const ContextChunks &chunks, int qi, int member, int which, bool causal) {
  return !causal || chunks.chunkOf(member, which) <= chunks.chunkOf(chunks.rank, qi);
}

struct ChunkedHead {
  const float *q, *k, *v;  // this head's first local query row; first gathered key / value row
  int64_t ldq, ldkv, C, hd;
  int c, rank;
  bool causal;
  float dropout;
  uint64_t seed, stream, counterBase;  // counterBase: the head's corner of the S x S counters
  ContextChunks chunks() const { return ContextChunks{2 * c * C, c, rank}; }
  // Block (query chunk qi of this rank, gathered key slot: member slot / 2's chunk slot % 2).
  Head block(int qi, int slot) const {
    return chunkPairHead(chunks(), q + qi * C * ldq, ldq, k + slot * C * ldkv, v + slot * C * ldkv, ldkv, hd, qi,
                         slot / 2, slot % 2, causal, dropout, seed, stream, counterBase);
  }
  bool sees(int qi, int slot) const { return chunkPairVisible(chunks(), qi, slot / 2, slot % 2, causal); }
};

int64_t chunkedScratchFloats(int64_t C, int64_t hd, bool backward) {
  // A block's, its part and part statistics, then (backward) O, its statistics and D.
  return headScratchFloats(C, backward) + C * hd + C + (backward ? 2 * C * hd + 4 * C : 2 * C);
}

// out (2C rows, ldo apart), lse (2C; null: kept in the scratch).
void chunkedHeadForward(const ChunkedHead &h, float *out, int64_t ldo, float *lse, float *scratch) {
  int64_t C = h.C, hd = h.hd;
  float *part = scratch + headScratchFloats(C, false), *partLse = part + C * hd, *ownLse = partLse + C;
  if (!lse) lse = ownLse;
  for (int qi = 0; qi < 2; ++qi) {
    float *o = out + qi * C * ldo, *l = lse + qi * C;
    std::fill(l, l + C, -std::numeric_limits<float>::infinity());
    zeroRows(o, C, hd, ldo);
    for (int slot = 0; slot < 2 * h.c; ++slot) {
      if (!h.sees(qi, slot)) continue;
      headForward(h.block(qi, slot), part, hd, partLse, scratch);
      mergeAttentionBlock(o, l, ldo, part, partLse, hd, C, hd);
    }
  }
}

// dq (2C rows, ldq apart), dk and dv (the gathered rows, ldkv apart) added to.
void chunkedHeadBackward(const ChunkedHead &h, const float *g, int64_t ldg, const float *lse, float *dq, float *dk,
                         float *dv, float *scratch) {
  int64_t C = h.C, hd = h.hd, block = headScratchFloats(C, true);
  float *o = scratch + block + C * hd + C, *oLse = o + 2 * C * hd, *delta = oLse + 2 * C;
  // O again (the forward's scratch fits in the backward's), then D = rowsum(dO * O).
  chunkedHeadForward(h, o, hd, oLse, scratch);
  for (int64_t i = 0; i < 2 * C; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < hd; ++j) sum += double(g[i * ldg + j]) * double(o[i * hd + j]);
    delta[i] = float(sum);
  }
  for (int qi = 0; qi < 2; ++qi)
    for (int slot = 0; slot < 2 * h.c; ++slot) {
      if (!h.sees(qi, slot)) continue;
      headBackward(h.block(qi, slot), g + qi * C * ldg, ldg, lse + qi * C, dq + qi * C * h.ldq,
                   dk + slot * C * h.ldkv, dv + slot * C * h.ldkv, h.ldq, h.ldkv, scratch, delta + qi * C,
                   /*accumulateDq=*/true);
    }
}

}  // namespace

int64_t contextAttentionScratchFloats(int64_t chunk, int64_t headDim, bool backward) {
  return kHeadGroups * chunkedScratchFloats(chunk, headDim, backward);
}

namespace {
ChunkedHead gatheredHead(const float *qkv, const AttentionShape &s, int c, int rank, int64_t b, int64_t h) {
  int64_t hd = s.headDim, ld = 3 * s.heads * hd, S = s.seq, C = S / (2 * c);
  const float *base = qkv + b * S * ld + h * 3 * hd;
  return ChunkedHead{base + rank * 2 * C * ld, base + hd, base + 2 * hd, ld, ld, C, hd, c, rank, s.causal, s.dropout,
                     s.seed, s.stream, uint64_t((b * s.heads + h) * S) * uint64_t(S)};
}
}  // namespace

void contextAttentionForward(const float *qkv, float *out, float *lse, const AttentionShape &s, int c, int rank,
                             float *scratch) {
  int64_t H = s.heads * s.headDim, L = s.seq / c, C = L / 2;
  inHeadGroups(s.batch * s.heads, chunkedScratchFloats(C, s.headDim, false), scratch, true, [&](int64_t i, float *p) {
    int64_t b = i / s.heads, h = i % s.heads;
    chunkedHeadForward(gatheredHead(qkv, s, c, rank, b, h), out + b * L * H + h * s.headDim, H,
                       lse ? lse + (b * s.heads + h) * L : nullptr, p);
  });
}

void contextAttentionBackward(const float *qkv, const float *g, const float *lse, float *dqkv,
                              const AttentionShape &s, int c, int rank, float *scratch) {
  int64_t hd = s.headDim, H = s.heads * hd, ld = 3 * H, S = s.seq, L = S / c, C = L / 2;
  std::fill(dqkv, dqkv + s.batch * S * ld, 0.0f);  // other members' query rows stay 0
  inHeadGroups(s.batch * s.heads, chunkedScratchFloats(C, hd, true), scratch, true, [&](int64_t i, float *p) {
    int64_t b = i / s.heads, h = i % s.heads;
    float *dq = dqkv + b * S * ld + rank * 2 * C * ld + h * 3 * hd, *dk = dqkv + b * S * ld + h * 3 * hd + hd;
    chunkedHeadBackward(gatheredHead(qkv, s, c, rank, b, h), g + b * L * H + h * hd, H, lse + (b * s.heads + h) * L,
                        dq, dk, dk + hd, p);
  });
}

namespace {
// s.seq: the local S / c queries; k and v hold c times as many rows.
ChunkedHead chunkedGroupedHead(const float *q, const float *k, const float *v, const GroupedAttentionShape &s, int c,
                               int rank, int64_t b, int64_t h) {
  int64_t hd = s.headDim, L = s.seq, S = L * c, ldq = s.heads * hd, ldkv = s.kvHeads * hd, kv = s.kvHeadOf(h);
  return ChunkedHead{q + b * L * ldq + h * hd, k + b * S * ldkv + kv * hd, v + b * S * ldkv + kv * hd, ldq, ldkv,
                     L / 2, hd, c, rank, s.causal, s.dropout, s.seed, s.stream,
                     uint64_t((b * s.heads + h) * S) * uint64_t(S)};
}
}  // namespace

void contextGroupedAttentionForward(const float *q, const float *k, const float *v, float *out, float *lse,
                                    const GroupedAttentionShape &s, int c, int rank, float *scratch) {
  int64_t L = s.seq, ldq = s.heads * s.headDim;
  inHeadGroups(s.batch * s.heads, chunkedScratchFloats(L / 2, s.headDim, false), scratch, true,
               [&](int64_t i, float *p) {
                 int64_t b = i / s.heads, h = i % s.heads;
                 chunkedHeadForward(chunkedGroupedHead(q, k, v, s, c, rank, b, h), out + b * L * ldq + h * s.headDim,
                                    ldq, lse ? lse + (b * s.heads + h) * L : nullptr, p);
               });
}

void contextGroupedAttentionBackward(const float *q, const float *k, const float *v, const float *g, const float *lse,
                                     float *dq, float *dk, float *dv, const GroupedAttentionShape &s, int c, int rank,
                                     float *scratch) {
  int64_t hd = s.headDim, L = s.seq, S = L * c, ldq = s.heads * hd, ldkv = s.kvHeads * hd;
  std::fill(dq, dq + s.batch * L * ldq, 0.0f);
  std::fill(dk, dk + s.batch * S * ldkv, 0.0f);
  std::fill(dv, dv + s.batch * S * ldkv, 0.0f);
  int64_t items = s.batch * s.heads, mid = items / 2;
  auto kvOf = [&](int64_t i) { return (i / s.heads) * s.kvHeads + s.kvHeadOf(i % s.heads); };
  bool splittable = items >= 2 && kvOf(mid - 1) != kvOf(mid);
  inHeadGroups(items, chunkedScratchFloats(L / 2, hd, true), scratch, splittable, [&](int64_t i, float *p) {
    int64_t b = i / s.heads, h = i % s.heads;
    int64_t qo = b * L * ldq + h * hd, kvo = b * S * ldkv + s.kvHeadOf(h) * hd;
    chunkedHeadBackward(chunkedGroupedHead(q, k, v, s, c, rank, b, h), g + qo, ldq, lse + (b * s.heads + h) * L,
                        dq + qo, dk + kvo, dv + kvo, p);
  });
}

// Context parallelism's ring (Megatron-Core's cp_comm_type "p2p"; Liu et al. 2023, "Ring
// Attention"): c steps; at step s this rank holds member (rank - s) mod c's two chunks of keys and
// values, computes its queries' blocks against them (merged by log-sum-exp, as
// contextAttentionForward does) while they travel on to the next member and the previous
// member's arrive. The backward walks the same ring with the keys' and values' gradient
// accumulators following their keys one step behind; after c steps each member's own come home.
int64_t RingAttentionShape::kvHeadOf(int64_t h) const { return (firstHead + h) / headsPerKv; }

namespace {
int64_t ringKvFloats(const RingAttentionShape &s) { return s.batch * s.local * s.kvHeads * s.headDim; }
ContextChunks ringChunks(const RingAttentionShape &s) { return ContextChunks{s.local * s.c, s.c, s.rank}; }
bool ringSees(const RingAttentionShape &s, int qi, int member, int which) {
  return chunkPairVisible(ringChunks(s), qi, member, which, s.causal);
}
// Query chunk qi of (b, h) (q: head h's column of the rank's queries, ldq apart) against chunk
// `which` of `member` in the packed K / V rows (kvw apart).
Head ringBlock(const RingAttentionShape &s, const float *q, int64_t ldq, const float *k, const float *v, int64_t b,
               int64_t h, int qi, int member, int which) {
  int64_t L = s.local, C = L / 2, hd = s.headDim, kvw = s.kvHeads * hd, S = L * s.c;
  int64_t kvo = (b * L + which * C) * kvw + s.kvHeadOf(h) * hd;
  return chunkPairHead(ringChunks(s), q + qi * C * ldq, ldq, k + kvo, v + kvo, kvw, hd, qi, member, which, s.causal,
                       s.dropout, s.seed, s.stream, uint64_t((b * s.heads + h) * S) * uint64_t(S));
}
int64_t ringBlockFloats(const RingAttentionShape &s, bool backward) {
  int64_t C = s.local / 2;
  return headScratchFloats(C, backward) + (backward ? 0 : C * s.headDim + C);
}

// Floats of the 16-bit staging of a K | V message (send and receive halves), when the keys
// travel in 16 bits.
int64_t ringStagingFloats(const RingAttentionShape &s) {
  return s.keyWire == RingAttentionShape::Wire::kF32 ? 0 : 2 * ringKvFloats(s);
}

// `count` floats of K | V to the next member and as many from the previous one, in the keys'
// wire dtype: fp32 as they are, or narrowed into `staging` (2 count 16-bit values: the outgoing,
// then the arriving) and widened on arrival. Runs on the transfer's own thread, so the
// conversions are the single-threaded row forms.
Status passKeys(const RingAttentionShape &s, const RingExchange &exchange, const float *send, float *recv,
                int64_t count, uint16_t *staging) {
  using Wire = RingAttentionShape::Wire;
  if (s.keyWire == Wire::kF32) return exchange(send, recv, count * int64_t(sizeof(float)));
  uint16_t *out = staging, *in = staging + count;
  s.keyWire == Wire::kBf16 ? narrowBf16Row(send, out, count) : narrowF16Row(send, out, count);
  LOOM_RETURN_IF_ERROR(exchange(out, in, count * int64_t(sizeof(uint16_t))));
  s.keyWire == Wire::kBf16 ? widenBf16Row(in, recv, count) : widenF16Row(in, recv, count);
  return Status::ok();
}

// The step's transfer on its own thread while the caller computes (the ring's overlap).
class RingTransfer {
 public:
  RingTransfer(std::function<Status()> transfer, bool active) {
    if (active) thread_ = std::thread([transfer = std::move(transfer), this] { status_ = transfer(); });
  }
  Status join() {
    if (thread_.joinable()) thread_.join();
    return status_;
  }
  ~RingTransfer() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::thread thread_;
  Status status_ = Status::ok();
};
}  // namespace

int64_t ringAttentionScratchFloats(const RingAttentionShape &s, bool backward, bool packedKeys) {
  int64_t kv = ringKvFloats(s), rows = s.batch * s.heads * s.local;
  // Two ring slots of K | V (and, backward, of dK | dV); the rows' statistics (backward: D);
  // the head groups' blocks; a 16-bit wire's staging; the packed local K | V and dK | dV the GPT
  // form's callers keep (last).
  return (backward ? 8 : 4) * kv + rows + kHeadGroups * ringBlockFloats(s, backward) + ringStagingFloats(s) +
         (packedKeys ? 4 * kv : 0);
}

Status ringAttentionForward(const float *q, int64_t ldq, int64_t qHeadStride, const float *k, const float *v,
                            float *out, float *lse, const RingAttentionShape &s, float *scratch,
                            const RingExchange &exchange) {
  int64_t L = s.local, C = L / 2, hd = s.headDim, H = s.heads * hd, kv = ringKvFloats(s);
  float *slot[2] = {scratch, scratch + 2 * kv};
  float *ownLse = scratch + 4 * kv, *blocks = ownLse + s.batch * s.heads * L;
  uint16_t *staging = reinterpret_cast<uint16_t *>(blocks + kHeadGroups * ringBlockFloats(s, false));
  if (!lse) lse = ownLse;
  std::copy(k, k + kv, slot[0]);
  std::copy(v, v + kv, slot[0] + kv);
  std::fill(out, out + s.batch * L * H, 0.0f);
  std::fill(lse, lse + s.batch * s.heads * L, -std::numeric_limits<float>::infinity());
  int cur = 0;
  for (int step = 0; step < s.c; ++step) {
    int member = (s.rank - step + s.c) % s.c;
    RingTransfer next([&, from = slot[cur], to = slot[1 - cur]] { return passKeys(s, exchange, from, to, 2 * kv, staging); },
                      step + 1 < s.c);
    const float *ks = slot[cur], *vs = slot[cur] + kv;
    inHeadGroups(s.batch * s.heads, ringBlockFloats(s, false), blocks, true, [&](int64_t i, float *p) {
      int64_t b = i / s.heads, h = i % s.heads;
      float *part = p + headScratchFloats(C, false), *partLse = part + C * hd;
      for (int qi = 0; qi < 2; ++qi)
        for (int which = 0; which < 2; ++which) {
          if (!ringSees(s, qi, member, which)) continue;
          headForward(ringBlock(s, q + b * L * ldq + h * qHeadStride, ldq, ks, vs, b, h, qi, member, which), part, hd,
                      partLse, p);
          mergeAttentionBlock(out + (b * L + qi * C) * H + h * hd, lse + (b * s.heads + h) * L + qi * C, H, part,
                              partLse, hd, C, hd);
        }
    });
    LOOM_RETURN_IF_ERROR(next.join());
    cur = 1 - cur;
  }
  return Status::ok();
}

Status ringAttentionBackward(const float *q, int64_t ldq, int64_t qHeadStride, const float *k, const float *v,
                             const float *g, const float *out, const float *lse, float *dq, float *dk, float *dv,
                             const RingAttentionShape &s, float *scratch, const RingExchange &exchange) {
  int64_t L = s.local, C = L / 2, hd = s.headDim, H = s.heads * hd, kv = ringKvFloats(s), kvw = s.kvHeads * hd;
  float *slot[2] = {scratch, scratch + 2 * kv}, *grads[2] = {scratch + 4 * kv, scratch + 6 * kv};
  float *delta = scratch + 8 * kv, *blocks = delta + s.batch * s.heads * L;
  uint16_t *staging = reinterpret_cast<uint16_t *>(blocks + kHeadGroups * ringBlockFloats(s, true));
  // D = rowsum(dO * O) over each head's rows (FlashAttention-2's D, for every step's blocks).
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t l = 0; l < L; ++l) {
        const float *gr = g + (b * L + l) * H + h * hd, *orow = out + (b * L + l) * H + h * hd;
        double sum = 0;
        for (int64_t j = 0; j < hd; ++j) sum += double(gr[j]) * double(orow[j]);
        delta[(b * s.heads + h) * L + l] = float(sum);
      }
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < s.heads; ++h) std::fill_n(dq + (b * L + l) * ldq + h * qHeadStride, hd, 0.0f);
  std::copy(k, k + kv, slot[0]);
  std::copy(v, v + kv, slot[0] + kv);
  std::fill(grads[0], grads[0] + 2 * kv, 0.0f);
  // Query heads sharing a KV head add into its gradients: such neighbours stay on one thread.
  int64_t items = s.batch * s.heads, mid = items / 2;
  auto kvOf = [&](int64_t i) { return (i / s.heads) * s.kvHeads + s.kvHeadOf(i % s.heads); };
  bool splittable = items >= 2 && kvOf(mid - 1) != kvOf(mid);
  int cur = 0;
  for (int step = 0; step < s.c; ++step) {
    int member = (s.rank - step + s.c) % s.c;
    RingTransfer next([&, from = slot[cur], to = slot[1 - cur]] { return passKeys(s, exchange, from, to, 2 * kv, staging); },
                      step + 1 < s.c);
    const float *ks = slot[cur], *vs = slot[cur] + kv;
    float *dks = grads[cur], *dvs = grads[cur] + kv;
    inHeadGroups(items, ringBlockFloats(s, true), blocks, splittable, [&](int64_t i, float *p) {
      int64_t b = i / s.heads, h = i % s.heads;
      const float *qh = q + b * L * ldq + h * qHeadStride;
      for (int qi = 0; qi < 2; ++qi)
        for (int which = 0; which < 2; ++which) {
          if (!ringSees(s, qi, member, which)) continue;
          int64_t kvo = (b * L + which * C) * kvw + s.kvHeadOf(h) * hd, row = (b * s.heads + h) * L + qi * C;
          headBackward(ringBlock(s, qh, ldq, ks, vs, b, h, qi, member, which), g + (b * L + qi * C) * H + h * hd, H,
                       lse + row, dq + (b * L + qi * C) * ldq + h * qHeadStride, dks + kvo, dvs + kvo, ldq, kvw, p,
                       delta + row, /*accumulateDq=*/true);
        }
    });
    LOOM_RETURN_IF_ERROR(next.join());
    // The accumulators follow their keys: this member's on to the next rank, which holds its
    // keys at the next step (after the last step each member's own come home).
    LOOM_RETURN_IF_ERROR(exchange(grads[cur], grads[1 - cur], 2 * kv * int64_t(sizeof(float))));
    cur = 1 - cur;
  }
  std::copy(grads[cur], grads[cur] + kv, dk);
  std::copy(grads[cur] + kv, grads[cur] + 2 * kv, dv);
  return Status::ok();
}

// bf16 attention with FlashAttention's rounding points (Dao 2023, FlashAttention-2, section
// 3.1; Megatron's fused attention in bf16 rounds alike): the scores S = q k^T / sqrt(hd) and the
// softmax in fp32 from bf16 q and k; the probabilities (after dropout) rounded to bf16 for
// out = P v. Backward: P again from the statistics; dV = P^T dO and dP = dO v^T (bf16 operands,
// fp32 sums); dS = P (dP - rowsum(P dP)) in fp32, rounded to bf16 for dQ = dS k / sqrt(hd) and
// dK = dS^T q / sqrt(hd). Every product is a bf16 GEMM; every output rounded once.
namespace {

// A head's scratch, a query block at a time (headForward's tiling): the block's P (fp32) and its
// bf16 copy; backward the block's P, D (dropout) and dP / dS (fp32), their bf16 D and dS, one
// block of a GEMM's fp32 result (dQ), and the head's fp32 dK and dV sums over the query blocks.
int64_t halves(int64_t n) { return (n + 1) / 2; }  // floats that hold n bf16 values
int64_t headScratchFloatsBf16(int64_t seq, int64_t headDim, bool backward) {
  int64_t block = blockFloats(seq);
  return backward ? 3 * block + 2 * halves(block) + kBlock * headDim + 2 * seq * headDim : block + halves(block);
}

Head attentionHeadBf16(const uint16_t *qkv, const float *keyMask, const AttentionShape &s, int64_t b, int64_t h) {
  int64_t hd = s.headDim, ld = 3 * s.heads * hd, S = s.seq;
  const uint16_t *q = qkv + b * S * ld + h * 3 * hd;
  return Head{nullptr, nullptr, nullptr, ld, ld, ld, q, q + hd, q + 2 * hd, keyMask ? keyMask + b * S : nullptr,
              S, hd, s.causal, s.dropout, s.seed, s.stream, uint64_t((b * s.heads + h) * S) * uint64_t(S)};
}

// The block's rows of x (row i at x + (i - i0) * S), each up to its block's width, rounded into
// x16 (same layout).
void roundBlockRows(const Head &h, int64_t i0, int64_t rows, float *x, uint16_t *x16) {
  blockRows(h, i0, rows, x, [&](int64_t i, float *row) { narrowToBf16(row, x16 + (i - i0) * h.S, h.rowColumns(i)); });
}

// dst[r, 0:hd) (bf16, ld apart) = scale * block[r, 0:hd) for `rows` rows.
void scaledRowsToBf16(const float *block, int64_t rows, int64_t hd, float scale, uint16_t *dst, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < hd; ++c) dst[r * ld + c] = floatToBf16(block[r * hd + c] * scale);
}

void headForwardBf16(const Head &h, uint16_t *out, int64_t ldo, float *lse, float *scratch) {
  float *p = scratch;
  uint16_t *p16 = reinterpret_cast<uint16_t *>(p + blockFloats(h.S));
  for (int64_t i0 = 0; i0 < h.S; i0 += kBlock) {
    int64_t rows = std::min(kBlock, h.S - i0), cols = h.blockKeys(i0);
    blockProbs(h, i0, rows, p, lse, nullptr);
    blockDropout(h, i0, rows, p);
    roundBlockRows(h, i0, rows, p, p16);
    gemmBf16(false, false, rows, h.hd, cols, p16, h.S, h.v16, h.ldv, nullptr, out + i0 * ldo, GemmOut::kBf16, ldo);
  }
}

// Where a head's dK or dV rows go (ld apart): rounded into bf16, each written once, or (grouped
// attention) added into fp32 sums over the query heads that share the KV head, rounded after.
struct KvGrad {
  uint16_t *bf16 = nullptr;
  float *sum = nullptr;
  void put(const float *block, int64_t rows, int64_t hd, float scale, int64_t row0, int64_t ld) const {
    if (!sum) return scaledRowsToBf16(block, rows, hd, scale, bf16 + row0 * ld, ld);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < hd; ++c) sum[(row0 + r) * ld + c] += block[r * hd + c] * scale;
  }
};

// dq (bf16, rows ldd apart, written once), dk and dv: this head's gradients. A query block at a
// time (FlashAttention-2's backward, Dao 2023, section 3.2): its rows of D and dS in bf16, its
// dQ, and its share of dV = D^T dO and dK = dS^T q / sqrt(hd) added to fp32 sums over the query
// blocks (with the causal mask a block's rows see the keys up to its width), rounded once after.
void headBackwardBf16(const Head &h, const uint16_t *g, int64_t ldg, const float *lse, uint16_t *dq, KvGrad dk,
                      KvGrad dv, int64_t ldd, int64_t ldkv, float *scratch) {
  int64_t S = h.S, hd = h.hd;
  float scale = 1.0f / std::sqrt(float(hd));
  float *p = scratch, *dropped = p + blockFloats(S), *dp = dropped + blockFloats(S);
  uint16_t *d16 = reinterpret_cast<uint16_t *>(dp + blockFloats(S)), *ds16 = d16 + 2 * halves(blockFloats(S));
  float *block = reinterpret_cast<float *>(ds16 + 2 * halves(blockFloats(S)));
  float *dkSum = block + kBlock * hd, *dvSum = dkSum + S * hd;
  std::fill(dkSum, dvSum + S * hd, 0.0f);
  for (int64_t i0 = 0; i0 < S; i0 += kBlock) {
    int64_t rows = std::min(kBlock, S - i0), cols = h.blockKeys(i0);
    const uint16_t *gi = g + i0 * ldg;
    blockProbs(h, i0, rows, p, nullptr, lse);
    float *d = blockDropped(h, i0, rows, p, dropped);
    roundBlockRows(h, i0, rows, d, d16);
    // dP = dO v^T, then dS = P (dP - rowsum(P dP)) rounded.
    gemmBf16(false, true, rows, cols, hd, gi, ldg, h.v16, h.ldv, nullptr, dp, GemmOut::kF32, S);
    blockSoftmaxGrad(h, i0, rows, p, d, dp, nullptr,
                     [&](int64_t i, float *r) { narrowToBf16(r, ds16 + (i - i0) * S, h.rowColumns(i)); });
    // dQ = dS k / sqrt(hd)
    gemmBf16(false, false, rows, hd, cols, ds16, S, h.k16, h.ldk, nullptr, block, GemmOut::kF32, hd);
    scaledRowsToBf16(block, rows, hd, scale, dq + i0 * ldd, ldd);
    // dV[0 : cols) += D^T dO, dK[0 : cols) += dS^T q (scaled once at the end).
    gemmBf16(true, false, cols, hd, rows, d16, S, gi, ldg, nullptr, dvSum, GemmOut::kF32Add, hd);
    gemmBf16(true, false, cols, hd, rows, ds16, S, h.q16 + i0 * h.ldq, h.ldq, nullptr, dkSum, GemmOut::kF32Add, hd);
  }
  dv.put(dvSum, S, hd, 1.0f, 0, ldkv);
  dk.put(dkSum, S, hd, scale, 0, ldkv);
}

}  // namespace

int64_t attentionScratchFloatsBf16(int64_t seq, int64_t headDim, bool backward) {
  return kHeadGroups * headScratchFloatsBf16(seq, headDim, backward);
}

void attentionForwardBf16(const uint16_t *qkv, const float *keyMask, uint16_t *out, float *lse, const AttentionShape &s,
                          float *scratch) {
  int64_t H = s.heads * s.headDim, S = s.seq;
  inHeadGroups(s.batch * s.heads, headScratchFloatsBf16(S, s.headDim, false), scratch, true, [&](int64_t i, float *p) {
    int64_t b = i / s.heads, h = i % s.heads;
    headForwardBf16(attentionHeadBf16(qkv, keyMask, s, b, h), out + b * S * H + h * s.headDim, H,
                    lse ? lse + (b * s.heads + h) * S : nullptr, p);
  });
}

void attentionBackwardBf16(const uint16_t *qkv, const float *keyMask, const uint16_t *g, const float *lse,
                           uint16_t *dqkv, const AttentionShape &s, float *scratch) {
  int64_t hd = s.headDim, ld = 3 * s.heads * hd, H = s.heads * hd, S = s.seq;
  inHeadGroups(s.batch * s.heads, headScratchFloatsBf16(S, hd, true), scratch, true, [&](int64_t i, float *p) {
    int64_t b = i / s.heads, h = i % s.heads;
    uint16_t *dq = dqkv + b * S * ld + h * 3 * hd;
    headBackwardBf16(attentionHeadBf16(qkv, keyMask, s, b, h), g + b * S * H + h * hd, H, lse + (b * s.heads + h) * S,
                     dq, KvGrad{dq + hd}, KvGrad{dq + 2 * hd}, ld, ld, p);
  });
}

int64_t GroupedAttentionShape::kvHeadOf(int64_t h) const { return (firstHead + h) / headsPerKv; }

namespace {
Head groupedHead(const float *q, const float *k, const float *v, const GroupedAttentionShape &s, int64_t b, int64_t h) {
  int64_t hd = s.headDim, S = s.seq, ldq = s.heads * hd, ldkv = s.kvHeads * hd, kv = s.kvHeadOf(h);
  return Head{q + b * S * ldq + h * hd, k + b * S * ldkv + kv * hd, v + b * S * ldkv + kv * hd, ldq, ldkv, ldkv,
              nullptr, nullptr, nullptr, nullptr, S, hd, s.causal, s.dropout, s.seed, s.stream, uint64_t((b * s.heads + h) * S) * uint64_t(S)};
}
}  // namespace

void groupedAttentionForward(const float *q, const float *k, const float *v, float *out, float *lse,
                             const GroupedAttentionShape &s, float *scratch) {
  int64_t S = s.seq, ldq = s.heads * s.headDim;
  inHeadGroups(s.batch * s.heads, headScratchFloats(S, false), scratch, true, [&](int64_t i, float *p) {
    int64_t b = i / s.heads, h = i % s.heads;
    headForward(groupedHead(q, k, v, s, b, h), out + b * S * ldq + h * s.headDim, ldq,
                lse ? lse + (b * s.heads + h) * S : nullptr, p);
  });
}

// As attentionBackward, per query head; a KV head's dK and dV sum over its query heads.
void groupedAttentionBackward(const float *q, const float *k, const float *v, const float *g, const float *lse,
                              float *dq, float *dk, float *dv, const GroupedAttentionShape &s, float *scratch) {
  int64_t hd = s.headDim, S = s.seq, ldq = s.heads * hd, ldkv = s.kvHeads * hd;
  std::fill(dk, dk + s.batch * S * ldkv, 0.0f);
  std::fill(dv, dv + s.batch * S * ldkv, 0.0f);
  // The halves may run apart when no KV head takes gradients from both (the query heads of
  // one KV head then still add into it in order).
  int64_t items = s.batch * s.heads, mid = items / 2;
  auto kvOf = [&](int64_t i) { return (i / s.heads) * s.kvHeads + s.kvHeadOf(i % s.heads); };
  bool splittable = items >= 2 && kvOf(mid - 1) != kvOf(mid);
  inHeadGroups(items, headScratchFloats(S, true), scratch, splittable, [&](int64_t i, float *p) {
    int64_t b = i / s.heads, h = i % s.heads;
    int64_t qo = b * S * ldq + h * hd, kvo = b * S * ldkv + s.kvHeadOf(h) * hd;
    headBackward(groupedHead(q, k, v, s, b, h), g + qo, ldq, lse + (b * s.heads + h) * S, dq + qo, dk + kvo, dv + kvo,
                 ldq, ldkv, p);
  });
}

// Grouped-query attention over bf16 q, k, v (FlashAttention's rounding points, as
// attentionForwardBf16); a KV head's dK and dV are summed over its query heads in fp32 and
// rounded once (FlashAttention-2's GQA backward; the same as the gradient of repeat_kv).
namespace {
Head groupedHeadBf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, const GroupedAttentionShape &s, int64_t b,
                     int64_t h) {
  int64_t hd = s.headDim, S = s.seq, ldq = s.heads * hd, ldkv = s.kvHeads * hd, kv = s.kvHeadOf(h);
  return Head{nullptr, nullptr, nullptr, ldq, ldkv, ldkv, q + b * S * ldq + h * hd, k + b * S * ldkv + kv * hd,
              v + b * S * ldkv + kv * hd, nullptr, S, hd, s.causal, s.dropout, s.seed, s.stream,
              uint64_t((b * s.heads + h) * S) * uint64_t(S)};
}
int64_t kvFloats(const GroupedAttentionShape &s) { return s.batch * s.seq * s.kvHeads * s.headDim; }
}  // namespace

int64_t groupedAttentionScratchFloatsBf16(const GroupedAttentionShape &s, bool backward) {
  return kHeadGroups * (headScratchFloatsBf16(s.seq, s.headDim, backward) + (backward ? 2 * kvFloats(s) : 0));
}

void groupedAttentionForwardBf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *out, float *lse,
                                 const GroupedAttentionShape &s, float *scratch) {
  int64_t S = s.seq, ldq = s.heads * s.headDim;
  inHeadGroups(s.batch * s.heads, headScratchFloatsBf16(S, s.headDim, false), scratch, true, [&](int64_t i, float *p) {
    int64_t b = i / s.heads, h = i % s.heads;
    headForwardBf16(groupedHeadBf16(q, k, v, s, b, h), out + b * S * ldq + h * s.headDim, ldq,
                    lse ? lse + (b * s.heads + h) * S : nullptr, p);
  });
}

// Each half of the heads sums its dK and dV in its own fp32 buffers (so the halves run apart
// even when a KV head's query heads fall in both); the halves' sums are added in half order and
// rounded once: the same bits whatever the thread count.
void groupedAttentionBackwardBf16(const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint16_t *g,
                                  const float *lse, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                                  const GroupedAttentionShape &s, float *scratch) {
  int64_t hd = s.headDim, S = s.seq, ldq = s.heads * hd, ldkv = s.kvHeads * hd, kvn = kvFloats(s);
  int64_t head = headScratchFloatsBf16(S, hd, true), perGroup = head + 2 * kvn;
  for (int64_t grp = 0; grp < kHeadGroups; ++grp) std::fill(scratch + grp * perGroup + head, scratch + (grp + 1) * perGroup, 0.0f);
  inHeadGroups(s.batch * s.heads, perGroup, scratch, true, [&](int64_t i, float *p) {
    int64_t b = i / s.heads, h = i % s.heads;
    int64_t qo = b * S * ldq + h * hd, kvo = b * S * ldkv + s.kvHeadOf(h) * hd;
    float *dkSum = p + head, *dvSum = dkSum + kvn;
    headBackwardBf16(groupedHeadBf16(q, k, v, s, b, h), g + qo, ldq, lse + (b * s.heads + h) * S, dq + qo,
                     KvGrad{nullptr, dkSum + kvo}, KvGrad{nullptr, dvSum + kvo}, ldq, ldkv, p);
  });
  float *first = scratch + head;  // group 0's dK sums, then its dV sums (2 kvn), likewise group 1's
  for (int64_t grp = 1; grp < kHeadGroups; ++grp) {
    const float *other = scratch + grp * perGroup + head;
    parallelFor(2 * kvn, kMinPartElements, [&](int64_t lo, int64_t hi) {
      for (int64_t j = lo; j < hi; ++j) first[j] += other[j];
    });
  }
  narrowToBf16(first, dk, kvn);
  narrowToBf16(first + kvn, dv, kvn);
}

namespace {
template <typename T>
void rmsNormForwardOf(const T *x, const T *gamma, T *y, int64_t rows, int64_t n, float eps) {
  WideParams<T> p(n, gamma);
  parallelFor(rows, grainFor(n), [&](int64_t r0, int64_t r1) {
    RowViews<T> views(2, n);
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = views.in(0, x + r * n);
      float rstd = 1.0f / std::sqrt(laneDot(xr, xr, n) / float(n) + eps);
      float *yr = views.out(1, y + r * n);
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * rstd * p.a[i];
      views.put(1, y + r * n);
    }
  });
}
}  // namespace

void rmsNormForward(const float *x, const float *gamma, float *y, int64_t rows, int64_t n, float eps) {
  rmsNormForwardOf(x, gamma, y, rows, n, eps);
}
void rmsNormForward(const uint16_t *x, const uint16_t *gamma, uint16_t *y, int64_t rows, int64_t n, float eps) {
  rmsNormForwardOf(x, gamma, y, rows, n, eps);
}

// dx = rstd (g gamma - x rstd mean(g gamma x rstd)), dgamma = sum g x rstd.
namespace {
// One row of the RMSNorm backward (restrict pointers: the loops vectorise; elementwise, and
// laneDot's fixed lane order, so every ISA variant gives the same bits).
LOOM_VECTOR_CLONES
void rmsNormGradRow(const float *__restrict xr, const float *__restrict gamma, const float *__restrict gr,
                    float *__restrict dxr, float *__restrict pg, float *__restrict dy, int64_t n, float eps) {
  float rstd = 1.0f / std::sqrt(laneDot(xr, xr, n) / float(n) + eps);
  for (int64_t i = 0; i < n; ++i) dy[i] = gr[i] * gamma[i];
  float mean = laneDot(dy, xr, n) * rstd / float(n);
  for (int64_t i = 0; i < n; ++i) {
    pg[i] += gr[i] * xr[i] * rstd;
    dxr[i] = rstd * (dy[i] - xr[i] * rstd * mean);
  }
}
}  // namespace

namespace {
template <typename T>
void rmsNormBackwardOf(const T *x, const T *gamma, const T *g, T *dx, T *dgamma, int64_t rows, int64_t n, float eps) {
  static thread_local std::vector<float> partialBuffer;
  WideParams<T> p(n, gamma);
  int64_t chunks = chunkCount(rows, kRowChunk);
  float *partial = scratch(partialBuffer, size_t(chunks * n));
  parallelChunks(rows, kRowChunk, [&](int64_t c, int64_t r0, int64_t r1) {
    static thread_local std::vector<float> dyBuffer;
    float *pg = partial + c * n, *dy = scratch(dyBuffer, size_t(n));
    std::fill(pg, pg + n, 0.0f);
    RowViews<T> views(3, n);
    for (int64_t r = r0; r < r1; ++r) {
      rmsNormGradRow(views.in(0, x + r * n), p.a, views.in(1, g + r * n), views.out(2, dx + r * n), pg, dy, n, eps);
      views.put(2, dx + r * n);
    }
  }, n);
  addChunksInto(partial, chunks, n, n, dgamma);
}
}  // namespace

void rmsNormBackward(const float *x, const float *gamma, const float *g, float *dx, float *dgamma, int64_t rows,
                     int64_t n, float eps) {
  rmsNormBackwardOf(x, gamma, g, dx, dgamma, rows, n, eps);
}
void rmsNormBackward(const uint16_t *x, const uint16_t *gamma, const uint16_t *g, uint16_t *dx, uint16_t *dgamma,
                     int64_t rows, int64_t n, float eps) {
  rmsNormBackwardOf(x, gamma, g, dx, dgamma, rows, n, eps);
}

namespace {
// RoPE's cos and sin of s * theta^(-2j / headDim), computed once per shape and thread (a call
// used to recompute seq x headDim / 2 of each, with std::pow, and allocate two tables).
struct RotaryTables {
  int64_t seq = -1, headDim = -1;
  float theta = 0;
  std::vector<float> cosT, sinT;
};
const RotaryTables &rotaryTables(int64_t seq, int64_t headDim, float theta) {
  static thread_local RotaryTables t;
  if (t.seq >= seq && t.headDim == headDim && t.theta == theta) return t;  // rows < seq are the same
  int64_t half = headDim / 2;
  t.seq = seq, t.headDim = headDim, t.theta = theta;
  t.cosT.resize(size_t(seq * half)), t.sinT.resize(size_t(seq * half));
  for (int64_t s = 0; s < seq; ++s)
    for (int64_t j = 0; j < half; ++j) {
      double angle = double(s) * std::pow(double(theta), -2.0 * double(j) / double(headDim));
      t.cosT[s * half + j] = float(std::cos(angle));
      t.sinT[s * half + j] = float(std::sin(angle));
    }
  return t;
}
}  // namespace

namespace {
template <typename T>
void rotaryOf(const T *x, T *y, int64_t batch, int64_t seq, int64_t heads, int64_t headDim, float theta,
              bool inverse, const int64_t *positions) {
  int64_t half = headDim / 2, width = heads * headDim, rowsNeeded = seq;
  if (positions)
    for (int64_t s = 0; s < seq; ++s) rowsNeeded = std::max(rowsNeeded, positions[s] + 1);
  const RotaryTables &t = rotaryTables(rowsNeeded, headDim, theta);
  const float *cosT = t.cosT.data(), *sinT = t.sinT.data();
  // Rows (batch, position) split over the threads: elementwise, the same bits for any split.
  parallelFor(batch * seq, grainFor(width), [&](int64_t r0, int64_t r1) {
    RowViews<T> views(2, width);
    for (int64_t r = r0; r < r1; ++r) {
      int64_t s = positions ? positions[r % seq] : r % seq;
      const float *xrow = views.in(0, x + r * width);
      float *yrow = views.out(1, y + r * width);
      for (int64_t h = 0; h < heads; ++h) {
        const float *xr = xrow + h * headDim;
        float *yr = yrow + h * headDim;
        for (int64_t j = 0; j < half; ++j) {
          float c = cosT[s * half + j], sn = inverse ? -sinT[s * half + j] : sinT[s * half + j];
          float x1 = xr[j], x2 = xr[j + half];
          yr[j] = x1 * c - x2 * sn;
          yr[j + half] = x2 * c + x1 * sn;
        }
      }
      views.put(1, y + r * width);
    }
  });
}

// sigmoid through fastExp (its clamp keeps 1 / (1 + e) finite: sigmoid(-inf side) ~ 5e-39).
template <typename T>
void swigluForwardOf(const T *gate, const T *up, T *y, int64_t count) {
  elementwise<2, 1, T>(count, {gate, up}, {y}, [](auto &in, auto &out, int64_t n, int64_t) {
    const float *a = in[0], *b = in[1];
    float *o = out[0];
    for (int64_t i = 0; i < n; ++i) {
      float sig = 1.0f / (1.0f + fastExp(-a[i]));
      o[i] = a[i] * sig * b[i];
    }
  });
}

template <typename T>
void swigluBackwardOf(const T *gate, const T *up, const T *g, T *dgate, T *dup, int64_t count) {
  elementwise<3, 2, T>(count, {gate, up, g}, {dgate, dup}, [](auto &in, auto &out, int64_t n, int64_t) {
    const float *a = in[0], *b = in[1], *gr = in[2];
    float *dg = out[0], *du = out[1];
    for (int64_t i = 0; i < n; ++i) {
      float x = a[i], sig = 1.0f / (1.0f + fastExp(-x));
      du[i] = gr[i] * x * sig;
      dg[i] = gr[i] * b[i] * sig * (1.0f + x * (1.0f - sig));
    }
  });
}
}  // namespace

void rotary(const float *x, float *y, int64_t batch, int64_t seq, int64_t heads, int64_t headDim, float theta,
            bool inverse, const int64_t *positions) {
  rotaryOf(x, y, batch, seq, heads, headDim, theta, inverse, positions);
}
void rotary(const uint16_t *x, uint16_t *y, int64_t batch, int64_t seq, int64_t heads, int64_t headDim, float theta,
            bool inverse, const int64_t *positions) {
  rotaryOf(x, y, batch, seq, heads, headDim, theta, inverse, positions);
}
void swigluForward(const float *gate, const float *up, float *y, int64_t count) {
  swigluForwardOf(gate, up, y, count);
}
void swigluForward(const uint16_t *gate, const uint16_t *up, uint16_t *y, int64_t count) {
  swigluForwardOf(gate, up, y, count);
}
void swigluBackward(const float *gate, const float *up, const float *g, float *dgate, float *dup, int64_t count) {
  swigluBackwardOf(gate, up, g, dgate, dup, count);
}
void swigluBackward(const uint16_t *gate, const uint16_t *up, const uint16_t *g, uint16_t *dgate, uint16_t *dup,
                    int64_t count) {
  swigluBackwardOf(gate, up, g, dgate, dup, count);
}

void embeddingForward(const int32_t *tokens, const float *word, const float *position, float *out,
                      int64_t tokenCount, int64_t seq, int64_t hidden, int64_t rowStart, int64_t rows) {
  for (int64_t t = 0; t < tokenCount; ++t) {
    int64_t row = int64_t(tokens[t]) - rowStart;
    float *o = out + t * hidden;
    if (row >= 0 && row < rows)
      std::memcpy(o, word + row * hidden, hidden * sizeof(float));
    else
      std::fill(o, o + hidden, 0.0f);
    if (position) {
      const float *p = position + (t % seq) * hidden;
      for (int64_t i = 0; i < hidden; ++i) o[i] += p[i];
    }
  }
}

// The table is zeroed by rows in parallel; the scatter-add goes over tokens in order, each
// thread taking a slice of the hidden columns (the same sums whatever the split).
void embeddingBackward(const int32_t *tokens, const float *g, float *dword, int64_t tokenCount,
                       int64_t hidden, int64_t rowStart, int64_t rows) {
  parallelFor(rows * hidden, 1 << 18, [&](int64_t lo, int64_t hi) { std::fill(dword + lo, dword + hi, 0.0f); });
  parallelFor(hidden, std::max<int64_t>(16, grainFor(tokenCount)), [&](int64_t i0, int64_t i1) {
    for (int64_t t = 0; t < tokenCount; ++t) {
      int64_t row = int64_t(tokens[t]) - rowStart;
      if (row < 0 || row >= rows) continue;
      for (int64_t i = i0; i < i1; ++i) dword[row * hidden + i] += g[t * hidden + i];
    }
  });
}

namespace {
// Each position's sum over the batch, in batch order, in fp32 (rows split over the threads).
template <typename T>
void positionBackwardOf(const T *g, T *dposition, int64_t batch, int64_t seq, int64_t hidden, int64_t positions,
                        const int64_t *rowOf) {
  std::fill(dposition, dposition + positions * hidden, T(0));
  parallelFor(seq, grainFor(batch * hidden), [&](int64_t s0, int64_t s1) {
    RowViews<T> views(2, hidden);
    for (int64_t s = s0; s < s1; ++s) {
      int64_t row = rowOf ? rowOf[s] : s;
      float *sum = views.out(1, dposition + row * hidden);
      std::fill(sum, sum + hidden, 0.0f);
      for (int64_t b = 0; b < batch; ++b) {
        const float *gr = views.in(0, g + (b * seq + s) * hidden);
        for (int64_t i = 0; i < hidden; ++i) sum[i] += gr[i];
      }
      views.put(1, dposition + row * hidden);
    }
  });
}

template <typename T>
void addPositionOf(const T *x, const T *position, T *out, int64_t batch, int64_t seq, int64_t hidden,
                   const int64_t *positions) {
  parallelFor(batch * seq, grainFor(hidden), [&](int64_t r0, int64_t r1) {
    RowViews<T> views(3, hidden);
    for (int64_t r = r0; r < r1; ++r) {
      int64_t s = positions ? positions[r % seq] : r % seq;
      const float *xr = views.in(0, x + r * hidden), *pr = views.in(1, position + s * hidden);
      float *o = views.out(2, out + r * hidden);
      for (int64_t i = 0; i < hidden; ++i) o[i] = xr[i] + pr[i];
      views.put(2, out + r * hidden);
    }
  });
}

template <typename T>
void addBiasOf(const T *x, const T *bias, T *y, int64_t rows, int64_t n) {
  WideParams<T> p(n, bias);
  parallelFor(rows, grainFor(n), [&](int64_t r0, int64_t r1) {
    RowViews<T> views(2, n);
    for (int64_t r = r0; r < r1; ++r) {
      const float *xr = views.in(0, x + r * n);
      float *yr = views.out(1, y + r * n);
      for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] + p.a[i];
      views.put(1, y + r * n);
    }
  });
}
}  // namespace

void positionBackward(const float *g, float *dposition, int64_t batch, int64_t seq, int64_t hidden,
                      int64_t positions, const int64_t *rowOf) {
  positionBackwardOf(g, dposition, batch, seq, hidden, positions, rowOf);
}
void positionBackward(const uint16_t *g, uint16_t *dposition, int64_t batch, int64_t seq, int64_t hidden,
                      int64_t positions, const int64_t *rowOf) {
  positionBackwardOf(g, dposition, batch, seq, hidden, positions, rowOf);
}
void addPositionForward(const float *x, const float *position, float *out, int64_t batch, int64_t seq,
                        int64_t hidden, const int64_t *positions) {
  addPositionOf(x, position, out, batch, seq, hidden, positions);
}
void addPositionForward(const uint16_t *x, const uint16_t *position, uint16_t *out, int64_t batch, int64_t seq,
                        int64_t hidden, const int64_t *positions) {
  addPositionOf(x, position, out, batch, seq, hidden, positions);
}
void addBiasForward(const float *x, const float *bias, float *y, int64_t rows, int64_t n) {
  addBiasOf(x, bias, y, rows, n);
}
void addBiasForward(const uint16_t *x, const uint16_t *bias, uint16_t *y, int64_t rows, int64_t n) {
  addBiasOf(x, bias, y, rows, n);
}

namespace {
// Tokens [t0, t1) of each loop below; the public functions split the tokens over the threads
// (rows independent: the same bits for any thread count).
LOOM_VECTOR_CLONES
void localMaxRows(const float *logits, float *rowMax, int64_t t0, int64_t t1, int64_t cols, int64_t valid) {
  for (int64_t t = t0; t < t1; ++t) {
    const float *row = logits + t * cols;
    float lanes[8];
    std::fill(lanes, lanes + 8, -std::numeric_limits<float>::infinity());
    int64_t j = 0;
    for (; j + 8 <= valid; j += 8)
      for (int k = 0; k < 8; ++k) lanes[k] = row[j + k] > lanes[k] ? row[j + k] : lanes[k];
    float mx = -std::numeric_limits<float>::infinity();
    for (int k = 0; k < 8; ++k) mx = lanes[k] > mx ? lanes[k] : mx;
    for (; j < valid; ++j) mx = row[j] > mx ? row[j] : mx;
    rowMax[t] = mx;
  }
}

// The sums by laneSum (8 float lanes combined in double) over a scratch row of exps.
LOOM_VECTOR_CLONES
void localSumRows(const float *logits, const int32_t *labels, const float *rowMax, float *sumExp, float *target,
                  int64_t t0, int64_t t1, int64_t cols, int64_t colStart, int64_t valid, float *e) {
  for (int64_t t = t0; t < t1; ++t) {
    const float *row = logits + t * cols;
    float m = rowMax[t];
    for (int64_t j = 0; j < valid; ++j) e[j] = fastExp(row[j] - m);
    sumExp[t] = laneSum(e, valid);
    int64_t col = int64_t(labels[t]) - colStart;
    target[t] = col >= 0 && col < valid ? row[col] : 0.0f;
  }
}

// dlogits rows = w_t * (exp(logit - lse_t) - onehot(label_t)), padding columns 0, with
// w_t = gradLoss * mask_t / count: one pass over the logits.
LOOM_VECTOR_CLONES
void gradRowsFromLse(const float *logits, const int32_t *labels, const float *mask, const float *lse, float gradLoss,
                     double count, float *dlogits, int64_t t0, int64_t t1, int64_t cols, int64_t colStart,
                     int64_t valid) {
  for (int64_t t = t0; t < t1; ++t) {
    float w = count > 0 ? float(gradLoss * (mask ? mask[t] : 1.0f) / count) : 0.0f;
    const float *row = logits + t * cols;
    float *d = dlogits + t * cols;
    float l = lse[t];
    for (int64_t j = 0; j < valid; ++j) d[j] = w * fastExp(row[j] - l);
    for (int64_t j = valid; j < cols; ++j) d[j] = 0.0f;
    int64_t col = int64_t(labels[t]) - colStart;
    if (col >= 0 && col < valid) d[col] -= w;
  }
}

int64_t validColumns(int64_t cols, int64_t colStart, int64_t validVocab) {
  return std::clamp<int64_t>(validVocab - colStart, 0, cols);
}
}  // namespace

void crossEntropyLocalMax(const float *logits, float *rowMax, int64_t tokens, int64_t cols,
                          int64_t colStart, int64_t validVocab) {
  int64_t valid = validColumns(cols, colStart, validVocab);
  parallelFor(tokens, grainFor(cols), [&](int64_t t0, int64_t t1) { localMaxRows(logits, rowMax, t0, t1, cols, valid); });
}

void crossEntropyLocalSums(const float *logits, const int32_t *labels, const float *rowMax,
                           float *sumExp, float *target, int64_t tokens, int64_t cols,
                           int64_t colStart, int64_t validVocab) {
  int64_t valid = validColumns(cols, colStart, validVocab);
  parallelFor(tokens, grainFor(cols), [&](int64_t t0, int64_t t1) {
    static thread_local std::vector<float> rowBuffer;
    localSumRows(logits, labels, rowMax, sumExp, target, t0, t1, cols, colStart, valid,
                 scratch(rowBuffer, size_t(cols)));
  });
}

float crossEntropyLoss(const float *rowMax, const float *sumExp, const float *target, const float *mask,
                       int64_t tokens) {
  double total = 0, count = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    float m = mask ? mask[t] : 1.0f;
    total += double(m) * (std::log(double(sumExp[t])) + rowMax[t] - target[t]);
    count += m;
  }
  return count > 0 ? float(total / count) : 0.0f;
}

void crossEntropyLogSumExp(const float *rowMax, const float *sumExp, float *lse, int64_t tokens) {
  for (int64_t t = 0; t < tokens; ++t) lse[t] = float(double(rowMax[t]) + std::log(double(sumExp[t])));
}

void crossEntropyBackward(const float *logits, const int32_t *labels, const float *mask, const float *lse,
                          float gradLoss, float *dlogits, int64_t tokens, int64_t cols, int64_t colStart,
                          int64_t validVocab) {
  crossEntropyBackwardRows(logits, labels, mask, lse, gradLoss, crossEntropyMaskCount(mask, tokens), dlogits, tokens,
                           cols, colStart, validVocab);
}

double crossEntropyMaskCount(const float *mask, int64_t tokens) {
  double count = 0;
  for (int64_t t = 0; t < tokens; ++t) count += mask ? mask[t] : 1.0f;
  return count;
}

void crossEntropyBackwardRows(const float *logits, const int32_t *labels, const float *mask, const float *lse,
                              float gradLoss, double maskCount, float *dlogits, int64_t tokens, int64_t cols,
                              int64_t colStart, int64_t validVocab) {
  int64_t valid = validColumns(cols, colStart, validVocab);
  parallelFor(tokens, grainFor(cols), [&](int64_t t0, int64_t t1) {
    gradRowsFromLse(logits, labels, mask, lse, gradLoss, maskCount, dlogits, t0, t1, cols, colStart, valid);
  });
}

}  // namespace loom::cpu
