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

// `prediction`: the simulator's step over `plans` (its timeline), or null for none. `check`:
// loomc check's verdict (`checked` false: its one-line error, which the page shows and, for a
// collective that differs between ranks, marks on the collectives where it first diverges).
struct CheckVerdict {
  bool checked = true;
  std::string text;
};
std::string planExplorerHtml(const PlanDirectory &plans, const StepPrediction *prediction,
                             const CheckVerdict &check = {});

// `loomc search --html`: the ranked candidates (searchJson's list) as a table sortable by any
// column and a scatter of TFLOP/s per device against peak memory, one page like the explorer.
std::string searchExplorerHtml(const std::string &candidatesJson, const std::string &title);

}  // namespace loom
