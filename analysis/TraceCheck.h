// `loomc check DIR --trace TRACES`: what the runtime ran (loom-rank --trace, one Chrome
// trace-event file per rank) against the plan semantics (compiler/StepSemantics.h). For every
// rank and stream, the traced instructions are exactly those the semantics runs on that stream
// (its programs' runs in schedule order, the stream's instructions in order, last_micro_batch
// instructions only in a program's last run), once per traced step; and no instruction starts
// before the instructions it waits for (wait_for) have ended. A one-line error names the rank,
// stream, step and the first instruction where the trace and the plan part.
#pragma once

#include <string>
#include <vector>

#include "analysis/PlanCheck.h"
#include "llvm/Support/Error.h"

namespace loom {

// `traceDir` holds rank_R.json for every rank of `ranks`; `*summary` says what was checked.
llvm::Error checkTraces(const std::vector<RankPrograms> &ranks, const std::string &traceDir, std::string *summary);

}  // namespace loom
