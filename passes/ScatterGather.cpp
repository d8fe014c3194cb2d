// loom-scatter-gather (see Passes.td): PTD-P's scatter/gather optimization (Narayanan et al.
// 2021, section 4.1). Without sequence parallelism a pipeline message (the residual stream
// forward, its gradient backward) is replicated across the t tensor-parallel ranks of a stage,
// and every one of them would send the whole tensor to its peer. Between stages on different
// nodes each tp rank sends its 1/t slice instead (loom.shard), over its own network adapter,
// and the receiving stage all-gathers the slices over the fast intra-node links: the
// cross-node bytes drop by t, the values are unchanged (slices and copies, no arithmetic).
#include <algorithm>
#include <set>
#include <utility>

#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMSCATTERGATHER
#include "passes/Passes.h.inc"

namespace {

constexpr llvm::StringLiteral kTensorGroup = "tp";

// The dimension a message is split along: the outermost one t divides (dimension 0 keeps each
// rank's slice contiguous, like Megatron's flat 1-D split); -1 when none does.
int64_t splitDim(mlir::RankedTensorType type, int64_t t) {
  for (int64_t d = 0; d < type.getRank(); ++d)
    if (type.getDimSize(d) % t == 0) return d;
  return -1;
}

mlir::RankedTensorType slicedType(mlir::RankedTensorType type, int64_t dim, int64_t t) {
  llvm::SmallVector<int64_t> shape(type.getShape());
  shape[dim] /= t;
  return mlir::RankedTensorType::get(shape, type.getElementType());
}

void copyPlacement(mlir::Operation *from, mlir::Operation *to) {
  for (llvm::StringRef a : {attr::kStage.data(), attr::kBackward.data(), attr::kLayer.data()})
    if (auto x = from->getAttr(a)) to->setAttr(a, x);
}

struct ScatterGatherPass : impl::LoomScatterGatherBase<ScatterGatherPass> {
  using LoomScatterGatherBase::LoomScatterGatherBase;

  void runOnOperation() override {
    mlir::ModuleOp module = getOperation();
    if (crossing.size() % 2 != 0) {
      module.emitError() << "loom-scatter-gather: crossing lists pipeline-stage pairs (an even count), got "
                         << crossing.size() << " values";
      return signalPassFailure();
    }
    // Sequence parallelism already sends 1/t of the sequence per rank; t = 1 has nothing to split.
    if (tp <= 1 || module->hasAttr("loom.sequence_parallel")) return;
    std::set<std::pair<int64_t, int64_t>> links;
    for (size_t i = 0; i < crossing.size(); i += 2)
      links.insert(std::minmax(int64_t(crossing[i]), int64_t(crossing[i + 1])));
    auto crosses = [&](int64_t a, int64_t b) { return links.count(std::minmax(a, b)) > 0; };
    auto position = [](mlir::Operation *op, int64_t pp) {
      auto stage = op->getAttrOfType<mlir::IntegerAttr>(attr::kStage);
      return stage ? stage.getInt() % pp : int64_t(-1);
    };
    mlir::OpBuilder b(module.getContext());
    module.walk([&](SendOp send) {
      auto type = mlir::dyn_cast<mlir::RankedTensorType>(send.getInput().getType());
      int64_t dim = type ? splitDim(type, tp) : -1;
      if (send.getGroup() != "pp" || dim < 0 || !crosses(position(send, send.getGroupSize()), send.getPeer())) return;
      b.setInsertionPoint(send);
      auto slice = b.create<ShardOp>(send.getLoc(), slicedType(type, dim, tp), send.getInput(),
                                     b.getStringAttr(kTensorGroup), b.getI64IntegerAttr(tp), b.getI64IntegerAttr(dim));
      copyPlacement(send, slice);
      send.getInputMutable().assign(slice.getResult());
    });
    module.walk([&](RecvOp recv) {
      auto type = mlir::dyn_cast<mlir::RankedTensorType>(recv.getResult().getType());
      int64_t dim = type ? splitDim(type, tp) : -1;
      if (recv.getGroup() != "pp" || dim < 0 || !crosses(position(recv, recv.getGroupSize()), recv.getPeer())) return;
      recv.getResult().setType(slicedType(type, dim, tp));
      b.setInsertionPointAfter(recv);
      auto gather = b.create<AllGatherOp>(recv.getLoc(), type, recv.getResult(), b.getStringAttr(kTensorGroup),
                                          b.getI64IntegerAttr(tp), b.getI64IntegerAttr(dim), /*split_gradient=*/nullptr);
      copyPlacement(recv, gather);
      recv.getResult().replaceAllUsesExcept(gather.getResult(), gather);
    });
  }
};

}  // namespace
}  // namespace loom
