// Pipeline stages balanced by predicted cost (cluster spec `balance_stages`): the layers are
// split into p * v consecutive virtual stages so that the costliest one costs least, the ops
// before the first layer (the embedding) counted on the first and the ops after the last (the
// final norm, the output layer, the loss) on the last. Each op of the global train_step is
// costed on the cluster's device model (compiler/CostModel.h) by its FLOPs and bytes, times
// its training work (forward and backward: 3x a GEMM's forward FLOPs, 3.5x attention's;
// plus one more forward for recomputed layers).
#pragma once

#include <cstdint>
#include <vector>

#include "llvm/Support/Error.h"
#include "mlir/IR/BuiltinOps.h"
#include "protos/cluster.pb.h"

namespace loom {

struct StageCosts {
  double before = 0, after = 0;  // seconds per micro-batch outside the layers
  std::vector<double> layers;    // seconds per micro-batch of each layer
};

// The costs of `module`'s train_step (shaped for the layout's micro-batch, not partitioned).
llvm::Expected<StageCosts> stageCosts(mlir::ModuleOp module, const config::ClusterSpec &cluster);

// Layers per virtual stage (`stages` entries, each at least 1) minimising the costliest stage.
std::vector<int64_t> balancedLayout(const StageCosts &costs, int64_t stages);

}  // namespace loom
