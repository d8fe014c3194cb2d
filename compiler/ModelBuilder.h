// Builders that turn a ModelConfig into Transformer IR: one `func.func @train_step` over
// global shapes whose arguments are the parameters, then tokens, labels and masks, and
// whose single result is the scalar loss.
#pragma once

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "protos/model.pb.h"

namespace loom {

// The IR is over global shapes and the tokenizer's vocabulary, the same for every parallel
// layout: vocabulary padding and the tensor-parallel split are compiler passes.
struct BuildOptions {
  // The batch dimension when > 0; otherwise the config's micro_batch_size when set, else
  // dynamic (`?`).
  int64_t microBatch = 0;
  // GPT only: return the logits [batch, seq, vocab] instead of the loss (inference).
  bool outputLogits = false;
};

// Registers the dialects the builders and tools use (loom, func).
void registerLoomDialects(mlir::MLIRContext &ctx);

// Builds GPT (pre-LN, learned positions, tied embeddings, GeLU MLP, final layer norm), a
// BERT-style encoder (pre-LN as in the Megatron-LM paper, masked-LM head) or LLaMA (RMSNorm,
// rotary positions, grouped-query attention, SwiGLU, no biases, untied embeddings unless
// tie_word_embeddings; Hugging Face's parameter names), depending on config.architecture(). The config must already carry defaults (applyModelDefaults).
mlir::OwningOpRef<mlir::ModuleOp> buildModel(mlir::MLIRContext &ctx,
                                             const config::ModelConfig &config,
                                             const BuildOptions &options);

}  // namespace loom
