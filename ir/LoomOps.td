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
    `word` is `[vocab, hidden]` (vocab possibly padded). With `vocab_parallel_group`,
    `word` is this rank's vocab shard: its first row is `rank_in_group * rows`, and tokens
    outside the shard contribute zero (Megatron's masked lookup; an all_reduce over the
    group completes the sum). `position` is `[max_positions, hidden]` with
    `max_positions >= seq`. Without `position` only the token embedding is returned. With
    `context_parallel_group` the tokens are this rank's chunks of the sequence (plan/Layout.h's
    ContextChunks) and `s` is each token's global position.
  }];
  let arguments = (ins Loom_IndexTensor:$tokens, Loom_FloatTensor:$word,
                       Optional<Loom_FloatTensor>:$position,
                       OptionalAttr<StrAttr>:$vocab_parallel_group,
                       OptionalAttr<StrAttr>:$context_parallel_group);
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

def Loom_TanhOp : Loom_Op<"tanh", [Pure, SameOperandsAndResultType]> {
  let summary = "hyperbolic tangent (BERT's pooler activation)";
  let arguments = (ins Loom_FloatTensor:$input);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Loom_AddTokenTypeOp : Loom_Op<"add_token_type", [Pure]> {
  let summary = "add token-type (segment) embeddings: `out[b, s, :] = input[b, s, :] + table[types[b, s0 + s], :]`";
  let description = [{
    BERT's segment embeddings (Devlin et al. 2019, section 3; Megatron's tokentype
    embeddings): `token_types` is `[batch, seq]` (0 for the first segment, 1 for the second),
    `table` `[types, hidden]`. `s0` is 0, or with `sequence_parallel_group` (the input is this
    rank's slice of the sequence) the rank's position in the group times the slice's length.
  }];
  let arguments = (ins Loom_FloatTensor:$input, Loom_IndexTensor:$token_types, Loom_FloatTensor:$table,
                       OptionalAttr<StrAttr>:$sequence_parallel_group);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $token_types `,` $table attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
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
    this op computes (the local heads after tensor parallelism). `stream` names the
    dropout's random stream; with `rank_distinct_dropout = "GROUP"` the stream also depends on
    the rank's position in that group (dropout inside a tensor-parallel region, Megatron-LM
    paper section 3).

    The optional result `lse` `[batch, heads, seq]` (f32) keeps the softmax statistics for
    the backward (FlashAttention, Dao et al. 2022, section 3.1): row i's log-sum-exp of its
    scaled, masked scores, so that `attention_grad` recomputes the probabilities as
    `exp(s - lse)` in one pass instead of the softmax's max, sum and scale. A row whose keys
    are all masked has `lse = +inf` (its probabilities are 0). loom-autodiff adds it.

    With `context_parallel_group` (loom-context-parallel) `qkv` holds the whole sequence,
    all-gathered over that group (member j's chunks j and 2c-1-j at rows [2jC, 2jC + 2C) for
    chunks of C tokens), and the queries are this rank's own rows of it: the result and `lse`
    cover the rank's S / c tokens, each query attending to the keys at global positions up to
    its own (the dropout counters are the whole sequence's). With `context_parallel_ring` as
    well (Megatron-Core's cp_comm_type "p2p"), `qkv` holds only this rank's S / c tokens and the
    keys and values travel round the group's ring, one member's chunks per step, the blocks'
    statistics merged step by step (`context_parallel_size` members): the plan's
    `ring_attention`, a collective over the group.
  }];
  let arguments = (ins Loom_FloatTensor:$qkv, Optional<Loom_MaskTensor>:$key_mask,
                       I64Attr:$num_heads, UnitAttr:$causal,
                       DefaultValuedAttr<F32Attr, "0.0">:$dropout,
                       DefaultValuedAttr<I64Attr, "0">:$stream,
                       OptionalAttr<StrAttr>:$rank_distinct_dropout,
                       OptionalAttr<StrAttr>:$context_parallel_group,
                       UnitAttr:$context_parallel_ring,
                       DefaultValuedAttr<I64Attr, "1">:$context_parallel_size);
  let results = (outs Loom_FloatTensor:$result, Optional<Loom_StatsTensor>:$lse);
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
    (Megatron-LM paper, section 3: dropout seeds): with `rank_distinct = "GROUP"` the stream
    also depends on the rank's position in that group. With `context_parallel_group` the input
    `[batch, seq, ...]` holds this rank's chunks of the sequence and each element's counter is
    the one of its global position (the masks of c = 1, cut into chunks).
  }];
  let arguments = (ins Loom_FloatTensor:$input, F32Attr:$rate,
                       DefaultValuedAttr<I64Attr, "0">:$stream,
                       OptionalAttr<StrAttr>:$rank_distinct,
                       OptionalAttr<StrAttr>:$context_parallel_group);
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
    loss. With `vocab_parallel_group` (and its size, `vocab_parallel_size`), `logits` holds
    this rank's vocab shard (first column `rank_in_group * columns`) and the op is Megatron's
    vocab-parallel cross-entropy: it all-reduces only the per-token max, sum of exponentials
    and target logit over the group (`[batch, seq]` all-reduces), never the logits.

    The optional result `lse` `[batch, seq]` (f32) keeps each token's log-sum-exp over the
    whole (valid) vocabulary for the backward, so that `cross_entropy_grad` computes the
    softmax as `exp(logit - lse)` in one pass, with no max, no sums and, vocab-parallel, no
    collective (as attention keeps its statistics). loom-autodiff adds it.
  }];
  let arguments = (ins Loom_FloatTensor:$logits, Loom_IndexTensor:$labels,
                       Optional<Loom_MaskTensor>:$loss_mask,
                       I64Attr:$valid_vocab,
                       OptionalAttr<StrAttr>:$vocab_parallel_group,
                       OptionalAttr<I64Attr>:$vocab_parallel_size);
  let results = (outs Loom_Scalar:$loss, Optional<Loom_StatsTensor>:$lse);
  let assemblyFormat = [{
    $logits `,` $labels (`,` $loss_mask^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}


def Loom_RmsNormOp : Loom_Op<"rms_norm", [Pure]> {
  let summary = "RMS normalization over the last dimension (LLaMA)";
  let description = [{
    `y = x / sqrt(mean(x^2) + epsilon) * gamma`, the mean over the last dimension; `gamma`
    has the size of that dimension (Zhang & Sennrich 2019; Hugging Face's LlamaRMSNorm).
  }];
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$gamma,
                       DefaultValuedAttr<F32Attr, "1.0e-6">:$epsilon);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $gamma attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Loom_RotaryOp : Loom_Op<"rotary", [Pure, SameOperandsAndResultType]> {
  let summary = "rotary position embedding, Hugging Face's rotate-half convention";
  let description = [{
    `x` is `[batch, seq, heads * head_dim]`. For each head, with `x = [x1, x2]` its two halves
    and `f_j = theta^(-2j / head_dim)` for `j < head_dim / 2`, at position `s`:
    `y1 = x1 cos(s f) - x2 sin(s f)`, `y2 = x2 cos(s f) + x1 sin(s f)` (Su et al. 2021,
    RoFormer, section 3.4, in the layout of Hugging Face's `rotate_half`). With `inverse`
    the rotation is by `-s f`: the gradient of the forward rotation. The positions are
    0 .. seq-1 of the full sequence, or with `context_parallel_group` the global positions of
    this rank's chunks.
  }];
  let arguments = (ins Loom_FloatTensor:$input, I64Attr:$head_dim, F32Attr:$theta, UnitAttr:$inverse,
                       OptionalAttr<StrAttr>:$context_parallel_group);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Loom_SwigluOp : Loom_Op<"swiglu", [Pure, SameOperandsAndResultType]> {
  let summary = "the SwiGLU gate: `silu(gate) * up`";
  let description = [{
    `y = gate * sigmoid(gate) * up`, elementwise (Shazeer 2020, GLU Variants Improve
    Transformer; LLaMA's MLP is `down(swiglu(gate(x), up(x)))`).
  }];
  let arguments = (ins Loom_FloatTensor:$gate, Loom_FloatTensor:$up);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$gate `,` $up attr-dict `:` type($result)";
}

def Loom_GroupedAttentionOp : Loom_Op<"grouped_attention", [Pure]> {
  let summary = "grouped-query attention core over separate q, k and v";
  let description = [{
    `q` is `[batch, seq, num_heads * head_dim]`, `k` and `v` `[batch, seq, num_kv_heads *
    head_dim]`; query head `i` attends with key/value head `i / (H / num_kv_heads)`, where
    `H` is the number of query heads in the whole group of `num_kv_heads` heads (Ainslie et
    al. 2023, GQA; `num_kv_heads = num_heads` is multi-head attention). Per head:
    `softmax(q k^T / sqrt(head_dim) + mask) v`, with `causal`, dropout `dropout` on the
    probabilities from stream `stream` (rank-distinct with `rank_distinct_dropout`). The
    result is `[batch, seq, num_heads * head_dim]`. With `kv_replicated_group` (tensor
    parallelism with more ranks than KV heads), `q` holds this rank's slice of the query heads
    (block `rank_in_group` of `group_size`) while `k` and `v` hold all KV heads. The optional
    result `lse` `[batch, num_heads, seq]` keeps the softmax statistics for the backward, as
    `loom.attention`'s. With `context_parallel_group`, `q` holds this rank's chunks of the
    sequence and `k`, `v` the whole sequence all-gathered over that group (in its order, as
    `loom.attention` describes), or with `context_parallel_ring` the rank's own tokens only
    (the ring's steps bring the others').
  }];
  let arguments = (ins Loom_FloatTensor:$q, Loom_FloatTensor:$k, Loom_FloatTensor:$v,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads, UnitAttr:$causal,
                       DefaultValuedAttr<F32Attr, "0.0">:$dropout,
                       DefaultValuedAttr<I64Attr, "0">:$stream,
                       OptionalAttr<StrAttr>:$rank_distinct_dropout,
                       OptionalAttr<StrAttr>:$kv_replicated_group,
                       DefaultValuedAttr<I64Attr, "1">:$group_size,
                       OptionalAttr<StrAttr>:$context_parallel_group,
                       UnitAttr:$context_parallel_ring,
                       DefaultValuedAttr<I64Attr, "1">:$context_parallel_size);
  let results = (outs Loom_FloatTensor:$result, Optional<Loom_StatsTensor>:$lse);
  let assemblyFormat = [{
    $q `,` $k `,` $v attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Loom_MoeOp : Loom_Op<"moe", [Pure]> {
  let summary = "a mixture-of-experts MLP: top-k routing over SwiGLU experts (Mixtral)";
  let description = [{
    `input` is `[batch, seq, hidden]`, `logits` the router's `[batch, seq, E]` (a `loom.linear`
    of the same input), `gate` and `up` `[E, ffn, hidden]` and `down` `[E, hidden, ffn]` the E
    experts' weights stacked (Hugging Face Mixtral's w1, w3 and w2 of each expert, rows per output
    feature). Per token (Mixtral; Jiang et al. 2024, section 2.1): `p = softmax(logits)`, the
    `top_k` largest `p` (ties to the lower expert index) renormalised to sum 1 as the weights
    `w_j`, and `y = sum_j w_j down_e(silu(gate_e x) * up_e x)` over the chosen experts `e`.
    With `capacity_factor > 0` each expert takes at most `ceil(capacity_factor * T * top_k / E)`
    of the micro-batch's `T` tokens: its assignments with the smallest weights (ties: the later
    token) are dropped and add nothing (Megatron-Core's "probs" drop policy; the kept weights
    are not renormalised again). `aux` is the layer's load-balancing loss (Switch Transformer,
    Fedus et al. 2021, section 2.2, as Hugging Face's load_balancing_loss_func computes it) from
    all the assignments before any drop: `E * sum_e (count_e / T) * P_e`, `count_e` the
    assignments to expert e, `P_e` the mean of `p_e` over the tokens. The training loss is the
    function's result plus `aux_loss_coef * aux` of every MoE layer: the op's gradient adds the
    coefficient's share to the router's (Megatron-Core's MoEAuxLossAutoScaler), so `aux` itself
    need not reach the returned loss. With `expert_parallel_group` (loom-expert-parallel) the
    rank holds experts `i E_l .. (i + 1) E_l - 1` of the `E = E_l expert_parallel_size` the
    logits choose from (`i` its place in the group): gate, up and down are its `E_l` experts,
    and the other members compute the assignments to theirs (all-to-all over the group).
    With `routing_stats` (`[2, E]`: `loom.moe_routing_stats` of the logits of every token the
    loss's statistics cover, summed over the ranks holding them; loom-tensor-parallel under
    sequence parallelism, Megatron-Core's sequence_partition_group) `count_e`, `P_e` and `T` come
    from it instead of from this op's tokens: the aux loss (and its gradient) is the whole
    sequence's while the op routes only its own slice.
  }];
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$logits, Loom_FloatTensor:$gate,
                       Loom_FloatTensor:$up, Loom_FloatTensor:$down, Optional<Loom_FloatTensor>:$routing_stats,
                       I64Attr:$top_k,
                       DefaultValuedAttr<F32Attr, "0.0">:$capacity_factor,
                       DefaultValuedAttr<F32Attr, "0.0">:$aux_loss_coef,
                       OptionalAttr<StrAttr>:$expert_parallel_group,
                       DefaultValuedAttr<I64Attr, "1">:$expert_parallel_size);
  let results = (outs Loom_FloatTensor:$result, Loom_Scalar:$aux);
  let assemblyFormat = [{
    $input `,` $logits `,` $gate `,` $up `,` $down (`,` `stats` $routing_stats^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Loom_MoeRoutingStatsOp : Loom_Op<"moe_routing_stats", [Pure]> {
  let summary = "a mixture-of-experts layer's load-balancing statistics over this rank's tokens";
  let description = [{
    `logits` is a router's `[batch, seq, E]`. Row 0 of the `[2, E]` result counts the tokens
    that chose expert e among their `top_k` (ties to the lower index, before any capacity drop),
    row 1 sums `softmax(logits)_e` over the tokens: the terms of `loom.moe`'s load-balancing loss,
    which summed over the ranks that split a sequence (an all-reduce) are the whole sequence's.
    No gradient: the counts are constants and `loom.moe_grad` takes the probabilities' share.
  }];
  let arguments = (ins Loom_FloatTensor:$logits, I64Attr:$top_k);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$logits attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Communication ops (inserted by the passes). `group` names the process group:
// "tp", "pp", "dp" or "embedding"; `group_size` is its size.
//===----------------------------------------------------------------------===//

def Loom_AllReduceOp : Loom_Op<"all_reduce", [SameOperandsAndResultType]> {
  let summary = "all-reduce over a process group (`reduce` is \"sum\", \"max\" or \"avg\")";
  let description = [{
    Gradient all-reduces of data parallelism carry `loom.bucket = k`: the lowering packs the
    all-reduces of one bucket into one collective over their concatenated buffers.
  }];
  let arguments = (ins Loom_FloatTensor:$input, StrAttr:$group, I64Attr:$group_size,
                       DefaultValuedStrAttr<StrAttr, "sum">:$reduce);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Loom_AllGatherOp : Loom_Op<"all_gather", []> {
  let summary = "all-gather along `dim`: the result's `dim` is `group_size` times the input's";
  let description = [{
    Its gradient is a reduce_scatter: the consumers are split over the group and each rank's
    gradient is a partial sum. With `split_gradient` the consumers are replicated (every rank
    computes the same thing from the gathered value, as a loss over replicated logits under
    sequence parallelism) and the gradient is the rank's own slice of it (a `shard`:
    Megatron-Core's gather_from_sequence_parallel_region with tensor_parallel_output_grad
    false).
  }];
  let arguments = (ins Loom_FloatTensor:$input, StrAttr:$group, I64Attr:$group_size,
                       I64Attr:$dim, UnitAttr:$split_gradient);
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

def Loom_ShardOp : Loom_Op<"shard", []> {
  let summary = "this rank's slice along `dim` of a value replicated over `group` (no communication)";
  let description = [{
    The scatter half of PTD-P's scatter/gather (Narayanan et al. 2021, section 4.1): a
    pipeline message replicated over the tensor-parallel group is sent as `group_size`
    slices, one per rank, and all-gathered along the same `dim` on the receiving stage. Member
    r of `group` keeps slice r. Inserted by loom-scatter-gather after partitioning (it has no
    gradient rule).
  }];
  let arguments = (ins Loom_FloatTensor:$input, StrAttr:$group, I64Attr:$group_size,
                       I64Attr:$dim);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Loom_IdentityOp : Loom_Op<"identity", [Pure, SameOperandsAndResultType]> {
  let summary = "identity forward, all-reduce of the gradient over `group` (Megatron's f)";
  let description = [{
    Marks a replicated value entering a tensor-parallel region (the input of a
    column-parallel GEMM). Forward it is the identity; its gradient is an all_reduce over
    `group`, because each rank's consumer contributes a partial gradient (Megatron-LM
    paper, section 3, figure 3: the f operator; `loom.all_reduce` is g).
  }];
  let arguments = (ins Loom_FloatTensor:$input, StrAttr:$group, I64Attr:$group_size);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Loom_AddPositionOp : Loom_Op<"add_position", [Pure]> {
  let summary = "add learned position embeddings: `out[b, s, :] = input[b, s, :] + position[s0 + s, :]`";
  let description = [{
    `s0` is 0, or with `sequence_parallel_group` (the input is this rank's slice of the
    sequence) the rank's position in the group times the slice's length. With
    `context_parallel_group` the local position `s0 + s` is mapped to its global one.
  }];
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$position,
                       OptionalAttr<StrAttr>:$sequence_parallel_group,
                       OptionalAttr<StrAttr>:$context_parallel_group);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input `,` $position attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Gradient ops (emitted by the autodiff pass). Each names the forward op it differentiates.
//===----------------------------------------------------------------------===//

def Loom_WeightGradOp : Loom_Op<"weight_grad", [Pure]> {
  let summary = "gradient of a linear's weight: `dW[k, n] = sum over rows of x[.., k] g[.., n]`";
  let description = [{
    With `transpose_weight` the result is `[n, k]` (the weight was stored `[out, in]`).
  }];
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$grad, UnitAttr:$transpose_weight);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input `,` $grad attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Loom_BiasGradOp : Loom_Op<"bias_grad", [Pure]> {
  let summary = "gradient of a bias: the sum of `grad` over all but the last dimension";
  let arguments = (ins Loom_FloatTensor:$grad);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$grad attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Loom_LayerNormGradOp : Loom_Op<"layer_norm_grad", [Pure]> {
  let summary = "gradients of layer_norm w.r.t. input, gamma and beta (statistics recomputed)";
  let description = [{
    With `xhat = (x - mean) * rstd`: `dgamma = sum(g * xhat)`, `dbeta = sum(g)` over rows,
    `dx = rstd * (g*gamma - mean(g*gamma) - xhat * mean(g*gamma*xhat))` per row.
  }];
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$gamma, Loom_FloatTensor:$grad,
                       DefaultValuedAttr<F32Attr, "1.0e-5">:$epsilon);
  let results = (outs Loom_FloatTensor:$grad_input, Loom_FloatTensor:$grad_gamma,
                      Loom_FloatTensor:$grad_beta);
  let assemblyFormat = "$input `,` $gamma `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Loom_GeluGradOp : Loom_Op<"gelu_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "gradient of the tanh GeLU: `g * gelu'(x)`";
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$grad);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input `,` $grad attr-dict `:` type($result)";
}

def Loom_AttentionGradOp : Loom_Op<"attention_grad", [Pure, AttrSizedOperandSegments]> {
  let summary = "gradient of the attention core w.r.t. qkv (probabilities from the forward's statistics)";
  let description = [{
    Same attributes as the forward `loom.attention`, whose `lse` result it takes: the scores
    are recomputed (Q K^T) and the probabilities are `exp(s - lse)`; the dropout mask is
    regenerated from the counter-based generator. With `context_parallel_ring`, `out` is the
    forward's result (the softmax backward's rowsum(dO * O), FlashAttention-2's D, over keys the
    ring brings one member at a time).
  }];
  let arguments = (ins Loom_FloatTensor:$qkv, Loom_FloatTensor:$grad, Loom_StatsTensor:$lse,
                       Optional<Loom_MaskTensor>:$key_mask, Optional<Loom_FloatTensor>:$out,
                       I64Attr:$num_heads, UnitAttr:$causal,
                       DefaultValuedAttr<F32Attr, "0.0">:$dropout,
                       DefaultValuedAttr<I64Attr, "0">:$stream,
                       OptionalAttr<StrAttr>:$rank_distinct_dropout,
                       OptionalAttr<StrAttr>:$context_parallel_group,
                       UnitAttr:$context_parallel_ring,
                       DefaultValuedAttr<I64Attr, "1">:$context_parallel_size);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = [{
    $qkv `,` $grad `,` $lse (`,` $key_mask^)? (`out` $out^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Loom_EmbeddingGradOp : Loom_Op<"embedding_grad", [Pure]> {
  let summary = "gradient of the word embedding: scatter-add of `grad` rows at the token ids";
  let arguments = (ins Loom_IndexTensor:$tokens, Loom_FloatTensor:$grad,
                       OptionalAttr<StrAttr>:$vocab_parallel_group);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$tokens `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Loom_TanhGradOp : Loom_Op<"tanh_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "gradient of tanh: `grad * (1 - tanh(input)^2)`";
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$grad);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input `,` $grad attr-dict `:` type($result)";
}

def Loom_TokenTypeGradOp : Loom_Op<"token_type_grad", [Pure]> {
  let summary = "gradient of the token-type table: `d[t, :] = sum of grad[b, s, :] over types[b, s0 + s] = t`";
  let arguments = (ins Loom_IndexTensor:$token_types, Loom_FloatTensor:$grad,
                       OptionalAttr<StrAttr>:$sequence_parallel_group);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$token_types `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Loom_PositionGradOp : Loom_Op<"position_grad", [Pure]> {
  let summary = "gradient of the position embedding: `d[s0 + s, :] = sum_b grad[b, s, :]`, zero elsewhere";
  let arguments = (ins Loom_FloatTensor:$grad, OptionalAttr<StrAttr>:$sequence_parallel_group,
                       OptionalAttr<StrAttr>:$context_parallel_group);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$grad attr-dict `:` functional-type(operands, results)";
}

def Loom_CrossEntropyGradOp : Loom_Op<"cross_entropy_grad", [Pure, AttrSizedOperandSegments]> {
  let summary = "gradient of cross_entropy w.r.t. the logits: `(softmax - onehot) * mask / count * g`";
  let description = [{
    Same attributes as the forward op, whose `lse` result it takes: the softmax is
    `exp(logit - lse)`, so a vocab-parallel backward is local to each rank's shard (no
    collective). `grad` is the loss's incoming gradient; without it the loss is the
    function's result and `grad` is `loss_scale` (1 unless the optimizer scales the loss).
  }];
  let arguments = (ins Loom_FloatTensor:$logits, Loom_IndexTensor:$labels, Loom_StatsTensor:$lse,
                       Optional<Loom_Scalar>:$grad, Optional<Loom_MaskTensor>:$loss_mask,
                       I64Attr:$valid_vocab, OptionalAttr<StrAttr>:$vocab_parallel_group,
                       DefaultValuedAttr<F32Attr, "1.0">:$loss_scale);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $labels `,` $lse (`grad` $grad^)? (`mask` $loss_mask^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Loom_RmsNormGradOp : Loom_Op<"rms_norm_grad", [Pure]> {
  let summary = "gradients of rms_norm w.r.t. input and gamma (statistics recomputed)";
  let description = [{
    With `r = 1 / sqrt(mean(x^2) + eps)` and `xhat = x r`: `dgamma = sum over rows of g * xhat`,
    `dx = r * (g*gamma - xhat * mean(g*gamma*xhat))` per row.
  }];
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$gamma, Loom_FloatTensor:$grad,
                       DefaultValuedAttr<F32Attr, "1.0e-6">:$epsilon);
  let results = (outs Loom_FloatTensor:$grad_input, Loom_FloatTensor:$grad_gamma);
  let assemblyFormat = "$input `,` $gamma `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Loom_SwigluGradOp : Loom_Op<"swiglu_grad", [Pure]> {
  let summary = "gradients of swiglu: `dgate = g * up * silu'(gate)`, `dup = g * silu(gate)`";
  let description = [{
    `silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x)))`.
  }];
  let arguments = (ins Loom_FloatTensor:$gate, Loom_FloatTensor:$up, Loom_FloatTensor:$grad);
  let results = (outs Loom_FloatTensor:$grad_gate, Loom_FloatTensor:$grad_up);
  let assemblyFormat = "$gate `,` $up `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Loom_GroupedAttentionGradOp : Loom_Op<"grouped_attention_grad", [Pure]> {
  let summary = "gradients of grouped_attention w.r.t. q, k and v (probabilities from the forward's statistics)";
  let description = [{
    Same attributes as the forward op, whose `lse` result it takes (as `loom.attention_grad`
    does). A KV head's gradients sum over the query heads that
    share it; with `kv_replicated_group` they cover only this rank's query heads (partial
    sums, completed over the group).
  }];
  let arguments = (ins Loom_FloatTensor:$q, Loom_FloatTensor:$k, Loom_FloatTensor:$v, Loom_FloatTensor:$grad,
                       Loom_StatsTensor:$lse, Optional<Loom_FloatTensor>:$out,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads, UnitAttr:$causal,
                       DefaultValuedAttr<F32Attr, "0.0">:$dropout,
                       DefaultValuedAttr<I64Attr, "0">:$stream,
                       OptionalAttr<StrAttr>:$rank_distinct_dropout,
                       OptionalAttr<StrAttr>:$kv_replicated_group,
                       DefaultValuedAttr<I64Attr, "1">:$group_size,
                       OptionalAttr<StrAttr>:$context_parallel_group,
                       UnitAttr:$context_parallel_ring,
                       DefaultValuedAttr<I64Attr, "1">:$context_parallel_size);
  let results = (outs Loom_FloatTensor:$grad_q, Loom_FloatTensor:$grad_k, Loom_FloatTensor:$grad_v);
  let assemblyFormat = [{
    $q `,` $k `,` $v `,` $grad `,` $lse (`out` $out^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Loom_MoeGradOp : Loom_Op<"moe_grad", [Pure]> {
  let summary = "gradients of moe w.r.t. its input, the router logits and the experts' weights";
  let description = [{
    The routing is recomputed from `logits` (the same top-k, the same drops). From `grad`
    (dL/dresult): the experts' weight gradients and `grad_input` through the kept assignments;
    `grad_logits` through the renormalised weights and the softmax, plus
    `aux_loss_coef * loss_scale` times the load-balancing loss's gradient (through the mean
    probabilities; the counts are constants). `loss_scale` is the share of the step's loss one
    run of the program carries (1 / micro-batches, set by loom-micro-batches), as
    `loom.cross_entropy_grad`'s. With `expert_parallel_group` the rank's experts' weight
    gradients cover the assignments of every member's tokens, divided by the group's size (so
    that their average over "edp" is the data-parallel mean). `routing_stats`: as `loom.moe`'s.
  }];
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$logits, Loom_FloatTensor:$gate,
                       Loom_FloatTensor:$up, Loom_FloatTensor:$down, Loom_FloatTensor:$grad,
                       Optional<Loom_FloatTensor>:$routing_stats, I64Attr:$top_k,
                       DefaultValuedAttr<F32Attr, "0.0">:$capacity_factor,
                       DefaultValuedAttr<F32Attr, "0.0">:$aux_loss_coef,
                       DefaultValuedAttr<F32Attr, "1.0">:$loss_scale,
                       OptionalAttr<StrAttr>:$expert_parallel_group,
                       DefaultValuedAttr<I64Attr, "1">:$expert_parallel_size);
  let results = (outs Loom_FloatTensor:$grad_input, Loom_FloatTensor:$grad_logits, Loom_FloatTensor:$grad_gate,
                      Loom_FloatTensor:$grad_up, Loom_FloatTensor:$grad_down);
  let assemblyFormat = [{
    $input `,` $logits `,` $gate `,` $up `,` $down `,` $grad (`,` `stats` $routing_stats^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Loom_AddBiasOp : Loom_Op<"add_bias", [Pure]> {
  let summary = "`out[..., n] = input[..., n] + bias[n]` (the bias of a row-parallel GEMM, added after its all-reduce)";
  let arguments = (ins Loom_FloatTensor:$input, Loom_FloatTensor:$bias);
  let results = (outs Loom_FloatTensor:$result);
  let assemblyFormat = "$input `,` $bias attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

#endif // LOOM_OPS_TD
