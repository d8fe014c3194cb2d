// loom-data-parallel: average gradients over "dp" in buckets (see Passes.td).
#include <algorithm>

#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMDATAPARALLEL
#include "passes/Passes.h.inc"

namespace {

int64_t bytesOf(mlir::Value v) {
  auto t = mlir::cast<mlir::RankedTensorType>(v.getType());
  return t.getNumElements() * ((t.getElementTypeBitWidth() + 7) / 8);
}

struct DataParallelPass : impl::LoomDataParallelBase<DataParallelPass> {
  using LoomDataParallelBase::LoomDataParallelBase;
  void runOnOperation() override {
    mlir::ModuleOp m = getOperation();
    if (dataParallel < 1 || bucketBytes < 1) {
      m.emitError() << "loom-data-parallel: dp and bucket-bytes must be >= 1";
      return signalPassFailure();
    }
    if (zero1) {
      m.emitError() << "loom-data-parallel: zero1 (distributed optimizer) is not implemented yet";
      return signalPassFailure();
    }
    auto f = m.lookupSymbol<mlir::func::FuncOp>("train_step");
    if (!f) {
      m.emitError() << "loom-data-parallel: no func.func @train_step";
      return signalPassFailure();
    }
    m->setAttr("loom.data_parallel_size", mlir::IntegerAttr::get(mlir::IntegerType::get(m.getContext(), 64), dataParallel));
    if (dataParallel == 1) return;
    auto ret = mlir::cast<mlir::func::ReturnOp>(f.getBody().front().getTerminator());
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
    mlir::OpBuilder b(f.getContext());
    int64_t bucket = 0, filled = 0;
    for (unsigned i : gradResults) {
      mlir::Value g = ret.getOperand(i);
      if (filled > 0 && filled + bytesOf(g) > bucketBytes) ++bucket, filled = 0;
      filled += bytesOf(g);
      if (mlir::Operation *def = g.getDefiningOp())
        b.setInsertionPointAfter(def);
      else
        b.setInsertionPointToStart(&f.getBody().front());
      auto ar = b.create<AllReduceOp>(g.getLoc(), g.getType(), g, b.getStringAttr("dp"),
                                      b.getI64IntegerAttr(dataParallel), b.getStringAttr("avg"));
      ar->setAttr(attr::kBucket, b.getI64IntegerAttr(bucket));
      ar->setAttr(attr::kBackward, b.getUnitAttr());
      if (auto layer = g.getDefiningOp() ? g.getDefiningOp()->getAttr(attr::kLayer) : nullptr)
        ar->setAttr(attr::kLayer, layer);
      ret.setOperand(i, ar);
    }
  }
};

}  // namespace
}  // namespace loom
