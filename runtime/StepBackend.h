// Where a rank's training state lives and how its programs run: what differs between the CPU
// backend (runtime/CpuBackend.h) and the CUDA one (runtime/cuda/CudaBackend.h). The step
// driver (train/StepDriver.h) binds the plan's programs to this storage and runs them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "protos/plan.pb.h"
#include "runtime/Executor.h"
#include "support/Status.h"
#include "runtime/Tensor.h"

namespace loom {

// What differs per backend: where the rank's state lives and how a program runs there.
class StepBackend {
 public:
  virtual ~StepBackend() = default;
  // Storage of `count` elements of `dtype` (fp32, int32, or 16-bit: bf16 / fp16) made
  // zero-filled on the first call for `key` and the same on every later call.
  virtual Status storage(const std::string &key, int64_t count, plan::DType dtype, ArgumentView *out) = 0;
  // Host data into storage and back (views as storage() gives, or slices of them).
  virtual Status upload(const HostTensor &from, ArgumentView to) = 0;
  virtual Status download(ArgumentView from, std::vector<float> *to) = 0;
  // Runs `program` over `args`; consume(i, data, count) gets result i in backend memory (valid
  // during the call), where the driver may only copy() from it.
  // Every op of `program` has a kernel in this backend (checked when the plans are loaded: a
  // one-line error naming the op and the backend).
  virtual Status checkKernels(const plan::Program &program) const = 0;
  virtual Status run(const plan::Program &program, const std::vector<ArgumentView> &args,
                     const ResultConsumer &consume, const ExecutionContext &ctx) = 0;
  virtual Status copy(const float *from, int64_t count, float *to) = 0;
  // `from`'s elements into `to` (16-bit storage of `dtype`, rounded to nearest even; or fp32,
  // widened): the 16-bit copies of the weights a 16-bit plan computes with, a 16-bit result
  // into its slot.
  virtual Status cast(ArgumentView from, ArgumentView to, plan::DType dtype) = 0;
  // A step (or a validation batch) begins: its pipeline messages are counted from the first.
  virtual void beginStep() {}
  // Every queued operation has completed (before host reads; CPU: nothing to wait for).
  virtual Status synchronize() { return Status::ok(); }
  // Bytes of device (or host) memory the backend holds for the rank: every storage() and the
  // programs' workspace; what the memory plan predicts.
  virtual int64_t allocatedBytes() const = 0;
};

}  // namespace loom
