#include "compiler/ToolSupport.h"

#include <algorithm>

#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Support/FileUtilities.h"

namespace loom {

std::string formatLocation(mlir::Location loc) {
  if (auto f = mlir::dyn_cast<mlir::FileLineColLoc>(loc))
    return (f.getFilename().strref() + ":" + llvm::Twine(f.getLine()) + ":" +
            llvm::Twine(f.getColumn()))
        .str();
  if (auto n = mlir::dyn_cast<mlir::NameLoc>(loc)) return n.getName().str();
  if (auto c = mlir::dyn_cast<mlir::CallSiteLoc>(loc)) return formatLocation(c.getCaller());
  if (auto fused = mlir::dyn_cast<mlir::FusedLoc>(loc))
    if (!fused.getLocations().empty()) return formatLocation(fused.getLocations().front());
  std::string s;
  llvm::raw_string_ostream os(s);
  os << loc;
  return s;
}

static const char *severityName(mlir::DiagnosticSeverity s) {
  switch (s) {
    case mlir::DiagnosticSeverity::Error: return "error";
    case mlir::DiagnosticSeverity::Warning: return "warning";
    case mlir::DiagnosticSeverity::Note: return "note";
    case mlir::DiagnosticSeverity::Remark: return "remark";
  }
  return "error";
}

OneLineDiagnostics::OneLineDiagnostics(mlir::MLIRContext &ctx) : ctx_(ctx) {
  id_ = ctx.getDiagEngine().registerHandler([](mlir::Diagnostic &d) {
    std::string msg = d.str();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    // MLIR's parser suggests a flag our tools do not have.
    if (llvm::StringRef(msg).starts_with("operation being parsed with an unregistered dialect"))
      msg = "operation of an unknown dialect (Loom's tools know the 'loom' and 'func' dialects)";
    llvm::errs() << formatLocation(d.getLocation()) << ": " << severityName(d.getSeverity())
                 << ": " << msg << "\n";
    return mlir::success();
  });
}

OneLineDiagnostics::~OneLineDiagnostics() { ctx_.getDiagEngine().eraseHandler(id_); }

mlir::OwningOpRef<mlir::ModuleOp> readModule(mlir::MLIRContext &ctx, const std::string &path) {
  std::string err;
  auto buffer = mlir::openInputFile(path, &err);
  if (!buffer) {
    mlir::emitError(mlir::FileLineColLoc::get(&ctx, path, 0, 0)) << "cannot open file: " << err;
    return nullptr;
  }
  llvm::SourceMgr sm;
  sm.AddNewSourceBuffer(std::move(buffer), llvm::SMLoc());
  // parseSourceFile verifies the module after parsing.
  return mlir::parseSourceFile<mlir::ModuleOp>(sm, &ctx);
}

llvm::Error writeOutput(const std::string &path, std::function<void(llvm::raw_ostream &)> write) {
  return llvm::writeToOutput(path, [&](llvm::raw_ostream &os) {
    write(os);
    return llvm::Error::success();
  });
}

static constexpr llvm::StringLiteral kReported = "(reported by the diagnostic handler)";

llvm::Error diagnosticsReported() { return llvm::createStringError(llvm::inconvertibleErrorCode(), kReported); }

int reportError(llvm::StringRef tool, llvm::Error err) {
  llvm::handleAllErrors(std::move(err), [&](const llvm::ErrorInfoBase &e) {
    std::string msg = e.message();
    if (msg == kReported) return;
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    // Messages from the loaders already start with "path: error:".
    if (llvm::StringRef(msg).contains(": error: "))
      llvm::errs() << msg << "\n";
    else
      llvm::errs() << tool << ": error: " << msg << "\n";
  });
  return 1;
}

}  // namespace loom
