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
  // fp32 arithmetic as PyTorch's AdamW, the bias corrections folded into two constants (from
  // double powers); the loop vectorises (sqrt and divide included).
  double c1 = 1 - std::pow(double(h.beta1), double(h.step)), c2 = 1 - std::pow(double(h.beta2), double(h.step));
  const float b1 = h.beta1, b2 = h.beta2, ob1 = float(1 - double(h.beta1)), ob2 = float(1 - double(h.beta2));
  const float invC1 = float(1 / c1), invSqrtC2 = float(1 / std::sqrt(c2)), eps = h.eps, lr = h.lr, scale = h.gradScale;
  planattr::forEachSegmentIn(segments, range.begin, range.count, [&](int64_t lo, int64_t hi, const planattr::FlatSegment &s) {
    const float decay = s.decay ? h.weightDecay : 0.0f;
    for (int64_t i = lo; i < hi; ++i) {
      float g = grad[i] * scale;
      float mi = b1 * m[i] + ob1 * g, vi = b2 * v[i] + ob2 * g * g;
      m[i] = mi, v[i] = vi;
      float update = (mi * invC1) / (std::sqrt(vi) * invSqrtC2 + eps) + decay * param[i];
      out[i] = param[i] - lr * update;
    }
  });
}

}  // namespace loom::cpu
