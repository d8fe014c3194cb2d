#include "runtime/cpu/Optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace loom::cpu {
float sumSquares(const float *grad, const std::vector<planattr::FlatSegment> &segments, FlatRange range,
                 bool countReplicated) {
  double sum = 0;
  planattr::forEachSegmentIn(segments, range.begin, range.count, [&](int64_t lo, int64_t hi, const planattr::FlatSegment &s) {
    if (!(s.norm || (s.normAtTp0 && countReplicated))) return;
    for (int64_t i = lo; i < hi; ++i) sum += double(grad[i]) * grad[i];
  });
  return float(sum);
}

void gradNorm(float squares, float clip, float lossScale, float *norm, float *factor) {
  double n = std::sqrt(double(squares)) / lossScale;
  *norm = float(n);
  double c = clip > 0 && n > clip ? clip / (n + 1e-6) : 1.0;
  *factor = std::isfinite(n) ? float(c / lossScale) : 0.0f;
}

void adamwFlat(const float *param, const float *grad, float *m, float *v, float *out,
               const std::vector<planattr::FlatSegment> &segments, FlatRange range, const AdamWHyper &h) {
  if (out != param) std::memcpy(out, param, size_t(range.count) * sizeof(float));
  if (h.gradScale == 0.0f) return;  // skipped: non-finite gradients
  double b1 = h.beta1, b2 = h.beta2, c1 = 1 - std::pow(b1, double(h.step)), c2 = 1 - std::pow(b2, double(h.step));
  bool scaled = h.gradScale != 1.0f;
  planattr::forEachSegmentIn(segments, range.begin, range.count, [&](int64_t lo, int64_t hi, const planattr::FlatSegment &s) {
    double decay = s.decay ? h.weightDecay : 0.0;
    for (int64_t i = lo; i < hi; ++i) {
      float g = scaled ? float(grad[i] * h.gradScale) : grad[i];
      m[i] = float(b1 * m[i] + (1 - b1) * g);
      v[i] = float(b2 * v[i] + (1 - b2) * double(g) * g);
      double update = (m[i] / c1) / (std::sqrt(v[i] / c2) + h.eps);
      update += decay * param[i];
      out[i] = float(param[i] - h.lr * update);
    }
  });
}

}  // namespace loom::cpu
