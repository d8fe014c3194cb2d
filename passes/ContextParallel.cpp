// loom-context-parallel: context parallelism (see Passes.td; Megatron-Core's context
// parallelism with cp_comm_type "all_gather", and Liu et al. 2023, "Ring Attention", for the
// chunking): after loom-tensor-parallel, every token-wise op runs on this rank's S / cp tokens.
//
// Rules, read off the op kinds (an op kind without one is an error naming it):
//   data inputs, activations   dim 1 (the sequence) divided by cp; softmax statistics that
//                              the IR already has follow their queries;
//   attention cores            comm = p2p (Megatron-Core's default): marked
//                              context_parallel_ring, the keys and values going round the cp
//                              ring inside the plan's ring_attention (a collective over "cp");
//                              comm = all_gather: k and v (GPT: the fused qkv) all-gathered over
//                              "cp" along the sequence before the core, which attends from the
//                              rank's own queries (autodiff turns the gather into a
//                              reduce-scatter of the keys' and values' gradients);
//   position-dependent ops     embedding positions, add_position, rotary and dropout carry
//                              context_parallel_group: the kernels map local tokens to global
//                              positions (plan/Layout.h ContextChunks);
//   the rest                   row-wise: unchanged but for their shapes.
// The loss stays each rank's mean over its tokens: averaged over the d x cp ranks (the
// data-parallel pass's "dpcp" group) it is the mean over the whole sequence, every rank holding
// the same number of tokens.
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMCONTEXTPARALLEL
#include "passes/Passes.h.inc"

namespace {

constexpr llvm::StringLiteral kGroup = "cp";

mlir::RankedTensorType scaledDim(mlir::Type t, int64_t dim, int64_t num, int64_t den) {
  auto r = mlir::cast<mlir::RankedTensorType>(t);
  auto shape = llvm::to_vector(r.getShape());
  shape[dim] = shape[dim] * num / den;
  return mlir::RankedTensorType::get(shape, r.getElementType());
}

class Chunker {
 public:
  Chunker(mlir::func::FuncOp f, int64_t cp, bool ring) : f_(f), cp_(cp), ring_(ring), b_(f.getContext()) {}

  mlir::LogicalResult run() {
    if (failed(check())) return mlir::failure();
    retypeInputs();
    f_.walk([&](mlir::Operation *op) { retypeResults(op); });
    llvm::SmallVector<mlir::Operation *> cores;
    f_.walk([&](mlir::Operation *op) {
      if (mlir::isa<AttentionOp, GroupedAttentionOp>(op)) cores.push_back(op);
      markPositions(op);
    });
    for (mlir::Operation *core : cores) {
      if (!ring_) {
        gatherKeys(core);
        continue;
      }
      core->setAttr("context_parallel_ring", b_.getUnitAttr());
      core->setAttr("context_parallel_size", b_.getI64IntegerAttr(cp_));
    }
    auto ret = f_.getBody().front().getTerminator();
    f_.setType(b_.getFunctionType(f_.getBody().front().getArgumentTypes(), ret->getOperandTypes()));
    return mlir::success();
  }

 private:
  mlir::LogicalResult check() {
    for (unsigned i = 0; i < f_.getNumArguments(); ++i) {
      if (!f_.getArgAttr(i, attr::kInput)) continue;
      auto t = mlir::cast<mlir::RankedTensorType>(f_.getArgument(i).getType());
      if (t.getRank() < 2 || t.getShape()[1] % (2 * cp_) != 0)
        return f_.emitError() << "loom-context-parallel: 2 * cp = " << 2 * cp_ << " does not divide the sequence ("
                              << (t.getRank() < 2 ? 0 : t.getShape()[1]) << ") of input "
                              << f_.getArgAttr(i, attr::kInput) << " (the sequence is cut into 2 cp equal chunks)";
    }
    mlir::WalkResult walk = f_.walk([&](mlir::Operation *op) -> mlir::WalkResult {
      if (mlir::isa<mlir::func::FuncOp, mlir::func::ReturnOp>(op)) return mlir::WalkResult::advance();
      if (auto a = mlir::dyn_cast<AttentionOp>(op); a && a.getKeyMask())
        return op->emitOpError() << "loom-context-parallel: a padding mask (key_mask) is not supported with context "
                                    "parallelism (the chunked attention does not take it); use cp = 1";
      if (mlir::isa<MoeOp>(op))
        return op->emitOpError() << "loom-context-parallel: a mixture-of-experts layer does not run with context "
                                    "parallelism yet (its load-balancing statistics need the whole sequence); use cp = 1";
      if (mlir::isa<AttentionOp, GroupedAttentionOp>(op) && op->getAttr("context_parallel_group"))
        return op->emitOpError() << "loom-context-parallel: already context-parallel";
      if (mlir::isa<EmbeddingOp, AddPositionOp, LayerNormOp, RmsNormOp, LinearOp, AddBiasOp, GeluOp, SwigluOp,
                    AttentionOp, GroupedAttentionOp, DropoutOp, AddOp, IdentityOp, AllReduceOp, AllGatherOp,
                    ReduceScatterOp, CrossEntropyOp, RotaryOp>(op))
        return mlir::WalkResult::advance();
      return op->emitOpError() << "loom-context-parallel: no context-parallel rule for this op (the pass runs on the "
                                  "forward ops, after loom-tensor-parallel)";
    });
    return mlir::failure(walk.wasInterrupted());
  }

