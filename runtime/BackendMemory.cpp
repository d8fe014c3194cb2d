#include "runtime/BackendMemory.h"

#include <algorithm>

#include "plan/InstructionSet.h"
#include "plan/PlanAttributes.h"
#include "runtime/Executor.h"
#include "runtime/cuda/DeviceMemory.h"

namespace loom {

plan::BackendReserve backendReserve(config::DeviceKind kind,
                                    const google::protobuf::RepeatedPtrField<plan::Program> &programs,
                                    int64_t parameterCount) {
  plan::BackendReserve reserve;
  if (kind == config::CUDA) {
    // An fp32 plan assumes the default GEMM precision, bf16 (chosen at launch with --precision);
    // a 16-bit plan's GEMMs run in its own type (cuda::programPrecision).
    const cuda::Precision planned = cuda::Precision::kBf16;
    int64_t scratch = 0, ones = 0;
    for (const plan::Program &prog : programs) {
      scratch = std::max<int64_t>(scratch, int64_t(cuda::scratchFor(prog, planned, cuda::AttentionKernel::kAuto).total()));
      for (const plan::Instruction &in : prog.instructions())
        if (const isa::OpDecl *d = isa::find(in.op()); d && d->id == isa::OpId::kBiasGrad) {  // ones as long as its rows
          const plan::Buffer &g = prog.buffers(in.inputs(0));
          ones = std::max<int64_t>(ones, planattr::elementBytes(g.dtype()) * planattr::numel(g) /
                                             std::max<int64_t>(1, planattr::dim(g, -1)));
        }
    }
    // An fp32 plan's GEMMs read 16-bit copies the executor makes; a 16-bit plan holds its own.
    bool fp32Plan = planattr::computeDtype(programs) == plan::F32;
    reserve.halfWeightBytes = fp32Plan ? cuda::halfWeightBytes(parameterCount, planned) : 0;
    reserve.scratchBytes = scratch + ones + int64_t(cuda::kLtWorkspaceBytes);
  } else {  // the CPU kernels' scratch (attention probabilities), kept all step
    for (const plan::Program &prog : programs)
      reserve.scratchBytes = std::max<int64_t>(reserve.scratchBytes, 4 * cpuScratchFloats(prog));
  }
  return reserve;
}

}  // namespace loom
