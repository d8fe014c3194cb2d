// The parallel layout: which global rank holds which tensor-, context-, data- and pipeline-
// parallel position, and the members of each group. The compiler writes every rank's groups
// into its plan from this (RankPlan.groups); the runtime reads them from the plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

// Rank order as in Megatron-Core: tensor-parallel fastest, then context, then data, then
// pipeline: rank = tp + t * (cp + c * (dp + d * pp)).
// Expert parallelism (e) adds no dimension: its groups are carved out of the data-parallel
// ranks, as Megatron-Core's expert-model-parallel groups (e consecutive dp ranks).
struct ParallelLayout {
  int t = 1, p = 1, d = 1, c = 1, e = 1;
  int world() const { return t * c * p * d; }
  int tpOf(int rank) const { return rank % t; }
  int cpOf(int rank) const { return (rank / t) % c; }
  int dpOf(int rank) const { return (rank / (t * c)) % d; }
  int ppOf(int rank) const { return rank / (t * c * d); }
  int epOf(int rank) const { return dpOf(rank) % e; }  // position in the "ep" group
  int rankOf(int tp, int dp, int pp, int cp = 0) const { return tp + t * (cp + c * (dp + d * pp)); }
};

// Global ranks, in group order, of `group` containing `rank`: "tp", "cp" (context parallelism's
// ring), "dp", "dpcp" (the data- and context-parallel ranks of a (tp, pp) position together, dp
// major: the weight gradients' reduction with context parallelism), "pp", "embedding" (the first
// and last pipeline stage), "ep" (expert parallelism: the e consecutive dp ranks whose experts
// together are all of a layer's, dp / e of a block), "edp" (the d / e dp ranks holding the same
// experts: position dp % e of every ep block; the experts' gradients are reduced over it),
// "world"; empty for an unknown group.
std::vector<int> groupMembers(const ParallelLayout &layout, const std::string &group, int rank);

// Context parallelism's causal load balance (Megatron-Core): the sequence of S tokens in 2c
// chunks of S / 2c; cp rank r holds chunks r and 2c-1-r, in that order, as its S / c local
// tokens. With c = 1 the local tokens are the sequence.
struct ContextChunks {
  int64_t seq = 0;  // S, the whole sequence
  int c = 1, rank = 0;
  int64_t chunk() const { return seq / (2 * c); }
  int64_t local() const { return seq / c; }
  // The global chunk of local chunk `which` (0 or 1) of cp rank `r`.
  int64_t chunkOf(int r, int which) const { return which == 0 ? r : 2 * c - 1 - r; }
  // The global position of this rank's local token l (0 <= l < S / c).
  int64_t globalOf(int64_t l) const {
    int64_t C = chunk();
    return chunkOf(rank, int(l / C)) * C + l % C;
  }
};

}  // namespace loom
