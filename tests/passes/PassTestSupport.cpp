#include "tests/passes/PassTestSupport.h"

#include <cmath>
#include <cstring>

#include "config/ConfigLoader.h"
#include "compiler/ModelBuilder.h"
#include "ir/ParamAttrs.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "passes/Passes.h"

namespace loom::test {

mlir::LogicalResult runPipeline(mlir::ModuleOp module, const std::string &pipeline) {
  static bool registered = [] {
    registerLoomPasses();
    return true;
  }();
  (void)registered;
  auto pm = mlir::PassManager::on<mlir::ModuleOp>(module.getContext());
  if (failed(mlir::parsePassPipeline(pipeline, pm, llvm::errs()))) return mlir::failure();
  return pm.run(module);
}

mlir::OwningOpRef<mlir::ModuleOp> buildExample(mlir::MLIRContext &ctx, const std::string &name, int64_t microBatch,
                                               float dropout, int64_t tp) {
  auto cfg = loadModelConfig("examples/models/" + name + ".pbtxt");
  if (!cfg) {
    llvm::errs() << llvm::toString(cfg.takeError()) << "\n";
    return nullptr;
  }
  cfg->set_hidden_dropout(dropout);
  cfg->set_attention_dropout(dropout);
  auto module = buildModel(ctx, *cfg, {.microBatch = microBatch});
  // Megatron's vocabulary padding for t, as loomc compile does it.
  if (failed(runPipeline(*module, "loom-pad-vocab{multiple=" + std::to_string(128 * tp) + "}"))) return nullptr;
  return module;
}

mlir::func::FuncOp trainStep(mlir::ModuleOp module) { return module.lookupSymbol<mlir::func::FuncOp>("train_step"); }

std::vector<HostTensor> makeArguments(mlir::func::FuncOp f, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<HostTensor> args;
  for (unsigned i = 0; i < f.getNumArguments(); ++i) {
    auto type = mlir::cast<mlir::RankedTensorType>(f.getArgument(i).getType());
    HostTensor t{{type.getShape().begin(), type.getShape().end()}};
    auto role = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kInput);
    if (role && type.getElementType().isInteger(32)) {
      t.isInt = true;
      // Token ids over the vocabulary; BERT's segments and sentence-order labels are 0 or 1.
      bool binary = role.getValue() == "token_types" || role.getValue() == "sop_labels";
      std::uniform_int_distribution<int32_t> tok(0, binary ? 1 : int32_t(vocab) - 1);
      for (int64_t k = 0; k < t.numel(); ++k) t.ints.push_back(tok(rng));
    } else if (role) {
      t.data.assign(t.numel(), 1.0f);
    } else {
      auto init = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kInit);
      auto stdAttr = f.getArgAttrOfType<mlir::FloatAttr>(i, attr::kInitStd);
      // Larger than the real initialisation so that activations and gradients are O(1).
      std::normal_distribution<float> normal(0.0f, stdAttr ? 10 * float(stdAttr.getValueAsDouble()) : 0.1f);
      float base = init && init.getValue() == "ones" ? 1.0f : 0.0f;
      for (int64_t k = 0; k < t.numel(); ++k) t.data.push_back(base + normal(rng));
    }
    args.push_back(std::move(t));
  }
  return args;
}

HostTensor shardOf(const HostTensor &full, int64_t dim, int64_t parts, int64_t part) {
  std::vector<int64_t> shape = full.shape;
  shape[dim] /= parts;
  HostTensor out = HostTensor::zeros(shape);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < int64_t(shape.size()); ++i)
    if (i < dim) outer *= shape[i];
    else if (i > dim) inner *= shape[i];
  int64_t block = shape[dim] * inner;
  for (int64_t a = 0; a < outer; ++a)
    std::memcpy(&out.data[a * block], &full.data[(a * parts + part) * block], block * sizeof(float));
  return out;
}

HostTensor unshard(const std::vector<HostTensor> &shards, int64_t dim) {
  std::vector<int64_t> shape = shards[0].shape;
  int64_t parts = shards.size();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < int64_t(shape.size()); ++i)
    if (i < dim) outer *= shape[i];
    else if (i > dim) inner *= shape[i];
  int64_t block = shape[dim] * inner;
  shape[dim] *= parts;
  HostTensor out = HostTensor::zeros(shape);
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t a = 0; a < outer; ++a)
      std::memcpy(&out.data[(a * parts + p) * block], &shards[p].data[a * block], block * sizeof(float));
  return out;
}

HostTensor batchSlice(const HostTensor &full, int64_t begin, int64_t count) {
  HostTensor out{full.shape};
  out.shape[0] = count;
  out.isInt = full.isInt;
  int64_t row = full.numel() / full.shape[0];
  if (full.isInt)
    out.ints.assign(full.ints.begin() + begin * row, full.ints.begin() + (begin + count) * row);
  else
    out.data.assign(full.data.begin() + begin * row, full.data.begin() + (begin + count) * row);
  return out;
}

double relativeError(const HostTensor &a, const HostTensor &b) {
  if (a.data.size() != b.data.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    diff += double(a.data[i] - b.data[i]) * (a.data[i] - b.data[i]);
    norm += double(b.data[i]) * b.data[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

}  // namespace loom::test
