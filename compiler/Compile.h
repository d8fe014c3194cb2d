// `loomc compile`: Transformer IR (or a model config, built into IR) + cluster spec -> one plan per rank, shared programs per
// pipeline stage, and a summary (parameters, peak memory, FLOPs, bytes per collective kind).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "plan/BackendMemory.h"
#include "plan/CompiledPlans.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/IR/BuiltinOps.h"
#include "protos/cluster.pb.h"
#include "protos/model.pb.h"
#include "protos/plan.pb.h"

namespace loom {

struct CompileOptions {
  std::string outDir;
  bool printIrAfterAll = false;  // dump the IR after each pass to stderr
  bool quiet = false;            // no summary on stdout
  std::string modelName;         // the model's name when the module has no symbol name
  bool progress = false;         // progress lines on a terminal (support/ProgressMeter.h)
  // What the cluster's backend allocates beyond the plan's buffers (required: loomc passes the
  // runtime's, runtime/BackendMemory.h).
  plan::BackendMemoryModel backendMemory;
};

// Runs the pass pipeline on `module` (global train_step) for the cluster's parallel request.
// `afterShapes`, when given, sees the module once the batch and the vocabulary are shaped for
// the layout and before anything partitions it (the global model's FLOPs are counted there).
// `stageLayout`, when given, receives the layers per virtual stage used (empty: even).
llvm::Error runCompilerPasses(mlir::ModuleOp module, const config::ClusterSpec &cluster, int64_t microBatches,
                              bool printIrAfterAll, const std::function<void(mlir::ModuleOp)> &afterShapes = {},
                              std::vector<int64_t> *stageLayout = nullptr);

// Compiles `module`: one func.func @train_step over global shapes (no t, the batch possibly
// dynamic); every model fact the plans carry is read from its ops. The module is rewritten
// by the passes. Errors in the IR are reported through the context's diagnostic handler
// (diagnosticsReported()).
llvm::Error compile(mlir::ModuleOp module, const config::ClusterSpec &cluster, const CompileOptions &options,
                    llvm::raw_ostream &summary);

// The same compile without writing anything: the programs of each pipeline stage, every
// rank's plan (checked, memory included) and the summary's parts.
llvm::Error compileInMemory(mlir::ModuleOp module, const config::ClusterSpec &cluster, const CompileOptions &opt,
                            CompiledPlans *out);

// `loomc build` then the same compile.
llvm::Error compile(const config::ModelConfig &model, const config::ClusterSpec &cluster,
                    const CompileOptions &options, llvm::raw_ostream &summary);

}  // namespace loom
