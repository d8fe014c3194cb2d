// What a CPU kernel (runtime/cpu/*Kernels.cpp) sees of the program run it is part of: the
// buffers' host addresses, the run's context (collectives, dropout seed, training or not) and
// the kernels' scratch. The CPU executor (runtime/Executor.cpp) owns one per run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/Collectives.h"
#include "runtime/Executor.h"
#include "runtime/KernelRegistry.h"

namespace loom::cpu {

struct CpuKernelContext {
  const plan::Program *program = nullptr;
  const ExecutionContext *run = nullptr;
  std::vector<float *> *floats = nullptr;     // per buffer id (null: not fp32 or unbound)
  std::vector<int32_t *> *ints32 = nullptr;   // per buffer id (int32 arguments)
  float *scratch = nullptr;                   // cpuScratchFloats(program) floats

  // An operand's storage; id -1 (an absent optional operand) gives null.
  float *f(int id) const { return id < 0 ? nullptr : (*floats)[size_t(id)]; }
  int32_t *i(int id) const { return id < 0 ? nullptr : (*ints32)[size_t(id)]; }
  Status collectives(Collectives **out) const {
    *out = run->collectives;
    return *out ? Status::ok() : Status::error("needs collectives but none were given");
  }
  int64_t shardStart(const std::string &group, int64_t rows) const {
    return loom::shardStart(run->collectives, group, rows);
  }
  uint64_t dropoutStream(int64_t stream, const std::string &distinctGroup) const {
    return loom::dropoutStream(run->collectives, stream, distinctGroup);
  }
  // The dropout rate to apply: none outside training.
  float dropout(double rate) const { return run->training ? float(rate) : 0.0f; }
};

using CpuKernelRegistry = KernelRegistry<CpuKernelContext>;

// The CPU backend's kernels, every declared op that it runs (built once).
const CpuKernelRegistry &cpuKernels();
// Each file's kernels, registered next to them.
void registerComputeKernels(CpuKernelRegistry &registry);
void registerCommunicationKernels(CpuKernelRegistry &registry);
void registerStepKernels(CpuKernelRegistry &registry);

}  // namespace loom::cpu
