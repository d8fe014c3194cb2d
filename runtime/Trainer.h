// A rank's training loop over its plan: each step runs the schedule's forward and backward
// programs per micro-batch (stashing activations between them, accumulating gradients),
// then the gradient-sync programs, then AdamW on the parameters it holds.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "protos/plan.pb.h"
#include "runtime/AdamW.h"
#include "runtime/Collectives.h"
#include "runtime/DataSource.h"
#include "runtime/RankTrainer.h"
#include "runtime/Status.h"
#include "runtime/Tensor.h"
#include "runtime/Trace.h"

namespace loom {

struct TrainerOptions {
  uint64_t seed = 1234;  // parameters and dropout
  AdamWConfig adam;
  std::string dumpBatches;  // write every training micro-batch's inputs here (the oracle reads them)
  TraceRecorder *trace = nullptr;  // record every executed instruction (loom-rank --trace)
};

// Dropout seeds: equal across a tensor-parallel group, distinct per step, replica and
// micro-batch (SplitMix64 finaliser over the mix). Every backend's trainer draws the same.
uint64_t dropoutSeed(uint64_t seed, int64_t step, int dp, int mb);
// Pipeline messages of micro-batch mb use their own tag range (the CPU executor's messageTag).
constexpr int64_t kTagsPerMicroBatch = 1 << 12;

// The error when a program's argument has nothing to bind to (a plan/schedule mismatch).
Status unboundArgument(const plan::Program &prog, const std::string &name, int mb);
// The global index of the first sample of micro-batch mb of `step` on this data-parallel rank.
int64_t firstSampleOf(const plan::RankPlan &plan, int64_t step, int mb);

class Trainer : public RankTrainer {
 public:
  Trainer(plan::RankPlan plan, plan::ProgramSet programs, Collectives *collectives, DataSource *data,
          TrainerOptions options);

  // Forward and backward over the step's micro-batches and the gradient sync; gradients()
  // then hold this step's final gradients.
  Status computeGradients(int64_t step, StepResult *result) override;
  // The global L2 norm of the gradients, each parameter counted once across tensor-parallel
  // replicas, pipeline-tied copies and data-parallel replicas (all-reduced over tp and pp).
  Status gradientNorm(double *norm) override;
  // Scales every gradient by `factor` (global norm clipping).
  Status scaleGradients(double factor) override;
  // AdamW with learning rate lr (step is 1-based).
  Status applyOptimizer(int64_t step, double lr) override;

  // ZeRO-1 (the plan's zero1): the gradients, flattened in parameter order and padded to a
  // multiple of d, are reduce-scattered (averaged) over dp; this rank clips and updates its
  // 1/d of the flat parameters with its 1/d of the AdamW state; the parameters are then
  // all-gathered over dp. `norm` is the global gradient norm before clipping.
  Status distributedOptimizerStep(int64_t step, double lr, double clip, double *norm) override;
  // The dp-averaged gradients (ZeRO-1 leaves them unsynchronised), for --dump-grads.
  Status synchronizeGradientsOverDataParallel() override;
  // Forward passes only over one global batch of `data` (index `batch`): the validation loss.
  Status evaluate(DataSource *data, int64_t batch, double *loss) override;

  // Checkpoint shard of this rank: parameters and AdamW moments.
  Status saveShard(const std::string &path, const std::map<std::string, std::string> &metadata) override;
  Status loadShard(const std::string &path, std::map<std::string, std::string> *metadata) override;
  // Replaces parameters by the tensors of a whole-model file (global shapes, keyed by Loom
  // parameter name), each rank taking its shard.
  Status loadGlobalParameters(const std::map<std::string, HostTensor> &global) override;

  Status hostGradients(std::map<std::string, HostTensor> *out) override {
    *out = grads_;
    return Status::ok();
  }

  const plan::RankPlan &plan() const override { return plan_; }
  std::map<std::string, HostTensor> &parameters() { return params_; }
  const std::map<std::string, HostTensor> &gradients() const { return grads_; }
  // AdamW moments by parameter name (empty before the first update or after new weights).
  std::map<std::string, AdamWState> &adamState() { return adam_; }
  // ZeRO-1: this rank's shard of the flat AdamW state.
  AdamWState &zeroState() { return zeroState_; }

 private:
  Status runProgram(const plan::Program &prog, int microBatch, int64_t step, double *loss);
  Status runSchedule(int64_t step, bool forwardOnly, double *lossSum);

  plan::RankPlan plan_;
  plan::ProgramSet programs_;
  std::map<std::string, const plan::Program *> byName_;
  Collectives *collectives_;
  DataSource *data_;
  TrainerOptions opt_;
  DataSource *trainData_;
  std::map<std::string, HostTensor> params_, grads_;
  std::map<std::string, AdamWState> adam_;
  std::map<std::pair<std::string, int>, HostTensor> stash_;   // forward -> backward, per micro-batch
  std::map<std::string, HostTensor> backwardOut_;            // backward -> grad sync, summed
  std::map<int, std::map<std::string, HostTensor>> batches_;  // inputs per micro-batch
  std::map<const plan::Program *, std::vector<float>> workspaces_;
  AdamWState zeroState_;  // this rank's shard of the flat AdamW state (ZeRO-1)
  bool evaluating_ = false;  // validation: forward programs with dropout off
};

}  // namespace loom
