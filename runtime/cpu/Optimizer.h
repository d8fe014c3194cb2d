// The optimizer program's CPU kernels over the flat parameter/gradient buffer: the sum of
// squares for the global gradient norm, the norm and clipping factor, and AdamW with
// Megatron's clipping and decoupled weight decay (Loshchilov & Hutter, ICLR 2019).
#pragma once

#include <cstdint>
#include <vector>

#include "plan/PlanAttributes.h"

namespace loom::cpu {

// The part of the flat buffer a rank holds: [begin, begin + count) (its ZeRO-1 shard, or all).
// The kernels' pointers start at `begin`.
struct FlatRange {
  int64_t begin = 0, count = 0;
};

// Sum of squares of the gradient elements in `range` that the norm counts (segments with n;
// with r only when countReplicated), in double: each segment in fixed chunks, the chunks in
// flat order (the same sum for any thread count).
float sumSquares(const float *grad, const std::vector<planattr::FlatSegment> &segments, FlatRange range,
                 bool countReplicated);

// The gradients are `lossScale` times the true ones. norm = sqrt(squares) / lossScale;
// factor = c / lossScale with c = clip / (norm + 1e-6) when clip > 0 and norm > clip, else 1
// (Megatron's clip_grad_norm); a norm that is not finite gives factor 0: no update.
void gradNorm(float squares, float clip, float lossScale, float *norm, float *factor);

struct AdamWHyper {
  float gradScale = 1, lr = 0, step = 1, weightDecay = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

// One AdamW step over the segments in `range` (1-based step for the bias correction; decay
// only where the segment says d): grad * gradScale as the gradient (gradScale 0: the step is
// skipped, `out` = `param`, moments unchanged), moments m and v updated
// in place, the new parameters written to `out` (may be `param`; elements outside every
// segment are copied unchanged).
void adamwFlat(const float *param, const float *grad, float *m, float *v, float *out,
               const std::vector<planattr::FlatSegment> &segments, FlatRange range, const AdamWHyper &h);

}  // namespace loom::cpu
