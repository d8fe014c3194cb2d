// AdamW (Loshchilov & Hutter) on fp32 master weights, as Megatron uses it: bias-corrected
// moments, decoupled weight decay applied only to weights (not biases or norm gains).
#pragma once

#include <string>
#include <vector>

#include "runtime/Tensor.h"

namespace loom {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weightDecay = 0.1;
};

struct AdamWState {
  std::vector<float> m, v;
};

// One update of `param` with gradient `grad` at step `step` (1-based) and learning rate lr.
void adamwUpdate(HostTensor &param, const HostTensor &grad, AdamWState &state, const AdamWConfig &cfg, double lr,
                 int64_t step, bool decay);

// Megatron's rule: no weight decay on biases and layer-norm parameters (1-D tensors).
bool decays(const std::string &name, const std::vector<int64_t> &shape);

}  // namespace loom
