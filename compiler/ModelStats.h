// What `loom-dump` reports about a module: parameters, FLOPs per token, op histogram.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "mlir/IR/BuiltinOps.h"

namespace loom {

struct ModelStats {
  int64_t parameters = 0;
  // Parameter elements that exist only because the vocabulary was padded.
  int64_t vocabPaddingParameters = 0;
  int64_t tokensPerStep = 0;          // batch * seq of the train_step inputs
  double forwardFlops = 0;            // GEMM FLOPs of one forward pass over tokensPerStep
  double forwardFlopsInLayers = 0;    // the part inside Transformer layers
  std::map<std::string, int64_t> opHistogram;

  int64_t parametersWithoutPadding() const { return parameters - vocabPaddingParameters; }
  double forwardFlopsPerToken() const { return forwardFlops / tokensPerStep; }
  // Backward costs twice the forward (two GEMMs per forward GEMM).
  double trainingFlopsPerToken() const { return 3 * forwardFlopsPerToken(); }
  // With full recomputation the layers' forward runs twice (PTD-P paper, section 5.1).
  double trainingFlopsPerTokenFullRecompute() const {
    return (3 * forwardFlops + forwardFlopsInLayers) / tokensPerStep;
  }
};

// Counts from the IR alone: parameter arguments (loom.param), FLOPs of each linear (2 M K N),
// attention core (4 b s^2 h: QK^T and PV) and mixture-of-experts MLP (its tokens through their
// top_k experts: 6 b s h f top_k), ops by name. A head whose results reach only a classifier
// loss (BERT's pooler and sentence-order classifier: one position per sample) counts once per
// sample.
ModelStats computeModelStats(mlir::ModuleOp module);

// The closed form of the PTD-P paper (arXiv:2104.04473), section 5.1, per token, with full
// recomputation: 96 l h^2 (1 + s / 6h + V / 16 l h). Used to cross-check computeModelStats.
double ptdpFlopsPerToken(int64_t layers, int64_t hidden, int64_t seq, int64_t vocab);

}  // namespace loom
