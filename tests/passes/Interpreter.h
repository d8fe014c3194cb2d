// The reference interpreter: runs a loom function of any pass stage (global, tensor-parallel
// SPMD, differentiated, a pipeline program) on host tensors by lowering it to a plan program
// and executing that with the runtime's CPU executor, so every test of the passes exercises
// the lowering, the memory plan and the runtime's kernels as well.
#pragma once

#include <vector>

#include "llvm/Support/Error.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "runtime/Collectives.h"
#include "runtime/Tensor.h"

namespace loom {

struct InterpreterOptions {
  uint64_t seed = 1234;                // dropout seed
  Collectives *collectives = nullptr;  // required when the function has collectives
};

llvm::Expected<std::vector<HostTensor>> interpret(mlir::func::FuncOp func, const std::vector<HostTensor> &args,
                                                  const InterpreterOptions &options);

}  // namespace loom
