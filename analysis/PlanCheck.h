// `loomc check`: proves before launch that a plan directory's ranks can run their step
// together. Every rank's schedule is executed symbolically with the runtime's semantics:
// programs one after another, each plan stream in instruction order, wait_for events between
// streams, last_micro_batch instructions only in a program's last run, buffered sends (Gloo's
// tagged messages; CUDA's PipelineLinks slots), receives that wait for their message, and
// collectives matched by order on each communicator (NCCL and Gloo match calls by order, not
// by name). It fails, in one line naming the ranks, program, micro-batch, instruction, op,
// group and layer, on: a collective whose members disagree (op, reduction, element counts), a
// receive whose message has another size, a message never received, and a deadlock (what
// every stuck rank waits for).
//
// Ranks of a pipeline stage whose programs and schedule are the same behave alike (they
// differ only in their tensor- and data-parallel position): then one rank per stage is
// simulated (the one at tp 0, dp 0), its collectives over groups within the stage complete as
// its peers would enter them alike, and the pipeline and embedding groups are simulated for
// real. Otherwise every rank is.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "llvm/Support/Error.h"
#include "protos/plan.pb.h"

namespace loom {

struct RankPrograms {
  const plan::RankPlan *plan;
  const plan::ProgramSet *programs;
};

struct CheckResult {
  std::string summary;  // what was checked
  // (sending rank, receiving rank) -> the most messages in flight on that link (simulated ranks).
  std::map<std::pair<int, int>, int> linkInFlight;
};

// `ranks[r]` is rank r's.
llvm::Error checkPlans(const std::vector<RankPrograms> &ranks, CheckResult *result);

// What the check and the simulator (compiler/StepSimulator.h) share.
// One run of a program in a rank's schedule; `last`: the program's last run of the step (its
// last_micro_batch instructions run); `first`: its first (its first_micro_batch instructions run).
struct ProgramRun {
  const plan::Program *prog;
  int mb;
  bool last;
  bool first = true;
};
// Rank r's schedule as program runs; an error if an entry names a program the rank lacks or a
// program is malformed.
llvm::Error programRunsOf(const RankPrograms &rank, int r, std::vector<ProgramRun> *runs);
// The ranks to execute: one per pipeline stage (tp 0, dp 0) when every stage's ranks run the
// same programs and schedule (`*onePerStage` says so), else all.
std::vector<bool> representativeRanks(const std::vector<RankPrograms> &ranks, bool *onePerStage);

}  // namespace loom
