// loom-recompute (see Passes.td). Runs on the partitioned programs.
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/StringSet.h"
#include "mlir/IR/IRMapping.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMRECOMPUTE
#include "passes/Passes.h.inc"

namespace {

constexpr llvm::StringLiteral kStash = "loom.stash";

int64_t layerOf(mlir::Operation *op) {
  auto l = op ? op->getAttrOfType<mlir::IntegerAttr>(attr::kLayer) : nullptr;
  return l ? l.getInt() : -1;
}

// Rewrites backward_k to recompute layer-internal activations from forward_k's checkpoints.
// kLayers: every layer-internal value (full recomputation). kGathers: only the all-gathers of
// a layer (sequence parallelism's gathered inputs of the column-parallel GEMMs), from their
// shards: Megatron's sequence parallelism keeps the sharded layer-norm output and gathers it
// again in the backward (Korthikanti et al. 2022, section 4.2.2), 2sbh/t bytes per GEMM input
// instead of 2sbh.
class Recomputer {
 public:
  enum Scope { kLayers, kGathers };
  Recomputer(mlir::func::FuncOp fwd, mlir::func::FuncOp bwd, Scope scope) : fwd_(fwd), bwd_(bwd), scope_(scope) {
    auto ret = mlir::cast<mlir::func::ReturnOp>(fwd.getBody().front().getTerminator());
    for (unsigned i = 0; i < fwd.getNumResults(); ++i)
      if (auto s = fwd.getResultAttrOfType<mlir::StringAttr>(i, kStash)) stashed_[s.getValue()] = ret.getOperand(i);
  }

  void run() {
    llvm::SmallVector<unsigned> replaced;
    for (unsigned i = 0; i < bwd_.getNumArguments(); ++i) {
      auto s = bwd_.getArgAttrOfType<mlir::StringAttr>(i, kStash);
      if (!s || !stashed_.count(s.getValue())) continue;
      mlir::Value v = stashed_[s.getValue()];
      mlir::BlockArgument arg = bwd_.getArgument(i);
      if (!recomputable(v) || arg.use_empty()) continue;
      mlir::Operation *firstUser = nullptr;
      for (mlir::Operation *u : arg.getUsers())
        if (!firstUser || u->isBeforeInBlock(firstUser)) firstUser = u;
      mlir::Value local = materialize(v, layerOf(v.getDefiningOp()), firstUser);
      arg.replaceAllUsesWith(local);
      replaced.push_back(i);
    }
    // Drop the stash arguments no longer used (and stashes no backward reads any more).
    llvm::BitVector erase(bwd_.getNumArguments());
    for (unsigned i : replaced)
      if (bwd_.getArgument(i).use_empty()) erase.set(i);
    (void)bwd_.eraseArguments(erase);
    pruneForwardStashes();
  }

 private:
  // A value is recomputed when it is produced inside a layer and used only inside that
  // layer in the forward program: layer outputs are the checkpoints.
  bool recomputable(mlir::Value v) {
    mlir::Operation *def = v.getDefiningOp();
    if (!def || mlir::isa<SendOp, RecvOp>(def)) return false;
    int64_t layer = layerOf(def);
    if (layer < 0) return false;
    if (scope_ == kGathers && !mlir::isa<AllGatherOp>(def)) return false;
    for (mlir::Operation *u : v.getUsers())
      if (!mlir::isa<mlir::func::ReturnOp>(u) && layerOf(u) != layer) return false;
    return true;
  }

  mlir::Value materialize(mlir::Value v, int64_t layer, mlir::Operation *before) {
    if (auto it = local_.find(v); it != local_.end()) return it->second;
    mlir::Value result;
    mlir::Operation *def = v.getDefiningOp();
    if (!def) {
      result = argumentFor(v);
    } else if (layerOf(def) != layer || !recomputable(v)) {
      result = stashArgument(v);  // a checkpoint: another layer's output, or received
    } else {
      mlir::IRMapping map;
      for (mlir::Value operand : def->getOperands()) map.map(operand, materialize(operand, layer, before));
      mlir::OpBuilder b(before);
      mlir::Operation *clone = b.clone(*def, map);
      clone->setAttr("loom.recomputed", b.getUnitAttr());
      for (auto [orig, copy] : llvm::zip(def->getResults(), clone->getResults())) local_[orig] = copy;
      return local_[v];
    }
    local_[v] = result;
    return result;
  }

