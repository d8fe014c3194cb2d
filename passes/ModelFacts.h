// The model facts that the compiler and the runtime need, read off the Transformer IR
// itself: the ops, the function signature and the parameter attributes. Module attributes
// play no part (a module without any has the same facts).
#pragma once

#include <cstdint>
#include <string>

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "ir/LoomDialect.h"
#include "mlir/IR/BuiltinOps.h"

namespace loom {

struct ModelFacts {
  std::string name;           // the module's symbol name ("" when it has none)
  std::string architecture;   // "gpt" (causal attention) | "bert" (bidirectional) | "llama" (RMSNorm,
                              // grouped attention)
  int64_t numLayers = 0;      // distinct loom.layer values
  int64_t hiddenSize = 0;     // the embedding's width
  int64_t numHeads = 0;       // heads of the first attention op (global IR: all heads)
  int64_t numKvHeads = 0;     // its key/value heads (num_heads without grouped-query attention)
  int64_t ffnHiddenSize = 0;  // width of the first GeLU or SwiGLU in a layer (0 without one)
  int64_t maxPositions = 0;   // rows of the learned position table (0 without one)
  double normEpsilon = 0;     // epsilon of the first layer norm or RMS norm
  double ropeTheta = 0;       // base of the first rotary embedding (0 without one)
  bool tiedEmbeddings = false;  // the output layer's weight is the embedding table
  int64_t seqLength = 0;      // the token ids' dim 1
  int64_t batch = 0;          // the token ids' dim 0 (mlir::ShapedType::kDynamic when `?`)
  int64_t vocabSize = 0;      // the tokenizer's vocabulary: cross_entropy's valid_vocab
  int64_t wordRows = 0;       // rows of the word-embedding table (vocab, possibly padded)
  // The dtype the parameters compute in: "f32" | "bf16" | "f16" (the module's loom.params_dtype
  // policy, or the parameters' element type).
  std::string paramsDtype;
  // Mixture of experts (the first loom.moe; 0 experts without one): experts, top-k, the layers
  // between MoE layers (from the first two MoE layers' loom.layer; 1 with one MoE layer), the
  // load-balancing loss's coefficient and the capacity factor.
  int64_t numExperts = 0, expertsPerToken = 0, moeLayerFreq = 0;
  double routerAuxLossCoef = 0, capacityFactor = 0;
};

// Reads the facts of a module's @train_step; a missing piece (no @train_step, no embedding,
// no cross_entropy, no token input) is an error emitted at the module or the op.
mlir::FailureOr<ModelFacts> readModelFacts(mlir::ModuleOp module);

// The output layer of a loss: the loom.linear that produces its logits and is used only there
// (null when the logits come from elsewhere). Its weight's output features are the vocabulary.
LinearOp outputLayerOf(CrossEntropyOp loss);

// A classifier's loss (BERT's sentence-order prediction): its logits come from a loom.replicated
// linear over a few classes, not from the output layer over the vocabulary. The vocabulary's
// rules (padding, vocab-parallel splitting, the model's vocab size) leave it alone.
bool isClassifierLoss(CrossEntropyOp loss);

// The losses a train step's loss sums: the loom.cross_entropy results of a tree of scalar
// loom.add ops (BERT's masked LM plus sentence order, summed as Megatron's pretrain_bert does),
// or the loss itself when it is one cross_entropy. Empty when `loss` is neither, or when one
// loss is summed twice.
llvm::SmallVector<mlir::Value> summedLosses(mlir::Value loss);
// The vocabulary padded up to a multiple of `multiple` (Megatron's
// make_vocab_size_divisible_by * t): the rows of the embedding table after loom-pad-vocab.
inline int64_t roundUpToMultiple(int64_t n, int64_t multiple) {
  return multiple <= 1 ? n : (n + multiple - 1) / multiple * multiple;
}

// Megatron's default make_vocab_size_divisible_by; a module may hint another value with the
// attribute loom.make_vocab_size_divisible_by.
inline constexpr int64_t kDefaultVocabDivisibleBy = 128;
int64_t vocabDivisibleBy(mlir::ModuleOp module);

}  // namespace loom
