// loom-tensor-parallel: Megatron tensor parallelism (see Passes.td and the Megatron-LM paper,
// section 3, figures 3 and 4).
//
// Each op kind has one rule, and which rule applies is read off the dataflow:
//   embedding          vocab-parallel: word rows split, masked lookup, all_reduce (g), then
//                      the positions;
//   linear, input R    column-parallel when everything its output reaches through the
//                      region ops below ends in linears (row-parallel); f (identity, or the
//                      sequence-parallel all_gather) before it; weight columns and bias split;
//   region ops         gelu, dropout (rank-distinct streams), add_bias (bias split), add (both
//                      operands column-split) and attention (whole heads per rank) keep the
//                      last dimension split;
//   linear, input C    row-parallel: weight rows split, all_reduce (g) or the
//                      sequence-parallel reduce_scatter, then its bias;
//   linear -> logits   vocab-parallel: output features split, fused vocab-parallel
//                      cross_entropy;
//   the rest           layer_norm, add, dropout, gelu, tanh, add_bias, add_position,
//                      add_token_type, cross_entropy and moe (its router a loom.replicated linear) on
//                      replicated values stay replicated (with sequence parallelism: on the
//                      rank's slice of the sequence, an MoE's load-balancing statistics summed
//                      over tp).
// A linear or attention op marked `loom.replicated` stays whole on every rank. A linear that
// fits no rule (its output reaches a layer norm, say), an attention core whose qkv is not
// column-split, and any other op kind are errors naming the op: nothing silently stays
// replicated.
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/MapVector.h"
#include "passes/ModelFacts.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMTENSORPARALLEL
#include "passes/Passes.h.inc"

namespace {

constexpr llvm::StringLiteral kGroup = "tp";

mlir::RankedTensorType withDim(mlir::Type t, int64_t dim, int64_t size) {
  auto r = mlir::cast<mlir::RankedTensorType>(t);
  auto shape = llvm::to_vector(r.getShape());
  shape[dim < 0 ? shape.size() + dim : dim] = size;
  return mlir::RankedTensorType::get(shape, r.getElementType());
}

int64_t dimOf(mlir::Value v, int64_t dim) {
  auto s = mlir::cast<mlir::RankedTensorType>(v.getType()).getShape();
  return s[dim < 0 ? s.size() + dim : dim];
}

// A column-parallel region: the column-parallel linears, the values whose last dimension is
// split inside it, the ops between, and the row-parallel linears that close it.
struct Region {
  llvm::SmallVector<LinearOp> columns;
  llvm::DenseSet<mlir::Value> values;
  llvm::SmallVector<mlir::Operation *> mids;
  llvm::SmallVector<LinearOp> rows;
};

bool isParamArg(mlir::func::FuncOp f, mlir::Value v) {
  auto arg = mlir::dyn_cast<mlir::BlockArgument>(v);
  return arg && arg.getOwner()->getParentOp() == f.getOperation() && f.getArgAttr(arg.getArgNumber(), attr::kParam);
}

class Sharder {
 public:
  Sharder(mlir::func::FuncOp f, int64_t t, bool sequenceParallel)
      : f_(f), t_(t), sp_(sequenceParallel), b_(f.getContext()) {}

  mlir::LogicalResult run() {
    if (failed(placeOps()) || failed(checkParamUses()) || failed(checkDivisible())) return mlir::failure();
    for (Region &r : regions_) rewriteRegion(r);
    for (EmbeddingOp e : embeddings_) rewriteEmbedding(e);
    for (LinearOp l : vocabLinears_) rewriteVocabLinear(l);
    enterRegions();
    applyParamShards();
    if (sp_) {
      shardSequence();
      balanceOverSequence();
    }
    return mlir::success();
  }

