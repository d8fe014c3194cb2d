#include "runtime/PlanFiles.h"

#include "support/Checksum.h"
#include "runtime/Executor.h"
#include "plan/PlanVersion.h"

namespace loom {

Status parsePlan(const std::string &planName, const std::string &planBytes, int rank, int worldSize,
                 plan::RankPlan *plan) {
  if (!plan->ParseFromString(planBytes) || plan->world_size() <= 0)
    return Status::error(planName + ": corrupt plan (not a RankPlan)");
  if (std::string why = planVersionError(plan->plan_version(), planName); !why.empty()) return Status::error(why);
  if (plan->rank() < 0 || plan->rank() >= plan->world_size())
    return Status::error(planName + ": rank " + std::to_string(plan->rank()) + " outside its world of " +
                         std::to_string(plan->world_size()) + " (corrupt plan)");
  if (rank >= 0 && plan->rank() != rank)
    return Status::error(planName + ": the plan is for rank " + std::to_string(plan->rank()) + ", not rank " +
                         std::to_string(rank));
  if (worldSize >= 0 && plan->world_size() != worldSize)
    return Status::error(planName + ": the plan is for a world of " + std::to_string(plan->world_size()) +
                         " ranks but the job has " + std::to_string(worldSize));
  return Status::ok();
}

Status parsePrograms(const plan::RankPlan &plan, const std::string &programBytes, plan::ProgramSet *programs) {
  if (checksum64(programBytes) != plan.programs_checksum())
    return Status::error(plan.programs_file() + ": checksum mismatch (corrupt, or from another compile)");
  if (!programs->ParseFromString(programBytes)) return Status::error(plan.programs_file() + ": corrupt program file");
  for (const plan::Program &p : programs->programs())
    if (Status s = checkProgram(p); !s.isOk()) return Status::error(plan.programs_file() + ": " + s.message());
  return Status::ok();
}

Status parsePlanFiles(const std::string &planName, const std::string &planBytes, const std::string &programBytes,
                      int rank, int worldSize, plan::RankPlan *plan, plan::ProgramSet *programs) {
  LOOM_RETURN_IF_ERROR(parsePlan(planName, planBytes, rank, worldSize, plan));
  return parsePrograms(*plan, programBytes, programs);
}

}  // namespace loom
