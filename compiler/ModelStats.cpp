#include "compiler/ModelStats.h"

#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
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

bool isParam(mlir::Value v) {
  auto arg = mlir::dyn_cast<mlir::BlockArgument>(v);
  if (!arg) return false;
  auto f = mlir::dyn_cast<mlir::func::FuncOp>(arg.getOwner()->getParentOp());
  return f && f.getArgAttr(arg.getArgNumber(), attr::kParam);
}

}  // namespace

ModelStats computeModelStats(mlir::ModuleOp module) {
  ModelStats s;
  // Rows of the embedding table beyond the tokenizer's vocabulary (cross_entropy's
  // valid_vocab) are padding.
  int64_t vocab = 0, rows = 0;
  module.walk([&](CrossEntropyOp c) { vocab = c.getValidVocab(); });
  module.walk([&](EmbeddingOp e) { rows = mlir::cast<mlir::RankedTensorType>(e.getWord().getType()).getDimSize(0); });
  int64_t extraRows = vocab > 0 && rows > vocab ? rows - vocab : 0;

  module.walk([&](mlir::func::FuncOp f) {
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      if (f.getArgAttr(i, attr::kParam)) s.parameters += numElements(f.getArgument(i).getType());
      auto role = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kInput);
      if (role && role.getValue() == "tokens") s.tokensPerStep = numElements(f.getArgument(i).getType());
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
      // The padded rows of a (tied) output embedding and of its bias are padding too;
      // the word embedding's padded rows are counted at the embedding below.
      if (auto b = lin.getBias(); b && isParam(b) && mlir::isa<CrossEntropyOp>(*lin->user_begin()))
        s.vocabPaddingParameters += extraRows;
    } else if (auto attn = mlir::dyn_cast<AttentionOp>(op)) {
      auto out = mlir::cast<mlir::RankedTensorType>(attn.getResult().getType());
      int64_t seq = out.getShape()[1];
      flops = 4.0 * numElements(attn.getResult()) * seq;  // QK^T and PV: 2 b s s h each
    } else if (auto ga = mlir::dyn_cast<GroupedAttentionOp>(op)) {
      int64_t seq = mlir::cast<mlir::RankedTensorType>(ga.getResult().getType()).getShape()[1];
      flops = 4.0 * numElements(ga.getResult()) * seq;
    } else if (auto emb = mlir::dyn_cast<EmbeddingOp>(op)) {
      if (isParam(emb.getWord()))
        s.vocabPaddingParameters +=
            extraRows * mlir::cast<mlir::RankedTensorType>(emb.getWord().getType()).getShape()[1];
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
