// Pieces of global tensors, as the ranks of a parallel layout hold them: the unit of Loom's
// layout-independent checkpoints (Megatron's dist_checkpointing and DeepSpeed's universal
// checkpoints describe shards the same way: a global shape and where a rank's slice sits in it).
// A piece is a block of the global tensor (per dimension [begin, end): a tensor-parallel or
// expert-parallel shard, or the whole tensor) and, in the block's row-major order, the
// elements [flatBegin, flatEnd) of it (ZeRO-1's part of a bucket cuts a block anywhere).
// Resharding is copying the overlap of every saved piece with every piece a new layout needs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct TensorPiece {
  std::vector<int64_t> begin, end;  // the block, per dimension of the global tensor
  int64_t flatBegin = 0, flatEnd = 0;
  int64_t blockElements() const;
  int64_t elements() const { return flatEnd - flatBegin; }
};

// The block of a shard: dimension `shardDim` (-1: none) of `globalShape` cut into `parts`
// equal blocks, block `index`; all of its elements.
TensorPiece shardPiece(const std::vector<int64_t> &globalShape, int shardDim, int parts, int index);

// Copies the elements both pieces hold from src's data (its elements() values, in order) into
// dst's data; returns how many (null data: only counts them). Runs along the last dimension are
// copied whole.
int64_t copyOverlap(const TensorPiece &src, const float *srcData, const TensorPiece &dst, float *dstData);

// "b0:e0,b1:e1,...;flatBegin:flatEnd" and back (false: malformed, or not a piece of `globalShape`).
std::string encodePiece(const TensorPiece &piece);
bool decodePiece(const std::string &text, const std::vector<int64_t> &globalShape, TensorPiece *piece);

}  // namespace loom
