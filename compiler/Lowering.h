// Lowering of partitioned loom programs to the plan protobufs the runtime executes.
#pragma once

#include "llvm/Support/Error.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "protos/plan.pb.h"

namespace loom {

// One program: a buffer per SSA value, an instruction per op on its stream with the events
// it waits for, bindings of arguments and results, and a workspace arena in which
// activations share memory when their lifetimes do not overlap.
llvm::Expected<plan::Program> lowerProgram(mlir::func::FuncOp f);

// The workspace arena of a lowered program (each ACTIVATION buffer's offset, from its
// first_use and last_use, and workspace_bytes): activations used only on the compute stream
// share memory when their lifetimes do not overlap; the others are held for the whole program.
void planWorkspace(plan::Program &prog);

// FLOPs of one op (GEMMs and attention; elementwise ops counted as zero, as the PTD-P paper
// does) and the bytes a collective moves per rank (ring algorithms).
double flopsOf(mlir::Operation *op);
int64_t bytesMovedOf(mlir::Operation *op);
// A ring collective's bytes per rank over a group of g: factor x bytes x (g - 1) / g (2 for an
// all-reduce, 1 for an all-gather or reduce-scatter); 0 for one member.
inline int64_t ringBytesPerRank(int64_t bytes, int64_t g, int64_t factor) { return g <= 1 ? 0 : factor * bytes * (g - 1) / g; }

}  // namespace loom
