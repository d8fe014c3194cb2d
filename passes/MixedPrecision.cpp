// loom-mixed-precision: the precision policy applied after partitioning (see Passes.td).
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMMIXEDPRECISION
#include "passes/Passes.h.inc"

namespace {

// The results that stay fp32 whatever the policy: the softmax statistics the backward reads
// (the dialect's Loom_StatsTensor), the loss and the MoE load-balancing losses (0-d
// Loom_Scalars), and the MoE routing statistics (token counts, exact in fp32 only up to 2^24, in
// 16 bits only to 256 or 2048).
bool keepsFp32(mlir::Operation *op, mlir::Value result) {
  auto t = mlir::cast<mlir::RankedTensorType>(result.getType());
  if (t.getRank() == 0 || mlir::isa<MoeRoutingStatsOp>(op)) return true;
  if (auto a = mlir::dyn_cast<AttentionOp>(op)) return result == a.getLse();
  if (auto a = mlir::dyn_cast<GroupedAttentionOp>(op)) return result == a.getLse();
  if (auto c = mlir::dyn_cast<CrossEntropyOp>(op)) return result == c.getLse();
  return false;
}

mlir::Type lowered(mlir::Type type, mlir::Type dtype) {
  auto t = mlir::dyn_cast<mlir::RankedTensorType>(type);
  if (!t || !t.getElementType().isF32()) return type;
  return mlir::RankedTensorType::get(t.getShape(), dtype);
}

struct MixedPrecisionPass : impl::LoomMixedPrecisionBase<MixedPrecisionPass> {
  using LoomMixedPrecisionBase::LoomMixedPrecisionBase;

  void runOnOperation() override {
    mlir::ModuleOp m = getOperation();
    std::string name = dtype;
    if (name.empty())
      if (auto policy = m->getAttrOfType<mlir::StringAttr>(attr::kParamsDtype)) name = policy.str();
    if (name.empty()) return;  // no policy: the IR's own types
    mlir::OpBuilder b(m.getContext());
    mlir::Type target = name == "bf16"  ? mlir::Type(b.getBF16Type())
                        : name == "f16" ? mlir::Type(b.getF16Type())
                        : name == "f32" ? mlir::Type(b.getF32Type())
                                        : nullptr;
    if (!target) {
      m.emitError() << "loom-mixed-precision: dtype must be bf16, f16 or f32, got '" << name << "'";
      return signalPassFailure();
    }
    for (auto f : m.getOps<mlir::func::FuncOp>())
      if (failed(apply(f, target))) return signalPassFailure();
  }

  mlir::LogicalResult apply(mlir::func::FuncOp f, mlir::Type target) {
    mlir::Block &body = f.getBody().front();
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      auto param = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam);
      if (!param) continue;  // data inputs (tokens, labels, masks) keep their types
      mlir::BlockArgument arg = body.getArgument(i);
      mlir::Type elem = mlir::cast<mlir::RankedTensorType>(arg.getType()).getElementType();
      if (!elem.isF32() && elem != target)
        return f.emitError() << "loom-mixed-precision: parameter '" << param.getValue() << "' is " << elem
                             << ", the policy is " << target;
      arg.setType(lowered(arg.getType(), target));
    }
    if (target.isF32()) return mlir::success();  // fp32: nothing to lower
    // Every activation in order: an op's float results follow the policy, but an op whose
    // results have its operands' type (a collective, an identity) keeps it: the MoE routing
    // statistics' all-reduce over tp stays fp32 with them.
    f.walk([&](mlir::Operation *op) {
      if (op->getDialect() != m().getContext()->getLoadedDialect<LoomDialect>()) return;
      bool sameType = op->hasTrait<mlir::OpTrait::SameOperandsAndResultType>() && op->getNumOperands() > 0;
      for (mlir::Value r : op->getResults())
        if (sameType)
          r.setType(op->getOperand(0).getType());
        else if (!keepsFp32(op, r))
          r.setType(lowered(r.getType(), target));
    });
    auto ret = mlir::cast<mlir::func::ReturnOp>(body.getTerminator());
    f.setType(mlir::FunctionType::get(f.getContext(), body.getArgumentTypes(), ret.getOperandTypes()));
    return mlir::success();
  }

  mlir::ModuleOp m() { return getOperation(); }
};

}  // namespace
}  // namespace loom
