// Helpers for pass tests: build a model, run passes, make deterministic parameters and
// batches, cut parameters into tensor-parallel shards, compare tensors.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "tests/passes/Interpreter.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace loom::test {

// Builds examples/models/NAME.pbtxt with dropout as given and the micro-batch given.
mlir::OwningOpRef<mlir::ModuleOp> buildExample(mlir::MLIRContext &ctx, const std::string &name,
                                               int64_t microBatch, float dropout = 0.0f, int64_t tp = 1);

// Runs passes on the module itself, e.g. "loom-tensor-parallel{tp=2},loom-autodiff".
mlir::LogicalResult runPipeline(mlir::ModuleOp module, const std::string &pipeline);

mlir::func::FuncOp trainStep(mlir::ModuleOp module);

// Parameters drawn as the IR's initializers say (normal with std, zeros, ones), perturbed so
// that zeros/ones are not trivially symmetric; then tokens/labels in [0, vocab), masks of ones.
std::vector<HostTensor> makeArguments(mlir::func::FuncOp f, int64_t vocab, uint32_t seed);

// The slice `part` of `parts` along `dim` of a full tensor.
HostTensor shardOf(const HostTensor &full, int64_t dim, int64_t parts, int64_t part);
// Concatenation of shards along `dim`.
HostTensor unshard(const std::vector<HostTensor> &shards, int64_t dim);
// Rows [begin, begin + count) of the batch dimension (dim 0) of a data tensor.
HostTensor batchSlice(const HostTensor &full, int64_t begin, int64_t count);

// Relative L2 error |a - b| / max(|b|, tiny).
double relativeError(const HostTensor &a, const HostTensor &b);

}  // namespace loom::test
