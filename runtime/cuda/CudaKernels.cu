// The math of each kernel is that of runtime/cpu/Kernels.cpp (see there); here: one thread
// per element for elementwise ops, one block per row for row reductions. Typed operands
// (DeviceArray.h) are read with load() and written with store() (DeviceMath.cuh): fp32
// arithmetic on any storage, each result rounded once.
#include "runtime/cuda/CudaKernels.h"

#include <algorithm>
#include "runtime/cuda/DeviceMath.cuh"

#include <cmath>

namespace loom::cuda {
namespace {


// A row's mean and 1 / sqrt(variance + eps), by the whole block; the row's elements are x at
// `row` onwards.
__device__ void rowMoments(In x, int64_t row, int64_t n, float eps, float *shared, float *mean, float *rstd) {
  float s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) s += load(x, row + i);
  float m = blockSum(s, shared) / n;
  float v = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float d = load(x, row + i) - m;
    v += d * d;
  }
  *mean = m;
  *rstd = rsqrtf(blockSum(v, shared) / n + eps);
}

// Typed operands are read into fp32 locals before the arithmetic that uses them, and results
// are stored after it: the fp32 expressions (and how they fuse into FMAs) are those of an fp32
// plan, whatever the storage.
__global__ void layerNormForwardKernel(In x, In gamma, In beta, Out y, int64_t n, float eps) {
  __shared__ float shared[kThreads];
  int64_t row = blockIdx.x * n;
  float mean, rstd;
  rowMoments(x, row, n, eps, shared, &mean, &rstd);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float xi = load(x, row + i), gi = load(gamma, i), bi = load(beta, i);
    store(y, row + i, (xi - mean) * rstd * gi + bi);
  }
}

// Each block takes a run of rows; with `partials` (2n floats of shared memory) it sums its
// rows' dgamma and dbeta per column there and adds them to the output once, instead of one
// atomic per element (thousands of rows would otherwise contend for the same n addresses).
// Column i is always thread i % kThreads's, so the shared sums need no atomics.
__global__ void layerNormBackwardKernel(In x, In gamma, In g, Out dx, float *dgamma, float *dbeta, int64_t rows,
                                        int64_t rowsPerBlock, int64_t n, float eps, bool partials) {
  __shared__ float shared[kThreads];
  extern __shared__ float partial[];  // [2n] when `partials`
  if (partials)
    for (int64_t i = threadIdx.x; i < 2 * n; i += kThreads) partial[i] = 0.0f;
  int64_t first = blockIdx.x * rowsPerBlock, last = min(rows, first + rowsPerBlock);
  for (int64_t row = first; row < last; ++row) {  // the same trip count for every thread
    int64_t base = row * n;
    float mean, rstd;
    rowMoments(x, base, n, eps, shared, &mean, &rstd);
    float a = 0, b = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      float xi = load(x, base + i), gr = load(g, base + i), gm = load(gamma, i);
      float xhat = (xi - mean) * rstd, dy = gr * gm;
      a += dy, b += dy * xhat;
      if (partials) {
        partial[i] += gr * xhat;
        partial[n + i] += gr;
      } else {
        atomicAdd(&dgamma[i], gr * xhat);
        atomicAdd(&dbeta[i], gr);
      }
    }
    float meanDy = blockSum(a, shared) / n, meanDyXhat = blockSum(b, shared) / n;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      float xi = load(x, base + i), gr = load(g, base + i), gm = load(gamma, i);
      float xhat = (xi - mean) * rstd;
      store(dx, base + i, rstd * (gr * gm - meanDy - xhat * meanDyXhat));
    }
  }
  if (partials)
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      atomicAdd(&dgamma[i], partial[i]);
      atomicAdd(&dbeta[i], partial[n + i]);
    }
}

// RMS norm: one block per row; the backward as layer norm's, runs of rows per block summing
// dgamma in shared memory when it fits.
__global__ void rmsNormForwardKernel(In x, In gamma, Out y, int64_t n, float eps) {
  __shared__ float shared[kThreads];
  int64_t row = blockIdx.x * n;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float xi = load(x, row + i);
    ss += xi * xi;
  }
  float rstd = rsqrtf(blockSum(ss, shared) / n + eps);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float xi = load(x, row + i), gm = load(gamma, i);
    store(y, row + i, xi * rstd * gm);
  }
}

