// loom-expert-parallel: expert parallelism (see Passes.td; Megatron-Core's expert model
// parallelism, its ep group carved out of the data-parallel ranks). Each loom.moe keeps its
// tokens and routing; its stacked expert weights become this rank's E / ep experts (dim 0
// split over "ep"), and the op is marked to exchange the assignments with the group's other
// members (the plan's expert_parallel_moe).
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMEXPERTPARALLEL
#include "passes/Passes.h.inc"

namespace {

constexpr llvm::StringLiteral kGroup = "ep";

struct ExpertParallelPass : impl::LoomExpertParallelBase<ExpertParallelPass> {
  using LoomExpertParallelBase::LoomExpertParallelBase;

  void runOnOperation() override {
    mlir::ModuleOp m = getOperation();
    if (ep < 1) {
      m.emitError() << "loom-expert-parallel: ep must be >= 1, got " << int64_t(ep);
      return signalPassFailure();
    }
    if (ep == 1) return;
    auto f = m.lookupSymbol<mlir::func::FuncOp>("train_step");
    if (!f) {
      m.emitError() << "loom-expert-parallel: no func.func @train_step";
      return signalPassFailure();
    }
    bool any = false;
    mlir::WalkResult walk = f.walk([&](MoeOp moe) -> mlir::WalkResult {
      any = true;
      if (failed(split(f, moe))) return mlir::WalkResult::interrupt();
      return mlir::WalkResult::advance();
    });
    if (walk.wasInterrupted()) return signalPassFailure();
    if (!any) {
      f.emitError() << "loom-expert-parallel: ep = " << int64_t(ep) << " but @train_step has no loom.moe (expert "
                    << "parallelism splits a mixture of experts' experts)";
      return signalPassFailure();
    }
  }

  // The experts of `moe` split over "ep": its gate, up and down must be parameters only it uses.
  mlir::LogicalResult split(mlir::func::FuncOp f, MoeOp moe) {
    if (moe.getExpertParallelGroup()) return moe.emitOpError() << "loom-expert-parallel: already expert-parallel";
    int64_t experts = mlir::cast<mlir::RankedTensorType>(moe.getGate().getType()).getDimSize(0);
    if (experts % ep != 0)
      return moe.emitOpError() << "loom-expert-parallel: ep = " << int64_t(ep) << " does not divide the " << experts
                               << " experts";
    for (unsigned operand : {2u, 3u, 4u}) {
      auto arg = mlir::dyn_cast<mlir::BlockArgument>(moe->getOperand(operand));
      if (!arg || arg.getOwner()->getParentOp() != f.getOperation() || !f.getArgAttr(arg.getArgNumber(), attr::kParam))
        return moe.emitOpError() << "loom-expert-parallel: operand " << operand
                                 << " (an expert weight) must be a parameter argument of @train_step";
      if (!arg.hasOneUse())
        return moe.emitOpError() << "loom-expert-parallel: parameter '"
                                 << f.getArgAttrOfType<mlir::StringAttr>(arg.getArgNumber(), attr::kParam).getValue()
                                 << "' has other uses than this op's experts";
      if (f.getArgAttr(arg.getArgNumber(), attr::kShardDim))
        return moe.emitOpError() << "loom-expert-parallel: expert weights already split";
      auto type = mlir::cast<mlir::RankedTensorType>(arg.getType());
      auto shape = llvm::to_vector(type.getShape());
      shape[0] /= ep;
      arg.setType(mlir::RankedTensorType::get(shape, type.getElementType()));
      mlir::Builder b(f.getContext());
      unsigned n = arg.getArgNumber();
      f.setArgAttr(n, attr::kShardDim, b.getI64IntegerAttr(0));
      f.setArgAttr(n, attr::kShardParts, b.getI64IntegerAttr(ep));
      f.setArgAttr(n, attr::kShardGroup, b.getStringAttr(kGroup));
    }
    mlir::Builder b(f.getContext());
    moe.setExpertParallelGroupAttr(b.getStringAttr(kGroup));
    moe.setExpertParallelSizeAttr(b.getI64IntegerAttr(ep));
    // The function's signature follows its arguments' new types.
    f.setType(mlir::FunctionType::get(f.getContext(), f.getBody().front().getArgumentTypes(), f.getResultTypes()));
    return mlir::success();
  }
};

}  // namespace
}  // namespace loom
