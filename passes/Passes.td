//===- Passes.td - Loom's compiler passes --------------------*- tablegen -*-===//
#ifndef LOOM_PASSES_TD
#define LOOM_PASSES_TD

include "mlir/Pass/PassBase.td"

def LoomSpecializeBatch : Pass<"loom-specialize-batch", "mlir::ModuleOp"> {
  let summary = "Give the dynamic batch dimension of train_step the cluster's micro-batch";
  let description = [{
    The IR may leave the batch (dim 0 of the data inputs and of every activation) dynamic
    (`?`); this pass sets it to `batch` everywhere. A static batch that differs from `batch`,
    a dynamic dimension other than the batch, and a parameter with a dynamic dimension are
    errors naming the argument or op and both numbers.
  }];
  let options = [Option<"batch", "batch", "int64_t", "1", "the micro-batch size">];
}

def LoomPadVocab : Pass<"loom-pad-vocab", "mlir::ModuleOp"> {
  let summary = "Pad the vocabulary dimension to a multiple of make_vocab_size_divisible_by * t";
  let description = [{
    Megatron pads the embedding table so that every tensor-parallel rank holds an equal,
    GEMM-friendly shard. The vocabulary dimensions are found from the dataflow: rows of each
    loom.embedding's word table, and the output features of the linear producing each
    loom.cross_entropy's logits (its weight, its bias, its result). cross_entropy keeps
    `valid_vocab`, so the padded columns never enter the softmax: padding changes neither the
    loss nor the gradients of the real rows. The added rows are initialised like the rest.
  }];
  let options = [Option<"multiple", "multiple", "int64_t", "128", "pad to a multiple of this">];
}

def LoomTensorParallel : Pass<"loom-tensor-parallel", "mlir::ModuleOp"> {
  let summary = "Megatron tensor parallelism: shard train_step into its SPMD form for group tp";
  let description = [{
    Megatron-LM paper (arXiv:1909.08053), section 3, by one rule per op kind found from the
    dataflow (not from a fixed op sequence): a linear on a replicated input whose output
    reaches, through gelu, dropout, add, add_bias and attention, only linears is
    column-parallel (each rank owns whole heads or a slice of the FFN) and those linears are
    row-parallel, followed by an all_reduce (g); a `loom.identity` (f) marks each replicated
    value entering a parallel region, so autodiff turns it into the backward all-reduce. The
    input embedding becomes vocab-parallel (masked lookup + all_reduce) and the linear
    producing the logits (tied or not) a vocab-parallel GEMM fused with cross-entropy. Layer
    norms, residual adds and other ops on replicated values stay replicated. A linear or
    attention op that fits no rule is an error naming it, unless marked `loom.replicated`.
    Dropout inside a parallel region draws rank-distinct random streams; dropout outside it
    stays identical across the group. Parameters get local shapes and
    `loom.shard_dim`/`loom.shard_parts`.
  }];
  let options = [
    Option<"tensorParallel", "tp", "int64_t", "1", "tensor-parallel degree t">,
    Option<"sequenceParallel", "sequence-parallel", "bool", "false",
           "shard layer norm and dropout along the sequence (all_gather / reduce_scatter)">,
  ];
}

def LoomContextParallel : Pass<"loom-context-parallel", "mlir::ModuleOp"> {
  let summary = "Context parallelism: every token-wise op on this rank's chunks of the sequence";
  let description = [{
    Megatron-Core's context parallelism (cp ranks, the sequence in 2 cp chunks, rank i holding
    chunks i and 2cp-1-i for causal load balance), after loom-tensor-parallel: the sequence
    dimension (dim 1) of the data inputs and of every activation is divided by cp. With comm =
    p2p (Megatron-Core's cp_comm_type "p2p", its default) each attention core is marked
    `context_parallel_ring`: the plan's ring_attention passes the keys and values round the cp
    ring, one member's chunks per step, overlapped with that step's blocks. With comm =
    all_gather each core's keys and values (GPT's fused qkv) are all-gathered over "cp" before it
    (autodiff makes the gradient a reduce-scatter) and the core computes the rank's queries
    against them. In both, the ops that depend on a token's
    position (learned positions, rotary, dropout counters, attention) carry
    `context_parallel_group = "cp"` and map local tokens to global positions. The sequence must
    be a multiple of 2 cp; a padding mask (key_mask) is refused.
  }];
  let options = [Option<"cp", "cp", "int64_t", "1", "context-parallel degree c">,
                 Option<"comm", "comm", "std::string", "\"p2p\"", "p2p (the ring) or all_gather">];
}

