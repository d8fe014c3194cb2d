// The CPU backend of the step driver: the rank's state in host memory, programs on the CPU
// executor (runtime/Executor.h: a thread per plan stream) in one workspace arena, grown to the
// largest program's and reused (the memory plan's max_workspace_bytes), and one kernel scratch
// (its scratch_bytes).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/StepBackend.h"

namespace loom {

class CpuBackend : public StepBackend {
 public:
  Status storage(const std::string &key, int64_t count, plan::DType dtype, ArgumentView *out) override;
  Status upload(const HostTensor &from, ArgumentView to) override;
  Status download(ArgumentView from, std::vector<float> *to) override;
  Status checkKernels(const plan::Program &program) const override { return checkCpuKernels(program); }
  Status run(const plan::Program &program, const std::vector<ArgumentView> &args, const ResultConsumer &consume,
             const ExecutionContext &ctx) override;
  Status copy(const float *from, int64_t count, float *to) override;
  Status cast(ArgumentView from, ArgumentView to, plan::DType dtype) override;

  // Every storage made so far (the state, stashes, inputs), the one workspace and the kernels' scratch.
  int64_t allocatedBytes() const override;

 private:
  std::map<std::string, std::vector<float>> floats_;
  std::map<std::string, std::vector<int32_t>> ints_;
  std::map<std::string, std::vector<uint16_t>> halves_;  // bf16 / fp16 storage
  std::vector<float> workspace_;  // one arena for every program: a rank runs one at a time
  std::vector<float> scratch_;    // the kernels' scratch (cpuScratchFloats), likewise shared
};

}  // namespace loom
