#include "train/LossScaler.h"

#include <algorithm>
#include <string>

namespace loom {

Status LossScaler::validate(const LossScalerConfig &c) {
  if (!(c.minScale > 0)) return Status::error("loss scaler: min_scale must be > 0, got " + std::to_string(c.minScale));
  if (!(c.initialScale >= c.minScale))
    return Status::error("loss scaler: initial_scale must be >= min_scale (" + std::to_string(c.minScale) + "), got " +
                         std::to_string(c.initialScale));
  if (!(c.growthFactor > 1))
    return Status::error("loss scaler: growth_factor must be > 1, got " + std::to_string(c.growthFactor));
  if (!(c.backoffFactor > 0 && c.backoffFactor < 1))
    return Status::error("loss scaler: backoff_factor must be in (0, 1), got " + std::to_string(c.backoffFactor));
  if (c.growthInterval < 1)
    return Status::error("loss scaler: growth_interval must be >= 1, got " + std::to_string(c.growthInterval));
  return Status::ok();
}

bool LossScaler::update(bool foundNonFinite) {
  if (foundNonFinite) {
    scale_ = std::max(scale_ * config_.backoffFactor, config_.minScale);
    cleanSteps_ = 0;
    return true;
  }
  if (++cleanSteps_ == config_.growthInterval) {
    scale_ *= config_.growthFactor;
    cleanSteps_ = 0;
  }
  return false;
}

}  // namespace loom
