#include "runtime/AdamW.h"

#include <cmath>

namespace loom {

void adamwUpdate(HostTensor &param, const HostTensor &grad, AdamWState &s, const AdamWConfig &cfg, double lr,
                 int64_t step, bool decay) {
  size_t n = param.data.size();
  if (s.m.size() != n) s.m.assign(n, 0.0f), s.v.assign(n, 0.0f);
  double c1 = 1 - std::pow(cfg.beta1, double(step)), c2 = 1 - std::pow(cfg.beta2, double(step));
  for (size_t i = 0; i < n; ++i) {
    float g = grad.data[i];
    s.m[i] = float(cfg.beta1 * s.m[i] + (1 - cfg.beta1) * g);
    s.v[i] = float(cfg.beta2 * s.v[i] + (1 - cfg.beta2) * double(g) * g);
    double update = (s.m[i] / c1) / (std::sqrt(s.v[i] / c2) + cfg.eps);
    if (decay) update += cfg.weightDecay * param.data[i];
    param.data[i] = float(param.data[i] - lr * update);
  }
}

bool decays(const std::string &, const std::vector<int64_t> &shape) { return shape.size() >= 2; }

}  // namespace loom
