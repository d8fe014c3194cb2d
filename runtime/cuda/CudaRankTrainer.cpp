#include "runtime/cuda/CudaRankTrainer.h"

#include <cstdio>
#include <cstdlib>

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


// fp16's loss scale and its run of clean steps travel in the shard's metadata, so a resumed
// run scales as the uninterrupted one would.
Status CudaRankTrainer::saveShard(const std::string &path, const std::map<std::string, std::string> &metadata) {
  LOOM_RETURN_IF_ERROR(device_->downloadParameters(&host_->parameters()));
  LOOM_RETURN_IF_ERROR(device_->downloadAdam(&host_->adamState()));
  LOOM_RETURN_IF_ERROR(device_->downloadZeroState(&host_->zeroState()));
  std::map<std::string, std::string> meta = metadata;
  if (device_->usesLossScaling()) {
    CudaTrainer::LossScaling state = device_->lossScaling();
    char scale[40];
    std::snprintf(scale, sizeof scale, "%.17g", state.scale);
    meta["fp16_loss_scale"] = scale;
    meta["fp16_clean_steps"] = std::to_string(state.cleanSteps);
  }
  return host_->saveShard(path, meta);
}

Status CudaRankTrainer::loadShard(const std::string &path, std::map<std::string, std::string> *metadata) {
  LOOM_RETURN_IF_ERROR(host_->loadShard(path, metadata));
  if (device_->usesLossScaling() && metadata->count("fp16_loss_scale") && metadata->count("fp16_clean_steps")) {
    char *end = nullptr;
    double scale = std::strtod((*metadata)["fp16_loss_scale"].c_str(), &end);
    int64_t clean = std::strtoll((*metadata)["fp16_clean_steps"].c_str(), nullptr, 10);
    if (!(scale > 0) || *end != '\0') return Status::error(path + ": a corrupt fp16_loss_scale in the metadata");
    device_->restoreLossScaling({scale, clean});
  }
  LOOM_RETURN_IF_ERROR(device_->uploadZeroState(host_->zeroState()));
  return device_->uploadState(host_->parameters(), host_->adamState());
}

Status CudaRankTrainer::loadGlobalParameters(const std::map<std::string, HostTensor> &global) {
  LOOM_RETURN_IF_ERROR(host_->loadGlobalParameters(global));  // clears the host moments: they restart at zero
  return device_->uploadState(host_->parameters(), host_->adamState());
}

}  // namespace loom::cuda