 private:
  // Walks the ops in order and gives each its rule; parameters' splits are decided here,
  // before anything is rewritten.
  mlir::LogicalResult placeOps() {
    if (failed(placeReplicatedKv())) return mlir::failure();
    mlir::WalkResult walk = f_.walk([&](mlir::Operation *op) -> mlir::WalkResult {
      if (mlir::isa<mlir::func::FuncOp, mlir::func::ReturnOp>(op)) return mlir::WalkResult::advance();
      bool replicated = op->hasAttr(attr::kReplicated);
      if (auto l = mlir::dyn_cast<LinearOp>(op)) {
        if (replicated || placed_.contains(op)) return mlir::WalkResult::advance();
        auto loss = l->hasOneUse() ? mlir::dyn_cast<CrossEntropyOp>(*l->getUsers().begin()) : CrossEntropyOp();
        if (loss && outputLayerOf(loss) == l) {
          if (failed(shardParam(l, 1, l.getTransposeWeight() ? 0 : 1)) || (l.getBias() && failed(shardParam(l, 2, 0))))
            return mlir::WalkResult::interrupt();
          vocabLinears_.push_back(l);
          placed_.insert(op);
          return mlir::WalkResult::advance();
        }
        return failed(growRegion(l)) ? mlir::WalkResult::interrupt() : mlir::WalkResult::advance();
      }
      if (mlir::isa<AttentionOp, GroupedAttentionOp>(op)) {
        if (replicated && sp_)  // it would see only this rank's slice of the sequence
          return op->emitOpError() << "loom-tensor-parallel: a loom.replicated attention core cannot run under "
                                    "sequence parallelism (it needs every position); split it by heads instead";
        if (replicated || placed_.contains(op)) return mlir::WalkResult::advance();
        return op->emitOpError() << "loom-tensor-parallel: cannot split this attention core: its queries do not come "
                                    "from a column-parallel linear (t = "
                                 << t_ << "); mark it loom.replicated to compute all heads on every rank";
      }
      if (auto e = mlir::dyn_cast<EmbeddingOp>(op)) {
        if (replicated) return mlir::WalkResult::advance();
        if (failed(shardParam(e, 1, 0))) return mlir::WalkResult::interrupt();
        embeddings_.push_back(e);
        return mlir::WalkResult::advance();
      }
      if (auto moe = mlir::dyn_cast<MoeOp>(op)) {
        // The experts stay whole on every rank of the group (expert tensor parallelism is not
        // done), over the replicated tokens, or with sequence parallelism over the rank's slice
        // of them (balanceOverSequence). An expert's capacity counts the whole sequence's
        // assignments, which no rank then sees.
        if (sp_ && moe.getCapacityFactor().convertToFloat() > 0)
          return op->emitOpError() << "loom-tensor-parallel: a mixture-of-experts layer with capacity_factor > 0 "
                                      "does not run under sequence parallelism (each rank routes only its slice of "
                                      "the sequence; the capacity is the whole sequence's); use capacity_factor 0 "
                                      "(dropless) or sequence_parallel false";
        return mlir::WalkResult::advance();
      }
      if (mlir::isa<LayerNormOp, RmsNormOp, AddOp, DropoutOp, GeluOp, AddBiasOp, AddPositionOp, CrossEntropyOp,
                    RotaryOp, SwigluOp, TanhOp, AddTokenTypeOp>(op))
        return mlir::WalkResult::advance();  // replicated, or a region op placed by its region
      return op->emitOpError() << "loom-tensor-parallel: no tensor-parallel rule for this op (the input IR holds the "
                                  "model's forward ops over global shapes)";
    });
    return mlir::failure(walk.wasInterrupted());
  }

  // The linear a value comes from through ops that keep a column split (rotary, gelu,
  // dropout, add_bias), or null.
  LinearOp columnSourceOf(mlir::Value v) {
    mlir::Operation *def = v.getDefiningOp();
    while (def && mlir::isa<RotaryOp, GeluOp, DropoutOp, AddBiasOp>(def)) def = def->getOperand(0).getDefiningOp();
    return mlir::dyn_cast_or_null<LinearOp>(def);
  }

