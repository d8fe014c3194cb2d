// What a rank writes into a layout-independent checkpoint and what it reads back, as pieces of
// global tensors (formats/TensorPieces.h), from its plan alone:
// - "param/NAME": the parameter's tensor-parallel or expert-parallel shard (its block), written
//   by the first of the ranks holding the same values (dp rank 0 and cp rank 0, or the first ep
//   group for experts; tp rank 0 for what tp replicates) and never for a pipeline-tied copy;
// - "adam_m/NAME", "adam_v/NAME": AdamW's moments, the same blocks without ZeRO-1; with ZeRO-1 the
//   rank's part of every bucket, cut at the parameters it covers (a flat range of each block);
//   "param/NAME" likewise where a 16-bit plan's fp32 master weights are sharded too
//   (RankPlan.master_weights_sharded).
// A rank loads every parameter (a tied copy from its twin's tensor) and the moments it holds,
// from whatever pieces of another layout overlap them.
#pragma once

#include <string>
#include <vector>

#include "formats/TensorPieces.h"
#include "plan/Zero1Parts.h"
#include "protos/plan.pb.h"

namespace loom {

struct StatePiece {
  std::string tensor;                // "param/NAME", "adam_m/NAME" or "adam_v/NAME"
  std::vector<int64_t> globalShape;  // the plan's (its vocabulary padding included)
  TensorPiece piece;
  // Where the rank holds it: parameter `parameter`'s view (storage "param"), or the optimizer
  // state `storage` ("adam_m", "adam_v", kMasterWeights): the parameter's slice of it, or with
  // ZeRO-1 (flatMoments) the rank's flat parts from element `offset`.
  std::string storage, parameter;
  bool flatMoments = false;
  int64_t offset = 0;
};

std::vector<StatePiece> piecesToSave(const plan::RankPlan &plan);
std::vector<StatePiece> piecesToLoad(const plan::RankPlan &plan);

}  // namespace loom
