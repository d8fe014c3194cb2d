// loom-tensor-parallel: Megatron tensor parallelism (see Passes.td and the Megatron-LM paper,
// section 3, figures 3 and 4).
//
// Which GEMMs are split is read off the graph: a linear feeding an attention core or a GeLU
// whose output feeds exactly one linear forms a (column, row) pair; the tied output layer
// feeding cross-entropy is vocab-parallel, like the input embedding. Anything else (layer
// norms, the BERT head's dense layer) stays replicated on every rank of the group.
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
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

class Sharder {
 public:
  Sharder(mlir::func::FuncOp f, int64_t t, bool sequenceParallel)
      : f_(f), t_(t), sp_(sequenceParallel), b_(f.getContext()) {}

  mlir::LogicalResult run() {
    collectPairs();
    // Decide every parameter's split before rewriting anything.
    for (auto [col, row] : pairs_) {
      if (failed(shardParam(col.getWeight(), 1, col)) || (col.getBias() && failed(shardParam(col.getBias(), 0, col))) ||
          failed(shardParam(row.getWeight(), 0, row)))
        return mlir::failure();
    }
    for (EmbeddingOp e : embeddings_)
      if (failed(shardParam(e.getWord(), 0, e))) return mlir::failure();
    for (LinearOp l : vocabLinears_)
      if (failed(shardParam(l.getWeight(), 0, l)) || (l.getBias() && failed(shardParam(l.getBias(), 0, l))))
        return mlir::failure();
    if (failed(checkDivisible())) return mlir::failure();

    for (auto [col, row] : pairs_) rewritePair(col, row);
    for (EmbeddingOp e : embeddings_) rewriteEmbedding(e);
    for (LinearOp l : vocabLinears_) rewriteVocabLinear(l);
    applyParamShards();
    if (sp_) shardSequence();
    return mlir::success();
  }

 private:
  void collectPairs() {
    f_.walk([&](mlir::Operation *op) {
      if (!mlir::isa<AttentionOp, GeluOp>(op)) return;
      auto col = op->getOperand(0).getDefiningOp<LinearOp>();
      mlir::Value out = op->getResult(0);
      if (!col || !col->hasOneUse() || !out.hasOneUse()) return;
      auto row = mlir::dyn_cast<LinearOp>(*out.getUsers().begin());
      if (!row || row.getInput() != out || row.getTransposeWeight() || col.getTransposeWeight()) return;
      pairs_.push_back({col, row});
    });
    f_.walk([&](EmbeddingOp e) { embeddings_.push_back(e); });
    f_.walk([&](LinearOp l) {
      if (l.getTransposeWeight() && l->hasOneUse() && mlir::isa<CrossEntropyOp>(*l->getUsers().begin()))
        vocabLinears_.push_back(l);
    });
  }

  mlir::LogicalResult shardParam(mlir::Value v, int64_t dim, mlir::Operation *user) {
    auto arg = mlir::dyn_cast<mlir::BlockArgument>(v);
    if (!arg || !f_.getArgAttr(arg.getArgNumber(), attr::kParam))
      return user->emitOpError() << "loom-tensor-parallel: a split weight must be a parameter argument";
    auto [it, inserted] = shardDims_.try_emplace(arg.getArgNumber(), dim);
    if (!inserted && it->second != dim)
      return user->emitOpError() << "loom-tensor-parallel: parameter '"
                                 << f_.getArgAttrOfType<mlir::StringAttr>(arg.getArgNumber(), attr::kParam).getValue()
                                 << "' would be split along two dimensions";
    return mlir::success();
  }

  mlir::LogicalResult checkDivisible() {
    // Heads first: the most telling message when t does not fit the model.
    for (auto [col, row] : pairs_)
      if (auto a = mlir::dyn_cast<AttentionOp>(*col->getUsers().begin()); a && a.getNumHeads() % t_ != 0)
        return a.emitOpError() << "loom-tensor-parallel: t = " << t_ << " does not divide num_heads = "
                               << a.getNumHeads();
    for (auto [argNo, dim] : shardDims_) {
      int64_t size = dimOf(f_.getArgument(argNo), dim);
      if (size % t_ != 0)
        return f_.emitError() << "loom-tensor-parallel: t = " << t_ << " does not divide dim " << dim << " ("
                              << size << ") of parameter '"
                              << f_.getArgAttrOfType<mlir::StringAttr>(argNo, attr::kParam).getValue() << "'";
    }
    return mlir::success();
  }