__global__ void rmsNormBackwardKernel(In x, In gamma, In g, Out dx, float *dgamma, int64_t rows, int64_t rowsPerBlock,
                                      int64_t n, float eps, bool partials) {
  __shared__ float shared[kThreads];
  extern __shared__ float partial[];  // [n] when `partials`
  if (partials)
    for (int64_t i = threadIdx.x; i < n; i += kThreads) partial[i] = 0.0f;
  int64_t first = blockIdx.x * rowsPerBlock, last = min(rows, first + rowsPerBlock);
  for (int64_t row = first; row < last; ++row) {
    int64_t base = row * n;
    float ss = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      float xi = load(x, base + i);
      ss += xi * xi;
    }
    float rstd = rsqrtf(blockSum(ss, shared) / n + eps);
    float dot = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      float xi = load(x, base + i), gr = load(g, base + i), gm = load(gamma, i);
      float xhat = xi * rstd;
      dot += gr * gm * xhat;
      if (partials)
        partial[i] += gr * xhat;
      else
        atomicAdd(&dgamma[i], gr * xhat);
    }
    float mean = blockSum(dot, shared) / n;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      float xi = load(x, base + i), gr = load(g, base + i), gm = load(gamma, i);
      store(dx, base + i, rstd * (gr * gm - xi * rstd * mean));
    }
  }
  if (partials)
    for (int64_t i = threadIdx.x; i < n; i += kThreads) atomicAdd(&dgamma[i], partial[i]);
}

// One thread per (token, head, pair j < hd/2): rotates (x[j], x[j + hd/2]) by s * theta^(-2j/hd).
__global__ void rotaryKernel(In x, Out y, int64_t tokens, int64_t seq, int64_t heads, int64_t headDim, float theta,
                             bool inverse) {
  int64_t half = headDim / 2, i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= tokens * heads * half) return;
  int64_t j = i % half, h = (i / half) % heads, t = i / (half * heads), s = t % seq;
  double angle = double(s) * pow(double(theta), -2.0 * double(j) / double(headDim));
  float c = float(cos(angle)), sn = float(inverse ? -sin(angle) : sin(angle));
  int64_t row = t * heads * headDim + h * headDim;  // x and y may be the same: both read first
  float x1 = load(x, row + j), x2 = load(x, row + j + half);
  // x1 c - x2 sn and x2 c + x1 sn with the FMAs nvcc formed from them when x was fp32 only:
  // written out, the fp32 bits do not depend on how the compiler orders the typed loads.
  float y1 = fmaf(x1, c, -(x2 * sn)), y2 = fmaf(x2, c, x1 * sn);
  store(y, row + j, y1);
  store(y, row + j + half, y2);
}

__global__ void swigluForwardKernel(In gate, In up, Out y, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  float x = load(gate, i), u = load(up, i);
  float sig = 1.0f / (1.0f + expf(-x));
  store(y, i, x * sig * u);
}

__global__ void swigluBackwardKernel(In gate, In up, In g, Out dgate, Out dup, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  float x = load(gate, i), u = load(up, i), gi = load(g, i);
  float sig = 1.0f / (1.0f + expf(-x));
  float du = gi * x * sig, dg = gi * u * sig * (1.0f + x * (1.0f - sig));
  store(dup, i, du);
  store(dgate, i, dg);
}

constexpr float kGeluC = 0.7978845608028654f;

__global__ void addBroadcastKernel(In x, In v, Out y, int64_t count, int64_t period) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  float xi = load(x, i), vi = load(v, i % period);
  store(y, i, xi + vi);
}

// One thread per column: neighbouring threads read neighbouring addresses of each row.
__global__ void sumRowsKernel(In g, Out out, int64_t m, int64_t n) {
  int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= n) return;
  float acc = 0;
  for (int64_t r = 0; r < m; ++r) acc += load(g, r * n + c);
  store(out, c, acc);
}

