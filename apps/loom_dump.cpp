// loom-dump: inspect Loom IR and compiled plans.
//   loom-dump FILE.mlir   module summary: parameters, FLOPs per token, op histogram.
//   loom-dump DIR [--rank R] [--view summary|graph|dot|collectives|timeline|memory] [--program NAME] [-o FILE]
//   loom-dump DIR --html FILE.html   (the plan explorer, analysis/PlanExplorer.h)
//       a plan directory from `loomc compile`: rank R's programs as text or Graphviz DOT, the
//       collectives, the step as SVG in predicted time (loomc simulate's model), the memory timeline.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler/ModelBuilder.h"
#include "compiler/ModelStats.h"
#include "analysis/PlanViews.h"
#include "analysis/PlanCheck.h"
#include "analysis/PlanExplorer.h"
#include "analysis/StepSimulator.h"
#include "compiler/ToolSupport.h"
#include "ir/ParamAttrs.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "passes/ModelFacts.h"
#include "support/CommandLine.h"

namespace cl = llvm::cl;

namespace {

cl::OptionCategory dumpCategory("loom-dump options");
cl::opt<std::string> input(cl::Positional, cl::Required, cl::desc("<input .mlir, - or plan directory>"),
                           cl::cat(dumpCategory));
cl::opt<int> rankOpt("rank", cl::desc("rank to show (plan directories)"), cl::init(0), cl::cat(dumpCategory));
cl::opt<std::string> view("view", cl::desc("summary | graph | dot | collectives | timeline | memory"),
                          cl::init("summary"), cl::cat(dumpCategory));
cl::opt<std::string> programOpt("program", cl::desc("program for --view=dot (default: the rank's first)"),
                                cl::cat(dumpCategory));
cl::list<int> diffRanks("diff", cl::desc("R1,R2: where two ranks' collective calls differ on the groups they share"),
                        cl::CommaSeparated, cl::cat(dumpCategory));
cl::opt<bool> jsonOpt("json", cl::desc("--view=memory as JSON"), cl::cat(dumpCategory));
cl::opt<std::string> htmlOpt("html",
                            cl::desc("write the plan explorer: one self-contained page (rank grid, programs as graphs, "
                                     "collectives, the simulator's timeline, memory)"),
                            cl::value_desc("FILE.html"), cl::cat(dumpCategory));
cl::opt<std::string> outFile("o", cl::desc("output file (default stdout)"), cl::init("-"), cl::cat(dumpCategory));

int dumpPlans() {
  auto plans = loom::readPlanDirectory(input);
  if (!plans) return loom::reportError("loom-dump", plans.takeError());
  if (rankOpt < 0 || rankOpt >= int(plans->ranks.size()))
    return loom::reportError("loom-dump", llvm::createStringError(llvm::inconvertibleErrorCode(),
                                                                  "--rank %d is outside the %zu ranks of %s",
                                                                  (int)rankOpt, plans->ranks.size(), input.c_str()));
  std::string text;
  if (jsonOpt && view != "memory")
    return loom::reportError("loom-dump", llvm::createStringError(llvm::inconvertibleErrorCode(),
                                                                  "--json is for --view=memory, not --view=%s",
                                                                  view.c_str()));
  if (!htmlOpt.empty()) {
    // The page: with the simulator's timeline where the plans' cluster has the device facts.
    std::vector<loom::RankPrograms> ranks = loom::rankPrograms(*plans);
    loom::SimulateOptions options;
    options.precision = loom::defaultPrecision(plans->ranks[0]);
    loom::StepPrediction prediction;
    bool simulated = true;
    if (llvm::Error e = loom::simulateStep(ranks, options, &prediction)) {
      llvm::consumeError(std::move(e));
      simulated = false;
    }
    loom::CheckResult checked;
    loom::CheckVerdict verdict;
    if (llvm::Error e = loom::checkPlans(ranks, &checked))
      verdict = {false, llvm::toString(std::move(e))};
    else
      verdict = {true, checked.summary};
    std::string page = loom::planExplorerHtml(*plans, simulated ? &prediction : nullptr, verdict);
    if (llvm::Error e = loom::writeOutput(htmlOpt, [&](llvm::raw_ostream &os) { os << page; }))
      return loom::reportError("loom-dump", std::move(e));
    std::printf("wrote the plan explorer of %zu ranks to %s (%.1f MiB)%s\n", plans->ranks.size(), htmlOpt.c_str(),
                double(page.size()) / (1 << 20), simulated ? "" : "; no timeline: the cluster spec lacks device facts");
    return 0;
  }
  if (!diffRanks.empty()) {
    if (diffRanks.size() != 2 || diffRanks[0] < 0 || diffRanks[1] < 0 || diffRanks[0] >= int(plans->ranks.size()) ||
        diffRanks[1] >= int(plans->ranks.size()))
      return loom::reportError("loom-dump", llvm::createStringError(llvm::inconvertibleErrorCode(),
                                                                    "--diff takes two ranks of the plan directory"));
    text = loom::collectiveDiff(*plans, diffRanks[0], diffRanks[1]);
  } else if (view == "summary") {
    auto s = std::ifstream(input + "/summary.txt");
    std::stringstream ss;
    ss << s.rdbuf();
    text = ss.str() + loom::collectivesSummary(*plans, rankOpt);
  } else if (view == "graph") {
    text = loom::programsAsText(*plans, rankOpt);
  } else if (view == "dot") {
    const auto &progs = plans->programsOf(rankOpt).programs();
    std::string name = programOpt.empty() ? progs.begin()->name() : std::string(programOpt);
    const loom::plan::Program *prog = plans->program(rankOpt, name);
    if (!prog)
      return loom::reportError("loom-dump", llvm::createStringError(llvm::inconvertibleErrorCode(),
                                                                    "rank %d has no program '%s'", (int)rankOpt,
                                                                    name.c_str()));
    text = loom::programAsDot(*prog);
  } else if (view == "collectives") {
    text = loom::collectivesSummary(*plans, rankOpt);
  } else if (view == "timeline") {
    // The step in predicted time (loomc simulate's model of the plans' cluster).
    std::vector<loom::RankPrograms> ranks = loom::rankPrograms(*plans);
    loom::SimulateOptions options;
    options.precision = loom::defaultPrecision(plans->ranks[0]);
    loom::StepPrediction prediction;
    if (llvm::Error e = loom::simulateStep(ranks, options, &prediction))
      return loom::reportError("loom-dump", std::move(e));
    text = loom::predictionTimelineSvg(ranks, prediction);
  } else if (view == "memory") {
    text = jsonOpt ? loom::memoryJson(*plans, rankOpt) : loom::memoryTimeline(*plans, rankOpt);
  } else {
    return loom::reportError("loom-dump", llvm::createStringError(llvm::inconvertibleErrorCode(),
                                                                  "--view must be summary, graph, dot, collectives, "
                                                                  "timeline or memory, got '%s'",
                                                                  view.c_str()));
  }
  if (llvm::Error e = loom::writeOutput(outFile, [&](llvm::raw_ostream &os) { os << text; }))
    return loom::reportError("loom-dump", std::move(e));
  return 0;
}

// 124439808 -> "124,439,808"
std::string withCommas(int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string engineering(double v) {
  const char *suffix[] = {"", "K", "M", "G", "T", "P", "E"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 6) v /= 1000, ++i;
  return llvm::formatv("{0:F2} {1}", v, suffix[i]).str();
}

}  // namespace

int main(int argc, char **argv) {
  if (!loom::parseCommandLine(argc, argv, "Loom IR and plan inspector\n", {&dumpCategory})) return 2;
  if (std::filesystem::is_directory(std::string(input))) return dumpPlans();
  mlir::MLIRContext ctx;
  loom::registerLoomDialects(ctx);
  loom::OneLineDiagnostics diags(ctx);
  mlir::OwningOpRef<mlir::ModuleOp> module = loom::readModule(ctx, input);
  if (!module) return 1;

  loom::ModelStats s = loom::computeModelStats(*module);
  llvm::raw_ostream &os = llvm::outs();
  mlir::FailureOr<loom::ModelFacts> facts = loom::readModelFacts(*module);
  if (failed(facts)) return 1;  // the handler printed why
  int64_t padded = loom::roundUpToMultiple(facts->wordRows, loom::vocabDivisibleBy(*module));
  os << "module: " << (module->getName() ? *module->getName() : "<unnamed>") << "\n";
  std::string heads = std::to_string(facts->numHeads) + " heads";
  if (facts->numKvHeads != facts->numHeads) heads += " (" + std::to_string(facts->numKvHeads) + " KV heads)";
  std::string experts;
  if (facts->numExperts > 0)
    experts = llvm::formatv(", {0} experts (top {1}) in every {2}", facts->numExperts, facts->expertsPerToken,
                            facts->moeLayerFreq == 1 ? std::string("layer") : std::to_string(facts->moeLayerFreq) + " layers")
                  .str();
  os << llvm::formatv("model: {0}, {1} layers, hidden {2}, {3}, ffn {4}{9}, seq {5}, vocab {6} (padded to {7} for t = 1)"
                      "{8}\n",
                      facts->architecture, facts->numLayers, facts->hiddenSize, heads, facts->ffnHiddenSize,
                      facts->seqLength, facts->vocabSize, padded, facts->tiedEmbeddings ? ", tied embeddings" : "",
                      experts);
  os << "parameters: " << withCommas(s.parameters) << "\n";
  if (s.vocabPaddingParameters > 0)
    os << "parameters without vocab padding: " << withCommas(s.parametersWithoutPadding()) << " ("
       << withCommas(s.vocabPaddingParameters) << " in padding)\n";
  if (s.tokensPerStep > 0) {
    os << "tokens per step: " << s.tokensPerStep << "\n";
    os << llvm::formatv("FLOPs per token: forward {0} ({1}FLOP), training {2} ({3}FLOP), "
                        "training with full recompute {4} ({5}FLOP)\n",
                        (int64_t)std::llround(s.forwardFlopsPerToken()),
                        engineering(s.forwardFlopsPerToken()),
                        (int64_t)std::llround(s.trainingFlopsPerToken()),
                        engineering(s.trainingFlopsPerToken()),
                        (int64_t)std::llround(s.trainingFlopsPerTokenFullRecompute()),
                        engineering(s.trainingFlopsPerTokenFullRecompute()));
    // The formula with the IR's own vocabulary width (the logits the IR computes).
    double ptdp = loom::ptdpFlopsPerToken(facts->numLayers, facts->hiddenSize, facts->seqLength, facts->wordRows);
    if (facts->architecture == "gpt")
      os << llvm::formatv("PTD-P formula (section 5.1, full recompute): {0} ({1}FLOP)\n", (int64_t)std::llround(ptdp),
                          engineering(ptdp));
  }
  os << "ops:\n";
  for (auto &[name, count] : s.opHistogram) os << llvm::formatv("  {0,-20} {1,8}\n", name, count);
  return 0;
}
