// `loomc compile`: model config + cluster spec -> one plan per rank, shared programs per
// pipeline stage, and a summary (parameters, peak memory, FLOPs, bytes per collective kind).
#pragma once

#include <string>

#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/IR/BuiltinOps.h"
#include "protos/cluster.pb.h"
#include "protos/model.pb.h"

namespace loom {

struct CompileOptions {
  std::string outDir;
  bool printIrAfterAll = false;  // dump the IR after each pass to stderr
  bool quiet = false;            // no summary on stdout
};

// Runs the pass pipeline on `module` (global train_step) for the cluster's parallel request.
llvm::Error runCompilerPasses(mlir::ModuleOp module, const config::ClusterSpec &cluster, int64_t microBatches,
                              bool printIrAfterAll);

llvm::Error compile(const config::ModelConfig &model, const config::ClusterSpec &cluster,
                    const CompileOptions &options, llvm::raw_ostream &summary);

}  // namespace loom