  // Grouped-query attention with fewer KV heads than ranks (t a multiple of num_kv_heads):
  // every rank computes all KV heads (Megatron's replicated KV heads), its slice of the query
  // heads reads the ones it needs. The K and V projections are entered through f like a
  // column-parallel GEMM (each rank's dK, dV cover only its query heads, so their input
  // gradients are partial sums) but keep their whole weights, whose gradients are partial
  // sums too (summed over tp by loom-data-parallel).
  mlir::LogicalResult placeReplicatedKv() {
    mlir::WalkResult walk = f_.walk([&](GroupedAttentionOp a) -> mlir::WalkResult {
      int64_t kv = a.getNumKvHeads();
      if (a->hasAttr(attr::kReplicated) || kv % t_ == 0) return mlir::WalkResult::advance();
      if (t_ % kv != 0)
        return a.emitOpError() << "loom-tensor-parallel: t = " << t_ << " neither divides num_kv_heads = " << kv
                               << " nor is a multiple of it (KV heads are split over t or replicated)";
      for (mlir::Value operand : {a.getK(), a.getV()}) {
        LinearOp proj = columnSourceOf(operand);
        if (!proj || proj->hasAttr(attr::kReplicated) || !isParamArg(f_, proj.getWeight()))
          return a.emitOpError() << "loom-tensor-parallel: with t = " << t_ << " > num_kv_heads = " << kv
                                 << " the keys and values must come from linears over parameters (replicated KV heads)";
        if (!placed_.insert(proj.getOperation()).second) continue;  // k and v from one projection
        entering_.push_back(proj);
        for (mlir::Value w : {proj.getWeight(), proj.getBias()})
          if (w && isParamArg(f_, w))
            f_.setArgAttr(mlir::cast<mlir::BlockArgument>(w).getArgNumber(), attr::kTpPartialGrad, b_.getI64IntegerAttr(t_));
      }
      a.setKvReplicatedGroup(kGroup);
      a.setGroupSize(t_);
      return mlir::WalkResult::advance();
    });
    return mlir::failure(walk.wasInterrupted());
  }

  // A linear whose input is replicated may start a column-parallel region.
  bool isColumnCandidate(LinearOp l) {
    return !l->hasAttr(attr::kReplicated) && !placed_.contains(l.getOperation()) && !inRegion_.contains(l.getInput());
  }

  mlir::LogicalResult blocked(LinearOp seed, mlir::Operation *at, llvm::StringRef why) {
    return seed.emitOpError() << "loom-tensor-parallel: cannot split this linear: its output reaches '"
                              << at->getName() << "' at " << at->getLoc() << ", which " << why
                              << "; a column-parallel linear must lead, through gelu, dropout, add, add_bias or "
                                 "attention, to row-parallel linears. Mark it loom.replicated to keep it whole";
  }

