// `loomc simulate`: replays one training step of every rank's compiled plan on a cost model
// (compiler/CostModel.h) and predicts its time. The replay follows the runtime's semantics as
// `loomc check` does (programs in schedule order, each starting when the previous one has
// finished on every stream; each plan stream in order; wait_for between streams;
// last_micro_batch instructions only in a program's last run; sends that need no receiver;
// receives that wait for their message; collectives that start when their last member enters
// and end together), as a discrete-event simulation in time. CPU ranks on one node share its
// cores (Device.cores_per_node): the compute instructions running at once progress at
// min(1, cores / their threads) of their full rate.
//
// Ranks of a stage that run alike are simulated once (the one at tp 0, dp 0), as in the
// check, unless their node's cores are shared.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/CostModel.h"
#include "analysis/PlanCheck.h"
#include "llvm/Support/Error.h"
#include "protos/plan.pb.h"

namespace loom {

struct SimulateOptions {
  GemmPrecision precision = GemmPrecision::kFp32;
  bool unitCost = false;
  const config::DeviceFile *device = nullptr;  // replaces the plans' device and links when set
};

// A program run on a rank's compute stream, for the timeline.
struct ProgramSpan {
  std::string program;
  plan::Program::Kind kind;
  int microBatch = -1, virtualStage = 0;
  double start = 0, end = 0;
};

// Communication in flight on one of a rank's streams ("all_reduce@tp", "send@pp", ...).
struct CommunicationSpan {
  std::string kind;
  double start = 0, end = 0;
};

struct RankPrediction {
  int rank = 0, stage = 0;
  double computeSeconds = 0;  // the compute stream busy
  double exposedCommunicationSeconds = 0;  // communication in flight while compute idles
  std::map<std::string, double> exposedByKind;  // "all_reduce@dp" -> seconds
  double idleSeconds = 0;  // neither: the pipeline bubble, waits on skewed peers
  std::map<std::string, double> computeByOp;  // "linear" -> seconds on the compute stream
  int64_t peakMemoryBytes = 0;
  // Pipeline messages' bytes this rank sends per step, to a peer on its node and on another
  // (PTD-P's scatter/gather cuts the latter by t).
  int64_t pipelineBytesWithinNode = 0, pipelineBytesAcrossNodes = 0;
  std::vector<ProgramSpan> spans;
  std::vector<CommunicationSpan> communication;  // for the timeline: what overlaps the compute
};

struct StepPrediction {
  double stepSeconds = 0;
  double modelTflopsPerDevice = 0;     // the PTD-P count: model FLOPs per token, no recomputation
  double hardwareTflopsPerDevice = 0;  // every executed FLOP, recomputation included
  double mfu = 0;                      // model FLOP/s per device over the device's peak
  // Idle over busy time of the compute streams, the mean over ranks (the PTD-P paper's bubble
  // time fraction: (p - 1) / m for 1F1B in unit-cost mode).
  double bubble = 0;
  int64_t peakMemoryBytes = 0;  // the largest rank's
  int64_t pipelineBytesWithinNode = 0, pipelineBytesAcrossNodes = 0;  // the most any simulated rank sends
  std::map<std::string, double> exposedByKind;  // the mean over simulated ranks
  std::vector<std::string> warnings;  // what the model lacks (a link without a bandwidth: free)
  int simulatedRanks = 0, worldSize = 0;
  int64_t instructions = 0;
  std::vector<RankPrediction> ranks;  // simulated ranks
};

// The GEMM precision loom-rank runs a plan's cluster at by default: bf16 on CUDA, fp32 on CPUs.
GemmPrecision defaultPrecision(const plan::RankPlan &plan);

llvm::Error simulateStep(const std::vector<RankPrograms> &ranks, const SimulateOptions &options,
                         StepPrediction *out);

// The step as SVG: ranks as rows (one per pipeline stage past 64 ranks), their program runs
// in predicted time (forward blue, backward green, loss and optimizer purple), idle grey.
std::string predictionTimelineSvg(const std::vector<RankPrograms> &ranks, const StepPrediction &prediction);

// The prediction as one JSON object (the keys documented in the README).
std::string predictionJson(const StepPrediction &prediction);
// The same as a JSON object (search's --json adds these keys to each configuration).
nlohmann::ordered_json predictionObject(const StepPrediction &prediction);
std::string predictionText(const StepPrediction &prediction);

}  // namespace loom
