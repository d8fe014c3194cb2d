#include "passes/ModelFacts.h"

#include <functional>
#include <set>

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSet.h"

#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"

namespace loom {
namespace {

mlir::RankedTensorType tensorOf(mlir::Value v) { return mlir::dyn_cast<mlir::RankedTensorType>(v.getType()); }

std::string dtypeName(mlir::Type t) {
  if (t.isF32()) return "f32";
  if (t.isBF16()) return "bf16";
  if (t.isF16()) return "f16";
  std::string s;
  llvm::raw_string_ostream os(s);
  t.print(os);
  return s;
}

}  // namespace

LinearOp outputLayerOf(CrossEntropyOp loss) {
  auto out = loss.getLogits().getDefiningOp<LinearOp>();
  return out && out->hasOneUse() ? out : LinearOp();
}

llvm::SmallVector<mlir::Value> summedLosses(mlir::Value loss) {
  llvm::SmallVector<mlir::Value> losses;
  llvm::DenseSet<mlir::Value> seen;
  std::function<bool(mlir::Value)> collect = [&](mlir::Value v) -> bool {
    if (v.getDefiningOp<CrossEntropyOp>()) {
      losses.push_back(v);
      return seen.insert(v).second;  // each loss summed once
    }
    auto add = v.getDefiningOp<AddOp>();
    return add && mlir::cast<mlir::RankedTensorType>(v.getType()).getRank() == 0 && collect(add.getLhs()) &&
           collect(add.getRhs());
  };
  if (!collect(loss)) return {};
  return losses;
}

bool isClassifierLoss(CrossEntropyOp loss) {
  mlir::Value logits = loss.getLogits();
  if (auto gather = logits.getDefiningOp<AllGatherOp>()) logits = gather.getInput();  // sequence parallelism's
  auto out = logits.getDefiningOp<LinearOp>();
  return out && out->hasAttr(attr::kReplicated);
}

int64_t vocabDivisibleBy(mlir::ModuleOp module) {
  if (auto a = module->getAttrOfType<mlir::IntegerAttr>(attr::kVocabDivisibleBy)) return a.getInt();
  return kDefaultVocabDivisibleBy;
}

mlir::FailureOr<ModelFacts> readModelFacts(mlir::ModuleOp module) {
  ModelFacts facts;
  if (auto name = module.getSymName()) facts.name = name->str();
  auto f = module.lookupSymbol<mlir::func::FuncOp>("train_step");
  if (!f) return module.emitError() << "the module has no func.func @train_step (the model's training step)";
  if (f.isExternal()) return f.emitError() << "@train_step has no body";

  llvm::StringSet<> names;
  for (unsigned i = 0; i < f.getNumArguments(); ++i) {
    auto role = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kInput);
    bool param = bool(f.getArgAttr(i, attr::kParam));
    if (!role && !param)
      return f.emitError() << "argument " << i << " of @train_step has neither loom.param (a parameter) nor "
                           << "loom.input (tokens, labels, loss_mask, attention_mask)";
    if (param) {
      llvm::StringRef name = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam).getValue();
      if (!names.insert(name).second)
        return f.emitError() << "two parameter arguments are named '" << name << "' (loom.param names are unique)";
      auto init = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kInit);
      if (!init)
        return f.emitError() << "parameter '" << name << "' (argument " << i
                             << ") has no loom.init (\"normal\" with loom.init_std, \"zeros\" or \"ones\")";
      if (init.getValue() == "normal" && !f.getArgAttr(i, attr::kInitStd))
        return f.emitError() << "parameter '" << name << "' (argument " << i
                             << ") has loom.init = \"normal\" but no loom.init_std";
    }
    if (param && facts.paramsDtype.empty()) {
      if (auto policy = module->getAttrOfType<mlir::StringAttr>(attr::kParamsDtype))
        facts.paramsDtype = policy.str();
      else if (auto t = tensorOf(f.getArgument(i)))
        facts.paramsDtype = dtypeName(t.getElementType());
    }
    if (role && role.getValue() == "tokens") {
      auto t = tensorOf(f.getArgument(i));
      if (!t || t.getRank() != 2)
        return f.emitError() << "the tokens argument must be a [batch, seq] tensor, got " << f.getArgument(i).getType();
      facts.batch = t.getDimSize(0);
      facts.seqLength = t.getDimSize(1);
    }
  }
  if (facts.seqLength == 0) return f.emitError() << "@train_step has no argument with loom.input = \"tokens\"";

  std::set<int64_t> layers;
  bool sawCausal = false, sawBidirectional = false, sawLlama = false, sawSecondMoe = false;
  int64_t firstMoeLayer = -1;
  mlir::Value word, outputWeight;
  mlir::WalkResult walk = f.walk([&](mlir::Operation *op) -> mlir::WalkResult {
    if (auto l = op->getAttrOfType<mlir::IntegerAttr>(attr::kLayer)) layers.insert(l.getInt());
    if (auto e = mlir::dyn_cast<EmbeddingOp>(op); e && facts.hiddenSize == 0) {
      facts.hiddenSize = tensorOf(e.getResult()).getDimSize(2);
      facts.wordRows = tensorOf(e.getWord()).getDimSize(0);
      word = e.getWord();
      if (e.getPosition()) facts.maxPositions = tensorOf(e.getPosition()).getDimSize(0);
    } else if (auto p = mlir::dyn_cast<AddPositionOp>(op); p && facts.maxPositions == 0) {
      facts.maxPositions = tensorOf(p.getPosition()).getDimSize(0);
    } else if (auto a = mlir::dyn_cast<AttentionOp>(op)) {
      if (facts.numHeads == 0) facts.numHeads = facts.numKvHeads = a.getNumHeads();
      (a.getCausal() ? sawCausal : sawBidirectional) = true;
    } else if (auto a = mlir::dyn_cast<GroupedAttentionOp>(op)) {
      if (facts.numHeads == 0) facts.numHeads = a.getNumHeads(), facts.numKvHeads = a.getNumKvHeads();
      (a.getCausal() ? sawCausal : sawBidirectional) = true;
      sawLlama = true;
    } else if (mlir::isa<GeluOp, SwigluOp>(op) && facts.ffnHiddenSize == 0 && op->hasAttr(attr::kLayer)) {
      facts.ffnHiddenSize = tensorOf(op->getResult(0)).getShape().back();
    } else if (auto m = mlir::dyn_cast<MoeOp>(op)) {
      auto layer = op->getAttrOfType<mlir::IntegerAttr>(attr::kLayer);
      if (facts.numExperts == 0) {
        facts.numExperts = tensorOf(m.getGate()).getDimSize(0);
        facts.expertsPerToken = m.getTopK();
        facts.routerAuxLossCoef = m.getAuxLossCoef().convertToDouble();
        facts.capacityFactor = m.getCapacityFactor().convertToDouble();
        facts.moeLayerFreq = 1;
        if (facts.ffnHiddenSize == 0) facts.ffnHiddenSize = tensorOf(m.getGate()).getDimSize(1);
        firstMoeLayer = layer ? layer.getInt() : -1;
      } else if (!sawSecondMoe && layer && firstMoeLayer >= 0 && layer.getInt() > firstMoeLayer) {
        facts.moeLayerFreq = layer.getInt() - firstMoeLayer;
        sawSecondMoe = true;
      }
    } else if (auto n = mlir::dyn_cast<LayerNormOp>(op); n && facts.normEpsilon == 0) {
      facts.normEpsilon = n.getEpsilon().convertToDouble();
    } else if (auto n = mlir::dyn_cast<RmsNormOp>(op)) {
      if (facts.normEpsilon == 0) facts.normEpsilon = n.getEpsilon().convertToDouble();
      sawLlama = true;
    } else if (auto r = mlir::dyn_cast<RotaryOp>(op); r && facts.ropeTheta == 0) {
      facts.ropeTheta = r.getTheta().convertToDouble();
    } else if (auto c = mlir::dyn_cast<CrossEntropyOp>(op); c && !isClassifierLoss(c)) {
      if (LinearOp out = outputLayerOf(c)) outputWeight = out.getWeight();
      if (facts.vocabSize != 0 && facts.vocabSize != int64_t(c.getValidVocab()))
        return op->emitOpError() << "valid_vocab = " << c.getValidVocab() << " differs from an earlier cross_entropy's "
                                 << facts.vocabSize;
      facts.vocabSize = c.getValidVocab();
    }
    return mlir::WalkResult::advance();
  });
  if (walk.wasInterrupted()) return mlir::failure();
  if (facts.hiddenSize == 0) return f.emitError() << "@train_step has no loom.embedding (the token embedding)";
  if (facts.vocabSize == 0) return f.emitError() << "@train_step has no loom.cross_entropy (the loss)";
  if (sawCausal && sawBidirectional)
    return f.emitError() << "@train_step mixes causal and bidirectional attention (neither GPT nor BERT)";
  facts.architecture = sawBidirectional ? "bert" : sawLlama ? "llama" : "gpt";
  facts.tiedEmbeddings = word && word == outputWeight;
  facts.numLayers = int64_t(layers.size());
  return facts;
}

}  // namespace loom