  // A forward argument (parameter or input) as an argument of the backward program.
  mlir::Value argumentFor(mlir::Value v) {
    auto arg = mlir::cast<mlir::BlockArgument>(v);
    mlir::DictionaryAttr attrs = fwd_.getArgAttrDict(arg.getArgNumber());
    for (llvm::StringRef key : {attr::kParam.data(), attr::kInput.data(), kStash.data()}) {
      auto name = attrs ? attrs.getAs<mlir::StringAttr>(key) : nullptr;
      if (!name) continue;
      for (unsigned i = 0; i < bwd_.getNumArguments(); ++i)
        if (bwd_.getArgAttrOfType<mlir::StringAttr>(i, key) == name) return bwd_.getArgument(i);
    }
    bwd_.insertArgument(bwd_.getNumArguments(), v.getType(), attrs, v.getLoc());
    return bwd_.getArgument(bwd_.getNumArguments() - 1);
  }

  // A checkpoint: stashed by the forward program (once), read by the backward program.
  mlir::Value stashArgument(mlir::Value v) {
    std::string name;
    for (auto &[n, value] : stashed_)
      if (value == v) name = n.str();
    if (name.empty()) {
      name = "ckpt" + std::to_string(stashed_.size()) + "." + fwd_.getName().str();
      auto ret = mlir::cast<mlir::func::ReturnOp>(fwd_.getBody().front().getTerminator());
      ret->insertOperands(ret.getNumOperands(), v);
      mlir::Builder b(fwd_.getContext());
      fwd_.insertResult(fwd_.getNumResults(), v.getType(),
                        b.getDictionaryAttr({b.getNamedAttr(kStash, b.getStringAttr(name))}));
      stashed_[name] = v;
    }
    mlir::Builder b(bwd_.getContext());
    for (unsigned i = 0; i < bwd_.getNumArguments(); ++i)
      if (auto s = bwd_.getArgAttrOfType<mlir::StringAttr>(i, kStash); s && s.getValue() == name)
        return bwd_.getArgument(i);
    bwd_.insertArgument(bwd_.getNumArguments(), v.getType(),
                        b.getDictionaryAttr({b.getNamedAttr(kStash, b.getStringAttr(name))}), v.getLoc());
    return bwd_.getArgument(bwd_.getNumArguments() - 1);
  }

  void pruneForwardStashes() {
    llvm::StringSet<> read;
    for (unsigned i = 0; i < bwd_.getNumArguments(); ++i)
      if (auto s = bwd_.getArgAttrOfType<mlir::StringAttr>(i, kStash)) read.insert(s.getValue());
    auto ret = mlir::cast<mlir::func::ReturnOp>(fwd_.getBody().front().getTerminator());
    llvm::BitVector erase(fwd_.getNumResults());
    for (unsigned i = 0; i < fwd_.getNumResults(); ++i)
      if (auto s = fwd_.getResultAttrOfType<mlir::StringAttr>(i, kStash); s && !read.contains(s.getValue()))
        erase.set(i);
    for (int i = int(fwd_.getNumResults()) - 1; i >= 0; --i)
      if (erase.test(i)) ret->eraseOperand(i);
    (void)fwd_.eraseResults(erase);
  }

  mlir::func::FuncOp fwd_, bwd_;
  Scope scope_;
  llvm::StringMap<mlir::Value> stashed_;
  llvm::DenseMap<mlir::Value, mlir::Value> local_;
};

struct RecomputePass : impl::LoomRecomputeBase<RecomputePass> {
  using LoomRecomputeBase::LoomRecomputeBase;
  void runOnOperation() override {
    mlir::ModuleOp m = getOperation();
    if (mode == "selective") {
      m.emitError() << "loom-recompute: mode 'selective' would change nothing: the attention backward always "
                       "recomputes the probabilities (use none or full)";
      return signalPassFailure();
    }
    if (mode != "none" && mode != "full") {
      m.emitError() << "loom-recompute: mode must be none or full, got '" << mode << "'";
      return signalPassFailure();
    }
    m->setAttr("loom.recompute", mlir::StringAttr::get(&getContext(), mode));
    Recomputer::Scope scope = mode == "full" ? Recomputer::kLayers : Recomputer::kGathers;
    // A backward program and the forward program of its virtual stage, by their typed kinds.
    auto kindOf = [](mlir::func::FuncOp f) {
      auto k = f->getAttrOfType<mlir::StringAttr>(attr::kProgramKind);
      return k ? k.getValue() : llvm::StringRef();
    };
    auto stageOf = [](mlir::func::FuncOp f) { return f->getAttrOfType<mlir::IntegerAttr>(attr::kStage); };
    for (auto bwd : llvm::make_early_inc_range(m.getOps<mlir::func::FuncOp>())) {
      if (kindOf(bwd) != "backward") continue;
      mlir::func::FuncOp fwd;
      for (auto f : m.getOps<mlir::func::FuncOp>())
        if (kindOf(f) == "forward" && stageOf(f) == stageOf(bwd)) fwd = f;
      if (!fwd) {
        bwd.emitError() << "loom-recompute: no forward program for " << bwd.getName();
        return signalPassFailure();
      }
      Recomputer(fwd, bwd, scope).run();
    }
  }
};

}  // namespace
}  // namespace loom
