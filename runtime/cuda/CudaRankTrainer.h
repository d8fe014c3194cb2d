// The training loop's view (runtime/RankTrainer.h) of a rank that trains on its GPU: every
// phase of the step runs in the CudaTrainer on the device; checkpoints, --init-from weights
// and --dump-grads move the state through a host Trainer, so the files are byte-for-byte the
// CPU backend's format (a CUDA run resumes from a CPU checkpoint of the same layout and back).
#pragma once

#include <memory>

#include "runtime/RankTrainer.h"
#include "runtime/Trainer.h"
#include "runtime/cuda/CudaTrainer.h"

namespace loom::cuda {

class CudaRankTrainer : public RankTrainer {
 public:
  // As CudaTrainer::create; the host trainer draws the initial weights (TrainerOptions::seed)
  // and the device starts from them.
  static Status create(plan::RankPlan plan, plan::ProgramSet programs, Collectives *collectives,
                       const NcclGroups *groups, DataSource *data, const TrainerOptions &hostOptions,
                       const CudaTrainerOptions &options, std::unique_ptr<CudaRankTrainer> *out);

  const plan::RankPlan &plan() const override { return device_->plan(); }
  Status computeGradients(int64_t step, StepResult *result) override {
    return device_->computeGradients(step, result);
  }
  Status gradientNorm(double *norm) override { return device_->gradientNorm(norm); }
  Status scaleGradients(double factor) override { return device_->scaleGradients(factor); }
  Status applyOptimizer(int64_t step, double lr) override { return device_->applyOptimizer(step, lr); }
  Status distributedOptimizerStep(int64_t step, double lr, double clip, double *norm) override {
    return device_->distributedOptimizerStep(step, lr, clip, norm);
  }
  Status synchronizeGradientsOverDataParallel() override { return device_->synchronizeGradientsOverDataParallel(); }
  Status hostGradients(std::map<std::string, HostTensor> *out) override { return device_->downloadGradients(out); }
  Status evaluate(DataSource *data, int64_t batch, double *loss) override {
    return device_->evaluate(data, batch, loss);
  }
  Status saveShard(const std::string &path, const std::map<std::string, std::string> &metadata) override;
  Status loadShard(const std::string &path, std::map<std::string, std::string> *metadata) override;
  Status loadGlobalParameters(const std::map<std::string, HostTensor> &global) override;

 private:
  CudaRankTrainer(std::unique_ptr<Trainer> host) : host_(std::move(host)) {}
  std::unique_ptr<Trainer> host_;  // the formats; its copy of the state is refreshed around each use
  std::unique_ptr<CudaTrainer> device_;
};

}  // namespace loom::cuda
