// A rank's plan and program files as bytes (from the coordinator or from disk) into checked
// messages: the plan parses, is this build's version and this rank's, the program file matches
// the plan's checksum and parses, and every program passes the executor's structural check
// (stream, wait and buffer ids in range, only inout arguments written). Anything else is one
// line naming the file; no byte of either file is trusted before these checks.
#pragma once

#include <string>

#include "protos/plan.pb.h"
#include "support/Status.h"

namespace loom {

// The plan alone (rank / worldSize < 0: not checked, for a reader outside a job).
Status parsePlan(const std::string &planName, const std::string &planBytes, int rank, int worldSize,
                 plan::RankPlan *plan);
// The program file the plan names, against the plan's checksum.
Status parsePrograms(const plan::RankPlan &plan, const std::string &programBytes, plan::ProgramSet *programs);
// Both.
Status parsePlanFiles(const std::string &planName, const std::string &planBytes, const std::string &programBytes,
                      int rank, int worldSize, plan::RankPlan *plan, plan::ProgramSet *programs);

}  // namespace loom
