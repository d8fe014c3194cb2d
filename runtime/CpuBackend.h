// The CPU backend of the step driver: the rank's state in host memory, programs on the CPU
// executor (runtime/Executor.h: a thread per plan stream), one reused workspace per program.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/StepBackend.h"

namespace loom {

class CpuBackend : public StepBackend {
 public:
  Status storage(const std::string &key, int64_t count, bool isInt, ArgumentView *out) override;
  Status upload(const HostTensor &from, ArgumentView to) override;
  Status download(ArgumentView from, std::vector<float> *to) override;
  Status run(const plan::Program &program, const std::vector<ArgumentView> &args, const ResultConsumer &consume,
             const ExecutionContext &ctx) override;
  Status copy(const float *from, int64_t count, float *to) override;

  // Bytes of every storage made so far (the state, stashes, inputs) and of the workspaces.
  int64_t storageBytes() const;

 private:
  std::map<std::string, std::vector<float>> floats_;
  std::map<std::string, std::vector<int32_t>> ints_;
  std::map<const plan::Program *, std::vector<float>> workspaces_;
};

}  // namespace loom
