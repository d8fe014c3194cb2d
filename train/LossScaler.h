// Dynamic loss scaling for fp16 training (Micikevicius et al., "Mixed Precision Training",
// ICLR 2018, section 3.2): the loss is multiplied by a scale S before the backward pass so small
// gradients survive fp16; gradients are divided by S before the optimizer. A step whose
// gradients hold an inf or a NaN is skipped and S is halved; after `growthInterval` clean steps
// in a row S doubles. bf16 has fp32's exponent range and trains without it.
#pragma once

#include <cstdint>

#include "support/Status.h"

namespace loom {

struct LossScalerConfig {
  double initialScale = 65536.0;  // 2^16, as Megatron-LM and PyTorch's GradScaler start
  double growthFactor = 2.0;
  double backoffFactor = 0.5;
  int64_t growthInterval = 1000;
  double minScale = 1.0;
};

class LossScaler {
 public:
  // Refuses a config that cannot scale (naming the field): scales <= 0, growth <= 1, backoff
  // outside (0, 1), interval < 1, initial scale below the minimum.
  static Status validate(const LossScalerConfig &config);
  explicit LossScaler(const LossScalerConfig &config) : config_(config), scale_(config.initialScale) {}

  double scale() const { return scale_; }
  // The factor gradients are multiplied by before the optimizer: 1 / scale.
  double unscaleFactor() const { return 1.0 / scale_; }
  int64_t cleanSteps() const { return cleanSteps_; }

  // Back to a checkpointed state (scale and clean steps in a row).
  void restore(double scale, int64_t cleanSteps) { scale_ = scale, cleanSteps_ = cleanSteps; }

  // Called once per optimizer step with whether any gradient (on any rank) was not finite.
  // Returns true when the optimizer step must be skipped.
  bool update(bool foundNonFinite);

 private:
  LossScalerConfig config_;
  double scale_;
  int64_t cleanSteps_ = 0;
};

}  // namespace loom
