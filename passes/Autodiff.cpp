// loom-autodiff: reverse-mode differentiation of train_step (see Passes.td).

#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "llvm/ADT/DenseSet.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "passes/GradientRules.h"
#include "passes/ModelFacts.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMAUTODIFF
#include "passes/Passes.h.inc"

namespace {

// Gives every `Op` without it its optional statistics result `lse` (of the type `statistics`
// gives), so that its gradient rule hands the forward's statistics to the backward instead of
// the backward recomputing the softmax. Result 0, the op's value, keeps its users.
template <typename Op>
void keepStatistics(mlir::func::FuncOp f, llvm::function_ref<mlir::RankedTensorType(Op, mlir::Type)> statistics) {
  llvm::SmallVector<Op> ops;
  f.walk([&](Op op) {
    if (!op.getLse()) ops.push_back(op);
  });
  for (Op op : ops) {
    mlir::OpBuilder b(op);
    mlir::Value value = op->getResult(0);
    auto kept = b.create<Op>(op.getLoc(), mlir::TypeRange{value.getType(), statistics(op, b.getF32Type())},
                             op->getOperands(), op->getAttrs());
    value.replaceAllUsesWith(kept->getResult(0));
    op.erase();
  }
}

// Attention: each query row's log-sum-exp, [batch, heads, seq] (see loom.attention;
// FlashAttention, Dao et al. 2022, section 3.1).
template <typename Attention>
mlir::RankedTensorType attentionStatistics(Attention a, mlir::Type f32) {
  auto queries = mlir::cast<mlir::RankedTensorType>(a.getResult().getType()).getShape();
  return mlir::RankedTensorType::get({queries[0], int64_t(a.getNumHeads()), queries[1]}, f32);
}

// The loss: each token's log-sum-exp over the vocabulary, [batch, seq] (see loom.cross_entropy):
// the backward's softmax is exp(logit - lse), one pass and, vocab-parallel, no collective.
mlir::RankedTensorType lossStatistics(CrossEntropyOp c, mlir::Type f32) {
  auto logits = mlir::cast<mlir::RankedTensorType>(c.getLogits().getType()).getShape();
  return mlir::RankedTensorType::get({logits[0], logits[1]}, f32);
}

// Differentiates `f`, whose single result is the scalar loss, appending a gradient result for
// every parameter argument.
mlir::LogicalResult differentiate(mlir::func::FuncOp f) {
  keepStatistics<AttentionOp>(f, attentionStatistics<AttentionOp>);
  keepStatistics<GroupedAttentionOp>(f, attentionStatistics<GroupedAttentionOp>);
  keepStatistics<CrossEntropyOp>(f, lossStatistics);
  auto ret = mlir::cast<mlir::func::ReturnOp>(f.getBody().front().getTerminator());
  // The loss: a loom.cross_entropy, or a sum (loom.add) of them (BERT's masked-LM and
  // sentence-order losses, summed as Megatron's pretrain_bert does). Each summed loss is a root
  // whose gradient is 1 (a null incoming gradient, see gradientOf).
  llvm::SmallVector<mlir::Value> summed;
  if (ret.getNumOperands() == 1) summed = summedLosses(ret.getOperand(0));
  llvm::DenseSet<mlir::Value> roots(summed.begin(), summed.end());
  if (summed.empty())
    return f.emitError() << "loom-autodiff: @" << f.getName()
                         << " must return exactly one loss produced by loom.cross_entropy (or a loom.add of distinct such losses)";
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
      isRoot |= roots.contains(r);
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