  // Grows the column-parallel region that `seed` starts: everything its output reaches
  // through region ops, up to the row-parallel linears. A residual-free elementwise add of
  // two split values pulls the linear producing the other operand in as a second column
  // (SwiGLU-style gate and up projections).
  mlir::LogicalResult growRegion(LinearOp seed) {
    Region r;
    llvm::SmallVector<mlir::Value> work;
    auto addColumn = [&](LinearOp c) {
      r.columns.push_back(c);
      placed_.insert(c.getOperation());
      r.values.insert(c.getResult());
      work.push_back(c.getResult());
    };
    addColumn(seed);
    llvm::SmallVector<mlir::Operation *> joins;
    llvm::DenseSet<mlir::Operation *> seen;
    while (true) {
      while (!work.empty()) {
        mlir::Value v = work.pop_back_val();
        for (mlir::OpOperand &use : v.getUses()) {
          mlir::Operation *u = use.getOwner();
          unsigned k = use.getOperandNumber();
          if (u->hasAttr(attr::kReplicated)) return blocked(seed, u, "is marked loom.replicated");
          if (auto row = mlir::dyn_cast<LinearOp>(u)) {
            if (k != 0) return blocked(seed, u, "takes it as a weight or bias");
            if (seen.insert(u).second) r.rows.push_back(row);
            continue;
          }
          auto grouped = mlir::dyn_cast<GroupedAttentionOp>(u);
          bool kvReplicated = grouped && grouped.getKvReplicatedGroup();
          bool regionOp = mlir::isa<GeluOp, DropoutOp, AddOp, SwigluOp, RotaryOp>(u) ||
                          (k == 0 && mlir::isa<AttentionOp, AddBiasOp>(u)) || (grouped && (k == 0 || !kvReplicated));
          if (!regionOp) return blocked(seed, u, "needs the whole feature dimension");
          // Ops whose every operand must be split: a sum, the SwiGLU gate and its up
          // projection, a grouped attention's q, k and v (KV heads split over t).
          if (mlir::isa<AddOp, SwigluOp>(u) || (grouped && !kvReplicated)) {
            if (!seen.contains(u)) {
              // Region values are all defined after the region's first linear, the seed: an
              // operand from before it (a residual stream) can never be split.
              for (mlir::Value operand : u->getOperands()) {
                mlir::Operation *def = operand.getDefiningOp();
                if (!r.values.contains(operand) && (!def || def->isBeforeInBlock(seed)))
                  return blocked(seed, u, "combines it with a value that is not column-split (a residual connection?)");
              }
              joins.push_back(u);
            }
          }
          if (seen.insert(u).second) {
            r.mids.push_back(u);
            r.values.insert(u->getResult(0));
            work.push_back(u->getResult(0));
          }
        }
      }
      // Every operand of a join inside the region must be split: the linear behind one that
      // is not yet joins the region as another column-parallel GEMM.
      bool grew = false;
      for (mlir::Operation *join : joins)
        for (mlir::Value operand : join->getOperands()) {
          if (r.values.contains(operand)) continue;
          LinearOp other = columnSourceOf(operand);
          if (!other || !isColumnCandidate(other))
            return blocked(seed, join, "combines it with a value that is not column-split (a residual connection?)");
          addColumn(other);
          grew = true;
        }
      if (!grew) break;
    }
    if (r.rows.empty()) return blocked(seed, seed, "reaches no row-parallel linear");
    for (LinearOp c : r.columns)
      if (failed(shardParam(c, 1, c.getTransposeWeight() ? 0 : 1)) || (c.getBias() && failed(shardParam(c, 2, 0))))
        return mlir::failure();
    for (mlir::Operation *m : r.mids)
      if (mlir::isa<AddBiasOp>(m) && failed(shardParam(m, 1, 0))) return mlir::failure();
    for (LinearOp row : r.rows) {
      if (failed(shardParam(row, 1, row.getTransposeWeight() ? 1 : 0))) return mlir::failure();
      placed_.insert(row.getOperation());
    }
    for (mlir::Operation *m : r.mids) placed_.insert(m);
    for (mlir::Value v : r.values) inRegion_.insert(v);
    regions_.push_back(std::move(r));
    return mlir::success();
  }

  // Operand `operand` of `user` is a parameter split along `dim`.
  mlir::LogicalResult shardParam(mlir::Operation *user, unsigned operand, int64_t dim) {
    mlir::Value v = user->getOperand(operand);
    if (!isParamArg(f_, v))
      return user->emitOpError() << "loom-tensor-parallel: operand " << operand
                                 << " is split, so it must be a parameter argument of @train_step";
    unsigned argNo = mlir::cast<mlir::BlockArgument>(v).getArgNumber();
    auto [it, inserted] = shardDims_.try_emplace(argNo, dim);
    if (!inserted && it->second != dim)
      return user->emitOpError() << "loom-tensor-parallel: parameter '" << paramName(argNo)
                                 << "' would be split along two dimensions (" << it->second << " and " << dim << ")";
    splitUses_.insert({user, operand});
    return mlir::success();
  }

  llvm::StringRef paramName(unsigned argNo) {
    return f_.getArgAttrOfType<mlir::StringAttr>(argNo, attr::kParam).getValue();
  }

  // A split parameter is split for every op that uses it.
  mlir::LogicalResult checkParamUses() {
    for (auto [argNo, dim] : shardDims_)
      for (mlir::OpOperand &use : f_.getArgument(argNo).getUses())
        if (!splitUses_.contains({use.getOwner(), use.getOperandNumber()}))
          return use.getOwner()->emitOpError()
                 << "loom-tensor-parallel: uses parameter '" << paramName(argNo)
                 << "' whole, but another op's rule splits it along dim " << dim;
    return mlir::success();
  }

