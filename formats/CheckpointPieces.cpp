#include "formats/CheckpointPieces.h"

#include <algorithm>

namespace loom {
namespace {

std::vector<int64_t> globalShapeOf(const plan::Parameter &p) {
  return p.global_shape_size() ? std::vector<int64_t>(p.global_shape().begin(), p.global_shape().end())
                               : std::vector<int64_t>(p.shape().begin(), p.shape().end());
}

int64_t elementsOf(const plan::Parameter &p) {
  int64_t n = 1;
  for (int64_t d : p.shape()) n *= d;
  return n;
}

TensorPiece blockOf(const plan::Parameter &p) {
  return shardPiece(globalShapeOf(p), p.shard_dim(), std::max(1, p.shard_parts()), p.shard_index());
}

int expertParallel(const plan::RankPlan &plan) {
  return std::max(1, int(plan.cluster().parallel().expert_parallel_size()));
}

bool tensorParallelShard(const plan::Parameter &p) { return p.shard_dim() >= 0 && p.shard_group() != "ep"; }

// The first of the ranks holding the same values of `p` (whole, or per ZeRO-1 part: `acrossDp`
// false).
bool firstReplica(const plan::RankPlan &plan, const plan::Parameter &p, bool acrossDp) {
  if (!tensorParallelShard(p) && plan.tp_rank() != 0) return false;
  if (!acrossDp) return true;
  if (plan.cp_rank() != 0) return false;
  return p.shard_group() == "ep" ? plan.dp_rank() < expertParallel(plan) : plan.dp_rank() == 0;
}

// The parts of the ZeRO-1 buckets this rank owns, cut at the parameters: per parameter the flat
// ranges of its block and where they sit in the rank's optimizer state: the moments, and the
// fp32 master weights where they are sharded too.
void zero1Pieces(const plan::RankPlan &plan, bool saving, std::vector<StatePiece> *out) {
  std::vector<const char *> storages = {"adam_m", "adam_v"};
  if (plan.master_weights_sharded()) storages.insert(storages.begin(), kMasterWeights);
  for (const Zero1Part &part : zero1Parts(plan)) {
    int64_t lo = part.flatBegin, hi = lo + part.elements;
    for (const plan::Parameter &p : plan.parameters()) {
      int64_t pBegin = p.flat_offset(), pEnd = pBegin + elementsOf(p);
      int64_t a = std::max(lo, pBegin), z = std::min(hi, pEnd);
      if (a >= z) continue;
      if (saving && (!p.tied_to().empty() || !firstReplica(plan, p, /*acrossDp=*/false))) continue;
      const std::string &source = p.tied_to().empty() ? p.name() : p.tied_to();
      for (const char *storage : storages) {
        StatePiece s;
        s.tensor = std::string(storage == std::string(kMasterWeights) ? "param" : storage) + "/" + source;
        s.globalShape = globalShapeOf(p);
        s.piece = blockOf(p);
        s.piece.flatBegin = a - pBegin, s.piece.flatEnd = z - pBegin;
        s.storage = storage, s.parameter = p.name();
        s.flatMoments = true, s.offset = part.stateBegin + (a - lo);
        out->push_back(std::move(s));
      }
    }
  }
}

std::vector<StatePiece> pieces(const plan::RankPlan &plan, bool saving) {
  std::vector<StatePiece> out;
  // Sharded master weights are pieces of the rank's ZeRO-1 parts, as the moments are (zero1Pieces).
  if (!plan.master_weights_sharded())
    for (const plan::Parameter &p : plan.parameters()) {
      if (saving && (!p.tied_to().empty() || !firstReplica(plan, p, /*acrossDp=*/true))) continue;
      const std::string &source = p.tied_to().empty() ? p.name() : p.tied_to();
      StatePiece s;
      s.tensor = "param/" + source;
      s.globalShape = globalShapeOf(p);
      s.piece = blockOf(p);
      s.storage = "param", s.parameter = p.name();
      out.push_back(s);
      if (plan.zero1() && plan.zero1_buckets_size() > 0) continue;  // the moments by ZeRO-1 parts
      for (const char *moment : {"adam_m", "adam_v"}) {
        s.tensor = std::string(moment) + "/" + source;
        s.storage = moment;
        out.push_back(s);
      }
    }
  if (plan.zero1() && plan.zero1_buckets_size() > 0) zero1Pieces(plan, saving, &out);
  return out;
}

}  // namespace

std::vector<StatePiece> piecesToSave(const plan::RankPlan &plan) { return pieces(plan, true); }
std::vector<StatePiece> piecesToLoad(const plan::RankPlan &plan) { return pieces(plan, false); }

}  // namespace loom
