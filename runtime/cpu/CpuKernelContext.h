// What a CPU kernel (runtime/cpu/*Kernels.cpp) sees of the program run it is part of: the
// buffers' host addresses, the run's context (collectives, dropout seed, training or not) and
// the kernels' scratch. The CPU executor (runtime/Executor.cpp) owns one per run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
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
  std::vector<uint16_t *> *halves = nullptr;  // per buffer id (16-bit storage: bf16 or fp16 bits)
  float *halfScratch = nullptr;               // this stream's halfScratchFloats(instruction) floats

  // An operand's storage; id -1 (an absent optional operand) gives null.
  float *f(int id) const { return id < 0 ? nullptr : (*floats)[size_t(id)]; }
  int32_t *i(int id) const { return id < 0 ? nullptr : (*ints32)[size_t(id)]; }
  uint16_t *h(int id) const { return id < 0 || !halves ? nullptr : (*halves)[size_t(id)]; }
  // f or h by storage type (kernels written once for fp32 and bf16 operands).
  template <typename T>
  T *at(int id) const {
    if constexpr (std::is_same_v<T, float>)
      return f(id);
    else
      return h(id);
  }
  Status collectives(Collectives **out) const {
    *out = run->collectives;
    return *out ? Status::ok() : Status::error("needs collectives but none were given");
  }
  int64_t shardStart(const std::string &group, int64_t rows) const {
    return loom::shardStart(run->collectives, group, rows);
  }
  // Context parallelism: this rank's chunks of the sequence over `group` for an operand holding
  // `local` tokens of each sample (c = 1, rank 0 without the group or collectives).
  ContextChunks chunks(const std::string &group, int64_t local) const {
    if (group.empty() || !run->collectives) return ContextChunks{local, 1, 0};
    int c = std::max(1, run->collectives->sizeOf(group));
    return ContextChunks{local * c, c, run->collectives->rankIn(group)};
  }
  // The global positions of rows [first, first + rows) of this rank's `local` tokens.
  std::vector<int64_t> positions(const std::string &group, int64_t first, int64_t rows, int64_t local) const {
    ContextChunks ch = chunks(group, local);
    std::vector<int64_t> global(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) global[size_t(r)] = ch.globalOf(first + r);
    return global;
  }
  int groupSize(const std::string &group) const {
    return group.empty() || !run->collectives ? 1 : run->collectives->sizeOf(group);
  }
  uint64_t dropoutStream(int64_t stream, const std::string &distinctGroup) const {
    return loom::dropoutStream(run->collectives, stream, distinctGroup);
  }
  // The dropout rate to apply: none outside training.
  float dropout(double rate) const { return run->training ? float(rate) : 0.0f; }
};

using CpuKernelRegistry = KernelRegistry<CpuKernelContext>;

// An attention instruction's shape (num_heads checked) and this run's dropout (ComputeKernels.cpp).
struct AttentionShape;
Status attentionShapeOf(CpuKernelContext &c, const KernelCall &k, AttentionShape *s);
struct GroupedAttentionShape;
Status groupedAttentionShapeOf(CpuKernelContext &c, const KernelCall &k, GroupedAttentionShape *s);

// Kernels that read and write 16-bit buffers themselves (runtime/cpu/HalfKernels.cpp), each for
// the operand dtypes its `takes` accepts; an instruction with 16-bit operands that none takes
// runs its fp32 kernel on widened copies (runtime/Executor.cpp). A native kernel computes in
// fp32 registers and rounds each 16-bit output once, as the widened path does.
struct HalfKernel {
  bool (*takes)(const KernelCall &call) = nullptr;
  CpuKernelRegistry::Kernel run = nullptr;
  // fp32 scratch it needs (CpuKernelContext::halfScratch; null: none).
  int64_t (*scratchFloats)(const KernelCall &call) = nullptr;
};
class HalfKernelTable {
 public:
  void add(isa::OpId op, HalfKernel kernel) { kernels_[size_t(op)] = kernel; }
  // The op's native kernel when it takes this call's dtypes, else null.
  const HalfKernel *find(const KernelCall &call) const {
    const HalfKernel &k = kernels_[size_t(call.decl.id)];
    return k.run && k.takes(call) ? &k : nullptr;
  }

 private:
  std::array<HalfKernel, isa::kOpCount> kernels_{};
};
const HalfKernelTable &cpuHalfKernels();
// body(buffer id) for each operand bound to the call (its declared slots that are present, and
// a variadic slot's every buffer).
template <typename Body>
void forEachOperand(const KernelCall &k, const Body &body) {
  for (size_t i = 0; i < k.decl.inputs.size(); ++i)
    if (k.decl.inputs[i].arity == isa::OperandDecl::kVariadic) {
      for (int id : k.bound.variadicInputs) body(id);
    } else if (int id = k.bound.inputs[i]; id >= 0) {
      body(id);
    }
  for (size_t i = 0; i < k.decl.outputs.size(); ++i)
    if (k.decl.outputs[i].arity == isa::OperandDecl::kVariadic) {
      for (int id : k.bound.variadicOutputs) body(id);
    } else if (int id = k.bound.outputs[i]; id >= 0) {
      body(id);
    }
}

// Whether every bound operand of the call is bf16 (the kernels written once for both storages).
bool everyOperandBf16(const KernelCall &call);
// Adds those of runtime/cpu/ComputeKernels.cpp, and the communication kernels for 16-bit
// buffers (runtime/cpu/CommunicationKernels.cpp), to the table.
void registerBf16ComputeKernels(HalfKernelTable &table);
void registerHalfCommunicationKernels(HalfKernelTable &table);
// A bf16 plan's MoE instructions (runtime/cpu/MoeKernels.cpp): the experts' products on bf16 weights.
void registerBf16MoeKernels(HalfKernelTable &table);

// The CPU backend's kernels, every declared op that it runs (built once).
const CpuKernelRegistry &cpuKernels();
// Each file's kernels, registered next to them.
void registerComputeKernels(CpuKernelRegistry &registry);
void registerCommunicationKernels(CpuKernelRegistry &registry);
void registerStepKernels(CpuKernelRegistry &registry);
void registerRingAttentionKernels(CpuKernelRegistry &registry);
// The fp32 scratch a ring attention instruction needs (0 for any other).
int64_t ringAttentionScratchOf(const plan::Program &program, const plan::Instruction &in);
void registerMoeKernels(CpuKernelRegistry &registry);
// The fp32 scratch a moe or moe_grad instruction needs (0 for any other).
int64_t moeScratchOf(const plan::Program &program, const plan::Instruction &in);

}  // namespace loom::cpu
