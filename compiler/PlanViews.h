// What `loom-dump DIR` shows of a compiled plan directory: a rank's programs as text and as
// Graphviz DOT, the collectives, the schedule timeline (SVG) and the memory timeline.
#pragma once

#include <map>
#include <string>
#include <vector>

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

std::string programsAsText(const PlanDirectory &plans, int rank);
std::string programAsDot(const plan::Program &program);
std::string collectivesSummary(const PlanDirectory &plans, int rank);
// Ranks as rows (one per pipeline stage past 64 ranks), forward, backward and
// gradient-sync boxes over time, durations proportional to each program's FLOPs and bytes.
llvm::Expected<std::string> timelineSvg(const PlanDirectory &plans);
std::string memoryTimeline(const PlanDirectory &plans, int rank);

}  // namespace loom