  mlir::LogicalResult checkDivisible() {
    // Heads first: the most telling message when t does not fit the model.
    for (Region &r : regions_)
      for (mlir::Operation *m : r.mids)
      {
        if (auto a = mlir::dyn_cast<AttentionOp>(m); a && a.getNumHeads() % t_ != 0)
          return a.emitOpError() << "loom-tensor-parallel: t = " << t_ << " does not divide num_heads = "
                                 << a.getNumHeads();
        if (auto a = mlir::dyn_cast<GroupedAttentionOp>(m); a && a.getNumHeads() % t_ != 0)
          return a.emitOpError() << "loom-tensor-parallel: t = " << t_ << " does not divide num_heads = "
                                 << a.getNumHeads();
        if (auto r = mlir::dyn_cast<RotaryOp>(m); r && (dimOf(r.getInput(), -1) / r.getHeadDim()) % t_ != 0)
          return r.emitOpError() << "loom-tensor-parallel: t = " << t_ << " does not divide the "
                                 << dimOf(r.getInput(), -1) / r.getHeadDim() << " heads this rotary embedding rotates";
      }
    for (auto [argNo, dim] : shardDims_) {
      int64_t size = dimOf(f_.getArgument(argNo), dim);
      if (size % t_ != 0)
        return f_.emitError() << "loom-tensor-parallel: t = " << t_ << " does not divide dim " << dim << " ("
                              << size << ") of parameter '" << paramName(argNo) << "'";
    }
    return mlir::success();
  }

  // f: the replicated input enters the parallel region. With sequence parallelism the input
  // is a slice of the sequence and is all-gathered instead (its gradient: a reduce-scatter).
  // Consumers of the same value share one f, placed before the first of them, so its
  // gradient is one all-reduce of their summed gradients.
  void enterRegions() {
    llvm::MapVector<mlir::Value, llvm::SmallVector<mlir::Operation *>> byValue;
    for (mlir::Operation *c : entering_) byValue[c->getOperand(0)].push_back(c);
    for (auto &[x, consumers] : byValue) {
      mlir::Operation *first = consumers.front();
      for (mlir::Operation *c : consumers)
        if (c->isBeforeInBlock(first)) first = c;
      b_.setInsertionPoint(first);
      mlir::Operation *enter;
      if (sp_)
        enter = b_.create<AllGatherOp>(first->getLoc(), x.getType(), x, b_.getStringAttr(kGroup),
                                       b_.getI64IntegerAttr(t_), b_.getI64IntegerAttr(1), /*split_gradient=*/nullptr);
      else
        enter = b_.create<IdentityOp>(first->getLoc(), x.getType(), x, b_.getStringAttr(kGroup),
                                      b_.getI64IntegerAttr(t_));
      copyLayer(first, enter);
      for (mlir::Operation *c : consumers) c->setOperand(0, enter->getResult(0));
    }
  }

  // g: the row-parallel GEMM's partial sums are all-reduced, or with sequence parallelism
  // reduce-scattered along the sequence.
  mlir::Operation *leaveRegion(mlir::Location loc, mlir::Value partial) {
    if (sp_)
      return b_.create<ReduceScatterOp>(loc, partial.getType(), partial, b_.getStringAttr(kGroup),
                                        b_.getI64IntegerAttr(t_), b_.getI64IntegerAttr(1));
    return b_.create<AllReduceOp>(loc, partial.getType(), partial, b_.getStringAttr(kGroup), b_.getI64IntegerAttr(t_),
                                  b_.getStringAttr("sum"));
  }

