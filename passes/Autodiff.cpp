// loom-autodiff: reverse-mode differentiation of train_step (see Passes.td).
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "passes/GradientRules.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMAUTODIFF
#include "passes/Passes.h.inc"

namespace {

// Gives every attention core its softmax statistics result (the per-row log-sum-exp, see
// loom.attention), so that its gradient rule hands them to the backward instead of the
// backward recomputing the softmax (FlashAttention, Dao et al. 2022, section 3.1).
template <typename Attention>
void keepSoftmaxStatistics(mlir::func::FuncOp f) {
  llvm::SmallVector<Attention> cores;
  f.walk([&](Attention a) {
    if (!a.getLse()) cores.push_back(a);
  });
  for (Attention a : cores) {
    auto queries = mlir::cast<mlir::RankedTensorType>(a.getResult().getType()).getShape();
    mlir::OpBuilder b(a);
    auto lse = mlir::RankedTensorType::get({queries[0], int64_t(a.getNumHeads()), queries[1]}, b.getF32Type());
    auto kept = b.create<Attention>(a.getLoc(), mlir::TypeRange{a.getResult().getType(), lse}, a->getOperands(),
                                    a->getAttrs());
    a.getResult().replaceAllUsesWith(kept.getResult());
    a.erase();
  }
}

// Gives the loss its per-token log-sum-exp result (see loom.cross_entropy), which its gradient
// rule hands to the backward: the softmax over the vocabulary is exp(logit - lse), one pass
// and, vocab-parallel, no collective.
void keepLossStatistics(mlir::func::FuncOp f) {
  llvm::SmallVector<CrossEntropyOp> losses;
  f.walk([&](CrossEntropyOp c) {
    if (!c.getLse()) losses.push_back(c);
  });
  for (CrossEntropyOp c : losses) {
    auto logits = mlir::cast<mlir::RankedTensorType>(c.getLogits().getType()).getShape();
    mlir::OpBuilder b(c);
    auto lse = mlir::RankedTensorType::get({logits[0], logits[1]}, b.getF32Type());
    auto kept = b.create<CrossEntropyOp>(c.getLoc(), mlir::TypeRange{c.getLoss().getType(), lse}, c->getOperands(),
                                         c->getAttrs());
    c.getLoss().replaceAllUsesWith(kept.getLoss());
    c.erase();
  }
}

// Differentiates `f`, whose single result is the scalar loss, appending a gradient result for
// every parameter argument.
mlir::LogicalResult differentiate(mlir::func::FuncOp f) {
  keepSoftmaxStatistics<AttentionOp>(f);
  keepSoftmaxStatistics<GroupedAttentionOp>(f);
  keepLossStatistics(f);
  auto ret = mlir::cast<mlir::func::ReturnOp>(f.getBody().front().getTerminator());
  if (ret.getNumOperands() != 1 || !ret.getOperand(0).getDefiningOp<CrossEntropyOp>())
    return f.emitError() << "loom-autodiff: @" << f.getName()
                         << " must return exactly one loss produced by loom.cross_entropy";
  mlir::Value loss = ret.getOperand(0);
  mlir::OpBuilder b(ret);
  llvm::DenseMap<mlir::Value, mlir::Value> grads;
  auto accumulate = [&](mlir::Value v, mlir::Value g) {
    auto [it, inserted] = grads.try_emplace(v, g);
    if (!inserted) it->second = b.create<AddOp>(v.getLoc(), it->second, g);
  };

  llvm::SmallVector<mlir::Operation *> forward;
  for (mlir::Operation &op : f.getBody().front().without_terminator()) forward.push_back(&op);
  for (mlir::Operation *op : llvm::reverse(forward)) {
    llvm::SmallVector<mlir::Value> resultGrads;
    bool any = false, isRoot = false;
    for (mlir::Value r : op->getResults()) {
      resultGrads.push_back(grads.lookup(r));
      any |= bool(resultGrads.back());
      isRoot |= r == loss;
    }
    if (!any && !isRoot) continue;
    mlir::Operation *last = ret->getPrevNode();
    mlir::FailureOr<llvm::SmallVector<mlir::Value>> d = gradientOf(b, op, resultGrads);
    if (failed(d)) return mlir::failure();
    for (auto [operand, g] : llvm::zip(op->getOperands(), *d))
      if (g) accumulate(operand, g);
    // Tag what the rule and the accumulation built: backward ops of the forward op's layer.
    for (mlir::Operation *n = last->getNextNode(); n != ret.getOperation(); n = n->getNextNode()) {
      n->setAttr(attr::kBackward, b.getUnitAttr());
      for (llvm::StringRef a : {attr::kLayer.data(), attr::kStage.data()})
        if (auto v = op->getAttr(a)) n->setAttr(a, v);
    }
  }

  llvm::SmallVector<mlir::Value> results{loss};
  llvm::SmallVector<mlir::Attribute> resultAttrs{b.getDictionaryAttr({})};
  for (mlir::BlockArgument arg : f.getArguments()) {
    auto name = f.getArgAttrOfType<mlir::StringAttr>(arg.getArgNumber(), attr::kParam);
    if (!name) continue;
    mlir::Value g = grads.lookup(arg);
    if (!g) return f.emitError() << "loom-autodiff: parameter '" << name.getValue() << "' does not reach the loss";
    results.push_back(g);
    resultAttrs.push_back(b.getDictionaryAttr({b.getNamedAttr(attr::kGradOf, name)}));
  }
  b.create<mlir::func::ReturnOp>(ret.getLoc(), results);
  ret.erase();
  llvm::SmallVector<mlir::Type> types;
  for (mlir::Value v : results) types.push_back(v.getType());
  f.setType(b.getFunctionType(f.getArgumentTypes(), types));
  f.setAllResultAttrs(resultAttrs);
  return mlir::success();
}

struct AutodiffPass : impl::LoomAutodiffBase<AutodiffPass> {
  void runOnOperation() override {
    auto f = getOperation().lookupSymbol<mlir::func::FuncOp>("train_step");
    if (!f) {
      getOperation().emitError() << "loom-autodiff: no func.func @train_step";
      return signalPassFailure();
    }
    if (failed(differentiate(f))) signalPassFailure();
  }
};

}  // namespace
}  // namespace loom
