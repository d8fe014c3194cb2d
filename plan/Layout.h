// The parallel layout: which global rank holds which tensor-, data- and pipeline-parallel
// position, and the members of each group. The compiler writes every rank's groups into its
// plan from this (RankPlan.groups); the runtime reads them from the plan.
#pragma once

#include <string>
#include <vector>

namespace loom {

// Rank order as in Megatron-Core: tensor-parallel fastest, then data, then pipeline:
// rank = tp + t * (dp + d * pp).
struct ParallelLayout {
  int t = 1, p = 1, d = 1;
  int world() const { return t * p * d; }
  int tpOf(int rank) const { return rank % t; }
  int dpOf(int rank) const { return (rank / t) % d; }
  int ppOf(int rank) const { return rank / (t * d); }
  int rankOf(int tp, int dp, int pp) const { return tp + t * (dp + d * pp); }
};

// Global ranks, in group order, of `group` ("tp", "dp", "pp", "embedding" = the first and last
// pipeline stage, "world") containing `rank`; empty for an unknown group.
std::vector<int> groupMembers(const ParallelLayout &layout, const std::string &group, int rank);

}  // namespace loom