__global__ void geluForwardKernel(In x, Out y, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  float v = load(x, i);
  store(y, i, 0.5f * v * (1.0f + tanhf(kGeluC * (v + 0.044715f * v * v * v))));
}

__global__ void geluBackwardKernel(In x, In g, Out dx, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  float v = load(x, i), gi = load(g, i);
  float t = tanhf(kGeluC * (v + 0.044715f * v * v * v));
  store(dx, i, gi * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluC * (1.0f + 3 * 0.044715f * v * v)));
}

__global__ void tanhForwardKernel(In x, Out y, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  store(y, i, tanhf(load(x, i)));
}

__global__ void tanhBackwardKernel(In x, In g, Out dx, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  float t = tanhf(load(x, i));
  store(dx, i, load(g, i) * (1.0f - t * t));
}

// Token (b, s) of the rank's rows: its type is types[b * seq + first + s]. A type outside the
// table gives NaN (the loss then says so) rather than another row.
__global__ void addTokenTypeKernel(In x, const int32_t *types, In table, Out y, int64_t rows, int64_t seq,
                                   int64_t first, int64_t hidden, int64_t tableRows) {
  int64_t t = blockIdx.x, b = t / rows, s = t % rows;
  int64_t type = types[b * seq + first + s];
  bool valid = type >= 0 && type < tableRows;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    store(y, t * hidden + i, valid ? load(x, t * hidden + i) + load(table, type * hidden + i) : NAN);
}

// One thread per (type, column): the column's sum over the tokens of that type in token order
// (a fixed order, no atomics: the table has a few rows, every token adds to one of them).
__global__ void tokenTypeGradKernel(const int32_t *types, In g, Out dtable, int64_t batch, int64_t rows, int64_t seq,
                                    int64_t first, int64_t hidden, int64_t tableRows) {
  int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= tableRows * hidden) return;
  int64_t type = c / hidden, col = c % hidden;
  float acc = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < rows; ++s)
      if (types[b * seq + first + s] == type) acc += load(g, (b * rows + s) * hidden + col);
  store(dtable, c, acc);
}

__global__ void dropoutKernel(In x, Out y, int64_t count, float rate, uint64_t seed, uint64_t stream) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  store(y, i, philoxUniform(seed, stream, uint64_t(i)) >= rate ? load(x, i) / (1.0f - rate) : 0.0f);
}

__global__ void embeddingForwardKernel(const int32_t *tokens, In word, In position, Out out, int64_t seq,
                                       int64_t hidden, int64_t rowStart, int64_t rows) {
  int64_t t = blockIdx.x;
  int64_t row = int64_t(tokens[t]) - rowStart;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = row >= 0 && row < rows ? load(word, row * hidden + i) : 0.0f;
    if (position.data) v += load(position, (t % seq) * hidden + i);
    store(out, t * hidden + i, v);
  }
}

__global__ void embeddingBackwardKernel(const int32_t *tokens, In g, float *dword, int64_t hidden, int64_t rowStart,
                                        int64_t rows) {
  int64_t t = blockIdx.x;
  int64_t row = int64_t(tokens[t]) - rowStart;
  if (row < 0 || row >= rows) return;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    atomicAdd(&dword[row * hidden + i], load(g, t * hidden + i));
}

__device__ int64_t validColumns(int64_t validVocab, int64_t colStart, int64_t cols) {
  int64_t v = validVocab - colStart;
  return v < 0 ? 0 : (v > cols ? cols : v);
}

__global__ void crossEntropyMaxKernel(In logits, float *rowMax, int64_t cols, int64_t colStart, int64_t validVocab) {
  __shared__ float shared[kThreads];
  int64_t valid = validColumns(validVocab, colStart, cols);
  int64_t row = blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += kThreads) m = fmaxf(m, load(logits, row + j));
  m = blockMax(m, shared);
  if (threadIdx.x == 0) rowMax[blockIdx.x] = m;
}

