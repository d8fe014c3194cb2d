// Lowering of partitioned loom programs to the plan protobufs the runtime executes.
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "protos/plan.pb.h"

namespace loom {

// The module attribute (an integer: blocks per GEMM) under which the lowering splits each GEMM
// whose result only a tensor-parallel all-reduce reads into blocks of rows, each block's
// all-reduce overlapping the next block's GEMM (parallel.tp_comm_overlap).
inline constexpr llvm::StringLiteral kTpCommOverlapAttr = "loom.tp_comm_overlap";

// One program: a buffer per SSA value, an instruction per op on its stream with the events
// it waits for, bindings of arguments and results, and a workspace arena in which
// activations share memory when their lifetimes do not overlap.
llvm::Expected<plan::Program> lowerProgram(mlir::func::FuncOp f);

// The workspace arena of a lowered program (each ACTIVATION buffer's offset, from its
// first_use and last_use, and workspace_bytes): activations used only on the compute stream
// share memory when their lifetimes do not overlap; the others are held for the whole program.
void planWorkspace(plan::Program &prog);

// FLOPs of one op (GEMMs and attention; elementwise ops counted as zero, as the PTD-P paper
// does) and the bytes a collective moves per rank (ring algorithms): the declaration's
// (plan/InstructionSet.h), from the op's operand shapes.
double flopsOf(mlir::Operation *op);
int64_t bytesMovedOf(mlir::Operation *op);


}  // namespace loom
