#include "tests/passes/Interpreter.h"

#include "compiler/Lowering.h"
#include "runtime/Executor.h"

namespace loom {

llvm::Expected<std::vector<HostTensor>> interpret(mlir::func::FuncOp func, const std::vector<HostTensor> &args,
                                                  const InterpreterOptions &options) {
  llvm::Expected<plan::Program> program = lowerProgram(func);
  if (!program) return program.takeError();
  std::vector<const HostTensor *> argPtrs;
  for (const HostTensor &a : args) argPtrs.push_back(&a);
  std::vector<HostTensor> results;
  ExecutionContext ctx;
  ctx.collectives = options.collectives;
  ctx.seed = options.seed;
  Status st = executeProgram(*program, argPtrs, results, ctx);
  if (!st.isOk()) return llvm::createStringError(llvm::inconvertibleErrorCode(), st.message());
  return results;
}

}  // namespace loom
