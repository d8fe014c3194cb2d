#include "runtime/cpu/Optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/cpu/Parallel.h"

namespace loom::cpu {
float sumSquares(const float *grad, const std::vector<planattr::FlatSegment> &segments, FlatRange range,
                 bool countReplicated) {
  // Each counted segment in fixed chunks of kChunk elements, each chunk summed in double, the
  // chunks added in order: the same sum for any thread count.
  constexpr int64_t kChunk = 1 << 16;
  double sum = 0;
  static thread_local std::vector<double> partial;
  planattr::forEachSegmentIn(segments, range.begin, range.count, [&](int64_t lo, int64_t hi, const planattr::FlatSegment &s) {
    if (!(s.norm || (s.normAtTp0 && countReplicated))) return;
    int64_t chunks = chunkCount(hi - lo, kChunk);
    if (int64_t(partial.size()) < chunks) partial.resize(size_t(chunks));
    double *sums = partial.data();  // the caller's (a thread_local is per thread)
    parallelChunks(hi - lo, kChunk, [&](int64_t c, int64_t b, int64_t e) {
      double lanes[4] = {0, 0, 0, 0};
      int64_t i = lo + b;
      for (; i + 4 <= lo + e; i += 4)
        for (int k = 0; k < 4; ++k) lanes[k] += double(grad[i + k]) * grad[i + k];
      for (; i < lo + e; ++i) lanes[0] += double(grad[i]) * grad[i];
      sums[c] = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    });
    for (int64_t c = 0; c < chunks; ++c) sum += sums[c];
  });
  return float(sum);
}

void gradNorm(float squares, float clip, float lossScale, float *norm, float *factor) {
  double n = std::sqrt(double(squares)) / lossScale;
  *norm = float(n);
  double c = clip > 0 && n > clip ? clip / (n + 1e-6) : 1.0;
  *factor = std::isfinite(n) ? float(c / lossScale) : 0.0f;
}

namespace {
struct AdamWConstants {
  float b1, b2, ob1, ob2, invC1, invSqrtC2, eps, lr, scale, decay;
};

// One run of elements, updated in place (p holds the parameters going in and out). Constants by
// value and the arrays __restrict, so the loop vectorises; IEEE sqrt and divide are correctly
// rounded in every lane width and there is no FMA contraction (runtime/BUILD), so the AVX-512,
// AVX2 and baseline variants give the same bits as a scalar loop.
__attribute__((target_clones("avx512f", "avx2", "default")))
void adamwRun(float *__restrict p, const float *__restrict grad, float *__restrict m, float *__restrict v, int64_t n,
              const AdamWConstants c) {
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] * c.scale;
    float mi = c.b1 * m[i] + c.ob1 * g, vi = c.b2 * v[i] + c.ob2 * g * g;
    m[i] = mi, v[i] = vi;
    float update = (mi * c.invC1) / (std::sqrt(vi) * c.invSqrtC2 + c.eps) + c.decay * p[i];
    p[i] = p[i] - c.lr * update;
  }
}
}  // namespace

void adamwFlat(const float *param, const float *grad, float *m, float *v, float *out,
               const std::vector<planattr::FlatSegment> &segments, FlatRange range, const AdamWHyper &h) {
  // Elements outside every segment are copied unchanged (all of them when the step is skipped);
  // the update then runs in place on `out`.
  if (out != param) std::memcpy(out, param, size_t(range.count) * sizeof(float));
  if (h.gradScale == 0.0f) return;  // skipped: non-finite gradients
  // fp32 arithmetic as PyTorch's AdamW, the bias corrections folded into two constants (from
  // double powers).
  double c1 = 1 - std::pow(double(h.beta1), double(h.step)), c2 = 1 - std::pow(double(h.beta2), double(h.step));
  AdamWConstants c{h.beta1, h.beta2, float(1 - double(h.beta1)), float(1 - double(h.beta2)), float(1 / c1),
                   float(1 / std::sqrt(c2)), h.eps, h.lr, h.gradScale, 0.0f};
  // The whole range split over the threads, each part through the segments it overlaps
  // (elementwise: the same values for any split).
  parallelFor(range.count, 1 << 14, [&](int64_t b, int64_t e) {
    planattr::forEachSegmentIn(segments, range.begin + b, e - b,
                               [&](int64_t lo, int64_t hi, const planattr::FlatSegment &s) {
                                 AdamWConstants sc = c;
                                 sc.decay = s.decay ? h.weightDecay : 0.0f;
                                 adamwRun(out + b + lo, grad + b + lo, m + b + lo, v + b + lo, hi - lo, sc);
                               });
  });
}

}  // namespace loom::cpu