  // f: the replicated input enters the parallel region. With sequence parallelism the input
  // is a slice of the sequence and is all-gathered instead (its gradient: a reduce-scatter).
  void enterRegion(mlir::Operation *consumer) {
    b_.setInsertionPoint(consumer);
    mlir::Value x = consumer->getOperand(0);
    mlir::Operation *enter;
    if (sp_) {
      enter = b_.create<AllGatherOp>(consumer->getLoc(), x.getType(), sequenceShardPlaceholder(x),
                                     b_.getStringAttr(kGroup), b_.getI64IntegerAttr(t_), b_.getI64IntegerAttr(1));
    } else {
      enter = b_.create<IdentityOp>(consumer->getLoc(), x.getType(), x, b_.getStringAttr(kGroup),
                                    b_.getI64IntegerAttr(t_));
    }
    copyLayer(consumer, enter);
    consumer->setOperand(0, enter->getResult(0));
  }

  // Under sequence parallelism the all-gather's operand keeps its full type until
  // shardSequence() retypes the sequence-sharded values; recorded here.
  mlir::Value sequenceShardPlaceholder(mlir::Value x) {
    gathered_.push_back(x);
    return x;
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
      if (!sharded && mlir::isa<LayerNormOp, DropoutOp, AddOp, AddBiasOp, AddPositionOp, GeluOp, LinearOp>(op)) {
        // Elementwise and row-wise ops on a sharded operand produce a sharded result (linear:
        // the BERT head's replicated dense layer).
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
      if (auto d = mlir::dyn_cast<DropoutOp>(op)) d.setRankDistinct(true);
      if (auto p = mlir::dyn_cast<AddPositionOp>(op)) p.setSequenceParallelGroup(kGroup);
    });
    // The all-gathers' results keep the full sequence; their operands are now sharded.
    f_.walk([&](AllGatherOp g) {
      auto in = mlir::cast<mlir::RankedTensorType>(g.getInput().getType());
      auto out = mlir::cast<mlir::RankedTensorType>(g.getResult().getType());
      if (in.getShape()[1] == out.getShape()[1]) g.getResult().setType(withDim(out, 1, in.getShape()[1] * t_));
    });
    for (unsigned i = 0; i < f_.getNumArguments(); ++i)
      if (f_.getArgAttr(i, attr::kParam) && !f_.getArgAttr(i, attr::kShardDim))
        f_.setArgAttr(i, attr::kTpPartialGrad, b_.getUnitAttr());
    f_->getParentOfType<mlir::ModuleOp>()->setAttr("loom.sequence_parallel", b_.getUnitAttr());
  }

  void copyLayer(mlir::Operation *from, mlir::Operation *to) {
    if (auto l = from->getAttr(attr::kLayer)) to->setAttr(attr::kLayer, l);
  }

  // Column-parallel `col`, the op between (attention core or GeLU) on local heads / FFN
  // slice, then row-parallel `row` + all_reduce (g) + bias.
  void rewritePair(LinearOp col, LinearOp row) {
    enterRegion(col);
    col.getResult().setType(withDim(col.getType(), -1, dimOf(col.getResult(), -1) / t_));
    mlir::Operation *mid = *col->getUsers().begin();
    mid->getResult(0).setType(withDim(mid->getResult(0).getType(), -1, dimOf(mid->getResult(0), -1) / t_));
    if (auto a = mlir::dyn_cast<AttentionOp>(mid)) {
      a.setNumHeads(a.getNumHeads() / t_);
      // Attention dropout is inside the parallel region: distinct streams per rank.
      if (a.getDropout().convertToFloat() > 0) a.setRankDistinctDropout(true);
    }
    b_.setInsertionPointAfter(row);
    mlir::Value bias = row.getBias();
    if (bias) row->eraseOperand(2);
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

  // Vocab-parallel embedding: masked lookup in the local shard, all_reduce, then positions.
  void rewriteEmbedding(EmbeddingOp e) {
    b_.setInsertionPointAfter(e);
    mlir::Value position = e.getPosition();
    if (position) e->eraseOperand(2);
    e.setVocabParallelGroup(kGroup);
    mlir::Operation *reduced = leaveRegion(e.getLoc(), e.getResult());
    mlir::Value out = reduced->getResult(0);
    if (position) out = b_.create<AddPositionOp>(e.getLoc(), out.getType(), out, position, nullptr);
    e.getResult().replaceAllUsesExcept(out, reduced);
    if (sp_) retypeSequence(reduced->getResult(0));
  }

  // The tied output layer on the local vocab shard, fused with vocab-parallel cross-entropy.
  void rewriteVocabLinear(LinearOp l) {
    enterRegion(l);
    l.getResult().setType(withDim(l.getType(), -1, dimOf(l.getResult(), -1) / t_));
    mlir::cast<CrossEntropyOp>(*l->getUsers().begin()).setVocabParallelGroup(kGroup);
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
  llvm::SmallVector<mlir::Value> gathered_;
  llvm::SmallVector<std::pair<LinearOp, LinearOp>> pairs_;
  llvm::SmallVector<EmbeddingOp> embeddings_;
  llvm::SmallVector<LinearOp> vocabLinears_;
  std::map<unsigned, int64_t> shardDims_;
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
