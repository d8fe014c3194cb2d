// Dialect registration and verification of Loom's discardable attributes.
#include "ir/LoomDialect.h"

#include "ir/ParamAttrs.h"
#include "llvm/ADT/StringSwitch.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"

#include "ir/LoomDialect.cpp.inc"

#define GET_OP_CLASSES
#include "ir/LoomOps.cpp.inc"

namespace loom {

void LoomDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "ir/LoomOps.cpp.inc"
      >();
}

static bool isOneOf(llvm::StringRef v, std::initializer_list<llvm::StringRef> allowed) {
  for (llvm::StringRef a : allowed)
    if (v == a) return true;
  return false;
}

mlir::LogicalResult LoomDialect::verifyRegionArgAttribute(mlir::Operation *op, unsigned,
                                                          unsigned argIndex,
                                                          mlir::NamedAttribute attr) {
  llvm::StringRef name = attr.getName().strref();
  auto fail = [&](const llvm::Twine &what) {
    return op->emitError() << "argument #" << argIndex << ": attribute '" << name << "' " << what;
  };
  if (name == attr::kParam) {
    auto s = mlir::dyn_cast<mlir::StringAttr>(attr.getValue());
    if (!s || s.getValue().empty()) return fail("must be a non-empty string (the parameter's name)");
    return mlir::success();
  }
  if (name == attr::kInit) {
    auto s = mlir::dyn_cast<mlir::StringAttr>(attr.getValue());
    if (!s || !isOneOf(s.getValue(), {"normal", "zeros", "ones"}))
      return fail("must be \"normal\", \"zeros\" or \"ones\"");
    return mlir::success();
  }
  if (name == attr::kInitStd) {
    auto f = mlir::dyn_cast<mlir::FloatAttr>(attr.getValue());
    if (!f || !(f.getValueAsDouble() > 0)) return fail("must be a positive float");
    return mlir::success();
  }
  if (name == attr::kInput) {
    auto s = mlir::dyn_cast<mlir::StringAttr>(attr.getValue());
    if (!s || !isOneOf(s.getValue(), {"tokens", "labels", "loss_mask", "attention_mask"}))
      return fail("must be \"tokens\", \"labels\", \"loss_mask\" or \"attention_mask\"");
    return mlir::success();
  }
  return fail("is not a known loom argument attribute");
}

mlir::LogicalResult LoomDialect::verifyOperationAttribute(mlir::Operation *op,
                                                          mlir::NamedAttribute attr) {
  llvm::StringRef name = attr.getName().strref();
  if (name == attr::kArchitecture) {
    auto s = mlir::dyn_cast<mlir::StringAttr>(attr.getValue());
    if (!s || !isOneOf(s.getValue(), {"gpt", "bert"}))
      return op->emitError() << "attribute '" << name << "' must be \"gpt\" or \"bert\"";
    return mlir::success();
  }
  bool isCount = isOneOf(name, {attr::kLayer, attr::kNumLayers, attr::kHiddenSize, attr::kNumHeads,
                                attr::kFfnHiddenSize, attr::kSeqLength, attr::kVocabSize,
                                attr::kPaddedVocabSize, attr::kTensorParallel});
  if (!isCount) return op->emitError() << "attribute '" << name << "' is not a known loom attribute";
  auto i = mlir::dyn_cast<mlir::IntegerAttr>(attr.getValue());
  bool ok = i && (name == attr::kLayer ? i.getInt() >= 0 : i.getInt() > 0);
  if (!ok)
    return op->emitError() << "attribute '" << name << "' must be a "
                           << (name == attr::kLayer ? "non-negative" : "positive") << " integer";
  return mlir::success();
}

}  // namespace loom
