// Executes one plan::Program on the GPU in fp32: activations in one device arena at the
// compiler's memory-plan offsets (kept and reused across runs), arguments copied to the device
// and results copied back. First version (issue 7): every instruction in plan order on one
// CUDA stream (a valid order: wait_for only names earlier instructions), GEMMs by cuBLAS
// SGEMM, the other ops by runtime/cuda kernels. Not yet: the plan's four streams with events,
// 16-bit activations, and communication ops (they need NcclGroup wiring), which are refused
// with a message naming the op.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "protos/plan.pb.h"
#include "runtime/Executor.h"
#include "runtime/Status.h"
#include "runtime/Tensor.h"

namespace loom::cuda {

class CudaExecutor {
 public:
  static Status create(std::unique_ptr<CudaExecutor> *out);
  ~CudaExecutor();
  CudaExecutor(const CudaExecutor &) = delete;
  CudaExecutor &operator=(const CudaExecutor &) = delete;

  // As loom::executeProgram: `args` follow program.arguments(), `results` program.results().
  // ctx.collectives only places this rank (shard offsets, tensor-parallel dropout streams):
  // communication ops are refused. seed and training are used as the CPU executor uses them.
  Status run(const plan::Program &program, const std::vector<const HostTensor *> &args,
             std::vector<HostTensor> &results, const ExecutionContext &ctx);

 private:
  CudaExecutor() = default;
  Status reserve(void **buffer, size_t *capacity, size_t bytes);
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void *arena_ = nullptr, *arguments_ = nullptr;
  size_t arenaBytes_ = 0, argumentBytes_ = 0;
};

}  // namespace loom::cuda
