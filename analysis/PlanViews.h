// What `loom-dump DIR` shows of a compiled plan directory: a rank's programs as text and as
// Graphviz DOT, the collectives and the memory timeline (the step's timeline: compiler/StepSimulator.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "analysis/PlanCheck.h"
#include "llvm/Support/Error.h"
#include "protos/plan.pb.h"

namespace loom {

struct PlanDirectory {
  std::string dir;
  std::vector<plan::RankPlan> ranks;
  std::map<std::string, plan::ProgramSet> programFiles;  // by file name

  const plan::ProgramSet &programsOf(int rank) const { return programFiles.at(ranks[rank].programs_file()); }
  const plan::Program *program(int rank, const std::string &name) const;
};

// Reads every rank_N.plan.pb and the program files they name, checking checksums.
llvm::Expected<PlanDirectory> readPlanDirectory(const std::string &dir);
// Every rank's plan and programs, rank r at r (what the check and the simulator take).
std::vector<RankPrograms> rankPrograms(const PlanDirectory &plans);

std::string programsAsText(const PlanDirectory &plans, int rank);
std::string programAsDot(const plan::Program &program);
std::string collectivesSummary(const PlanDirectory &plans, int rank);

// One collective call of a rank's step, in the order its group sees them.
struct CollectiveCall {
  std::string group, op, reduce, program;
  int64_t index = 0, elements = 0;  // index: the call's position among the group's calls
  int microBatch = -1, instruction = 0, layer = -1;
  std::string text() const;
};
std::vector<CollectiveCall> collectiveSequence(const PlanDirectory &plans, int rank);
// Where two ranks' calls on each group they share first differ (or that they agree).
std::string collectiveDiff(const PlanDirectory &plans, int a, int b);
// A rank's memory in Megatron's terms (weights and optimizer by dtype and per parameter, the
// activations of the micro-batches in flight, workspace, communication buffers, the backend's
// parts) and its timeline over the schedule; the same as JSON (loom-dump --view=memory --json).
std::string memoryTimeline(const PlanDirectory &plans, int rank);
std::string memoryJson(const PlanDirectory &plans, int rank);

}  // namespace loom
