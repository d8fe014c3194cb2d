// One training step of a rank, as its plan says, on any backend: the schedule walk (forward
// and backward programs per micro-batch, then the loss and optimizer programs), the binding
// of every program argument to the rank's state (flat parameter and gradient buffers,
// optimizer state, stashes per micro-batch, micro-batch inputs, the recipe's scalars) and the
// hand-over of results (stashes, metrics). Everything a step computes or communicates is an
// instruction of the plan; the driver only binds storage and orders program runs.
#pragma once

#include <utility>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "protos/plan.pb.h"
#include "runtime/Collectives.h"
#include "data/DataSource.h"
#include "plan/Layout.h"
#include "plan/Zero1Parts.h"
#include "runtime/Executor.h"
#include "runtime/StepBackend.h"
#include "support/Status.h"
#include "runtime/Tensor.h"
#include "runtime/Trace.h"

namespace loom {

// The training recipe's per-step scalars: the optimizer program's HYPERPARAMETER inputs.
struct OptimizerScalars {
  double learningRate = 0, clipGrad = 0, lossScale = 1, weightDecay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  int64_t adamStep = 1;  // 1-based count of updates taken (bias correction)
};

// Dropout seeds: equal across a tensor-parallel group, distinct per step, replica and
// micro-batch (SplitMix64 finaliser over the mix). Every backend draws the same.
uint64_t dropoutSeed(uint64_t seed, int64_t step, int dp, int mb);
// The global index of the first sample of micro-batch mb of `step` on this data-parallel rank.
int64_t firstSampleOf(const plan::RankPlan &plan, int64_t step, int mb);

// Context parallelism: each [count, S] tensor of a micro-batch (mb) cut to the two sequence
// chunks of cp rank chunks.rank, into *result (which may be &batch). A loss_mask whose tokens
// are not spread evenly over the cp ranks is refused in one line naming the micro-batch.
Status contextChunksOf(const std::map<std::string, HostTensor> &batch, const ContextChunks &chunks, int mb,
                       std::map<std::string, HostTensor> *result);

class StepDriver {
 public:
  StepDriver(const plan::RankPlan &plan, const plan::ProgramSet &programs, StepBackend &backend,
             Collectives *collectives, uint64_t seed);
  // Checks the schedule against the programs and makes the state (parameters from `initial`,
  // in plan.parameters() order; gradients, optimizer state and loss sum zero).
  Status init(const std::vector<HostTensor> &initial);

  // The step's forward and backward programs over `data`'s batch `step` (0-based), then the
  // loss program: the gradients are final (synchronised) and *loss (ranks of the last stage:
  // *hasLoss) is the mean over micro-batches and dp replicas. evaluate: forward programs
  // only, dropout off, nothing traced.
  Status runGradients(DataSource *data, int64_t step, bool evaluate, bool *hasLoss, double *loss);
  // The losses the loss sums (BERT's "lm loss" and "sop loss"), each averaged as the loss is,
  // from the last runGradients that had the loss (empty for a loss of one term).
  const std::vector<std::pair<std::string, double>> &lossTerms() const { return lossTerms_; }
  // The optimizer program: *gradNorm (not finite: the update was skipped) and the update.
  Status runOptimizer(const OptimizerScalars &scalars, double *gradNorm);

  // ZeRO-1: after an update each rank holds only its own parts of the parameters until the next
  // step's forwards gather them; this gathers them now (the plan's parameter_gather program, a
  // collective over dp: every rank calls it at the same point) for a reader outside the step.
  // Nothing to do when the parameters are whole; an error where the fp32 master weights are
  // sharded (mastersSharded(): they are never whole).
  Status gatherParameters();
  // ZeRO-1: between runGradients and runOptimizer each rank holds the reduced gradients of its
  // own parts of the buckets the backwards reduce-scattered; this gathers them whole (the plan's
  // gradient_gather program, a collective over dp) for a reader (--dump-grads). The buckets the
  // optimizer reduces still hold each replica's own gradients.
  Status gatherGradients();

  // The rank's state, for checkpoints and exports (backend memory). parameter(): the fp32
  // master weights of `name` (an empty view where they are sharded).
  ArgumentView parameter(const std::string &name) const { return mastersSharded_ ? ArgumentView{} : sliceOf(params_, name); }
  // ZeRO-1 in a 16-bit plan (RankPlan.master_weights_sharded): the fp32 master weights are the
  // rank's bucket parts only, the optimizer state kMasterWeights (plan/Zero1Parts.h).
  bool mastersSharded() const { return mastersSharded_; }
  // Writes parameter `name`'s fp32 master weights from its whole values (the rank's parts of
  // them where the masters are sharded); parametersChanged() after the last write.
  Status writeParameter(const std::string &name, const HostTensor &values);
  ArgumentView gradient(const std::string &name) const { return sliceOf(grads_, name); }
  // Parameter `name`'s slice of a flat buffer (parameters, gradients, unsharded AdamW state);
  // "flat": all of it.
  ArgumentView sliceOf(const ArgumentView &flat, const std::string &name) const;
  ArgumentView flatParameters() const { return params_; }
  // The master weights were written from outside the step (initialisation, a checkpoint,
  // --init-from): a 16-bit plan's copies are remade from them (with sharded masters a
  // collective over dp: every rank calls it at the same point).
  Status parametersChanged();
  // The optimizer state of the plan (adam_m, adam_v: over the flat buffer, or its ZeRO-1 shard;
  // kMasterWeights where the master weights are sharded).
  const std::map<std::string, ArgumentView> &optimizerState() const { return optimizerState_; }

