// A rank's plan and program files (the first part of the input and the rest) through the
// checks loom-rank applies before executing anything (runtime/PlanFiles.h). The program
// file's checksum gate is set to the input's own, or mutations would never get past it.
#include "fuzz/FuzzSupport.h"
#include "support/Checksum.h"
#include "runtime/Executor.h"
#include "runtime/PlanFiles.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  auto [planBytes, programBytes] = loom::fuzz::splitInput(data, size);
  loom::plan::RankPlan plan;
  if (!loom::parsePlan("rank_0.plan.pb", planBytes, -1, -1, &plan).isOk()) return 0;
  plan.set_programs_checksum(loom::checksum64(programBytes));
  loom::plan::ProgramSet programs;
  if (!loom::parsePrograms(plan, programBytes, &programs).isOk()) return 0;
  // What the CPU backend sizes from a checked program before running it.
  for (const loom::plan::Program &p : programs.programs()) (void)loom::cpuScratchFloats(p);
  return 0;
}
