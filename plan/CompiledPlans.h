// What `loomc compile` produces before writing anything (compileInMemory in Compile.h): shared
// by the compile driver and by `loomc search`, which compiles candidates in memory.
#pragma once

#include <string>
#include <vector>

#include "protos/plan.pb.h"

namespace loom {

struct CompiledPlans {
  std::vector<plan::ProgramSet> sets;  // by pipeline stage
  std::vector<plan::RankPlan> plans;   // by rank
  std::string summaryHead, summaryTail;
};

}  // namespace loom
