// One gradient rule per loom op, in one place (passes/GradientRules.cpp). A rule receives the
// forward op and the gradient of each of its results (null where a result has none) and
// returns the gradient of each operand (null where an operand gets none).
#pragma once

#include "llvm/ADT/SmallVector.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Operation.h"

namespace loom {

mlir::FailureOr<llvm::SmallVector<mlir::Value>> gradientOf(mlir::OpBuilder &b, mlir::Operation *op,
                                                           llvm::ArrayRef<mlir::Value> resultGrads);

}  // namespace loom
