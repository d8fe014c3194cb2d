// ZeRO-1's ownership from a rank's plan (RankPlan.zero1_buckets, Megatron's distributed
// optimizer): member r of a bucket's group owns the r-th part of the bucket, and the rank's
// optimizer state (AdamW's moments; a 16-bit plan's fp32 master weights) holds its parts back to
// back. Read by the step driver, the checkpoint pieces and nothing else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "protos/plan.pb.h"

namespace loom {

// The optimizer state holding a 16-bit ZeRO-1 plan's sharded fp32 master weights
// (RankPlan.master_weights_sharded).
inline constexpr char kMasterWeights[] = "master_weights";

// The rank's position in a ZeRO-1 bucket group ("dp", "dpcp", "edp"); -1 for another name.
int zero1PartIndex(const plan::RankPlan &plan, const std::string &group);

// A bucket part the rank owns: flat elements [flatBegin, flatBegin + elements) of the stage's
// flat buffers, held from element stateBegin of the rank's optimizer state.
struct Zero1Part {
  int64_t flatBegin = 0, elements = 0, stateBegin = 0;
};
// In bucket order (empty without ZeRO-1 buckets).
std::vector<Zero1Part> zero1Parts(const plan::RankPlan &plan);

}  // namespace loom
