#include "compiler/StageBalance.h"

#include <algorithm>
#include <limits>

#include "analysis/CostModel.h"
#include "compiler/Lowering.h"
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace loom {
namespace {

double tensorBytes(mlir::Type t) {
  auto r = mlir::dyn_cast<mlir::RankedTensorType>(t);
  if (!r || !r.hasStaticShape()) return 0;
  return double(r.getNumElements()) * double(std::max<unsigned>(r.getElementTypeBitWidth(), 8) / 8);
}

}  // namespace

llvm::Expected<StageCosts> stageCosts(mlir::ModuleOp module, const config::ClusterSpec &cluster) {
  auto f = module.lookupSymbol<mlir::func::FuncOp>("train_step");
  if (!f) return llvm::createStringError(llvm::inconvertibleErrorCode(), "no func.func @train_step to balance");
  CostModel cost(cluster, cluster.device().kind() == config::CUDA ? GemmPrecision::kBf16 : GemmPrecision::kFp32, false);
  bool recompute = cluster.parallel().recompute() == config::RECOMPUTE_FULL;
  StageCosts out;
  bool pastLayers = false;
  for (mlir::Operation &op : f.getBody().front().without_terminator()) {
    llvm::StringRef full = op.getName().getStringRef();
    if (!full.consume_front("loom.")) continue;  // arith constants and the like: free
    std::string name = full.str();
    double bytes = 0;
    for (mlir::Value v : op.getOperands()) bytes += tensorBytes(v.getType());
    for (mlir::Value v : op.getResults()) bytes += tensorBytes(v.getType());
    double flops = flopsOf(&op);
    double forward = cost.computeSeconds(name, flops, bytes);
    double training = forward * (isAttentionOp(name) ? 3.5 : 3.0);
    if (auto l = op.getAttrOfType<mlir::IntegerAttr>(attr::kLayer)) {
      size_t layer = size_t(l.getInt());
      if (out.layers.size() <= layer) out.layers.resize(layer + 1, 0.0);
      out.layers[layer] += training + (recompute ? forward : 0);
      pastLayers = true;
    } else {
      (pastLayers ? out.after : out.before) += training;
    }
  }
  return out;
}

std::vector<int64_t> balancedLayout(const StageCosts &costs, int64_t stages) {
  int64_t n = int64_t(costs.layers.size());
  if (stages <= 1 || n < stages) return {};
  std::vector<double> prefix(size_t(n + 1), 0.0);
  for (int64_t l = 0; l < n; ++l) prefix[size_t(l + 1)] = prefix[size_t(l)] + costs.layers[size_t(l)];
  // best[k][j]: the least costliest stage splitting the first j layers into k stages; a
  // stage's cost is its layers', plus `before` on the first and `after` on the last.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(stages + 1), std::vector<double>(size_t(n + 1), inf));
  std::vector<std::vector<int64_t>> cut(size_t(stages + 1), std::vector<int64_t>(size_t(n + 1), 0));
  best[0][0] = 0;
  for (int64_t k = 1; k <= stages; ++k)
    for (int64_t j = k; j <= n - (stages - k); ++j)
      for (int64_t i = k - 1; i < j; ++i) {
        double stage = prefix[size_t(j)] - prefix[size_t(i)] + (k == 1 ? costs.before : 0) +
                       (k == stages ? costs.after : 0);
        double worst = std::max(best[size_t(k - 1)][size_t(i)], stage);
        if (worst < best[size_t(k)][size_t(j)]) best[size_t(k)][size_t(j)] = worst, cut[size_t(k)][size_t(j)] = i;
      }
  std::vector<int64_t> layout(static_cast<size_t>(stages), 0);
  for (int64_t k = stages, j = n; k >= 1; --k) {
    int64_t i = cut[size_t(k)][size_t(j)];
    layout[size_t(k - 1)] = j - i;
    j = i;
  }
  return layout;
}

}  // namespace loom