  // Sequence parallelism (Korthikanti et al. 2022, section 4.2.2): between the all-gathers
  // and reduce-scatters every activation holds s / t positions. Retypes the results of the
  // ops in that region (layer norms, dropouts, residual adds, biases, positions), makes their
  // dropouts rank-distinct, and marks the replicated parameters, whose gradients are then
  // partial sums over the ranks' positions.
  void shardSequence() {
    f_.walk([&](mlir::Operation *op) {
      bool sharded = mlir::isa<ReduceScatterOp>(op);
      if (!sharded &&
          mlir::isa<LayerNormOp, RmsNormOp, DropoutOp, AddOp, AddBiasOp, AddPositionOp, GeluOp, LinearOp, MoeOp, TanhOp,
                    AddTokenTypeOp>(op)) {
        // Elementwise and row-wise ops on a sharded operand produce a sharded result (linear:
        // the BERT head's replicated dense layer, an MoE's router; moe: token by token).
        mlir::Value in = op->getOperand(0);
        if (auto t = mlir::dyn_cast<mlir::RankedTensorType>(in.getType());
            t && t.getRank() == 3 && mlir::isa<mlir::RankedTensorType>(op->getResult(0).getType())) {
          auto out = mlir::cast<mlir::RankedTensorType>(op->getResult(0).getType());
          if (out.getRank() == 3 && out.getShape()[1] != t.getShape()[1]) {
            op->getResult(0).setType(withDim(out, 1, t.getShape()[1]));
            sharded = true;
          }
        }
      }
      if (!sharded) return;
      if (auto d = mlir::dyn_cast<DropoutOp>(op)) d.setRankDistinct(kGroup);
      if (auto p = mlir::dyn_cast<AddPositionOp>(op)) p.setSequenceParallelGroup(kGroup);
      if (auto p = mlir::dyn_cast<AddTokenTypeOp>(op)) p.setSequenceParallelGroup(kGroup);
    });
    // The all-gathers' results keep the full sequence; their operands are now sharded.
    f_.walk([&](AllGatherOp g) {
      auto in = mlir::cast<mlir::RankedTensorType>(g.getInput().getType());
      auto out = mlir::cast<mlir::RankedTensorType>(g.getResult().getType());
      if (in.getShape()[1] == out.getShape()[1]) g.getResult().setType(withDim(out, 1, in.getShape()[1] * t_));
    });
    // A loss over replicated logits (BERT's sentence-order head: its pooler and classifier are
    // replicated linears) sees the whole sequence: its logits are all-gathered, and as every
    // rank then computes the same loss, each keeps its own slice of their gradient
    // (split_gradient; Megatron-Core's pooler gathers with tensor_parallel_output_grad false).
    f_.walk([&](CrossEntropyOp loss) {
      auto logits = mlir::cast<mlir::RankedTensorType>(loss.getLogits().getType());
      int64_t seq = dimOf(loss.getLabels(), 1);
      if (loss.getVocabParallelGroup() || logits.getShape()[1] == seq) return;
      b_.setInsertionPoint(loss);
      auto gathered = b_.create<AllGatherOp>(loss.getLoc(), withDim(logits, 1, seq), loss.getLogits(),
                                             b_.getStringAttr(kGroup), b_.getI64IntegerAttr(t_), b_.getI64IntegerAttr(1),
                                             b_.getUnitAttr());
      loss.getLogitsMutable().assign(gathered);
    });
    for (unsigned i = 0; i < f_.getNumArguments(); ++i)
      if (f_.getArgAttr(i, attr::kParam) && !f_.getArgAttr(i, attr::kShardDim))
        f_.setArgAttr(i, attr::kTpPartialGrad, b_.getI64IntegerAttr(t_));
    f_->getParentOfType<mlir::ModuleOp>()->setAttr("loom.sequence_parallel", b_.getUnitAttr());
  }

  // Sequence parallelism hands each MoE layer the rank's s / t tokens, which it routes through
  // its whole experts; the load-balancing loss is the whole sequence's (Megatron-Core reduces
  // its statistics over the sequence_partition_group): the rank's routing statistics summed
  // over tp, the op's routing_stats.
  void balanceOverSequence() {
    f_.walk([&](MoeOp moe) {
      b_.setInsertionPoint(moe);
      auto logits = mlir::cast<mlir::RankedTensorType>(moe.getLogits().getType());
      auto type = mlir::RankedTensorType::get({2, logits.getShape()[2]}, b_.getF32Type());
      auto local = b_.create<MoeRoutingStatsOp>(moe.getLoc(), type, moe.getLogits(), moe.getTopKAttr());
      auto summed = b_.create<AllReduceOp>(moe.getLoc(), type, local, b_.getStringAttr(kGroup), b_.getI64IntegerAttr(t_),
                                           b_.getStringAttr("sum"));
      copyLayer(moe, local), copyLayer(moe, summed);
      moe.getRoutingStatsMutable().assign(summed);
    });
  }

