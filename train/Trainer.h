// A rank's training state under the recipe, on any backend: the step driver over the plan
// (train/StepDriver.h), the recipe's scalars (AdamW's, the learning rate, clipping, fp16's
// dynamic loss scale), and the state's way in and out (checkpoint shards, whole-model
// weights, gradients for --dump-grads). What differs between the CPU and CUDA backends is
// only the StepBackend (runtime/CpuBackend.h, runtime/cuda/CudaBackend.h): checkpoints are
// the same files on both.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "protos/plan.pb.h"
#include "runtime/Collectives.h"
#include "data/DataSource.h"
#include "formats/Checkpoint.h"
#include "train/LossScaler.h"
#include "runtime/StepBackend.h"
#include "support/Status.h"
#include "runtime/Tensor.h"
#include "runtime/Trace.h"
#include "train/LossScaler.h"
#include "train/StepDriver.h"

namespace loom {

// AdamW (Loshchilov & Hutter) on fp32 master weights as Megatron uses it: bias-corrected
// moments, decoupled weight decay on the parameters the plan marks (matrices, not biases or
// norm gains). The optimizer program's hyperparameters.
struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weightDecay = 0.1;
};

struct TrainerOptions {
  uint64_t seed = 1234;  // parameters and dropout
  AdamWConfig adam;
  std::string dumpBatches;         // write every training micro-batch's inputs here (the oracle reads them)
  TraceRecorder *trace = nullptr;  // record every executed instruction (loom-rank --trace)
  Progress *progress = nullptr;    // where the rank is, for its heartbeat
  int64_t stallStep = -1;          // fault injection (hang tests): stall in this data step's first linear
  double slowdown = 0;             // fault injection (straggler report): kernels take 1 + this times as long
  bool lossScaling = false;        // fp16: dynamic loss scaling (train/LossScaler.h)
  LossScalerConfig lossScaler;
};

struct StepResult {
  bool hasLoss = false;  // ranks of the last pipeline stage
  double loss = 0;       // mean over micro-batches and data-parallel replicas
  double lossScale = 0;  // the scale this step used (0: none)
  // The losses the loss sums, by name, each averaged as the loss is (BERT: "lm loss" and "sop
  // loss"; empty for a loss of one term).
  std::vector<std::pair<std::string, double>> lossTerms;
};

class Trainer {
 public:
  // `initial`: the parameters to start from (null: drawn by initParameters with options.seed).
  Trainer(const Trainer &) = delete;
  Trainer &operator=(const Trainer &) = delete;
  static Status create(plan::RankPlan plan, plan::ProgramSet programs, std::unique_ptr<StepBackend> backend,
                       Collectives *collectives, DataSource *data, const TrainerOptions &options,
                       std::unique_ptr<Trainer> *out);

  const plan::RankPlan &plan() const { return plan_; }
  bool isLossRank() const { return plan_.pp_rank() == plan_.p() - 1; }

  // Forward and backward over the step's micro-batches (0-based `step` picks the data and
  // dropout); the gradients are then final.
  Status computeGradients(int64_t step, StepResult *result);
  // The optimizer program at 1-based update `update`: *norm is the global gradient norm. When
  // it is not finite nothing was updated: with fp16 loss scaling *skipped is set (the scale
  // backs off), otherwise it is an error.
  Status optimizerStep(int64_t update, double lr, double clip, double *norm, bool *skipped);
  // Forward passes only over global batch `batch` of `data`: the validation loss.
  Status evaluate(DataSource *data, int64_t batch, double *loss,
                  std::vector<std::pair<std::string, double>> *lossTerms = nullptr);

  // This step's gradients (--dump-grads), by parameter name (a collective with ZeRO-1: the
  // plan's gradient_gather). With ZeRO-1 the buckets the backwards reduce-scattered hold the
  // reduced gradients (gathered whole), the others (reduced by the optimizer: a pipeline-tied
  // embedding) each replica's own: see gradientsSynchronized(). A reader averaging the replicas
  // gets the reduced gradients either way.
  Status hostGradients(std::map<std::string, HostTensor> *out);
  bool gradientsSynchronized() const { return !plan_.zero1() || plan_.d() * std::max(1, plan_.c()) == 1; }
  // What the backend holds for this rank (to compare with the plan's memory.peak_bytes).
  int64_t allocatedBytes() const { return backend_->allocatedBytes(); }
  // Seconds this rank spent in its own kernels so far (runtime/Progress.h computeSeconds; -1:
  // not measured, e.g. without a Progress or on CUDA).
  double computeSeconds() const { return driver_.progress() ? driver_.progress()->computeSeconds() : -1; }
  // This rank's mixture-of-experts statistics since the last call (runtime/Executor.h MoeTally).
  MoeTally takeMoeTally() { return driver_.takeMoeTally(); }
  // The training runs' MoE routing, recorded when set (loom-rank --dump-routing).
  void setLogRouting(bool on) { driver_.setLogRouting(on); }
  MoeRoutingByLayer takeMoeRouting() { return driver_.takeMoeRouting(); }
  // Parameters by name (host copies; an error where the fp32 master weights are sharded: ZeRO-1 in
  // a 16-bit plan, whose pieces a checkpoint holds).
  Status hostParameters(std::map<std::string, HostTensor> *out);
  // This rank's file of a layout-independent checkpoint (formats/CheckpointPieces.h): its pieces
  // of the parameters and AdamW moments, each with its fact in the metadata.
  // `progress`: a progress line on a terminal (runtime/ProgressMeter.h) while the file is written.
  Status saveShard(const std::string &path, const std::map<std::string, std::string> &metadata, bool progress = false);
  // saveShard's first half: this rank's pieces copied to host memory, ready to be written (an
  // asynchronous save writes them on another thread while training goes on).
  Status snapshotShard(const std::map<std::string, std::string> &metadata, SafetensorsFile *file);
  // The bytes of this rank's pieces (an asynchronous save holds one copy in host memory).
  int64_t checkpointBytes() const;
  // Fills every parameter and this rank's AdamW moments from a checkpoint of any layout
  // (directory `dir`, its metadata.json read into `index`): the pieces overlapping them, each
  // checked against its checksum; shapes must match the plan's (vocabulary padding aside).
  Status loadResharded(const std::string &dir, const CheckpointIndex &index, bool progress = false);
  // fp16's dynamic loss scale (the training state a checkpoint keeps once).
  const LossScaler &lossScaler() const { return scaler_; }
  const TrainerOptions &options() const { return opt_; }
  void restoreLossScaler(double scale, int64_t cleanSteps) { scaler_.restore(scale, cleanSteps); }
  // Replaces the parameters by a whole-model file's tensors (global shapes, Loom names), each
  // rank taking its shard; the optimizer state restarts at zero.
  Status loadGlobalParameters(const std::map<std::string, HostTensor> &global);

 private:
  Trainer(plan::RankPlan plan, plan::ProgramSet programs, std::unique_ptr<StepBackend> backend,
          Collectives *collectives, DataSource *data, const TrainerOptions &options);
  Status zeroOptimizerState();

  plan::RankPlan plan_;
  plan::ProgramSet programs_;
  std::unique_ptr<StepBackend> backend_;
  DataSource *data_;
  TrainerOptions opt_;
  StepDriver driver_;
  LossScaler scaler_;
};

}  // namespace loom
