// loom-data-parallel: average gradients over "dp" in buckets (see Passes.td).
#include <algorithm>

#include "llvm/ADT/StringSet.h"

#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMDATAPARALLEL
#include "passes/Passes.h.inc"

namespace {

void copyPlacement(mlir::Operation *from, mlir::Operation *to) {
  if (!from) return;
  for (llvm::StringRef a : {attr::kLayer.data(), attr::kStage.data()})
    if (auto v = from->getAttr(a)) to->setAttr(a, v);
}

// Inserts `op(g)` right after g's producer and makes it the function's result `i`.
template <typename Build>
void wrapResult(mlir::func::ReturnOp ret, unsigned i, Build build) {
  mlir::Value g = ret.getOperand(i);
  mlir::OpBuilder b(ret->getContext());
  if (mlir::Operation *def = g.getDefiningOp())
    b.setInsertionPointAfter(def);
  else
    b.setInsertionPointToStart(ret->getBlock());
  mlir::Operation *op = build(b, g);
  op->setAttr(attr::kBackward, b.getUnitAttr());
  op->setAttr(attr::kGradSync, b.getUnitAttr());
  copyPlacement(g.getDefiningOp(), op);
  ret.setOperand(i, op->getResult(0));
}

// The tied word embedding lives on the first and the last pipeline stage (the copy carries
// loom.tied_to): each copy's gradient becomes the sum of both over the "embedding" group
// (Megatron: _allreduce_word_embedding_grads).
void syncTiedGradients(mlir::func::FuncOp f, mlir::func::ReturnOp ret) {
  llvm::StringSet<> tied;
  for (unsigned a = 0; a < f.getNumArguments(); ++a)
    if (auto to = f.getArgAttrOfType<mlir::StringAttr>(a, attr::kTiedTo)) {
      tied.insert(to.getValue());
      tied.insert(f.getArgAttrOfType<mlir::StringAttr>(a, attr::kParam).getValue());
    }
  for (unsigned i = 0; i < f.getNumResults(); ++i) {
    auto of = f.getResultAttrOfType<mlir::StringAttr>(i, attr::kGradOf);
    if (!of || !tied.contains(of.getValue())) continue;
    wrapResult(ret, i, [](mlir::OpBuilder &b, mlir::Value g) {
      return b.create<AllReduceOp>(g.getLoc(), g.getType(), g, b.getStringAttr("embedding"), b.getI64IntegerAttr(2),
                                   b.getStringAttr("sum"));
    });
  }
}

// Sequence parallelism leaves replicated parameters with partial gradients (each rank saw
// only its positions): they are summed over "tp" (Megatron: allreduce_layernorm_grads).
void syncPartialGradients(mlir::func::FuncOp f, mlir::func::ReturnOp ret) {
  llvm::StringMap<int64_t> partial;  // parameter -> the size of the tp group it is partial over
  for (unsigned a = 0; a < f.getNumArguments(); ++a)
    if (auto t = f.getArgAttrOfType<mlir::IntegerAttr>(a, attr::kTpPartialGrad))
      partial[f.getArgAttrOfType<mlir::StringAttr>(a, attr::kParam).getValue()] = t.getInt();
  for (unsigned i = 0; i < f.getNumResults(); ++i) {
    auto of = f.getResultAttrOfType<mlir::StringAttr>(i, attr::kGradOf);
    if (!of || !partial.contains(of.getValue())) continue;
    int64_t t = partial.lookup(of.getValue());
    wrapResult(ret, i, [&](mlir::OpBuilder &b, mlir::Value g) {
      return b.create<AllReduceOp>(g.getLoc(), g.getType(), g, b.getStringAttr("tp"), b.getI64IntegerAttr(t),
                                   b.getStringAttr("sum"));
    });
  }
}

int64_t bytesOf(mlir::Value v) {
  auto t = mlir::cast<mlir::RankedTensorType>(v.getType());
  return t.getNumElements() * ((t.getElementTypeBitWidth() + 7) / 8);
}

struct DataParallelPass : impl::LoomDataParallelBase<DataParallelPass> {
  using LoomDataParallelBase::LoomDataParallelBase;
  void runOnOperation() override {
    mlir::ModuleOp m = getOperation();
    if (dataParallel < 1 || bucketBytes < 1) {
      m.emitError() << "loom-data-parallel: dp (" << int64_t(dataParallel) << ") and bucket-bytes (" << int64_t(bucketBytes) << ") must be >= 1";
      return signalPassFailure();
    }
    auto f = m.lookupSymbol<mlir::func::FuncOp>("train_step");
    if (!f) {
      m.emitError() << "loom-data-parallel: no func.func @train_step";
      return signalPassFailure();
    }
    m->setAttr("loom.data_parallel_size", mlir::IntegerAttr::get(mlir::IntegerType::get(m.getContext(), 64), dataParallel));
    auto ret = mlir::cast<mlir::func::ReturnOp>(f.getBody().front().getTerminator());
    syncTiedGradients(f, ret);
    syncPartialGradients(f, ret);
    // ZeRO-1: the runtime reduce-scatters the flattened gradients over dp, updates its shard of
    // the parameters and optimizer state, and all-gathers the parameters (Megatron's
    // distributed optimizer); the programs leave the gradients unsynchronised over dp.
    if (zero1) m->setAttr("loom.zero1", mlir::UnitAttr::get(m.getContext()));
    if (expertParallel < 1 || dataParallel % expertParallel != 0) {
      m.emitError() << "loom-data-parallel: expert-parallel (" << int64_t(expertParallel) << ") must divide dp ("
                    << int64_t(dataParallel) << ")";
      return signalPassFailure();
    }
    if (dataParallel == 1 || zero1) return;
    // The experts split over "ep" (loom.shard_group): each is held by the dp / ep ranks of "edp".
    llvm::StringSet<> experts;
    for (unsigned a = 0; a < f.getNumArguments(); ++a)
      if (auto g = f.getArgAttrOfType<mlir::StringAttr>(a, attr::kShardGroup); g && g.getValue() == "ep")
        experts.insert(f.getArgAttrOfType<mlir::StringAttr>(a, attr::kParam).getValue());
    // Gradients in the order they become final (position of their producer in the block).
    llvm::SmallVector<unsigned> gradResults;
    for (unsigned i = 0; i < f.getNumResults(); ++i)
      if (f.getResultAttr(i, attr::kGradOf)) gradResults.push_back(i);
    if (gradResults.empty()) {
      f.emitError() << "loom-data-parallel: @train_step has no gradient results (run loom-autodiff first)";
      return signalPassFailure();
    }
    llvm::DenseMap<mlir::Operation *, unsigned> position;
    unsigned n = 0;
    for (mlir::Operation &op : f.getBody().front()) position[&op] = n++;
    auto producerPos = [&](unsigned result) {
      mlir::Operation *def = ret.getOperand(result).getDefiningOp();
      return def ? position[def] : 0u;
    };
    std::stable_sort(gradResults.begin(), gradResults.end(),
                     [&](unsigned a, unsigned b) { return producerPos(a) < producerPos(b); });
    // Buckets per group: the dense gradients' over `group`, the experts' over "edp".
    struct Buckets {
      int64_t bucket = 0, filled = 0;
    } dense, expert;
    for (unsigned i : gradResults) {
      mlir::Value g = ret.getOperand(i);
      bool isExpert = experts.contains(f.getResultAttrOfType<mlir::StringAttr>(i, attr::kGradOf).getValue());
      Buckets &bk = isExpert ? expert : dense;
      if (bk.filled > 0 && bk.filled + bytesOf(g) > bucketBytes) ++bk.bucket, bk.filled = 0;
      bk.filled += bytesOf(g);
      int64_t size = isExpert ? dataParallel / expertParallel : dataParallel;
      if (size == 1) continue;
      wrapResult(ret, i, [&](mlir::OpBuilder &b, mlir::Value v) {
        auto ar = b.create<AllReduceOp>(v.getLoc(), v.getType(), v, b.getStringAttr(isExpert ? std::string("edp") : std::string(group)),
                                        b.getI64IntegerAttr(size), b.getStringAttr("avg"));
        ar->setAttr(attr::kBucket, b.getI64IntegerAttr(bk.bucket));
        return ar.getOperation();
      });
    }
  }
};

}  // namespace
}  // namespace loom