  void retypeInputs() {
    for (unsigned i = 0; i < f_.getNumArguments(); ++i)
      if (f_.getArgAttr(i, attr::kInput)) {
        mlir::BlockArgument arg = f_.getArgument(i);
        arg.setType(scaledDim(arg.getType(), 1, 1, cp_));
      }
  }

  // Every activation is [batch, seq, ...]; attention's statistics [batch, heads, seq] and the
  // loss's [batch, seq]; the loss itself is a scalar.
  void retypeResults(mlir::Operation *op) {
    if (mlir::isa<mlir::func::FuncOp>(op)) return;
    for (mlir::OpResult r : op->getResults()) {
      auto t = mlir::dyn_cast<mlir::RankedTensorType>(r.getType());
      if (!t || t.getRank() < 2) continue;
      bool statistics = mlir::isa<AttentionOp, GroupedAttentionOp>(op) && r.getResultNumber() == 1;
      r.setType(scaledDim(t, statistics ? 2 : 1, 1, cp_));
    }
  }

  void markPositions(mlir::Operation *op) {
    bool positional = mlir::isa<AddPositionOp, RotaryOp, DropoutOp, AttentionOp, GroupedAttentionOp>(op) ||
                      (mlir::isa<EmbeddingOp>(op) && mlir::cast<EmbeddingOp>(op).getPosition());
    if (positional) op->setAttr("context_parallel_group", b_.getStringAttr(kGroup));
  }

  // The whole sequence's keys and values before the core: an all-gather over "cp" along dim 1
  // (member j's chunks at rows [2jC, 2jC + 2C), the order the core's kernel reads them in).
  void gatherKeys(mlir::Operation *core) {
    b_.setInsertionPoint(core);
    llvm::SmallVector<unsigned> operands;
    if (mlir::isa<AttentionOp>(core))
      operands = {0};
    else
      operands = {1, 2};
    for (unsigned i : operands) {
      mlir::Value local = core->getOperand(i);
      auto gather = b_.create<AllGatherOp>(core->getLoc(), scaledDim(local.getType(), 1, cp_, 1), local,
                                           b_.getStringAttr(kGroup), b_.getI64IntegerAttr(cp_),
                                           b_.getI64IntegerAttr(1), /*split_gradient=*/nullptr);
      if (auto layer = core->getAttr(attr::kLayer)) gather->setAttr(attr::kLayer, layer);
      core->setOperand(i, gather.getResult());
    }
  }

  mlir::func::FuncOp f_;
  int64_t cp_;
  bool ring_;
  mlir::OpBuilder b_;
};

struct ContextParallelPass : impl::LoomContextParallelBase<ContextParallelPass> {
  using LoomContextParallelBase::LoomContextParallelBase;
  void runOnOperation() override {
    mlir::ModuleOp m = getOperation();
    if (cp < 1) {
      m.emitError() << "loom-context-parallel: cp must be >= 1, got " << int64_t(cp);
      return signalPassFailure();
    }
    if (comm != "p2p" && comm != "all_gather") {
      m.emitError() << "loom-context-parallel: comm must be p2p or all_gather, got '" << comm << "'";
      return signalPassFailure();
    }
    if (cp == 1) return;
    auto f = m.lookupSymbol<mlir::func::FuncOp>("train_step");
    if (!f) {
      m.emitError() << "loom-context-parallel: no func.func @train_step";
      return signalPassFailure();
    }
    m->setAttr("loom.context_parallel_size", mlir::IntegerAttr::get(mlir::IntegerType::get(m.getContext(), 64), cp));
    if (failed(Chunker(f, cp, comm == "p2p").run())) signalPassFailure();
  }
};

}  // namespace
}  // namespace loom
