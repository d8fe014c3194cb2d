// Loom IR text (what `loomc compile` reads) through MLIR's parser and the loom dialect's
// verifiers. Whatever parses and verifies must print and parse back to the same text.
#include <memory>
#include <string>

#include "fuzz/FuzzSupport.h"
#include "ir/LoomDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

namespace {

// One context for many inputs (loading dialects costs more than a parse); a fresh one every
// 4096 inputs, so that uniqued attributes and types do not pile up.
mlir::MLIRContext &context() {
  static std::unique_ptr<mlir::MLIRContext> ctx;
  static int uses = 0;
  if (!ctx || ++uses % 4096 == 0) {
    ctx = std::make_unique<mlir::MLIRContext>(mlir::MLIRContext::Threading::DISABLED);
    ctx->loadDialect<loom::LoomDialect, mlir::func::FuncDialect>();
    ctx->getDiagEngine().registerHandler([](mlir::Diagnostic &) { return mlir::success(); });
  }
  return *ctx;
}

std::string print(mlir::ModuleOp m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  m.print(os, mlir::OpPrintingFlags().enableDebugInfo(false));
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mlir::MLIRContext &ctx = context();
  std::string text(reinterpret_cast<const char *>(data), size);
  mlir::OwningOpRef<mlir::ModuleOp> m = mlir::parseSourceString<mlir::ModuleOp>(text, &ctx);  // verifies
  if (!m) return 0;
  std::string printed = print(*m);
  mlir::OwningOpRef<mlir::ModuleOp> again = mlir::parseSourceString<mlir::ModuleOp>(printed, &ctx);
  if (!again) loom::fuzz::invariantBroken("verified IR does not parse back after printing:\n" + printed);
  if (print(*again) != printed) loom::fuzz::invariantBroken("printing is not stable:\n" + printed);
  return 0;
}
