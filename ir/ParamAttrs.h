// Names of the discardable attributes that carry model structure through the IR.
#pragma once

#include "llvm/ADT/StringRef.h"

namespace loom::attr {

// On parameter arguments of the train_step function.
inline constexpr llvm::StringLiteral kParam = "loom.param";        // global name, string
inline constexpr llvm::StringLiteral kInit = "loom.init";          // "normal" | "zeros" | "ones"
inline constexpr llvm::StringLiteral kInitStd = "loom.init_std";   // f32, for "normal"
// On parameters split by tensor parallelism: the dimension split and into how many parts
// (the rank's part is its position in group "tp").
inline constexpr llvm::StringLiteral kShardDim = "loom.shard_dim";
inline constexpr llvm::StringLiteral kShardParts = "loom.shard_parts";
// The group a sharded parameter is split over: "tp" when absent; "ep" for experts split by
// loom-expert-parallel (replicated over tp).
inline constexpr llvm::StringLiteral kShardGroup = "loom.shard_group";
// On parameters whose gradient each tensor-parallel rank computes only in part (replicated
// parameters under sequence parallelism): their gradients are summed over "tp".
inline constexpr llvm::StringLiteral kTpPartialGrad = "loom.tp_partial_grad";
// On the ops of loom-data-parallel that synchronise gradients (run once per step).
inline constexpr llvm::StringLiteral kGradSync = "loom.grad_sync";
// On gradient results: the parameter they belong to.
inline constexpr llvm::StringLiteral kGradOf = "loom.grad_of";
// On ops emitted by autodiff.
inline constexpr llvm::StringLiteral kBackward = "loom.backward";
// On the gradient all-reduces of data parallelism: the bucket they are packed into.
inline constexpr llvm::StringLiteral kBucket = "loom.bucket";

// On parameters whose vocabulary dimension loom-pad-vocab padded: that dimension and its
// size before padding (the real entries; the padding is zeros).
inline constexpr llvm::StringLiteral kPaddedDim = "loom.padded_dim";
inline constexpr llvm::StringLiteral kUnpaddedSize = "loom.unpadded_size";

// On data arguments: "tokens" | "labels" | "loss_mask" | "attention_mask", and BERT's
// "token_types" (segments), "sop_labels" and "sop_mask" (the sentence-order label and its mask,
// at each sample's first position).
inline constexpr llvm::StringLiteral kInput = "loom.input";

// On ops inside Transformer layer N (0-based).
inline constexpr llvm::StringLiteral kLayer = "loom.layer";
// On a loom.cross_entropy: the name the training log reports it by when the loss sums several
// (BERT's "lm loss" and "sop loss", as Megatron's pretrain_bert logs them).
inline constexpr llvm::StringLiteral kLossName = "loom.loss_name";
// On ops after pipeline preparation: the virtual pipeline stage (chunk c of stage s is
// virtual stage c * p + s) that computes them.
inline constexpr llvm::StringLiteral kStage = "loom.stage";
// On the programs of loom-pipeline-partition: "forward" | "backward" | "grad_sync" (what the
// program is does not depend on its name).
inline constexpr llvm::StringLiteral kProgramKind = "loom.program_kind";
// On a parameter argument duplicated for another pipeline stage (the tied output embedding
// on the last stage): the name of the parameter it copies. Their gradients are summed over
// the "embedding" group.
inline constexpr llvm::StringLiteral kTiedTo = "loom.tied_to";

// On an op: keep it replicated on every rank of the tensor-parallel group (the op's
// tensor-parallel rule would otherwise split it, or refuse an op it cannot place).
inline constexpr llvm::StringLiteral kReplicated = "loom.replicated";

// On the module, optional: Megatron's make_vocab_size_divisible_by (default 128); the
// compiler pads the vocabulary to a multiple of it times t.
inline constexpr llvm::StringLiteral kVocabDivisibleBy = "loom.make_vocab_size_divisible_by";
// On the module, optional: the precision policy, "bf16" or "f16" (the model's params_dtype;
// absent: fp32). The model itself stays fp32; loom-mixed-precision applies the policy after
// partitioning (16-bit weights for compute and activations; fp32 statistics and losses).
inline constexpr llvm::StringLiteral kParamsDtype = "loom.params_dtype";
// Set by loom-tensor-parallel (never part of the input IR): the degree t it applied.
inline constexpr llvm::StringLiteral kTensorParallel = "loom.tensor_parallel_size";

}  // namespace loom::attr