  void copyLayer(mlir::Operation *from, mlir::Operation *to) {
    if (auto l = from->getAttr(attr::kLayer)) to->setAttr(attr::kLayer, l);
  }

  // The region on local heads / FFN columns: each column-parallel linear behind f, the
  // ops between on the local slice, each row-parallel linear followed by g and its bias.
  void rewriteRegion(Region &r) {
    for (LinearOp col : r.columns) {
      entering_.push_back(col);
      col.getResult().setType(withDim(col.getType(), -1, dimOf(col.getResult(), -1) / t_));
    }
    for (mlir::Operation *mid : r.mids) {
      mid->getResult(0).setType(withDim(mid->getResult(0).getType(), -1, dimOf(mid->getResult(0), -1) / t_));
      // Softmax statistics (when the IR already has them) follow the local heads. Dropout
      // inside the parallel region: distinct streams per rank (Megatron-LM paper, section 3:
      // the model-parallel random state).
      auto splitStatistics = [&](mlir::Value lse) {
        if (lse) lse.setType(withDim(lse.getType(), 1, dimOf(lse, 1) / t_));
      };
      if (auto a = mlir::dyn_cast<AttentionOp>(mid)) {
        a.setNumHeads(a.getNumHeads() / t_);
        splitStatistics(a.getLse());
        if (a.getDropout().convertToFloat() > 0) a.setRankDistinctDropout(kGroup);
      }
      if (auto a = mlir::dyn_cast<GroupedAttentionOp>(mid)) {
        a.setNumHeads(a.getNumHeads() / t_);
        splitStatistics(a.getLse());
        if (!a.getKvReplicatedGroup()) a.setNumKvHeads(a.getNumKvHeads() / t_);
        if (a.getDropout().convertToFloat() > 0) a.setRankDistinctDropout(kGroup);
      }
      if (auto d = mlir::dyn_cast<DropoutOp>(mid)) d.setRankDistinct(kGroup);
    }
    for (LinearOp row : r.rows) {
      b_.setInsertionPointAfter(row);
      mlir::Value bias = row.getBias();
      if (bias) row->eraseOperand(2);
#ifdef LOOM_MUTANT_DROP_ROW_ALL_REDUCE
      // The oracle's mutant check (passes:passes_mutant): g dropped, partial sums flow on.
      if (!sp_) {
        if (bias) {
          auto added = b_.create<AddBiasOp>(row.getLoc(), row.getType(), row.getResult(), bias);
          copyLayer(row, added);
          row.getResult().replaceAllUsesExcept(added, added);
        }
        continue;
      }
#endif
      mlir::Operation *reduced = leaveRegion(row.getLoc(), row.getResult());
      copyLayer(row, reduced);
      mlir::Value out = reduced->getResult(0);
      if (bias) {
        auto added = b_.create<AddBiasOp>(row.getLoc(), out.getType(), out, bias);
        copyLayer(row, added);
        out = added;
      }
      row.getResult().replaceAllUsesExcept(out, reduced);
      if (sp_) retypeSequence(reduced->getResult(0));
    }
  }

  // Vocab-parallel embedding: masked lookup in the local shard, all_reduce, then positions.
  void rewriteEmbedding(EmbeddingOp e) {
    b_.setInsertionPointAfter(e);
    mlir::Value position = e.getPosition();
    if (position) e->eraseOperand(2);
    e.setVocabParallelGroup(kGroup);
    mlir::Operation *reduced = leaveRegion(e.getLoc(), e.getResult());
    mlir::Value out = reduced->getResult(0);
    if (position) out = b_.create<AddPositionOp>(e.getLoc(), out.getType(), out, position, nullptr, nullptr);
    e.getResult().replaceAllUsesExcept(out, reduced);
    if (sp_) retypeSequence(reduced->getResult(0));
  }