__global__ void crossEntropySumsKernel(In logits, const int32_t *labels, const float *rowMax, float *sumExp,
                                       float *target, int64_t cols, int64_t colStart, int64_t validVocab) {
  __shared__ float shared[kThreads];
  int64_t valid = validColumns(validVocab, colStart, cols);
  int64_t row = blockIdx.x * cols;
  float s = 0;
  for (int64_t j = threadIdx.x; j < valid; j += kThreads) s += expf(load(logits, row + j) - rowMax[blockIdx.x]);
  s = blockSum(s, shared);
  if (threadIdx.x == 0) {
    sumExp[blockIdx.x] = s;
    int64_t col = int64_t(labels[blockIdx.x]) - colStart;
    target[blockIdx.x] = col >= 0 && col < valid ? load(logits, row + col) : 0.0f;
  }
}

__global__ void crossEntropyBackwardKernel(In logits, const int32_t *labels, const float *mask, const float *lse,
                                           float gradOverCount, Out dlogits, int64_t cols, int64_t colStart,
                                           int64_t validVocab) {
  int64_t valid = validColumns(validVocab, colStart, cols), t = blockIdx.x;
  float w = gradOverCount * (mask ? mask[t] : 1.0f);
  int64_t label = int64_t(labels[t]) - colStart;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    float d = j < valid ? w * expf(load(logits, t * cols + j) - lse[t]) : 0.0f;
    if (j == label && j < valid) d -= w;
    store(dlogits, t * cols + j, d);
  }
}

// decayMask: per element (null: `decay` for all).
__global__ void adamwKernel(float *p, const float *g, float *m, float *v, int64_t n, float lr, float beta1,
                            float beta2, float eps, float weightDecay, float c1, float c2, bool decay,
                            const float *decayMask) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  m[i] = beta1 * m[i] + (1 - beta1) * g[i];
  v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
  float update = (m[i] / c1) / (sqrtf(v[i] / c2) + eps);
  if (decayMask ? decayMask[i] != 0.0f : decay) update += weightDecay * p[i];
  p[i] -= lr * update;
}

__global__ void squaresKernel(const float *x, int64_t n, double *out, const float *mask) {
  __shared__ float shared[kThreads];
  float acc = 0;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads)
    if (!mask || mask[i] != 0.0f) acc += x[i] * x[i];
  acc = blockSum(acc, shared);
  if (threadIdx.x == 0) atomicAdd(out, double(acc));
}

__global__ void fillKernel(Out x, int64_t n, float value) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) store(x, i, value);
}

// x: the same elements as y, read (scaleInPlace).
__global__ void scaleKernel(In x, Out y, int64_t n, float factor) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) store(y, i, load(x, i) * factor);
}

__global__ void convertKernel(In x, Out y, int64_t count) {
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < count) store(y, i, load(x, i));
}

}  // namespace

void layerNormForward(In x, In gamma, In beta, Out y, int64_t rows, int64_t n, float eps, cudaStream_t s) {
  if (rows <= 0) return;  // an empty grid is a launch error
  layerNormForwardKernel<<<int(rows), kThreads, 0, s>>>(x, gamma, beta, y, n, eps);
}

void layerNormBackward(In x, In gamma, In g, Out dx, float *dgamma, float *dbeta, int64_t rows, int64_t n, float eps,
                       cudaStream_t s) {
  cudaMemsetAsync(dgamma, 0, n * sizeof(float), s);
  cudaMemsetAsync(dbeta, 0, n * sizeof(float), s);
  if (rows <= 0) return;  // an empty grid is a launch error
  int64_t grid = std::min<int64_t>(rows, 1024), perBlock = (rows + grid - 1) / grid;
  grid = (rows + perBlock - 1) / perBlock;
  size_t partialBytes = size_t(2 * n) * sizeof(float);
  bool partials = partialBytes <= 40 * 1024;  // with the reduction slots, within the 48 KB default
  layerNormBackwardKernel<<<int(grid), kThreads, partials ? partialBytes : 0, s>>>(x, gamma, g, dx, dgamma, dbeta, rows,
                                                                                  perBlock, n, eps, partials);
}

void rmsNormForward(In x, In gamma, Out y, int64_t rows, int64_t n, float eps, cudaStream_t s) {
  if (rows <= 0) return;  // an empty grid is a launch error
  rmsNormForwardKernel<<<int(rows), kThreads, 0, s>>>(x, gamma, y, n, eps);
}

