// What the training loop (runtime/TrainingLoop.h) drives on a rank, whichever backend holds the
// state: the CPU Trainer (runtime/Trainer.h) or the CUDA one (runtime/cuda/CudaRankTrainer.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "protos/plan.pb.h"
#include "runtime/DataSource.h"
#include "runtime/Status.h"
#include "runtime/Tensor.h"

namespace loom {

struct StepResult {
  bool hasLoss = false;  // ranks of the last pipeline stage
  double loss = 0;       // mean over micro-batches and data-parallel replicas
  double seconds = 0;
  bool skipped = false;  // fp16 dynamic loss scaling found an inf/NaN gradient: no update this step
  double lossScale = 0;  // the scale this step used (0: none)
};

class RankTrainer {
 public:
  virtual ~RankTrainer() = default;
  virtual const plan::RankPlan &plan() const = 0;
  bool isLossRank() const { return plan().pp_rank() == plan().p() - 1; }

  // Forward and backward over the step's micro-batches (0-based `step` picks the data and
  // dropout) and the gradient sync.
  virtual Status computeGradients(int64_t step, StepResult *result) = 0;
  // The global L2 norm of the gradients, each parameter counted once.
  virtual Status gradientNorm(double *norm) = 0;
  virtual Status scaleGradients(double factor) = 0;
  // AdamW with learning rate lr (step is 1-based).
  virtual Status applyOptimizer(int64_t step, double lr) = 0;
  // ZeRO-1: reduce-scatter, clip, update the shard, all-gather (see Trainer).
  virtual Status distributedOptimizerStep(int64_t step, double lr, double clip, double *norm) = 0;
  virtual Status synchronizeGradientsOverDataParallel() = 0;
  // This step's gradients on the host (--dump-grads).
  virtual Status hostGradients(std::map<std::string, HostTensor> *out) = 0;
  // Forward passes only over global batch `batch` of `data`: the validation loss.
  virtual Status evaluate(DataSource *data, int64_t batch, double *loss) = 0;
  // Checkpoint shard of this rank: parameters and AdamW moments.
  virtual Status saveShard(const std::string &path, const std::map<std::string, std::string> &metadata) = 0;
  virtual Status loadShard(const std::string &path, std::map<std::string, std::string> *metadata) = 0;
  // Whole-model weights (global shapes, Loom names), each rank taking its shard.
  virtual Status loadGlobalParameters(const std::map<std::string, HostTensor> &global) = 0;
};

}  // namespace loom
