// Dialect registration and verification of Loom's discardable attributes.
#include "ir/LoomDialect.h"

#include "ir/ParamAttrs.h"
#include "llvm/ADT/StringSwitch.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

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
  if (name == attr::kShardDim || name == attr::kShardParts || name == attr::kPaddedDim || name == attr::kUnpaddedSize) {
    bool nonNegative = name == attr::kShardDim || name == attr::kPaddedDim;
    auto i = mlir::dyn_cast<mlir::IntegerAttr>(attr.getValue());
    if (!i || i.getInt() < (nonNegative ? 0 : 1))
      return fail(nonNegative ? "must be a non-negative integer" : "must be a positive integer");
    return mlir::success();
  }
  if (name == attr::kTpPartialGrad) {  // the size of the tp group the gradient is partial over
    auto i = mlir::dyn_cast<mlir::IntegerAttr>(attr.getValue());
    if (!i || i.getInt() < 1) return fail("must be a positive integer (the tp group's size)");
    return mlir::success();
  }
  if (name == attr::kShardGroup) {
    auto s = mlir::dyn_cast<mlir::StringAttr>(attr.getValue());
    if (!s || !isOneOf(s.getValue(), {"tp", "ep"})) return fail("must be \"tp\" or \"ep\"");
    return mlir::success();
  }
  if (name == attr::kTiedTo) {
    if (!mlir::isa<mlir::StringAttr>(attr.getValue())) return fail("must be a string (a parameter name)");
    return mlir::success();
  }
  if (name == attr::kGradOf || name == "loom.stash") {
    if (!mlir::isa<mlir::StringAttr>(attr.getValue())) return fail("must be a string");
    return mlir::success();
  }
  if (name == attr::kInput) {
    auto s = mlir::dyn_cast<mlir::StringAttr>(attr.getValue());
    if (!s || !isOneOf(s.getValue(), {"tokens", "labels", "loss_mask", "attention_mask", "token_types", "sop_labels",
                                      "sop_mask"}))
      return fail("must be \"tokens\", \"labels\", \"loss_mask\", \"attention_mask\", \"token_types\", "
                  "\"sop_labels\" or \"sop_mask\"");
    return mlir::success();
  }
  return fail("is not a known loom argument attribute");
}

mlir::LogicalResult LoomDialect::verifyRegionResultAttribute(mlir::Operation *op, unsigned,
                                                             unsigned resultIndex,
                                                             mlir::NamedAttribute attr) {
  // Results carry "loom.grad_of" (a gradient's parameter), "loom.stash" (an activation a
  // forward program keeps for its backward program), "loom.output" (the loss) or
  // "loom.loss_term" (one of the losses the loss sums, by name).
  llvm::StringRef name = attr.getName().strref();
  if ((name == attr::kGradOf || name == "loom.stash" || name == "loom.output" || name == "loom.loss_term") &&
      mlir::isa<mlir::StringAttr>(attr.getValue()))
    return mlir::success();
  return op->emitError() << "result #" << resultIndex << ": attribute '" << name
                         << "' is not a known loom result attribute";
}

mlir::LogicalResult LoomDialect::verifyOperationAttribute(mlir::Operation *op,
                                                          mlir::NamedAttribute attr) {
  llvm::StringRef name = attr.getName().strref();
  if (name == "loom.recompute") {
    auto s = mlir::dyn_cast<mlir::StringAttr>(attr.getValue());
    if (!s || !isOneOf(s.getValue(), {"none", "full", "selective"}))
      return op->emitError() << "attribute 'loom.recompute' must be \"none\", \"full\" or \"selective\"";
    return mlir::success();
  }
  if (name == "loom.recomputed" || name == "loom.zero1" || name == attr::kGradSync ||
      name == "loom.sequence_parallel" || name == attr::kReplicated) {
    if (!mlir::isa<mlir::UnitAttr>(attr.getValue()))
      return op->emitError() << "attribute '" << name << "' must be a unit attribute";
    return mlir::success();
  }
  if (name == attr::kParamsDtype) {
    auto s = mlir::dyn_cast<mlir::StringAttr>(attr.getValue());
    if (!s || !isOneOf(s.getValue(), {"f32", "bf16", "f16"}))
      return op->emitError() << "attribute '" << name << "' must be \"f32\", \"bf16\" or \"f16\"";
    return mlir::success();
  }
  if (name == attr::kLossName) {
    auto s = mlir::dyn_cast<mlir::StringAttr>(attr.getValue());
    if (!mlir::isa<CrossEntropyOp>(op) || !s || s.getValue().empty())
      return op->emitError() << "attribute '" << name << "' must be a non-empty string on a loom.cross_entropy";
    return mlir::success();
  }
  if (name == attr::kProgramKind) {
    auto s = mlir::dyn_cast<mlir::StringAttr>(attr.getValue());
    if (!s || !isOneOf(s.getValue(), {"forward", "backward", "grad_sync"}))
      return op->emitError() << "attribute '" << name << "' must be \"forward\", \"backward\" or \"grad_sync\"";
    return mlir::success();
  }
  if (name == attr::kBackward) {
    if (!mlir::isa<mlir::UnitAttr>(attr.getValue()))
      return op->emitError() << "attribute '" << name << "' must be a unit attribute";
    return mlir::success();
  }
  if (name == attr::kStage && mlir::isa<mlir::func::FuncOp>(op)) {
    auto i = mlir::dyn_cast<mlir::IntegerAttr>(attr.getValue());
    if (!i || i.getInt() < 0) return op->emitError() << "attribute 'loom.stage' must be a non-negative integer";
    return mlir::success();
  }
  bool isCount = isOneOf(name, {attr::kLayer, attr::kBucket, attr::kStage, attr::kVocabDivisibleBy, attr::kTensorParallel,
                                "loom.data_parallel_size", "loom.context_parallel_size", "loom.pipeline_parallel_size",
                                "loom.virtual_pipeline_size", "loom.micro_batches"});
  if (!isCount) return op->emitError() << "attribute '" << name << "' is not a known loom attribute";
  auto i = mlir::dyn_cast<mlir::IntegerAttr>(attr.getValue());
  bool nonNegative = name == attr::kLayer || name == attr::kBucket || name == attr::kStage;
  bool ok = i && (nonNegative ? i.getInt() >= 0 : i.getInt() > 0);
  if (!ok)
    return op->emitError() << "attribute '" << name << "' must be a "
                           << (nonNegative ? "non-negative" : "positive") << " integer";
  return mlir::success();
}

}  // namespace loom
