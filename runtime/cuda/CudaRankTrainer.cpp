#include "runtime/cuda/CudaRankTrainer.h"

namespace loom::cuda {

Status CudaRankTrainer::create(plan::RankPlan plan, plan::ProgramSet programs, Collectives *collectives,
                               const NcclGroups *groups, DataSource *data, const TrainerOptions &hostOptions,
                               const CudaTrainerOptions &options, std::unique_ptr<CudaRankTrainer> *out) {
  auto host = std::make_unique<Trainer>(plan, programs, collectives, data, hostOptions);
  std::unique_ptr<CudaRankTrainer> t(new CudaRankTrainer(std::move(host)));
  LOOM_RETURN_IF_ERROR(CudaTrainer::create(std::move(plan), std::move(programs), collectives, groups, data, options,
                                           &t->device_, &t->host_->parameters()));
  *out = std::move(t);
  return Status::ok();
}

Status CudaRankTrainer::distributedOptimizerStep(int64_t, double, double, double *) {
  return Status::error("ZeRO-1 (use_distributed_optimizer) is not wired into the CUDA backend yet");
}

Status CudaRankTrainer::synchronizeGradientsOverDataParallel() {
  return Status::error("ZeRO-1 (use_distributed_optimizer) is not wired into the CUDA backend yet");
}

Status CudaRankTrainer::saveShard(const std::string &path, const std::map<std::string, std::string> &metadata) {
  LOOM_RETURN_IF_ERROR(device_->downloadParameters(&host_->parameters()));
  LOOM_RETURN_IF_ERROR(device_->downloadAdam(&host_->adamState()));
  return host_->saveShard(path, metadata);
}

Status CudaRankTrainer::loadShard(const std::string &path, std::map<std::string, std::string> *metadata) {
  LOOM_RETURN_IF_ERROR(host_->loadShard(path, metadata));
  return device_->uploadState(host_->parameters(), host_->adamState());
}

Status CudaRankTrainer::loadGlobalParameters(const std::map<std::string, HostTensor> &global) {
  LOOM_RETURN_IF_ERROR(host_->loadGlobalParameters(global));  // clears the host moments: they restart at zero
  return device_->uploadState(host_->parameters(), host_->adamState());
}

}  // namespace loom::cuda
