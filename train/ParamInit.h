// Parameter initialisation that does not depend on the parallel layout: element i of a
// parameter's global tensor is drawn from a counter-based generator keyed by (seed, name, i),
// so every (t, p, d) starts from the same weights, and a shard draws only its own elements.
#pragma once

#include <cstdint>
#include <vector>

#include "protos/plan.pb.h"
#include "runtime/Tensor.h"

namespace loom {

// normal(0, init_std) by Box-Muller on two Philox uniforms, zeros, or ones. A tied copy
// (loom.tied_to) draws the elements of the parameter it copies.
HostTensor initParameter(const plan::Parameter &param, uint64_t seed);

// Every parameter of a rank's plan, in plan order, drawn on the machine's cores in parallel
// (the values do not depend on the threads).
std::vector<HostTensor> initParameters(const plan::RankPlan &plan, uint64_t seed);

// FNV-1a 64 of a string: a stable stream id for a name.
uint64_t streamOfName(const std::string &name);

}  // namespace loom
