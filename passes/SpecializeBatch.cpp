// loom-specialize-batch: the dynamic batch dimension becomes the cluster's micro-batch (see
// Passes.td).
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMSPECIALIZEBATCH
#include "passes/Passes.h.inc"

namespace {

// `t` with dim 0 set to `batch` when it is dynamic; nullptr when `t` has another dynamic
// dimension (`badDim` says which).
mlir::Type specialise(mlir::Type t, int64_t batch, int64_t &badDim) {
  auto r = mlir::dyn_cast<mlir::RankedTensorType>(t);
  if (!r || r.hasStaticShape()) return t;
  auto shape = llvm::to_vector(r.getShape());
  for (int64_t d = 0; d < r.getRank(); ++d) {
    if (!mlir::ShapedType::isDynamic(shape[d])) continue;
    if (d != 0 || r.getRank() < 2) {
      badDim = d;
      return nullptr;
    }
    shape[d] = batch;
  }
  return mlir::RankedTensorType::get(shape, r.getElementType());
}

struct SpecializeBatchPass : impl::LoomSpecializeBatchBase<SpecializeBatchPass> {
  using LoomSpecializeBatchBase::LoomSpecializeBatchBase;

  void runOnOperation() override {
    mlir::ModuleOp m = getOperation();
    if (batch < 1) {
      m.emitError() << "loom-specialize-batch: batch must be >= 1, got " << int64_t(batch);
      return signalPassFailure();
    }
    auto f = m.lookupSymbol<mlir::func::FuncOp>("train_step");
    if (!f) {
      m.emitError() << "loom-specialize-batch: no func.func @train_step";
      return signalPassFailure();
    }
    mlir::Block &body = f.getBody().front();
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      mlir::BlockArgument arg = body.getArgument(i);
      auto type = mlir::cast<mlir::RankedTensorType>(arg.getType());
      if (auto name = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam)) {
        if (!type.hasStaticShape()) {
          f.emitError() << "parameter '" << name.getValue() << "' has a dynamic dimension (" << arg.getType()
                        << "): parameters must have static shapes";
          return signalPassFailure();
        }
        continue;
      }
      auto role = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kInput);
      llvm::StringRef what = role ? role.getValue() : "argument";
      if (type.getRank() >= 1 && !type.isDynamicDim(0) && type.getDimSize(0) != batch) {
        f.emitError() << "the IR's batch dimension is " << type.getDimSize(0) << " (" << what << ": " << arg.getType()
                      << ") but the cluster's micro_batch_size is " << int64_t(batch)
                      << " (leave the batch dynamic, `?`, or make them agree)";
        return signalPassFailure();
      }
      int64_t badDim = -1;
      mlir::Type fixed = specialise(type, batch, badDim);
      if (!fixed) {
        f.emitError() << what << " dim " << badDim << " is dynamic (" << arg.getType()
                      << "): only the batch dimension (dim 0) may be";
        return signalPassFailure();
      }
      arg.setType(fixed);
    }
    mlir::WalkResult walk = f.walk([&](mlir::Operation *op) -> mlir::WalkResult {
      for (mlir::OpResult r : op->getResults()) {
        int64_t badDim = -1;
        mlir::Type fixed = specialise(r.getType(), batch, badDim);
        if (!fixed)
          return op->emitOpError() << "result dim " << badDim << " is dynamic (" << r.getType()
                                   << "): only the batch dimension (dim 0) may be";
        r.setType(fixed);
      }
      return mlir::WalkResult::advance();
    });
    if (walk.wasInterrupted()) return signalPassFailure();
    f.setType(mlir::FunctionType::get(f.getContext(), body.getArgumentTypes(), body.getTerminator()->getOperandTypes()));
  }
};

}  // namespace
}  // namespace loom
