// Tensor-parallel shards: block `index` of `parts` equal blocks along dimension `dim`.
// One layout serves loading (a rank takes its block of a whole tensor) and exporting (the
// blocks go back into the whole tensor).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/Tensor.h"

namespace loom {

struct ShardGeometry {
  int64_t outer = 1;  // product of the dimensions before `dim`
  int64_t block = 1;  // the shard's extent along `dim` times the dimensions after it
};

inline ShardGeometry shardGeometry(const std::vector<int64_t> &shardShape, int dim) {
  ShardGeometry g;
  for (int k = 0; k < int(shardShape.size()); ++k)
    if (k < dim) g.outer *= shardShape[k];
    else g.block *= shardShape[k];
  return g;
}

// shard <- block `index` of `full`
inline void copyShardOut(const std::vector<float> &full, std::vector<float> &shard, const ShardGeometry &g,
                         int64_t parts, int64_t index) {
  for (int64_t a = 0; a < g.outer; ++a)
    std::copy_n(&full[(a * parts + index) * g.block], g.block, &shard[a * g.block]);
}

// The first `size` entries of `t` along `dim` (a tensor without its vocabulary padding).
inline HostTensor leadingSlice(const HostTensor &t, int dim, int64_t size) {
  int64_t outer = 1, inner = 1;
  for (int k = 0; k < dim; ++k) outer *= t.shape[k];
  for (int k = dim + 1; k < int(t.shape.size()); ++k) inner *= t.shape[k];
  HostTensor out{t.shape};
  out.shape[dim] = size;
  out.data.resize(size_t(out.numel()));
  for (int64_t a = 0; a < outer; ++a)
    std::copy_n(&t.data[a * t.shape[dim] * inner], size * inner, &out.data[a * size * inner]);
  return out;
}

// full <- shard as block `index`
inline void copyShardIn(const std::vector<float> &shard, std::vector<float> &full, const ShardGeometry &g,
                        int64_t parts, int64_t index) {
  for (int64_t a = 0; a < g.outer; ++a)
    std::copy_n(&shard[a * g.block], g.block, &full[(a * parts + index) * g.block]);
}

}  // namespace loom
