// The `loom` Transformer dialect: ops at Transformer granularity plus the collectives
// the passes insert. See LoomOps.td for each op's math.
#pragma once

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "ir/LoomDialect.h.inc"

#define GET_OP_CLASSES
#include "ir/LoomOps.h.inc"
