#include "compiler/ModelStats.h"

#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "passes/ModelFacts.h"
#include "llvm/ADT/DenseSet.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace loom {
namespace {

// Elements with a dynamic (batch) dimension counted as 1: per-sample counts, so per-token
// figures do not depend on the batch.
int64_t numElements(mlir::Type t) {
  int64_t n = 1;
  for (int64_t d : mlir::cast<mlir::RankedTensorType>(t).getShape()) n *= mlir::ShapedType::isDynamic(d) ? 1 : d;
  return n;
}
int64_t numElements(mlir::Value v) { return numElements(v.getType()); }

}  // namespace

ModelStats computeModelStats(mlir::ModuleOp module) {
  ModelStats s;
  // Vocabulary padding: what loom-pad-vocab recorded on the parameters it padded; in IR padded
  // by hand, the entries of the embedding table and the output layer beyond the tokenizer's
  // vocabulary (cross_entropy's valid_vocab) along their vocabulary dimension.
  int64_t vocab = 0;
  llvm::DenseMap<mlir::Value, int64_t> vocabDim;  // parameter -> its vocabulary dimension
  module.walk([&](EmbeddingOp e) { vocabDim[e.getWord()] = 0; });
  module.walk([&](CrossEntropyOp c) {
    if (isClassifierLoss(c)) return;
    vocab = c.getValidVocab();
    if (LinearOp out = outputLayerOf(c)) {
      vocabDim[out.getWeight()] = out.getTransposeWeight() ? 0 : 1;
      if (out.getBias()) vocabDim[out.getBias()] = 0;
    }
  });

  module.walk([&](mlir::func::FuncOp f) {
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      auto role = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kInput);
      if (role && role.getValue() == "tokens") s.tokensPerStep = numElements(f.getArgument(i).getType());
      if (!f.getArgAttr(i, attr::kParam)) continue;
      auto type = mlir::cast<mlir::RankedTensorType>(f.getArgument(i).getType());
      int64_t n = numElements(type);
      s.parameters += n;
      if (auto real = f.getArgAttrOfType<mlir::IntegerAttr>(i, attr::kUnpaddedSize)) {
        int64_t dim = f.getArgAttrOfType<mlir::IntegerAttr>(i, attr::kPaddedDim).getInt();
        s.vocabPaddingParameters += n / type.getDimSize(dim) * (type.getDimSize(dim) - real.getInt());
      } else if (auto d = vocabDim.find(f.getArgument(i)); d != vocabDim.end() && vocab > 0 &&
                                                            type.getDimSize(d->second) > vocab) {
        s.vocabPaddingParameters += n / type.getDimSize(d->second) * (type.getDimSize(d->second) - vocab);
      }
    }
  });

  // A sentence-level head (BERT's pooler and sentence-order classifier) runs at every position,
  // but its loss reads one position per sample: the model needs its FLOPs once per sample, not
  // per token. Those are the ops whose results reach nothing but a classifier loss.
  llvm::DenseSet<mlir::Operation *> perSample;
  module.walk([&](CrossEntropyOp c) {
    if (!isClassifierLoss(c)) return;
    llvm::SmallVector<mlir::Value> pending{c.getLogits()};
    while (!pending.empty()) {
      mlir::Operation *def = pending.pop_back_val().getDefiningOp();
      if (!def || perSample.contains(def)) continue;
      bool onlyTheHead = llvm::all_of(def->getUsers(), [&](mlir::Operation *user) {
        return user == c.getOperation() || perSample.contains(user);
      });
      if (!onlyTheHead) continue;
      perSample.insert(def);
      for (mlir::Value v : def->getOperands()) pending.push_back(v);
    }
  });

  module.walk([&](mlir::Operation *op) {
    if (op->getDialect() && op->getDialect()->getNamespace() == "loom")
      ++s.opHistogram[op->getName().getStringRef().str()];
    bool inLayer = op->hasAttr(attr::kLayer);
    double flops = 0;
    if (auto lin = mlir::dyn_cast<LinearOp>(op)) {
      auto in = mlir::cast<mlir::RankedTensorType>(lin.getInput().getType());
      flops = 2.0 * numElements(lin.getResult()) * in.getShape().back();
    } else if (auto attn = mlir::dyn_cast<AttentionOp>(op)) {
      auto out = mlir::cast<mlir::RankedTensorType>(attn.getResult().getType());
      int64_t seq = out.getShape()[1];
      flops = 4.0 * numElements(attn.getResult()) * seq;  // QK^T and PV: 2 b s s h each
    } else if (auto ga = mlir::dyn_cast<GroupedAttentionOp>(op)) {
      int64_t seq = mlir::cast<mlir::RankedTensorType>(ga.getResult().getType()).getShape()[1];
      flops = 4.0 * numElements(ga.getResult()) * seq;
    } else if (auto moe = mlir::dyn_cast<MoeOp>(op)) {
      // Each token through its top_k experts: gate, up and down, 2 H F each (the router is a
      // loom.linear, counted as one).
      int64_t ffn = mlir::cast<mlir::RankedTensorType>(moe.getGate().getType()).getShape()[1];
      flops = 6.0 * numElements(moe.getResult()) * ffn * double(moe.getTopK());
    }
    if (flops > 0 && perSample.contains(op)) {  // one position of [batch, seq, ...]
      auto out = mlir::cast<mlir::RankedTensorType>(op->getResult(0).getType());
      if (out.getRank() >= 3 && !mlir::ShapedType::isDynamic(out.getShape()[1])) flops /= double(out.getShape()[1]);
    }
    s.forwardFlops += flops;
    if (inLayer) s.forwardFlopsInLayers += flops;
  });
  return s;
}

double ptdpFlopsPerToken(int64_t l, int64_t h, int64_t s, int64_t v) {
  double L = l, H = h, S = s, V = v;
  return 96.0 * L * H * H * (1.0 + S / (6.0 * H) + V / (16.0 * L * H));
}

}  // namespace loom
