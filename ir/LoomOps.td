//===- LoomOps.td - ops of the `loom` dialect ---------------*- tablegen -*-===//
#ifndef LOOM_OPS_TD
#define LOOM_OPS_TD

include "LoomBase.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

//===----------------------------------------------------------------------===//
// Transformer compute ops
//===----------------------------------------------------------------------===//

def Loom_EmbeddingOp : Loom_Op<"embedding", [Pure]> {
  let summary = "token embedding lookup plus learned position embedding";
  let description = [{
    `out[b, s, :] = word[tokens[b, s], :] + position[s, :]`.
    `word` is `[vocab, hidden]` (vocab possibly padded, or a vocab shard after tensor
    parallelism, in which case `vocab_start` is the shard's first row and tokens outside
    the shard contribute zero: Megatron's masked lookup). `position` is
    `[max_positions, hidden]` with `max_positions >= seq`. Without `position` only the
    token embedding is returned.
  }];
  let arguments = (ins Loom_IndexTensor:$tokens, Loom_FloatTensor:$word,
                       Optional<Loom_FloatTensor>:$position,
                       DefaultValuedAttr<I64Attr, "0">:$vocab_start);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = [{
    $tokens `,` $word (`,` $position^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Loom_LayerNormOp : Loom_Op<"layer_norm", [Pure]> {
  let summary = "layer normalization over the last dimension";
  let description = [{
    `y = (x - mean(x)) / sqrt(var(x) + epsilon) * gamma + beta`, statistics over the
    last dimension; `gamma` and `beta` have the size of that dimension.
  }];
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$gamma,
                       Loom_FloatTensor:$beta,
                       DefaultValuedAttr<F32Attr, "1.0e-5">:$epsilon);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $gamma `,` $beta attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Loom_LinearOp : Loom_Op<"linear", [Pure]> {
  let summary = "matrix multiply over the last dimension plus optional bias";
  let description = [{
    `y[..., n] = sum_k x[..., k] * W[k, n] + bias[n]` with `W` stored `[in, out]`.
    With `transpose_weight`, `W` is stored `[out, in]`: the tied output embedding uses
    the `[vocab, hidden]` word-embedding table this way.
  }];
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$weight,
                       Optional<Loom_FloatTensor>:$bias,
                       UnitAttr:$transpose_weight);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $weight (`,` $bias^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Loom_GeluOp : Loom_Op<"gelu", [Pure, SameOperandsAndResultType]> {
  let summary = "GeLU, tanh approximation as in GPT-2";
  let description = [{
    `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
  }];
  let arguments = (ins Loom_FloatTensor:$input);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Loom_AttentionOp : Loom_Op<"attention", [Pure]> {
  let summary = "attention core: scaled dot product, mask, softmax, dropout, weighted sum";
  let description = [{
    `qkv` is `[batch, seq, 3 * heads * head_dim]`, laid out per head as
    `[heads, 3, head_dim]` (Megatron's layout), so a column-parallel split of the QKV
    projection gives each rank whole heads. For each head:
    `softmax(q k^T / sqrt(head_dim) + mask) v`, with dropout of rate `dropout` on the
    probabilities. `causal` masks future keys; the optional `key_mask`
    `[batch, seq]` (1 keep, 0 pad) masks padded keys. The result is
    `[batch, seq, heads * head_dim]`, heads concatenated. `num_heads` counts the heads
    this op computes (the local heads after tensor parallelism).
  }];
  let arguments = (ins Loom_FloatTensor:$qkv, Optional<Loom_MaskTensor>:$key_mask,
                       I64Attr:$num_heads, UnitAttr:$causal,
                       DefaultValuedAttr<F32Attr, "0.0">:$dropout);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = [{
    $qkv (`,` $key_mask^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Loom_DropoutOp : Loom_Op<"dropout", [SameOperandsAndResultType]> {
  let summary = "inverted dropout: zero with probability `rate`, scale the rest by 1/(1-rate)";
  let description = [{
    `stream` names the random stream so that the passes can make seeds identical
    across a tensor-parallel group outside parallel regions and distinct inside them
    (Megatron-LM paper, section 3: dropout seeds).
  }];
  let arguments = (ins Loom_FloatTensor:$input, F32Attr:$rate,
                       DefaultValuedAttr<I64Attr, "0">:$stream);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Loom_AddOp : Loom_Op<"add", [Pure, SameOperandsAndResultType, Commutative]> {
  let summary = "elementwise sum (the residual connection)";
  let arguments = (ins Loom_FloatTensor:$lhs, Loom_FloatTensor:$rhs);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Loom_CrossEntropyOp : Loom_Op<"cross_entropy", [Pure]> {
  let summary = "softmax cross-entropy, mean over (unmasked) tokens";
  let description = [{
    `logits` is `[batch, seq, vocab]`, `labels` `[batch, seq]`. The loss is
    `sum_t mask_t * (logsumexp(logits_t) - logits_t[label_t]) / sum_t mask_t`, with the
    mask all ones when `loss_mask` is absent. Columns at or beyond `valid_vocab`
    (vocabulary padding) are excluded from the softmax, so padding never changes the
    loss. After vocab-parallel sharding `vocab_start` is the first column this op holds.
  }];
  let arguments = (ins Loom_FloatTensor:$logits, Loom_IndexTensor:$labels,
                       Optional<Loom_MaskTensor>:$loss_mask,
                       I64Attr:$valid_vocab,
                       DefaultValuedAttr<I64Attr, "0">:$vocab_start);
  let results = (outs Loom_Scalar:$loss);
  let assemblyFormat = [{
    $logits `,` $labels (`,` $loss_mask^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Communication ops (inserted by the passes). `group` names the process group:
// "tp", "pp", "dp" or "embedding"; `group_size` is its size.
//===----------------------------------------------------------------------===//

def Loom_AllReduceOp : Loom_Op<"all_reduce", [SameOperandsAndResultType]> {
  let summary = "all-reduce over a process group (`reduce` is \"sum\" or \"max\")";
  let arguments = (ins Loom_FloatTensor:$input, StrAttr:$group, I64Attr:$group_size,
                       DefaultValuedStrAttr<StrAttr, "sum">:$reduce);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Loom_AllGatherOp : Loom_Op<"all_gather", []> {
  let summary = "all-gather along `dim`: the result's `dim` is `group_size` times the input's";
  let arguments = (ins Loom_FloatTensor:$input, StrAttr:$group, I64Attr:$group_size,
                       I64Attr:$dim);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Loom_ReduceScatterOp : Loom_Op<"reduce_scatter", []> {
  let summary = "sum-reduce then scatter along `dim`: the result's `dim` is the input's / `group_size`";
  let arguments = (ins Loom_FloatTensor:$input, StrAttr:$group, I64Attr:$group_size,
                       I64Attr:$dim);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Loom_SendOp : Loom_Op<"send", []> {
  let summary = "point-to-point send to `peer` (a position in `group`)";
  let arguments = (ins Loom_FloatTensor:$input, StrAttr:$group, I64Attr:$group_size,
                       I64Attr:$peer, DefaultValuedAttr<I64Attr, "0">:$tag);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Loom_RecvOp : Loom_Op<"recv", []> {
  let summary = "point-to-point receive from `peer` (a position in `group`)";
  let arguments = (ins StrAttr:$group, I64Attr:$group_size, I64Attr:$peer,
                       DefaultValuedAttr<I64Attr, "0">:$tag);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "attr-dict `:` type($result)";
  let hasVerifier = 1;
}

#endif // LOOM_OPS_TD