void rmsNormBackward(In x, In gamma, In g, Out dx, float *dgamma, int64_t rows, int64_t n, float eps, cudaStream_t s) {
  cudaMemsetAsync(dgamma, 0, n * sizeof(float), s);
  if (rows <= 0) return;
  int64_t grid = std::min<int64_t>(rows, 1024), perBlock = (rows + grid - 1) / grid;
  grid = (rows + perBlock - 1) / perBlock;
  size_t partialBytes = size_t(n) * sizeof(float);
  bool partials = partialBytes <= 40 * 1024;
  rmsNormBackwardKernel<<<int(grid), kThreads, partials ? partialBytes : 0, s>>>(x, gamma, g, dx, dgamma, rows,
                                                                                perBlock, n, eps, partials);
}

void rotary(In x, Out y, int64_t batch, int64_t seq, int64_t heads, int64_t headDim, float theta, bool inverse,
            cudaStream_t s) {
  int64_t count = batch * seq * heads * (headDim / 2);
  rotaryKernel<<<blocks(count), kThreads, 0, s>>>(x, y, batch * seq, seq, heads, headDim, theta, inverse);
}

void swigluForward(In gate, In up, Out y, int64_t count, cudaStream_t s) {
  swigluForwardKernel<<<blocks(count), kThreads, 0, s>>>(gate, up, y, count);
}

void swigluBackward(In gate, In up, In g, Out dgate, Out dup, int64_t count, cudaStream_t s) {
  swigluBackwardKernel<<<blocks(count), kThreads, 0, s>>>(gate, up, g, dgate, dup, count);
}

void addBroadcast(In x, In v, Out y, int64_t count, int64_t period, cudaStream_t s) {
  addBroadcastKernel<<<blocks(count), kThreads, 0, s>>>(x, v, y, count, period);
}

void sumRows(In g, Out out, int64_t m, int64_t n, cudaStream_t s) {
  sumRowsKernel<<<blocks(n), kThreads, 0, s>>>(g, out, m, n);
}

void geluForward(In x, Out y, int64_t count, cudaStream_t s) {
  geluForwardKernel<<<blocks(count), kThreads, 0, s>>>(x, y, count);
}

void geluBackward(In x, In g, Out dx, int64_t count, cudaStream_t s) {
  geluBackwardKernel<<<blocks(count), kThreads, 0, s>>>(x, g, dx, count);
}

void tanhForward(In x, Out y, int64_t count, cudaStream_t s) {
  tanhForwardKernel<<<blocks(count), kThreads, 0, s>>>(x, y, count);
}

void tanhBackward(In x, In g, Out dx, int64_t count, cudaStream_t s) {
  tanhBackwardKernel<<<blocks(count), kThreads, 0, s>>>(x, g, dx, count);
}

void addTokenType(In x, const int32_t *types, In table, Out y, int64_t batch, int64_t rows, int64_t seq, int64_t first,
                  int64_t hidden, int64_t tableRows, cudaStream_t s) {
  if (batch * rows <= 0) return;  // an empty grid is a launch error
  addTokenTypeKernel<<<int(batch * rows), kThreads, 0, s>>>(x, types, table, y, rows, seq, first, hidden, tableRows);
}

void tokenTypeGrad(const int32_t *types, In g, Out dtable, int64_t batch, int64_t rows, int64_t seq, int64_t first,
                   int64_t hidden, int64_t tableRows, cudaStream_t s) {
  tokenTypeGradKernel<<<blocks(tableRows * hidden), kThreads, 0, s>>>(types, g, dtable, batch, rows, seq, first, hidden,
                                                                      tableRows);
}

void dropoutForward(In x, Out y, int64_t count, float rate, uint64_t seed, uint64_t stream, cudaStream_t s) {
  dropoutKernel<<<blocks(count), kThreads, 0, s>>>(x, y, count, rate, seed, stream);
}

