// fp32 CUDA kernels of the loom ops, the same math as runtime/cpu/Kernels.h (and the same
// counter-based dropout), launched on a given stream. Pointers are device pointers.
// Checked against the CPU kernels by tests/cuda/cuda_kernels_test (skipped without a GPU).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom::cuda {

void layerNormForward(const float *x, const float *gamma, const float *beta, float *y, int64_t rows, int64_t n,
                      float eps, cudaStream_t s);
// dgamma and dbeta are accumulated with atomics: zeroed here first.
void layerNormBackward(const float *x, const float *gamma, const float *g, float *dx, float *dgamma, float *dbeta,
                       int64_t rows, int64_t n, float eps, cudaStream_t s);
// RMS norm over rows of n; the backward zeroes dgamma and accumulates it.
void rmsNormForward(const float *x, const float *gamma, float *y, int64_t rows, int64_t n, float eps, cudaStream_t s);
void rmsNormBackward(const float *x, const float *gamma, const float *g, float *dx, float *dgamma, int64_t rows,
                     int64_t n, float eps, cudaStream_t s);
// Rotary embedding (rotate-half) of x [B,S,heads*hd]; `inverse`: by the opposite angle.
void rotary(const float *x, float *y, int64_t batch, int64_t seq, int64_t heads, int64_t headDim, float theta,
            bool inverse, cudaStream_t s);
// y = silu(gate) * up and its gradients.
void swigluForward(const float *gate, const float *up, float *y, int64_t count, cudaStream_t s);
void swigluBackward(const float *gate, const float *up, const float *g, float *dgate, float *dup, int64_t count,
                    cudaStream_t s);
// y[i] = x[i] + v[i % period]: add (period = count), add_bias (period = N), add_position
// (period = seq * hidden, v the sequence's rows of the position table).
void addBroadcast(const float *x, const float *v, float *y, int64_t count, int64_t period, cudaStream_t s);
// out[c] = sum over the m rows of g[m, n] of column c: bias_grad, and position_grad (n = seq *
// hidden, rows = batch; zero the table rows beyond seq separately).
void sumRows(const float *g, float *out, int64_t m, int64_t n, cudaStream_t s);
void geluForward(const float *x, float *y, int64_t count, cudaStream_t s);
void geluBackward(const float *x, const float *g, float *dx, int64_t count, cudaStream_t s);
void dropoutForward(const float *x, float *y, int64_t count, float rate, uint64_t seed, uint64_t stream,
                    cudaStream_t s);
void embeddingForward(const int32_t *tokens, const float *word, const float *position, float *out,
                      int64_t tokenCount, int64_t seq, int64_t hidden, int64_t rowStart, int64_t rows, cudaStream_t s);
void embeddingBackward(const int32_t *tokens, const float *g, float *dword, int64_t tokenCount, int64_t hidden,
                       int64_t rowStart, int64_t rows, cudaStream_t s);
void crossEntropyLocalMax(const float *logits, float *rowMax, int64_t tokens, int64_t cols, int64_t colStart,
                          int64_t validVocab, cudaStream_t s);
void crossEntropyLocalSums(const float *logits, const int32_t *labels, const float *rowMax, float *sumExp,
                           float *target, int64_t tokens, int64_t cols, int64_t colStart, int64_t validVocab,
                           cudaStream_t s);
// dlogits = gradOverCount * mask_t * (exp(logit - lse_t) - onehot(label)), padding columns 0.
void crossEntropyBackward(const float *logits, const int32_t *labels, const float *mask, const float *lse,
                          float gradOverCount, float *dlogits, int64_t tokens, int64_t cols, int64_t colStart,
                          int64_t validVocab, cudaStream_t s);
void adamwUpdate(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                 float eps, float weightDecay, int64_t step, bool decay, cudaStream_t s);
// *sumOfSquares += sum of x[i]^2 (accumulated in double: the global gradient norm); with a
// mask, only where mask[i] != 0.
void accumulateSquares(const float *x, int64_t n, double *sumOfSquares, cudaStream_t s,
                       const float *mask = nullptr);
// x[i] = value.
void fillValue(float *x, int64_t n, float value, cudaStream_t s);
// x[i] *= factor (gradient clipping).
void scaleInPlace(float *x, int64_t n, float factor, cudaStream_t s);

// A kernel that keeps the stream busy for `seconds` (the hang tests' kernel that does not return).
void spinOnDevice(double seconds, cudaStream_t s);

// Whether a CUDA device can run kernels here; `why` says why not.
bool deviceAvailable(const char **why);

}  // namespace loom::cuda