  void setTrace(TraceRecorder *trace) { trace_ = trace; }
  void setProgress(Progress *progress) { progress_ = progress; }
  // Fault injection (the hang tests): in data step `step`, the first `op` instruction never ends.
  void stallForTest(int64_t step, const std::string &op) { stallStep_ = step, stallOp_ = op; }
  void slowForTest(double factor) { slowdown_ = factor; }
  Progress *progress() const { return progress_; }
  void setLossScale(float scale) { lossScale_ = scale; }
  // The mixture-of-experts statistics of the training runs since the last call (then zeroed).
  MoeTally takeMoeTally() { return std::exchange(moeTally_, MoeTally{}); }
  // Record the training runs' MoE routing (loom-rank --dump-routing); take it after a step.
  void setLogRouting(bool on) { logRouting_ = on; }
  MoeRoutingByLayer takeMoeRouting() { return std::exchange(moeRouting_.choices, {}); }
  // Every training micro-batch's inputs written here (the oracle reads them).
  void setDumpBatches(const std::string &dir) { dumpBatches_ = dir; }

 private:
  Status runEntry(size_t entry, DataSource *data, int64_t step, bool evaluate);
  Status bind(const plan::Program &prog, int mb, DataSource *data, int64_t step, bool evaluate,
              std::vector<ArgumentView> *args);
  Status slot(const std::string &key, const plan::Buffer &buffer, ArgumentView *out);
  // The part of `storage` a view argument binds (Binding.offset, part_of).
  Status view(const ArgumentView &storage, const plan::Program &prog, const plan::Binding &a, ArgumentView *out) const;
  Status readMetric(const plan::Program &prog, const std::string &name, double *value);
  // A program outside the schedule (a gather), run to completion.
  Status runOutsideSchedule(const plan::Program &program);

  const plan::RankPlan &plan_;
  const plan::ProgramSet &programs_;
  StepBackend &backend_;
  Collectives *collectives_;
  uint64_t seed_;
  TraceRecorder *trace_ = nullptr;
  Progress *progress_ = nullptr;
  int64_t stallStep_ = -1;
  std::string stallOp_;
  double slowdown_ = 0;
  float lossScale_ = 1.0f;
  MoeTally moeTally_;
  MoeRoutingLog moeRouting_;
  bool logRouting_ = false;
  std::string dumpBatches_;
  std::vector<const plan::Program *> entryProgram_;  // per schedule entry
  std::vector<bool> lastRun_;                       // per entry: the program's last run of the step
  std::vector<bool> firstRun_;                      // per entry: the program's first run of the step
  const plan::Program *gatherProgram_ = nullptr;    // ZeRO-1's parameter_gather (outside the schedule)
  const plan::Program *gradientGatherProgram_ = nullptr;  // ZeRO-1's gradient_gather (outside the schedule)
  bool parametersStale_ = false;                    // only the rank's own parts are current
  bool mastersSharded_ = false;                     // RankPlan.master_weights_sharded
  ArgumentView masters_;                            // then: the optimizer state kMasterWeights
  std::vector<Zero1Part> parts_;                    // the rank's bucket parts, where masters_ holds them
  std::map<std::string, const plan::Parameter *> paramByName_;
  ArgumentView params_, grads_;
  std::map<std::string, ArgumentView> lossSums_;  // by LOSS argument: "loss_sum", "loss_sum:<term>"
  std::vector<std::pair<std::string, double>> lossTerms_;  // the last loss program's terms
  plan::DType computeDtype_ = plan::F32;  // the programs' PARAMETER dtype
  ArgumentView params16_;                 // their 16-bit copies of params_ (16-bit plans)
  std::map<std::string, ArgumentView> optimizerState_, hyper_;
  std::map<std::string, float> metrics_;  // this step's METRIC results
  std::map<int, bool> batchReady_;        // micro-batches whose inputs are uploaded this step
  std::set<std::string> inputsRead_;      // the inputs this rank's programs bind (a stage's own)
  // Storage slots reused across micro-batches, as the memory plan counts them: a chunk's stash
  // is held from its forward to its backward, a micro-batch's inputs from its first program to
  // its last; a freed slot serves the next micro-batch.
  struct SlotPool {
    std::map<int, int> held;  // micro-batch -> slot
    std::vector<int> free;
    int next = 0;
    int acquire(int mb);
    void release(int mb);
  };
  std::map<std::string, SlotPool> pools_;  // "inputs", "stash/<virtual stage>"
  std::vector<std::map<int, size_t>> lastEntryOf_;  // [evaluate]: micro-batch -> its last schedule entry
};

}  // namespace loom
