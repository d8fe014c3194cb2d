// loom-pad-vocab: pad the vocabulary dimensions to a multiple (see Passes.td).
#include <map>
#include <set>

#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "passes/ModelFacts.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMPADVOCAB
#include "passes/Passes.h.inc"

namespace {

mlir::RankedTensorType withDim(mlir::Type t, int64_t dim, int64_t size) {
  auto r = mlir::cast<mlir::RankedTensorType>(t);
  auto shape = llvm::to_vector(r.getShape());
  shape[dim] = size;
  return mlir::RankedTensorType::get(shape, r.getElementType());
}

struct PadVocabPass : impl::LoomPadVocabBase<PadVocabPass> {
  using LoomPadVocabBase::LoomPadVocabBase;

  mlir::func::FuncOp f_;
  std::map<unsigned, int64_t> padDim_;           // parameter argument -> its vocabulary dimension
  std::set<std::pair<mlir::Operation *, unsigned>> vocabUses_;  // (op, operand) taking a padded parameter

  mlir::LogicalResult addParam(mlir::Operation *user, unsigned operand, int64_t dim, llvm::StringRef what) {
    auto arg = mlir::dyn_cast<mlir::BlockArgument>(user->getOperand(operand));
    if (!arg || !f_.getArgAttr(arg.getArgNumber(), attr::kParam))
      return user->emitOpError() << "loom-pad-vocab: the " << what
                                 << " must be a parameter argument of @train_step to pad the vocabulary";
    auto [it, inserted] = padDim_.try_emplace(arg.getArgNumber(), dim);
    if (!inserted && it->second != dim)
      return user->emitOpError() << "loom-pad-vocab: parameter '"
                                 << f_.getArgAttrOfType<mlir::StringAttr>(arg.getArgNumber(), attr::kParam).getValue()
                                 << "' has its vocabulary along two dimensions";
    vocabUses_.insert({user, operand});
    return mlir::success();
  }

  void runOnOperation() override {
    mlir::ModuleOp m = getOperation();
    f_ = m.lookupSymbol<mlir::func::FuncOp>("train_step");
    if (!f_) {
      m.emitError() << "loom-pad-vocab: no func.func @train_step";
      return signalPassFailure();
    }
    if (multiple < 1) {
      m.emitError() << "loom-pad-vocab: multiple must be >= 1, got " << int64_t(multiple);
      return signalPassFailure();
    }
    // The vocabulary dimensions, from the dataflow: embedding tables and the producers of
    // the logits.
    llvm::SmallVector<LinearOp> outputLayers;
    mlir::WalkResult walk = f_.walk([&](mlir::Operation *op) -> mlir::WalkResult {
      if (auto e = mlir::dyn_cast<EmbeddingOp>(op))
        return mlir::failed(addParam(op, 1, 0, "word table")) ? mlir::WalkResult::interrupt()
                                                                : mlir::WalkResult::advance();
      auto ce = mlir::dyn_cast<CrossEntropyOp>(op);
      if (!ce || isClassifierLoss(ce)) return mlir::WalkResult::advance();
      LinearOp out = outputLayerOf(ce);
      if (!out)
        return op->emitOpError() << "loom-pad-vocab: the logits must come straight from a loom.linear used only "
                                    "here (the output layer) to pad the vocabulary";
      if (mlir::failed(addParam(out, 1, out.getTransposeWeight() ? 0 : 1, "output layer's weight")) ||
          (out.getBias() && mlir::failed(addParam(out, 2, 0, "output layer's bias"))))
        return mlir::WalkResult::interrupt();
      outputLayers.push_back(out);
      return mlir::WalkResult::advance();
    });
    if (walk.wasInterrupted()) return signalPassFailure();

    mlir::Block &body = f_.getBody().front();
    for (auto [argNo, dim] : padDim_) {
      mlir::BlockArgument arg = body.getArgument(argNo);
      for (mlir::OpOperand &use : arg.getUses())
        if (!vocabUses_.count({use.getOwner(), use.getOperandNumber()})) {
          use.getOwner()->emitOpError()
              << "loom-pad-vocab: uses parameter '"
              << f_.getArgAttrOfType<mlir::StringAttr>(argNo, attr::kParam).getValue()
              << "' whole, but its vocabulary dimension is padded for the embedding and the output layer";
          return signalPassFailure();
        }
      int64_t size = mlir::cast<mlir::RankedTensorType>(arg.getType()).getDimSize(dim);
      int64_t padded = roundUpToMultiple(size, multiple);
      if (padded == size) continue;
      arg.setType(withDim(arg.getType(), dim, padded));
      // The runtime initialises the real entries as if unpadded and the padding to zeros, so
      // the padding changes no value the model computes with.
      mlir::Builder b(f_.getContext());
      if (!f_.getArgAttr(argNo, attr::kUnpaddedSize)) {  // padded once already: keep the real size
        f_.setArgAttr(argNo, attr::kPaddedDim, b.getI64IntegerAttr(dim));
        f_.setArgAttr(argNo, attr::kUnpaddedSize, b.getI64IntegerAttr(size));
      }
    }
    for (LinearOp out : outputLayers) {
      auto w = mlir::cast<mlir::RankedTensorType>(out.getWeight().getType());
      int64_t rank = mlir::cast<mlir::RankedTensorType>(out.getType()).getRank();
      out.getResult().setType(withDim(out.getType(), rank - 1, w.getDimSize(out.getTransposeWeight() ? 0 : 1)));
    }
    f_.setType(mlir::FunctionType::get(f_.getContext(), body.getArgumentTypes(), body.getTerminator()->getOperandTypes()));
  }
};

}  // namespace
}  // namespace loom
