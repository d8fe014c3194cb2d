// A rank's training step on the GPU with everything resident on the device: fp32 master
// parameters and AdamW moments, gradients accumulated over micro-batches in fp32, the stash
// handed from each forward to its backward, the micro-batch inputs. Programs run on a
// CudaExecutor (four streams; fp32, bf16 or fp16 GEMMs; NCCL collectives for tensor and data
// parallelism, the grad-sync program's bucket all-reduces included). The step's arithmetic is
// the CPU Trainer + TrainingLoop's (runtime/Trainer.h): the same parameter initialisation,
// data order, dropout seeds, mean loss over micro-batches and dp replicas, global-norm
// clipping (clip / (norm + 1e-6)) and AdamW with Megatron's decay rule.
//
// Data parallelism: when the plan's grad-sync program is only bucket all-reduces (backward
// outputs in, gradients out, as the compiler's data-parallel pass emits them), the buckets are
// not run as a program after the backward pass: during the last micro-batch's backward, each
// bucket's all-reduce goes out on a sync stream as soon as its last member gradient is
// accumulated, overlapping the rest of the backward pass (Megatron-LM's overlapped gradient
// reduction; Li et al., "PyTorch Distributed", VLDB 2020, section 3.2.3 for bucketing).
//
// fp16: dynamic loss scaling (runtime/LossScaler.h): the loss gradient is multiplied by the
// scale, gradients are unscaled on the device and checked for infs/NaNs; a step with any is
// skipped (over tp and dp) and the scale halves. bf16 and fp32 train without it.
//
// Pipeline parallelism: the schedule's programs in order, messages between stages through
// PipelineLinks (options.links; runtime/cuda/PipelineLinks.h). ZeRO-1 as the CPU trainer. Checkpoints and exports: runtime/cuda/CudaRankTrainer.h moves
// the state to the host and writes the CPU trainer's format.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "protos/plan.pb.h"
#include "runtime/AdamW.h"
#include "runtime/Collectives.h"
#include "runtime/DataSource.h"
#include "runtime/LossScaler.h"
#include "runtime/RankTrainer.h"
#include "runtime/Status.h"
#include "runtime/Tensor.h"
#include "runtime/cuda/CudaExecutor.h"
#include "runtime/cuda/HalfPrecision.h"

namespace loom::cuda {

class NcclGroup;
class NcclGroups;
class PipelineLinks;

struct CudaTrainerOptions {
  uint64_t seed = 1234;  // parameters and dropout, as TrainerOptions::seed
  AdamWConfig adam;
  Precision precision = Precision::kBf16;
  AttentionKernel attention = AttentionKernel::kAuto;
  LossScalerConfig lossScaling;  // used with fp16 only
  PipelineLinks *links = nullptr; // pipeline plans (p > 1): messages between stages; outlives the trainer
};

class CudaTrainer {
 public:
  // `collectives` (host scalars: loss, norm, overflow flag; and the rank's place in its
  // groups) and `groups` (NCCL) must outlive the trainer. `initial`: the parameters to start
  // from (null: initParameter with options.seed, as the CPU trainer does).
  static Status create(plan::RankPlan plan, plan::ProgramSet programs, Collectives *collectives,
                       const NcclGroups *groups, DataSource *data, const CudaTrainerOptions &options,
                       std::unique_ptr<CudaTrainer> *out,
                       const std::map<std::string, HostTensor> *initial = nullptr);
  ~CudaTrainer();
  CudaTrainer(const CudaTrainer &) = delete;
  CudaTrainer &operator=(const CudaTrainer &) = delete;

  // The phases of a step, as RankTrainer's (runtime/RankTrainer.h). computeGradients takes
  // the 0-based data step; with fp16 it also unscales and checks the gradients, and a step
  // with an inf/NaN comes back skipped (the scale halves; no norm or update may follow).
  Status computeGradients(int64_t dataStep, StepResult *result);
  Status gradientNorm(double *norm);
  Status scaleGradients(double factor);
  Status applyOptimizer(int64_t step, double lr);
  Status evaluate(DataSource *data, int64_t batch, double *loss);
  // ZeRO-1 (the plan's zero1), as Trainer::distributedOptimizerStep: gradients flattened in
  // parameter order (padded to a multiple of d) are reduce-scattered and averaged over dp by
  // NCCL; this rank clips by the global norm and updates its 1/d with its 1/d of the AdamW
  // state (decay per element); the parameters are all-gathered back.
  Status distributedOptimizerStep(int64_t step, double lr, double clip, double *norm);
  // The gradients averaged over dp (ZeRO-1 leaves them unsynchronised), for --dump-grads.
  Status synchronizeGradientsOverDataParallel();
  // A whole step as the training loop runs it: computeGradients(step - 1), the norm, clipping
  // by clip / (norm + 1e-6) when above `clip` (0: never), AdamW at 1-based `step`.
  Status step(int64_t step, double lr, double clip, StepResult *result, double *gradNorm);

