// What a backend allocates beyond the plan's buffers, all step long: its kernels' scratch,
// library workspaces and the 16-bit copies of the weights its GEMMs read. The compile pipeline
// plans these bytes (a layout that does not fit the device is refused before launch), but the
// arithmetic belongs to the executors that allocate them: the runtime implements it
// (runtime/BackendMemory) and whoever compiles (loomc) hands that implementation to the
// compiler, so that the compiler includes no runtime header and the rule exists once.
#pragma once

#include <cstdint>
#include <functional>

#include "protos/cluster.pb.h"
#include "protos/plan.pb.h"

namespace loom::plan {

struct BackendReserve {
  int64_t scratchBytes = 0;     // kernel scratch and library workspaces
  int64_t halfWeightBytes = 0;  // 16-bit weight copies (CUDA with a 16-bit GEMM precision)
};

// For one pipeline stage: its programs and the parameters it holds, on a device of `kind`.
using BackendMemoryModel = std::function<BackendReserve(
    config::DeviceKind kind, const google::protobuf::RepeatedPtrField<Program> &programs, int64_t parameterCount)>;

}  // namespace loom::plan