def LoomExpertParallel : Pass<"loom-expert-parallel", "mlir::ModuleOp"> {
  let summary = "Expert parallelism: each rank of an ep group holds num_experts / ep of every MoE layer's experts";
  let description = [{
    Megatron-Core's expert parallelism (the ep group: ep consecutive data-parallel ranks, whose
    micro-batches differ). Every `loom.moe` gets `expert_parallel_group = "ep"` and
    `expert_parallel_size = ep`, and its stacked expert weights (gate, up, down) are split along
    the experts (dim 0): rank i of the group holds experts i E / ep .. (i + 1) E / ep - 1, marked
    `loom.shard_dim = 0`, `loom.shard_parts = ep`, `loom.shard_group = "ep"`. In the plan each
    such MoE is one collective over "ep": the rank routes its own tokens (the same routing,
    capacity and load-balancing loss as without ep), sends each kept assignment's row to the
    rank holding its expert and gets the expert's output back (all-to-all with the counts
    exchanged first), and the backward returns the rows' gradients the same way. The experts'
    weight gradients are reduced over "edp" (loom-data-parallel). ep must divide the experts.
  }];
  let options = [Option<"ep", "ep", "int64_t", "1", "expert-parallel degree">];
}

def LoomMixedPrecision : Pass<"loom-mixed-precision", "mlir::ModuleOp"> {
  let summary = "Apply the precision policy: 16-bit weights for compute and activations";
  let description = [{
    Megatron's mixed precision (Micikevicius et al. 2018; Megatron-LM's Float16Module): the
    parameters the model computes with and every activation become `dtype` (bf16 or f16),
    while what must stay fp32 stays fp32 by the dialect's types: the softmax statistics
    (`lse` of attention, grouped attention and cross-entropy), the loss and the MoE
    load-balancing losses, the MoE routing statistics (token counts), and the data inputs
    (masks). Runs after partitioning and before autodiff, so that the gradients of the
    activations are 16-bit too; the compiler keeps fp32 master weights, main gradients and
    AdamW moments for the 16-bit parameters (compiler/StepPrograms.h). `dtype` empty: the
    module's `loom.params_dtype` (absent: fp32, nothing changes). Parameters already of
    another 16-bit dtype are an error naming one.
  }];
  let options = [Option<"dtype", "dtype", "std::string", "\"\"", "bf16 | f16 | f32 (default: the module's loom.params_dtype)">];
}

def LoomAutodiff : Pass<"loom-autodiff", "mlir::ModuleOp"> {
  let summary = "Reverse-mode autodiff of train_step: append the gradient of the loss w.r.t. every parameter";
  let description = [{
    One gradient rule per op (passes/GradientRules.cpp). The gradient of all_reduce is the
    identity and the gradient of loom.identity is an all_reduce, so Megatron's f/g
    operators come out of differentiating the sharded forward graph. The function then
    returns (loss, grad_0, ..., grad_{n-1}), each gradient result tagged
    `loom.grad_of = <parameter name>`; backward ops carry `loom.backward` and the
    `loom.layer` of the forward op they differentiate.
  }];
}