  // Host copies of the state (checkpoints, exports, --dump-grads) and its replacement.
  Status downloadParameters(std::map<std::string, HostTensor> *out);
  Status downloadAdam(std::map<std::string, AdamWState> *out);
  Status downloadGradients(std::map<std::string, HostTensor> *out);
  // Every parameter must be in `params` with its size; a parameter without moments in `adam`
  // starts them at zero.
  Status uploadState(const std::map<std::string, HostTensor> &params, const std::map<std::string, AdamWState> &adam);
  // ZeRO-1's shard of the flat AdamW state (Trainer's layout).
  Status downloadZeroState(AdamWState *out);
  Status uploadZeroState(const AdamWState &state);
  // fp16 dynamic loss scaling's state, for checkpoints.
  struct LossScaling {
    double scale;
    int64_t cleanSteps;
  };
  LossScaling lossScaling() const;
  void restoreLossScaling(const LossScaling &state);
  bool usesLossScaling() const { return opt_.precision == Precision::kFp16; }

  const plan::RankPlan &plan() const { return plan_; }
  bool isLossRank() const { return plan_.pp_rank() == plan_.p() - 1; }

 private:
  struct Array;  // a device allocation
  struct Param;
  CudaTrainer(plan::RankPlan plan, plan::ProgramSet programs, Collectives *collectives, DataSource *data,
              const CudaTrainerOptions &options);
  Status runSchedule(int64_t dataStep, bool forwardOnly, double *meanLoss);
  Status runProgram(const plan::Program &prog, int mb, int64_t dataStep, bool overlapSync);
  Status planOverlappedSync(const NcclGroups *groups);
  Status memberReady(const std::string &stashName, cudaStream_t producer);
  Status uploadBatch(int mb, int64_t dataStep);
  Status unscaleAndCheck(bool *foundNonFinite);
  Status download(const float *device, size_t count, std::vector<float> *host);
  Status downloadTensors(Array Param::*which, std::map<std::string, HostTensor> *out);
  Status preallocate();
  Status planZero(const NcclGroups *groups);
  Status flatten(Array Param::*which);  // into zero_.flat in parameter order, padding zeroed
  Status unflattenParameters();
  Status slot(std::map<std::pair<std::string, int>, Array> &in, const std::string &name, int mb, size_t bytes,
              bool zeroed, Array **out);

  plan::RankPlan plan_;
  plan::ProgramSet programs_;
  std::map<std::string, const plan::Program *> byName_;
  Collectives *collectives_;
  DataSource *data_;
  CudaTrainerOptions opt_;
  std::unique_ptr<CudaExecutor> executor_;
  LossScaler scaler_;
  std::vector<Param> params_;
  std::map<std::string, size_t> paramIndex_;
  // Keyed by (name, micro-batch); backward outputs handed to grad sync use micro-batch -1.
  std::map<std::pair<std::string, int>, Array> stash_, inputs_, backwardOut_;
  std::map<std::string, bool> gradientSeen_;
  struct Pinned {
    void *data = nullptr;
    size_t bytes = 0;
  };
  std::map<std::pair<std::string, int>, Pinned> staging_;  // host side of inputs_
  std::set<int> uploaded_;                                  // micro-batches uploaded this schedule run
  // The grad-sync buckets run during the last backward (empty: the program runs instead).
  struct Bucket {
    NcclGroup *comm;
    ReduceOp op;
    std::vector<std::pair<std::string, size_t>> members;  // (backward output, parameter index)
    int pending = 0;                                      // members not yet accumulated this step
  };
  std::vector<Bucket> buckets_;
  std::map<std::string, std::pair<size_t, cudaEvent_t>> bucketOf_;  // backward output -> (bucket, ready event)
  cudaStream_t syncStream_ = nullptr;
  cudaEvent_t syncDone_ = nullptr;
  struct ZeroShard {
    int64_t total = 0, shard = 0, begin = 0;  // elements: all parameters, per rank, this rank's first
    float *flat = nullptr;                    // [shard * d]: flat gradients, then flat parameters
    float *grad = nullptr, *m = nullptr, *v = nullptr;  // [shard]
    float *counted = nullptr, *decayed = nullptr;       // [shard]: in the norm? decayed by AdamW?
  } zero_;
  NcclGroup *dpComm_ = nullptr;   // ZeRO-1's reduce-scatter and all-gather
  bool evaluating_ = false;       // forward programs with dropout off
  int64_t skippedSteps_ = 0;      // fp16 steps skipped by step() (not counted by AdamW)
  float *lossHost_ = nullptr;     // pinned: one loss per micro-batch
  double *squares_ = nullptr;     // device accumulator of the gradient norm
  int32_t *nonFinite_ = nullptr;  // device flag of fp16 overflow
};

}  // namespace loom::cuda
