// CUDA runtime and cuBLAS return codes as Status values: one line naming what failed.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "support/Status.h"

namespace loom::cuda {

inline Status cudaStatus(cudaError_t err, const std::string &what) {
  if (err == cudaSuccess) return Status::ok();
  return Status::error("CUDA " + what + ": " + cudaGetErrorString(err));
}

inline Status blasStatus(cublasStatus_t st, const std::string &what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status::error("cuBLAS " + what + ": status " + std::to_string(int(st)));
}

}  // namespace loom::cuda
