// The linear op's GEMM on the GPU through cuBLASLt: bf16 or fp16 operands, fp32 accumulation
// and fp32 output, with the bias (and GeLU) folded into the GEMM's epilogue where asked.
// Same contract as cpu::linearForward: row-major y[M,N] = x[M,K] W + bias, W stored [K,N] or,
// with transposeW, [N,K]. Pointers are device pointers.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "runtime/Status.h"
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

  // bias: fp32 [N], read only with a bias epilogue.
  Status forward(const LinearShape &shape, const void *x, const void *w, const float *bias, float *y,
                 cudaStream_t stream);

 private:
  LtLinear() = default;
  cublasLtHandle_t handle_ = nullptr;
  void *workspace_ = nullptr;
  size_t workspaceBytes_ = 0;
};

}  // namespace loom::cuda
