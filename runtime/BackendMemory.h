// The executors' own memory beyond the plan's buffers (plan/BackendMemory.h), computed with the
// same functions the executors size their allocations by: the CPU kernels' scratch
// (cpuScratchFloats) and the CUDA backend's per-stream scratch, bias-gradient ones vector,
// cuBLASLt workspace and 16-bit weight copies (runtime/cuda/DeviceMemory.h).
#pragma once

#include "plan/BackendMemory.h"

namespace loom {

plan::BackendReserve backendReserve(config::DeviceKind kind,
                                    const google::protobuf::RepeatedPtrField<plan::Program> &programs,
                                    int64_t parameterCount);

}  // namespace loom
