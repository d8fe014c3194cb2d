// loom-micro-batches (see Passes.td).
#include "ir/LoomDialect.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMMICROBATCHES
#include "passes/Passes.h.inc"

namespace {

struct MicroBatchesPass : impl::LoomMicroBatchesBase<MicroBatchesPass> {
  using LoomMicroBatchesBase::LoomMicroBatchesBase;
  void runOnOperation() override {
    if (count < 1) {
      getOperation().emitError() << "loom-micro-batches: count must be >= 1, got " << count;
      return signalPassFailure();
    }
    mlir::Builder b(&getContext());
    getOperation().walk([&](CrossEntropyGradOp g) {
      if (!g.getGrad()) g.setLossScaleAttr(b.getF32FloatAttr(1.0f / float(count)));
    });
    // The load-balancing losses' share of the step's loss, likewise.
    getOperation().walk([&](MoeGradOp g) { g.setLossScaleAttr(b.getF32FloatAttr(1.0f / float(count))); });
    getOperation()->setAttr("loom.micro_batches", b.getI64IntegerAttr(count));
  }
};

}  // namespace
}  // namespace loom
