// loom-pipeline-stages (see Passes.td).
#include <set>

#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "llvm/Support/FormatVariadic.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMPIPELINESTAGES
#include "passes/Passes.h.inc"

namespace {

mlir::IntegerAttr i64(mlir::MLIRContext *ctx, int64_t v) {
  return mlir::IntegerAttr::get(mlir::IntegerType::get(ctx, 64), v);
}

struct PipelineStagesPass : impl::LoomPipelineStagesBase<PipelineStagesPass> {
  using LoomPipelineStagesBase::LoomPipelineStagesBase;

  void runOnOperation() override {
    mlir::ModuleOp m = getOperation();
    auto f = m.lookupSymbol<mlir::func::FuncOp>("train_step");
    if (!f) return fail(m, "no func.func @train_step");
    if (pipelineParallel < 1 || virtualStages < 1)
      return fail(m, llvm::formatv("pp ({0}) and vp ({1}) must be >= 1", int64_t(pipelineParallel),
                                   int64_t(virtualStages)).str());
    if (pipelineParallel == 1 && virtualStages > 1)
      return fail(m, llvm::formatv("vp = {0} chunks need pp >= 2 stages", int64_t(virtualStages)).str());
    // The layers are the ops' loom.layer values, which must number them 0 .. L-1.
    std::set<int64_t> layerIds;
    f.walk([&](mlir::Operation *op) {
      if (auto l = op->getAttrOfType<mlir::IntegerAttr>(attr::kLayer)) layerIds.insert(l.getInt());
    });
    int64_t layers = int64_t(layerIds.size()), p = pipelineParallel, v = virtualStages, stages = p * v;
    if (layers > 0 && *layerIds.rbegin() != layers - 1)
      return fail(m, llvm::formatv("the ops' loom.layer values must number the layers 0 .. L-1, but there are {0} "
                                   "distinct values up to {1}", layers, *layerIds.rbegin()).str());
    if (layers == 0 && stages > 1)
      return fail(m, llvm::formatv("p * v = {0} pipeline stages need Transformer layers (ops tagged loom.layer), "
                                   "and no op has one", stages).str());
    mlir::MLIRContext *ctx = m.getContext();

    // First layer of each virtual stage.
    llvm::SmallVector<int64_t> firstLayer;
    if (layout.empty()) {
      if (layers % stages != 0)
        return fail(m, llvm::formatv("p * v = {0} * {1} = {2} does not divide the {3} layers (give a layout)", p, v,
                                     stages, layers)
                           .str());
      for (int64_t k = 0; k < stages; ++k) firstLayer.push_back(k * layers / stages);
    } else {
      if (int64_t(layout.size()) != stages)
        return fail(m, llvm::formatv("layout has {0} entries but p * v = {1}", layout.size(), stages).str());
      int64_t sum = 0;
      for (int64_t n : layout) {
        if (n < 1) return fail(m, "every virtual stage of the layout needs at least one layer");
        firstLayer.push_back(sum);
        sum += n;
      }
      if (sum != layers)
        return fail(m, llvm::formatv("layout sums to {0} layers but the model has {1}", sum, layers).str());
    }
    auto stageOfLayer = [&](int64_t l) {
      return int64_t(std::upper_bound(firstLayer.begin(), firstLayer.end(), l) - firstLayer.begin()) - 1;
    };

    // Layered ops by their layer; others before the layers (no layered input) to stage 0,
    // after them to the last stage.
    llvm::DenseSet<mlir::Operation *> afterLayers;
    for (mlir::Operation &op : f.getBody().front().without_terminator()) {
      int64_t stage;
      if (auto l = op.getAttrOfType<mlir::IntegerAttr>(attr::kLayer)) {
        stage = stageOfLayer(l.getInt());
        afterLayers.insert(&op);
      } else {
        bool after = llvm::any_of(op.getOperands(), [&](mlir::Value x) {
          return x.getDefiningOp() && afterLayers.contains(x.getDefiningOp());
        });
        if (after) afterLayers.insert(&op);
        stage = after ? stages - 1 : 0;
      }
      op.setAttr(attr::kStage, i64(ctx, stage));
    }
    m->setAttr("loom.pipeline_parallel_size", i64(ctx, p));
    m->setAttr("loom.virtual_pipeline_size", i64(ctx, v));
    if (p > 1) untie(f, p);
  }

  // A parameter used on several physical stages gets one copy per extra stage.
  void untie(mlir::func::FuncOp f, int64_t p) {
    mlir::OpBuilder b(f.getContext());
    unsigned firstInput = f.getNumArguments();
    for (unsigned a = 0; a < f.getNumArguments(); ++a)
      if (f.getArgAttr(a, attr::kInput)) {
        firstInput = a;
        break;
      }
    for (unsigned a = 0; a < firstInput; ++a) {
      auto name = f.getArgAttrOfType<mlir::StringAttr>(a, attr::kParam);
      if (!name) continue;
      mlir::BlockArgument arg = f.getArgument(a);
      std::map<int64_t, llvm::SmallVector<mlir::OpOperand *>> usesByStage;
      for (mlir::OpOperand &use : arg.getUses())
        usesByStage[use.getOwner()->getAttrOfType<mlir::IntegerAttr>(attr::kStage).getInt() % p].push_back(&use);
      if (usesByStage.size() < 2) continue;
      // Only the tied word embedding (the input lookup and the output layer) is shared by two
      // stages; its copies' gradients are summed over the "embedding" group of the first and
      // last stage. Anything else shared across stages has no group to sum over.
      bool wordEmbedding = llvm::all_of(arg.getUses(), [](mlir::OpOperand &use) {
        auto lin = mlir::dyn_cast<LinearOp>(use.getOwner());
        return mlir::isa<EmbeddingOp>(use.getOwner()) || (lin && lin.getTransposeWeight());
      });
      if (!wordEmbedding || usesByStage.size() != 2 || usesByStage.begin()->first != 0 ||
          std::prev(usesByStage.end())->first != p - 1) {
        f.emitError() << "loom-pipeline-stages: parameter '" << name.getValue()
                      << "' is used on several pipeline stages; only the tied word embedding (first and last "
                         "stage) may be shared";
        signalPassFailure();
        return;
      }
      for (auto it = std::next(usesByStage.begin()); it != usesByStage.end(); ++it) {
        llvm::SmallVector<mlir::NamedAttribute> attrs(f.getArgAttrDict(a).getValue());
        for (auto &na : attrs)
          if (na.getName() == attr::kParam)
            na.setValue(b.getStringAttr(name.getValue() + ".stage" + std::to_string(it->first)));
        attrs.push_back(b.getNamedAttr(attr::kTiedTo, name));
        f.insertArgument(firstInput, arg.getType(), b.getDictionaryAttr(attrs), arg.getLoc());
        mlir::BlockArgument copy = f.getArgument(firstInput);
        ++firstInput;
        for (mlir::OpOperand *use : it->second) use->set(copy);
      }
    }
  }

  void fail(mlir::Operation *at, const std::string &msg) {
    at->emitError() << "loom-pipeline-stages: " << msg;
    signalPassFailure();
  }
};

}  // namespace
}  // namespace loom