def LoomDataParallel : Pass<"loom-data-parallel", "mlir::ModuleOp"> {
  let summary = "Average gradients over the data-parallel group dp in buckets";
  let description = [{
    Inserts an all_reduce (avg) over "dp" for every gradient result, each right after the op
    that makes the gradient final and tagged with a bucket of at most `bucket-bytes` in that
    order (last layer first), so that a runtime can start a bucket while the backward pass
    continues (PyTorch DDP / Megatron's grad buffer). The lowering packs each bucket into one
    collective; the CPU runtime runs the grad-sync programs after the last micro-batch (not yet
    overlapped with the backward pass). With `zero1` (ZeRO stage 1, Megatron's
    distributed optimizer) no dp all-reduce is emitted and the module is marked `loom.zero1`:
    the runtime reduce-scatters the flattened gradients over dp, each rank updates its 1/d of
    the parameters with its 1/d of the AdamW state, and all-gathers the parameters.
  }];
  let options = [
    Option<"dataParallel", "dp", "int64_t", "1", "data-parallel degree d">,
    Option<"bucketBytes", "bucket-bytes", "int64_t", "25000000", "bucket size in bytes">,
    Option<"zero1", "zero1", "bool", "false", "shard optimizer state (reduce-scatter gradients)">,
    Option<"group", "group", "std::string", "\"dp\"",
           "the group the gradients are averaged over (dpcp: the d x c ranks with context parallelism)">,
    Option<"expertParallel", "expert-parallel", "int64_t", "1",
           "expert parallelism ep: the experts' gradients (shard group ep) are averaged over the edp group, the dp / ep ranks holding the same experts">,
  ];
}

def LoomPipelineStages : Pass<"loom-pipeline-stages", "mlir::ModuleOp"> {
  let summary = "Assign every op of train_step a virtual pipeline stage; duplicate parameters shared by two stages";
  let description = [{
    PTD-P paper (arXiv:2104.04473), section 2.2. With p stages and v chunks per stage there are
    p * v virtual stages; chunk c of stage s is virtual stage c * p + s (the interleaved
    assignment of section 2.2.2). Layers are split evenly, or as `layout` gives (layers per
    virtual stage). Ops before the first layer (embedding) go to virtual stage 0, ops after
    the last (final layer norm, output layer, loss) to the last. A parameter used on two
    stages (the tied word embedding, on the first and the last) gets a copy for the second
    stage carrying `loom.tied_to`; loom-data-parallel sums their gradients over the
    "embedding" group. Run before loom-autodiff, which carries `loom.stage` to backward ops.
  }];
  let options = [
    Option<"pipelineParallel", "pp", "int64_t", "1", "pipeline stages p">,
    Option<"virtualStages", "vp", "int64_t", "1", "chunks per stage v (interleaved schedule)">,
    ListOption<"layout", "layout", "int64_t", "layers per virtual stage (p * v entries); default: even">,
  ];
}

def LoomPipelinePartition : Pass<"loom-pipeline-partition", "mlir::ModuleOp"> {
  let summary = "Split the differentiated train_step into forward, backward and grad-sync programs per virtual stage";
  let description = [{
    For each virtual stage k: @forward_k, @backward_k and, when gradients are synchronised
    (data parallelism, tied embeddings), @grad_sync_k. Values crossing stages become
    loom.send / loom.recv on group "pp" (tag = the value's channel); activations a backward
    program needs from its forward program are results of the forward marked `loom.stash`
    and arguments of the backward with the same name; gradients are results marked
    `loom.grad_of`. The runtime runs forward/backward once per micro-batch in the order the
    schedule gives, accumulates gradients, and runs grad_sync once per step.
  }];
}

def LoomRecompute : Pass<"loom-recompute", "mlir::ModuleOp"> {
  let summary = "Activation recomputation: none or full (per layer)";
  let description = [{
    Reducing Activation Recomputation in Large Transformer Models (arXiv:2205.05198). With
    `full`, a backward program keeps from its forward program only the inputs of each
    Transformer layer (the checkpoints) and recomputes the layer's forward ops right before
    the layer's backward, dropout included (same counter-based streams, hence the same
    masks). There is no `selective` mode: Megatron's selective recomputation stops storing
    the attention core's [b, heads, s, s] probabilities, and Loom's attention backward never
    stores them (it recomputes them from q, k, v, a flash-attention-style kernel), so `none`
    already is selective; `selective` is refused rather than accepted as a no-op.
  }];
  let options = [
    Option<"mode", "mode", "std::string", "\"none\"", "none | full">,
  ];
}

def LoomScatterGather : Pass<"loom-scatter-gather", "mlir::ModuleOp"> {
  let summary = "PTD-P's scatter/gather: cross-node pipeline messages travel as t slices, all-gathered on arrival";
  let description = [{
    Narayanan et al. 2021, section 4.1. Without sequence parallelism every pipeline message is
    replicated across the tensor-parallel group; on the links listed in `crossing` (pairs of
    pipeline-stage positions whose ranks are on different nodes, both directions) each
    loom.send on "pp" sends its rank's 1/t slice (loom.shard along the outermost dimension t
    divides) and the matching loom.recv receives the slice and all-gathers it over "tp".
    Values are unchanged. Runs after loom-pipeline-partition (the last pass).
  }];
  let options = [
    Option<"tp", "tp", "int64_t", "1", "tensor-parallel size t">,
    ListOption<"crossing", "crossing", "int64_t", "pipeline-stage position pairs a,b whose messages cross nodes">,
  ];
}

def LoomMicroBatches : Pass<"loom-micro-batches", "mlir::ModuleOp"> {
  let summary = "Scale the loss gradient by 1/m for gradient accumulation over m micro-batches";
  let description = [{
    The step's loss is the mean of the m micro-batch losses (and of the d replicas' losses,
    which loom-data-parallel's averaging takes care of), so each micro-batch's loss gradient
    is 1/m (Megatron divides the loss by the number of micro-batches).
  }];
  let options = [Option<"count", "count", "int64_t", "1", "micro-batches per step m">];
}

#endif // LOOM_PASSES_TD
