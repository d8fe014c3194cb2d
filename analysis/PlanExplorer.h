// The plan explorer (issue 40): a compiled job as one self-contained HTML page (`loom-dump PLANS
// --html FILE.html`): the rank grid coloured by pipeline stage with a rank's groups on hover, a
// rank's programs as dataflow graphs (instructions by stream, their inputs' producers and waits as
// edges; zoom and pan), the collective calls of each of its groups in order, the simulator's
// timeline and the memory per rank by part. No network: the data (JSON) and the script are inline.
// Ranks that run the same programs file share one copy of the programs in the page.
#pragma once

#include <string>

#include "analysis/PlanViews.h"
#include "analysis/StepSimulator.h"

namespace loom {

// `prediction`: the simulator's step over `plans` (its timeline), or null for none.
std::string planExplorerHtml(const PlanDirectory &plans, const StepPrediction *prediction);

}  // namespace loom
