// Plan assembly, the last stage of `loomc compile`: from the lowered programs of each pipeline
// stage, the schedule and the model facts, every rank's RankPlan (its groups; its parameters
// with their shard, initializer and padding facts from the IR's arguments; its schedule,
// collective totals and memory plan), each checked against the device's memory.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "plan/Schedule.h"
#include "compiler/StepPrograms.h"
#include "llvm/Support/Error.h"
#include "mlir/IR/BuiltinOps.h"
#include "passes/ModelFacts.h"
#include "plan/BackendMemory.h"
#include "protos/cluster.pb.h"
#include "protos/plan.pb.h"

namespace loom {

struct PlanRequest {
  const config::ClusterSpec &cluster;
  const ModelFacts &facts;
  std::string modelName;
  int64_t paddedVocab;
  double modelFlopsPerToken;  // training FLOPs per token counted from the IR
  ScheduleKind kind;
  const std::vector<StageSchedule> &schedule;
  int microBatches;
  const std::vector<StageLayout> &layouts;  // per pipeline stage: its flat parameter buffer
  bool progress = false;                    // a progress line over the ranks on a terminal
  plan::BackendMemoryModel backendMemory;   // what the cluster's backend allocates beyond the plan
};

// `sets[s]`, `programFiles[s]` and `checksums[s]`: pipeline stage s's programs, their file
// (relative to the plan directory) and its FNV-1a checksum. `module` is the compiled module
// (the programs' functions with their argument attributes).
llvm::Expected<std::vector<plan::RankPlan>> assembleRankPlans(mlir::ModuleOp module,
                                                             const std::vector<plan::ProgramSet> &sets,
                                                             const std::vector<std::string> &programFiles,
                                                             const std::vector<uint64_t> &checksums,
                                                             const PlanRequest &request);

// After loomc check: each rank's pipeline links with their message slots (`stageLinkSlots`:
// (sending stage, receiving stage) -> the most messages in flight), the slots' memory on CUDA
// clusters, then every rank's planned peak against the device's memory (one line naming the
// rank, both numbers and the three largest parts).
llvm::Error finishPlans(std::vector<plan::RankPlan> &plans, const std::vector<plan::ProgramSet> &sets,
                        const std::map<std::pair<int, int>, int> &stageLinkSlots, const config::ClusterSpec &cluster);

// The summary `loomc compile` prints and writes to summary.txt (before the line saying where
// it wrote the plans).
std::string compileSummary(const PlanRequest &request, const std::vector<plan::RankPlan> &plans, double bubble);

// "none" | "full": the plan's name of a recompute mode.
std::string recomputeName(config::RecomputeMode r);

}  // namespace loom
