// The linear op's three GEMMs on the GPU through cuBLASLt: bf16 or fp16 operands, fp32
// accumulation, an fp32 output (an fp32 plan's, as autocast) or one of the operands' type (a
// 16-bit plan's, rounded once), with the bias (and GeLU) folded into the forward GEMM's
// epilogue where asked. Same contracts as runtime/cpu/Kernels.h: row-major y[M,N] = x[M,K] W
// + bias, W stored [K,N] or, with transposeW, [N,K]; dX = g W^T; dW = x^T g accumulated into
// an fp32 gradient (as Megatron-LM's gradient-accumulation fusion keeps main grads in fp32).
// Pointers are device pointers; 16-bit operands are of shape.type.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "support/Status.h"
#include "runtime/cuda/DeviceArray.h"
#include "runtime/cuda/HalfPrecision.h"

namespace loom::cuda {

enum class LinearEpilogue { kNone, kBias, kBiasGelu };  // GeLU: cuBLASLt's tanh approximation

struct LinearShape {
  int64_t m = 0, k = 0, n = 0;
  bool transposeW = false;
  HalfType type = HalfType::kBf16;
  LinearEpilogue epilogue = LinearEpilogue::kNone;
};

class LtLinear {
 public:
  // One handle and one workspace for the life of the runtime: nothing is allocated per call.
  static Status create(size_t workspaceBytes, std::unique_ptr<LtLinear> *out);
  ~LtLinear();
  LtLinear(const LtLinear &) = delete;
  LtLinear &operator=(const LtLinear &) = delete;

  // bias: [N] (fp32, or the output's 16-bit type), read only with a bias epilogue. The output's
  // type is y's: fp32, or shape.type.
  Status forward(const LinearShape &shape, const void *x, const void *w, In bias, Out y, cudaStream_t stream);
  // dx[M,K] = g[M,N] W^T (shape.epilogue is ignored).
  Status inputGrad(const LinearShape &shape, const void *g, const void *w, Out dx, cudaStream_t stream);
  // dw (W's layout) = x^T g, added to dw when accumulate.
  Status weightGrad(const LinearShape &shape, const void *x, const void *g, Out dw, bool accumulate,
                    cudaStream_t stream);

 private:
  // Row-major c[M,N] = op(a)[M,K] op(b)[K,N] (+ c when accumulate); a stored [K,M] when
  // transposeA, b stored [N,K] when transposeB.
  struct Gemm {
    int64_t m, k, n;
    bool transposeA, transposeB;
    HalfType type;
    LinearEpilogue epilogue;
    bool accumulate;
  };
  Status gemm(const Gemm &p, const void *a, const void *b, In bias, Out c, cudaStream_t stream);
  LtLinear() = default;
  cublasLtHandle_t handle_ = nullptr;
  void *workspace_ = nullptr;
  size_t workspaceBytes_ = 0;
};

}  // namespace loom::cuda