  // The tied output layer on the local vocab shard, fused with vocab-parallel cross-entropy.
  void rewriteVocabLinear(LinearOp l) {
    entering_.push_back(l);
    l.getResult().setType(withDim(l.getType(), -1, dimOf(l.getResult(), -1) / t_));
    auto loss = mlir::cast<CrossEntropyOp>(*l->getUsers().begin());
    loss.setVocabParallelGroup(kGroup);
    loss.setVocabParallelSize(uint64_t(t_));
  }

  // A reduce-scatter along the sequence: its result holds s / t positions.
  void retypeSequence(mlir::Value scattered) {
    auto t = mlir::cast<mlir::RankedTensorType>(scattered.getType());
    scattered.setType(withDim(t, 1, t.getShape()[1] / t_));
  }

  void applyParamShards() {
    for (auto [argNo, dim] : shardDims_) {
      mlir::BlockArgument arg = f_.getArgument(argNo);
      arg.setType(withDim(arg.getType(), dim, dimOf(arg, dim) / t_));
      f_.setArgAttr(argNo, attr::kShardDim, b_.getI64IntegerAttr(dim));
      f_.setArgAttr(argNo, attr::kShardParts, b_.getI64IntegerAttr(t_));
    }
    auto ret = f_.getBody().front().getTerminator();
    f_.setType(b_.getFunctionType(f_.getBody().front().getArgumentTypes(), ret->getOperandTypes()));
  }

  mlir::func::FuncOp f_;
  int64_t t_;
  bool sp_;
  mlir::OpBuilder b_;
  llvm::SmallVector<Region> regions_;
  llvm::SmallVector<EmbeddingOp> embeddings_;
  llvm::SmallVector<LinearOp> vocabLinears_;
  std::map<unsigned, int64_t> shardDims_;
  llvm::DenseSet<std::pair<mlir::Operation *, unsigned>> splitUses_;  // (op, operand) taking a split parameter
  llvm::DenseSet<mlir::Operation *> placed_;  // ops a split rule has claimed
  llvm::DenseSet<mlir::Value> inRegion_;      // values split along their last dimension
  llvm::SmallVector<mlir::Operation *> entering_;  // consumers of f (operand 0)
};

struct TensorParallelPass : impl::LoomTensorParallelBase<TensorParallelPass> {
  using LoomTensorParallelBase::LoomTensorParallelBase;
  void runOnOperation() override {
    mlir::ModuleOp m = getOperation();
    if (tensorParallel < 1) {
      m.emitError() << "loom-tensor-parallel: tp must be >= 1, got " << int64_t(tensorParallel);
      return signalPassFailure();
    }
    auto f = m.lookupSymbol<mlir::func::FuncOp>("train_step");
    if (!f) {
      m.emitError() << "loom-tensor-parallel: no func.func @train_step";
      return signalPassFailure();
    }
    m->setAttr(attr::kTensorParallel, mlir::IntegerAttr::get(mlir::IntegerType::get(m.getContext(), 64), tensorParallel));
    if (tensorParallel == 1) return;
    if (sequenceParallel) {  // the sequence dimension of the token ids is what gets split
      for (unsigned i = 0; i < f.getNumArguments(); ++i) {
        auto role = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kInput);
        if (!role || role.getValue() != "tokens") continue;
        int64_t seq = mlir::cast<mlir::RankedTensorType>(f.getArgument(i).getType()).getShape()[1];
        if (seq % tensorParallel != 0) {
          m.emitError() << "loom-tensor-parallel: t = " << int64_t(tensorParallel) << " does not divide seq_length = "
                        << seq << " (sequence parallelism)";
          return signalPassFailure();
        }
      }
    }
    if (failed(Sharder(f, tensorParallel, sequenceParallel).run())) signalPassFailure();
  }
};

}  // namespace
}  // namespace loom