void embeddingForward(const int32_t *tokens, In word, In position, Out out, int64_t tokenCount, int64_t seq,
                      int64_t hidden, int64_t rowStart, int64_t rows, cudaStream_t s) {
  if (tokenCount <= 0) return;  // an empty grid is a launch error
  embeddingForwardKernel<<<int(tokenCount), kThreads, 0, s>>>(tokens, word, position, out, seq, hidden, rowStart,
                                                              rows);
}

void embeddingBackward(const int32_t *tokens, In g, float *dword, int64_t tokenCount, int64_t hidden,
                       int64_t rowStart, int64_t rows, cudaStream_t s) {
  cudaMemsetAsync(dword, 0, rows * hidden * sizeof(float), s);
  if (tokenCount <= 0) return;  // an empty grid is a launch error
  embeddingBackwardKernel<<<int(tokenCount), kThreads, 0, s>>>(tokens, g, dword, hidden, rowStart, rows);
}

void crossEntropyLocalMax(In logits, float *rowMax, int64_t tokens, int64_t cols, int64_t colStart,
                          int64_t validVocab, cudaStream_t s) {
  if (tokens <= 0) return;  // an empty grid is a launch error
  crossEntropyMaxKernel<<<int(tokens), kThreads, 0, s>>>(logits, rowMax, cols, colStart, validVocab);
}

void crossEntropyLocalSums(In logits, const int32_t *labels, const float *rowMax, float *sumExp, float *target,
                           int64_t tokens, int64_t cols, int64_t colStart, int64_t validVocab, cudaStream_t s) {
  if (tokens <= 0) return;  // an empty grid is a launch error
  crossEntropySumsKernel<<<int(tokens), kThreads, 0, s>>>(logits, labels, rowMax, sumExp, target, cols, colStart,
                                                          validVocab);
}

void crossEntropyBackward(In logits, const int32_t *labels, const float *mask, const float *lse, float gradOverCount,
                          Out dlogits, int64_t tokens, int64_t cols, int64_t colStart, int64_t validVocab,
                          cudaStream_t s) {
  if (tokens <= 0) return;  // an empty grid is a launch error
  crossEntropyBackwardKernel<<<int(tokens), kThreads, 0, s>>>(logits, labels, mask, lse, gradOverCount, dlogits, cols,
                                                              colStart, validVocab);
}

void adamwUpdate(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                 float eps, float weightDecay, int64_t step, bool decay, cudaStream_t s) {
  float c1 = 1 - powf(beta1, float(step)), c2 = 1 - powf(beta2, float(step));
  adamwKernel<<<blocks(n), kThreads, 0, s>>>(param, grad, m, v, n, lr, beta1, beta2, eps, weightDecay, c1, c2, decay,
                                              nullptr);
}

void accumulateSquares(const float *x, int64_t n, double *sumOfSquares, cudaStream_t s, const float *mask) {
  if (n <= 0) return;
  squaresKernel<<<std::min(blocks(n), 1024), kThreads, 0, s>>>(x, n, sumOfSquares, mask);
}

void fillValue(Out x, int64_t n, float value, cudaStream_t s) {
  if (n <= 0) return;
  fillKernel<<<blocks(n), kThreads, 0, s>>>(x, n, value);
}

void scaleInPlace(Out x, int64_t n, float factor, cudaStream_t s) {
  if (n <= 0) return;
  scaleKernel<<<blocks(n), kThreads, 0, s>>>(x, x, n, factor);
}

void convertElements(In x, Out y, int64_t count, cudaStream_t s) {
  if (count <= 0) return;
  convertKernel<<<blocks(count), kThreads, 0, s>>>(x, y, count);
}

namespace {

// Busy until the device's global nanosecond timer has advanced by `nanoseconds`.
__global__ void spinKernel(uint64_t nanoseconds) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

}  // namespace

void spinOnDevice(double seconds, cudaStream_t s) { spinKernel<<<1, 1, 0, s>>>(uint64_t(seconds * 1e9)); }

bool deviceAvailable(const char **why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why = cudaGetErrorString(err);
    return false;
  }
  if (count == 0) {
    *why = "no CUDA device";
    return false;
  }
  return true;
}

}  // namespace loom::cuda
