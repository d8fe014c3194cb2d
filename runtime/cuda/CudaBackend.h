// The CUDA backend of the step driver (train/StepDriver.h): the rank's state resident on the
// GPU (the flat fp32 parameter and gradient buffers, optimizer state, stashes, micro-batch
// inputs, the recipe's scalars; a 16-bit plan's stashes and weight copies in 16 bits), programs
// on the CudaExecutor (a CUDA stream per plan stream; fp32, bf16 or fp16 GEMMs, 16-bit plans; NCCL for tensor and data parallelism; PipelineLinks between
// stages). The driver is the CPU backend's: the same plan instructions in the same order,
// gradient buckets overlapping the last backward on the dp stream as the plan's events say.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/StepBackend.h"
#include "runtime/cuda/CudaExecutor.h"

namespace loom::cuda {

class CudaBackend : public StepBackend {
 public:
  // Sizes the executor's arena, scratch and events for every program of `programs` now.
  static Status create(const CudaExecutorOptions &options, const plan::ProgramSet &programs,
                       std::unique_ptr<CudaBackend> *out);
  ~CudaBackend() override;

  Status storage(const std::string &key, int64_t count, plan::DType dtype, ArgumentView *out) override;
  Status upload(const HostTensor &from, ArgumentView to) override;
  Status download(ArgumentView from, std::vector<float> *to) override;
  Status checkKernels(const plan::Program &program) const override { return checkCudaKernels(program); }
  Status run(const plan::Program &program, const std::vector<ArgumentView> &args, const ResultConsumer &consume,
             const ExecutionContext &ctx) override;
  Status copy(const float *from, int64_t count, float *to) override;
  Status cast(ArgumentView from, ArgumentView to, plan::DType dtype) override;
  Status synchronize() override;
  void beginStep() override;
  // The storage and the executor's arena, scratch, 16-bit parameter copies and cuBLASLt
  // workspace (pipeline message slots belong to PipelineLinks: not counted here).
  int64_t allocatedBytes() const override;

 private:
  CudaBackend() = default;
  std::unique_ptr<CudaExecutor> executor_;
  PipelineLinks *links_ = nullptr;  // the executor's (pipeline plans)
  struct Allocation {
    void *data = nullptr;
    int64_t count = 0;
    bool isInt = false;
    int elementBytes = 4;
  };
  std::map<std::string, Allocation> storage_;
  cudaStream_t current_ = nullptr;  // the stream results are consumed on during run()
  ElementType resultType_ = ElementType::kF32;  // and the type of the result being consumed
};

}  // namespace loom::cuda
