// Shared pieces of the command-line tools: one-line diagnostics, reading and verifying IR
// files, writing outputs without losing what was on disk.
#pragma once

#include <functional>
#include <string>

#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

namespace loom {

// Prints every diagnostic as one line "file:line:col: error: message" on stderr (MLIR's
// default handler adds source excerpts and notes over several lines).
class OneLineDiagnostics {
 public:
  explicit OneLineDiagnostics(mlir::MLIRContext &ctx);
  ~OneLineDiagnostics();

 private:
  mlir::MLIRContext &ctx_;
  uint64_t id_;
};

// Formats a location as "file:line:col" (or a best effort for other location kinds).
std::string formatLocation(mlir::Location loc);

// Parses an IR file ("-" for stdin) and verifies it; errors go through the context's
// diagnostic handlers. Returns null on failure.
mlir::OwningOpRef<mlir::ModuleOp> readModule(mlir::MLIRContext &ctx, const std::string &path);

// Writes to `path` ("-" for stdout) through a temporary file renamed into place, so an
// existing file is replaced only by complete output.
llvm::Error writeOutput(const std::string &path, std::function<void(llvm::raw_ostream &)> write);

// An error whose one-line message the context's diagnostic handler has already printed
// (an IR or pass error with its location); reportError prints nothing more for it.
llvm::Error diagnosticsReported();

// Prints "tool: error: message" for an llvm::Error and returns exit code 1.
int reportError(llvm::StringRef tool, llvm::Error err);

}  // namespace loom
