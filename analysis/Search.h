// `loomc search MODEL --cluster SPEC`: which parallel configuration to train with, predicted
// before launch. Every (t, p, d, v, b, recompute, sequence parallel, ZeRO-1, schedule) the
// cluster's devices and the spec's global batch allow is enumerated and validated as
// `loomc compile` would; a closed-form estimate (PTD-P's arithmetic: per-stage GEMM time on
// the device model, the bubble (p - 1) / (v m), ring traffic of the tp, pp and dp groups,
// weights, gradients, AdamW state and stashed activations) drops those over 1.25x the device's
// memory and orders the rest; the best `evaluate` of them are compiled in memory (no plan
// files) and simulated (compiler/StepSimulator.h: one rank per stage), those whose compiled
// plans do not fit are dropped with the plan's reason, and the rest are ranked by predicted
// model TFLOP/s per device. The best `top` with a tensor-parallel all-reduce are compiled and
// simulated again with parallel.tp_comm_overlap, and the best `top` with ZeRO-1 with
// parallel.overlap_param_gather: false, and ranked beside them.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "plan/CompiledPlans.h"
#include "analysis/StepSimulator.h"
#include "llvm/Support/Error.h"
#include "protos/cluster.pb.h"
#include "protos/model.pb.h"

namespace loom {

struct SearchOptions {
  int top = 5;
  int evaluate = 32;  // candidates compiled and simulated (the estimate's best)
  int threads = 2;
  std::string clusterPath;  // for errors
  bool progress = false;    // a progress line over the evaluated candidates on a terminal
  // Compiles a model for a cluster into plans in memory (loomc's compileInMemory).
  std::function<llvm::Error(const config::ModelConfig &, const config::ClusterSpec &, CompiledPlans *)> compile;
};

struct SearchCandidate {
  config::ParallelConfig parallel;
  double estimatedSeconds = 0;
  double estimatedBytes = 0;
  bool evaluated = false;
  std::string refused;  // why the compiled plans were refused (memory), empty if they fit
  StepPrediction prediction;
};

struct SearchResult {
  std::vector<SearchCandidate> ranked;  // evaluated and fitting, best first
  int enumerated = 0, invalid = 0, overEstimate = 0, refusedByPlan = 0, notEvaluated = 0;
  int overlapVariants = 0;  // the best again with parallel.tp_comm_overlap (compiled, simulated)
  int paramGatherVariants = 0;  // the best ZeRO-1 ones again with overlap_param_gather: false
  std::string exampleRefusal;  // one compiled plan's memory refusal, for the summary
  double worstMemoryEstimateError = 0;  // |estimated / compiled peak - 1|, worst over the compiled
  double seconds = 0;
};

llvm::Error searchConfigurations(const config::ModelConfig &model, const config::ClusterSpec &cluster,
                                 const SearchOptions &options, SearchResult *out);

std::string searchText(const SearchResult &result, const config::ClusterSpec &cluster, int top);
std::string searchJson(const SearchResult &result, int top);

}  // namespace loom
