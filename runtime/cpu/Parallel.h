// Work split over the threads a rank computes with (loom-rank --threads, which also sets
// OpenBLAS's count), run by a pool kept for the process: no thread is started inside the step.
//
// Two shapes of work, both giving results that do not depend on the thread count:
//  - parallelFor: items [0, n) whose results are independent of each other (rows of a
//    softmax, elements of GeLU), split into one contiguous part per thread.
//  - parallelChunks: a reduction over items in fixed chunks of `chunk` items (the chunk
//    boundaries never move with the thread count); the caller keeps one partial result per
//    chunk and combines them in chunk order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

namespace loom::cpu {

// The threads kernels use now (OpenBLAS's count, at least 1).
int kernelThreads();
// Whether the calling thread is running a part of a parallelFor (work inside it then runs on
// this thread alone: a GEMM there is single-threaded).
bool insideParallelPart();

// body(begin, end) over contiguous parts covering [0, n); parts hold at least `grain` items
// (small n runs on the calling thread alone).
void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &body);

// body(chunkIndex, begin, end) for each chunk [c * chunk, min(n, (c + 1) * chunk)); items of
// about `elementsPerItem` elements of work each (for the grain).
void parallelChunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t, int64_t)> &body,
                    int64_t elementsPerItem = 1);

// A part's least number of items when each is about `elementsPerItem` elements of work: a
// part below ~16 K elements costs more to hand to a thread than it saves (tiny models).
constexpr int64_t kMinPartElements = 16384;
inline int64_t grainFor(int64_t elementsPerItem) {
  return std::max<int64_t>(1, kMinPartElements / std::max<int64_t>(1, elementsPerItem));
}
inline int64_t chunkCount(int64_t n, int64_t chunk) { return (n + chunk - 1) / chunk; }

}  // namespace loom::cpu
