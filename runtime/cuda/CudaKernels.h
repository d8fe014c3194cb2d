// CUDA kernels of the loom ops, the same math as runtime/cpu/Kernels.h (and the same
// counter-based dropout), launched on a given stream. Pointers are device pointers.
// Operands are typed (runtime/cuda/DeviceArray.h: fp32, bf16 or fp16 storage, fp32 arithmetic,
// each result rounded once); a plain float pointer is an fp32 operand. Outputs accumulated
// across rows with atomics (norm parameter gradients, the embedding gradient) and the
// statistics of the softmax and the loss stay fp32: a 16-bit plan's executor gives such
// kernels fp32 scratch and rounds it into the plan's buffer after (CudaExecutor.cpp).
// Checked against the CPU kernels by tests/cuda/cuda_kernels_test (skipped without a GPU).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/DeviceArray.h"

namespace loom::cuda {

void layerNormForward(In x, In gamma, In beta, Out y, int64_t rows, int64_t n, float eps, cudaStream_t s);
// dgamma and dbeta (fp32) are accumulated with atomics: zeroed here first.
void layerNormBackward(In x, In gamma, In g, Out dx, float *dgamma, float *dbeta, int64_t rows, int64_t n, float eps,
                       cudaStream_t s);
// RMS norm over rows of n; the backward zeroes dgamma (fp32) and accumulates it.
void rmsNormForward(In x, In gamma, Out y, int64_t rows, int64_t n, float eps, cudaStream_t s);
void rmsNormBackward(In x, In gamma, In g, Out dx, float *dgamma, int64_t rows, int64_t n, float eps, cudaStream_t s);
// Rotary embedding (rotate-half) of x [B,S,heads*hd]; `inverse`: by the opposite angle.
void rotary(In x, Out y, int64_t batch, int64_t seq, int64_t heads, int64_t headDim, float theta, bool inverse,
            cudaStream_t s);
// y = silu(gate) * up and its gradients.
void swigluForward(In gate, In up, Out y, int64_t count, cudaStream_t s);
void swigluBackward(In gate, In up, In g, Out dgate, Out dup, int64_t count, cudaStream_t s);
// y[i] = x[i] + v[i % period]: add (period = count), add_bias (period = N), add_position
// (period = seq * hidden, v the sequence's rows of the position table), accumulate (y = x).
void addBroadcast(In x, In v, Out y, int64_t count, int64_t period, cudaStream_t s);
// out[c] = sum over the m rows of g[m, n] of column c: position_grad (n = seq * hidden, rows =
// batch; zero the table rows beyond seq separately).
void sumRows(In g, Out out, int64_t m, int64_t n, cudaStream_t s);
void geluForward(In x, Out y, int64_t count, cudaStream_t s);
void geluBackward(In x, In g, Out dx, int64_t count, cudaStream_t s);
// BERT's pooler activation: y = tanh(x); dx = g (1 - tanh(x)^2).
void tanhForward(In x, Out y, int64_t count, cudaStream_t s);
void tanhBackward(In x, In g, Out dx, int64_t count, cudaStream_t s);
// BERT's segment embeddings: y[b, s] = x[b, s] + table[types[b, first + s]] for the rank's `rows`
// of each sample's `seq` (first > 0 under sequence parallelism); a type outside the table's
// tableRows gives NaN. The gradient: dtable[t] = the sum of g's rows of type t, in token order
// (deterministic, no atomics), rounded once.
void addTokenType(In x, const int32_t *types, In table, Out y, int64_t batch, int64_t rows, int64_t seq, int64_t first,
                  int64_t hidden, int64_t tableRows, cudaStream_t s);
void tokenTypeGrad(const int32_t *types, In g, Out dtable, int64_t batch, int64_t rows, int64_t seq, int64_t first,
                   int64_t hidden, int64_t tableRows, cudaStream_t s);
void dropoutForward(In x, Out y, int64_t count, float rate, uint64_t seed, uint64_t stream, cudaStream_t s);
// position: nullable.
void embeddingForward(const int32_t *tokens, In word, In position, Out out, int64_t tokenCount, int64_t seq,
                      int64_t hidden, int64_t rowStart, int64_t rows, cudaStream_t s);
// dword (fp32) is zeroed and accumulated with atomics.
void embeddingBackward(const int32_t *tokens, In g, float *dword, int64_t tokenCount, int64_t hidden,
                       int64_t rowStart, int64_t rows, cudaStream_t s);
void crossEntropyLocalMax(In logits, float *rowMax, int64_t tokens, int64_t cols, int64_t colStart,
                          int64_t validVocab, cudaStream_t s);
void crossEntropyLocalSums(In logits, const int32_t *labels, const float *rowMax, float *sumExp, float *target,
                           int64_t tokens, int64_t cols, int64_t colStart, int64_t validVocab, cudaStream_t s);
// dlogits = gradOverCount * mask_t * (exp(logit - lse_t) - onehot(label)), padding columns 0.
void crossEntropyBackward(In logits, const int32_t *labels, const float *mask, const float *lse, float gradOverCount,
                          Out dlogits, int64_t tokens, int64_t cols, int64_t colStart, int64_t validVocab,
                          cudaStream_t s);
// fp32 only (master weights, main gradients and moments are fp32 in every plan).
void adamwUpdate(float *param, const float *grad, float *m, float *v, int64_t n, float lr, float beta1, float beta2,
                 float eps, float weightDecay, int64_t step, bool decay, cudaStream_t s);
// *sumOfSquares += sum of x[i]^2 (accumulated in double: the global gradient norm); with a
// mask, only where mask[i] != 0.
void accumulateSquares(const float *x, int64_t n, double *sumOfSquares, cudaStream_t s,
                       const float *mask = nullptr);
// x[i] = value.
void fillValue(Out x, int64_t n, float value, cudaStream_t s);
// x[i] *= factor (gradient clipping).
void scaleInPlace(Out x, int64_t n, float factor, cudaStream_t s);
// y[i] = x[i] in y's type (rounded to nearest even into 16 bits, widened exactly into fp32):
// the plan's cast, and fp32 scratch into a 16-bit result.
void convertElements(In x, Out y, int64_t count, cudaStream_t s);

// A kernel that keeps the stream busy for `seconds` (the hang tests' kernel that does not return).
void spinOnDevice(double seconds, cudaStream_t s);

// Whether a CUDA device can run kernels here; `why` says why not.
bool deviceAvailable(const char **why);

}  // namespace loom::cuda
