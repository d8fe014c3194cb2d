#include "plan/InstructionSet.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

namespace loom::isa {
namespace {

using Shapes = std::vector<std::vector<int64_t>>;
using O = OperandDecl;
using A = AttrDecl;

int64_t numel(const std::vector<int64_t> &s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Operand shorthands: a float tensor, an int32 tensor, optional ones told apart by rank.
O fl(const char *n) { return {n, kFloat, O::kOne, -1}; }
O i32(const char *n) { return {n, kI32, O::kOne, -1}; }
O optFl(const char *n, int8_t rank = -1) { return {n, kFloat, O::kOptional, rank}; }
O many(const char *n) { return {n, kFloat, O::kVariadic, -1}; }
// fp32 only: the optimizer's master weights, main gradients, moments and scalars (Megatron's
// mixed precision keeps them in fp32 whatever the compute dtype).
O f32(const char *n) { return {n, kF32, O::kOne, -1}; }

// Attribute shorthands.
A req(const char *n, AttrType t) { return {n, t, true}; }
A optInt(const char *n, int64_t d = 0) { return {n, AttrType::kInt, false, d}; }
A optF(const char *n, double d = 0) { return {n, AttrType::kFloat, false, 0, d}; }
A optStr(const char *n, const char *d = "") { return {n, AttrType::kString, false, 0, 0, d}; }
A flagA(const char *n) { return {n, AttrType::kFlag}; }
constexpr AttrType kI = AttrType::kInt, kF = AttrType::kFloat, kS = AttrType::kString;

// The dropout attributes of attention (and its gradient, and the grouped forms).
std::vector<A> attentionAttrs(bool grouped) {
  std::vector<A> a = {req("num_heads", kI)};
  if (grouped) a.push_back(req("num_kv_heads", kI));
  a.insert(a.end(), {flagA("causal"), optF("dropout"), optInt("stream"), optStr("rank_distinct_dropout")});
  if (grouped) a.insert(a.end(), {optStr("kv_replicated_group"), optInt("group_size", 1)});
  a.insert(a.end(), {optStr("context_parallel_group"), flagA("context_parallel_ring"), optInt("context_parallel_size", 1)});
  return a;
}
// Context parallelism's ring (attention cores marked context_parallel_ring): the cores' own
// attributes and the collective's group ("cp", its size context_parallel_size; group_size stays
// grouped attention's own).
std::vector<A> ringAttentionAttrs(bool grouped) {
  std::vector<A> a = attentionAttrs(grouped);
  a.push_back(req("group", kS));
  return a;
}
std::vector<A> crossEntropyAttrs() { return {req("valid_vocab", kI), optStr("vocab_parallel_group")}; }
// reduce_scatter's "reduce" is the plan's own ("avg": ZeRO-1's gradient average); the dialect's
// reduce_scatter sums.
std::vector<A> shardAttrs() { return {req("group", kS), req("group_size", kI), req("dim", kI)}; }
std::vector<A> gatherScatterAttrs(bool withReduce) {
  std::vector<A> a = shardAttrs();
  a.insert(a.end(), {optInt("row_begin"), optInt("row_end")});
  if (!withReduce) a.push_back(flagA("split_gradient"));  // all_gather: how its gradient goes (autodiff's)
  if (withReduce) a.insert(a.end(), {optStr("reduce", "sum"), optStr("wire_dtype")});
  return a;
}
// row_begin / row_end of all_gather and reduce_scatter (tp_comm_overlap with sequence
// parallelism): rows of the flattened large (gathered) buffer, whole slices along the dims
// before `dim` (for dim 1 of [B, S, H]: samples b0..b1 as rows b0 S .. b1 S); 0 / 0: all.
constexpr const char *kGatherRowsDoc =
    "row_begin / row_end (tp_comm_overlap with sequence parallelism; 0 / 0: all): rows of the flattened gathered "
    "buffer covering whole slices along the dims before `dim`, and their share of the small one";

// FLOPs (the PTD-P count: 2 per multiply-add).
double gemmFlops(const Shapes &in, const Shapes &out) { return 2.0 * numel(out[0]) * in[0].back(); }
double weightGradFlops(const Shapes &in, const Shapes &out) {
  return 2.0 * numel(out[0]) * (numel(in[0]) / in[0].back());
}
// Forward: QK^T and PV, 2 GEMMs of 2 b s s_k h; the result is [b, s, h] and operand `Keys`
// holds the s_k keys (s_k = s, or with context parallelism the gathered sequence: s = s_k / c).
// Keys = -1: the ring's, which meets the whole sequence: s_k = s c for a ring of c (the shapes
// alone do not say c; attentionFlopsOf with the instruction's group_size does).
template <int Keys>
double attentionFlops(const Shapes &in, const Shapes &out) {
  return 4.0 * numel(out[0]) * (Keys < 0 ? out[0][1] : in[Keys][1]);
}
// Backward: QK^T recomputed, then dV, dP, dQ, dK: 5 GEMMs of 2 b s s_k h, from the incoming
// gradient (operand `Grad`, [b, s, h]).
template <int Grad, int Keys>
double attentionGradFlops(const Shapes &in, const Shapes &) {
  return 10.0 * numel(in[Grad]) * (Keys < 0 ? in[Grad][1] : in[Keys][1]);
}

// A mixture-of-experts MLP per routed (token, expert) pair, times top_k (flopsTimesAttr): gate,
// up and down, 3 GEMMs of 2 H F (operand 2, gate, is [E, F, H]); the backward recomputes them and
// adds 6 more (the activation's and the weights' gradients of each): 18 H F.
double moeFlops(const Shapes &in, const Shapes &) { return 6.0 * numel(in[0]) * in[2][1]; }
double moeGradFlops(const Shapes &in, const Shapes &) { return 18.0 * numel(in[0]) * in[2][1]; }
std::vector<A> moeAttrs(bool grad = false, bool expertParallel = false) {
  std::vector<A> a = {req("top_k", kI), optF("capacity_factor"), optF("aux_loss_coef")};
  if (grad) a.push_back(optF("loss_scale", 1.0));
  a.insert(a.end(), {optStr("expert_parallel_group"), optInt("expert_parallel_size", 1)});
  if (expertParallel) a.push_back(req("group", kS));
  return a;
}

// Bytes per rank on a ring (Megatron's and NCCL's ring algorithms).
int64_t allReduceBytes(int64_t in, int64_t, int64_t g) { return ringBytesPerRank(in, g, 2); }
int64_t gatherBytes(int64_t, int64_t out, int64_t g) { return ringBytesPerRank(out, g, 1); }
int64_t scatterBytes(int64_t in, int64_t, int64_t g) { return ringBytesPerRank(in, g, 1); }
int64_t sendBytes(int64_t in, int64_t, int64_t) { return in; }
int64_t recvBytes(int64_t, int64_t out, int64_t) { return out; }

constexpr StreamRule kC = StreamRule::kCompute;
constexpr Comm kNo = Comm::kNone;
constexpr CostClass kMem = CostClass::kMemory, kGemmCost = CostClass::kGemm, kAttnCost = CostClass::kAttention,
                    kNoCost = CostClass::kFree;

OpDecl make(OpId id, const char *name, bool dialectOp, std::vector<O> inputs, std::vector<O> outputs,
            std::vector<A> attributes, StreamRule stream, Comm comm, CostClass cost, int ringFactor = 0,
            const char *summary = "", double (*flops)(const Shapes &, const Shapes &) = nullptr,
            int64_t (*bytesMoved)(int64_t, int64_t, int64_t) = nullptr, const char *flopsTimesAttr = nullptr) {
  OpDecl d{id, name, dialectOp, std::move(inputs), std::move(outputs), std::move(attributes), stream, comm, cost};
  d.ringFactor = ringFactor, d.summary = summary, d.flops = flops, d.bytesMoved = bytesMoved;
  d.flopsTimesAttr = flopsTimesAttr;
  return d;
}

std::vector<OpDecl> declare() {
  using enum OpId;
  std::vector<OpDecl> ops = {
      // The loom dialect's ops (ir/LoomOps.td has their math; the attributes and defaults here
      // are the dialect's, checked by tests/plan/instruction_set_test).
      make(kEmbedding, "embedding", true, {i32("tokens"), fl("word"), optFl("position")}, {fl("result")},
       {optStr("vocab_parallel_group"), optStr("context_parallel_group")}, kC, kNo, kMem),
      make(kAddPosition, "add_position", true, {fl("input"), fl("position")}, {fl("result")},
       {optStr("sequence_parallel_group"), optStr("context_parallel_group")}, kC, kNo, kMem),
      make(kLayerNorm, "layer_norm", true, {fl("input"), fl("gamma"), fl("beta")}, {fl("result")}, {optF("epsilon", 1e-5)},
       kC, kNo, kMem),
      make(kLinear, "linear", true, {fl("input"), fl("weight"), optFl("bias")}, {fl("result")},
       {flagA("transpose_weight"), optInt("row_begin"), optInt("row_end")}, kC, kNo, kGemmCost, 0,
       "row_begin / row_end (tp_comm_overlap's chunks; 0 / 0: all): only those rows of the flattened input and "
       "result",
       gemmFlops),
      make(kAddBias, "add_bias", true, {fl("input"), fl("bias")}, {fl("result")}, {}, kC, kNo, kMem),
      make(kGelu, "gelu", true, {fl("input")}, {fl("result")}, {}, kC, kNo, kMem),
      make(kAttention, "attention", true, {fl("qkv"), optFl("key_mask")}, {fl("result"), optFl("lse")},
       attentionAttrs(false), kC, kNo, kAttnCost, 0, "", attentionFlops<0>),
      make(kDropout, "dropout", true, {fl("input")}, {fl("result")},
       {req("rate", kF), optInt("stream"), optStr("rank_distinct"), optStr("context_parallel_group")}, kC, kNo, kMem),
      make(kAdd, "add", true, {fl("lhs"), fl("rhs")}, {fl("result")}, {}, kC, kNo, kMem),
      make(kIdentity, "identity", true, {fl("input")}, {fl("result")}, {req("group", kS), req("group_size", kI)}, kC, kNo, kNoCost),
      make(kCrossEntropy, "cross_entropy", true, {fl("logits"), i32("labels"), optFl("loss_mask")},
       {fl("loss"), optFl("lse")}, {req("valid_vocab", kI), optStr("vocab_parallel_group"), optInt("vocab_parallel_size")},
       kC, kNo, kMem),
      make(kRmsNorm, "rms_norm", true, {fl("input"), fl("gamma")}, {fl("result")}, {optF("epsilon", 1e-6)}, kC, kNo,
       kMem),
      make(kRotary, "rotary", true, {fl("input")}, {fl("result")},
       {req("head_dim", kI), req("theta", kF), flagA("inverse"), optStr("context_parallel_group")}, kC, kNo, kMem),
      make(kSwiglu, "swiglu", true, {fl("gate"), fl("up")}, {fl("result")}, {}, kC, kNo, kMem),
      make(kGroupedAttention, "grouped_attention", true, {fl("q"), fl("k"), fl("v")}, {fl("result"), optFl("lse")},
       attentionAttrs(true), kC, kNo, kAttnCost, 0, "", attentionFlops<1>),
      make(kWeightGrad, "weight_grad", true, {fl("input"), fl("grad")}, {fl("result")}, {flagA("transpose_weight")}, kC,
       kNo, kGemmCost, 0, "", weightGradFlops),
      make(kBiasGrad, "bias_grad", true, {fl("grad")}, {fl("result")}, {}, kC, kNo, kMem),
      make(kLayerNormGrad, "layer_norm_grad", true, {fl("input"), fl("gamma"), fl("grad")},
       {fl("grad_input"), fl("grad_gamma"), fl("grad_beta")}, {optF("epsilon", 1e-5)}, kC, kNo, kMem),
      make(kGeluGrad, "gelu_grad", true, {fl("input"), fl("grad")}, {fl("result")}, {}, kC, kNo, kMem),
      make(kAttentionGrad, "attention_grad", true, {fl("qkv"), fl("grad"), fl("lse"), optFl("key_mask", 2), optFl("out", 3)},
       {fl("result")},
       attentionAttrs(false), kC, kNo, kAttnCost, 0, "", attentionGradFlops<1, 0>),
      make(kEmbeddingGrad, "embedding_grad", true, {i32("tokens"), fl("grad")}, {fl("result")},
       {optStr("vocab_parallel_group")}, kC, kNo, kMem),
      make(kPositionGrad, "position_grad", true, {fl("grad")}, {fl("result")},
       {optStr("sequence_parallel_group"), optStr("context_parallel_group")}, kC, kNo, kMem),
      // The loss's incoming gradient is a scalar, the mask [batch, seq]: told apart by rank.
      make(kCrossEntropyGrad, "cross_entropy_grad", true,
       {fl("logits"), i32("labels"), fl("lse"), optFl("grad", 0), optFl("loss_mask", 2)}, {fl("result")},
       {req("valid_vocab", kI), optStr("vocab_parallel_group"), optF("loss_scale", 1.0)}, kC, kNo, kMem),
      make(kRmsNormGrad, "rms_norm_grad", true, {fl("input"), fl("gamma"), fl("grad")},
       {fl("grad_input"), fl("grad_gamma")}, {optF("epsilon", 1e-6)}, kC, kNo, kMem),
      make(kSwigluGrad, "swiglu_grad", true, {fl("gate"), fl("up"), fl("grad")}, {fl("grad_gate"), fl("grad_up")}, {}, kC,
       kNo, kMem),
      make(kGroupedAttentionGrad, "grouped_attention_grad", true,
       {fl("q"), fl("k"), fl("v"), fl("grad"), fl("lse"), optFl("out")},
       {fl("grad_q"), fl("grad_k"), fl("grad_v")}, attentionAttrs(true), kC, kNo, kAttnCost, 0, "",
       attentionGradFlops<3, 1>),
      make(kMoe, "moe", true,
       {fl("input"), fl("logits"), fl("gate"), fl("up"), fl("down"), optFl("routing_stats", 2)},
       {fl("result"), f32("aux")}, moeAttrs(), kC, kNo, kGemmCost, 0, "", moeFlops, nullptr, "top_k"),
      make(kMoeGrad, "moe_grad", true,
       {fl("input"), fl("logits"), fl("gate"), fl("up"), fl("down"), fl("grad"), optFl("routing_stats", 2)},
       {fl("grad_input"), fl("grad_logits"), fl("grad_gate"), fl("grad_up"), fl("grad_down")}, moeAttrs(true), kC, kNo,
       kGemmCost, 0, "", moeGradFlops, nullptr, "top_k"),
      make(kMoeRoutingStats, "moe_routing_stats", true, {fl("logits")}, {f32("result")}, {req("top_k", kI)}, kC, kNo,
       kMem),
      // BERT's pooler activation and segment embeddings (the sentence-order head's parts).
      make(kTanh, "tanh", true, {fl("input")}, {fl("result")}, {}, kC, kNo, kMem),
      make(kTanhGrad, "tanh_grad", true, {fl("input"), fl("grad")}, {fl("result")}, {}, kC, kNo, kMem),
      make(kAddTokenType, "add_token_type", true, {fl("input"), i32("token_types"), fl("table")}, {fl("result")},
       {optStr("sequence_parallel_group")}, kC, kNo, kMem),
      make(kTokenTypeGrad, "token_type_grad", true, {i32("token_types"), fl("grad")}, {fl("result")},
       {optStr("sequence_parallel_group")}, kC, kNo, kMem),

      // Megatron's vocab-parallel cross-entropy as its steps (compiler/Lowering.cpp): local max
      // -> all-reduce (max) -> local sums of exponentials and the target logit -> all-reduce
      // (sum) -> the mean loss and the kept log-sum-exp.
      make(kCrossEntropyMax, "cross_entropy_max", false, {fl("logits")}, {fl("max")}, crossEntropyAttrs(), kC, kNo,
       kMem, 0, "per-token max of this shard's valid logits"),
      make(kCrossEntropySums, "cross_entropy_sums", false, {fl("logits"), i32("labels"), fl("max")}, {fl("sums")},
       crossEntropyAttrs(), kC, kNo, kMem, 0,
       "[2, tokens]: this shard's sums of exp(logit - max), then its target logits (0 where not in the shard)"),
      make(kCrossEntropyLoss, "cross_entropy_loss", false, {fl("max"), fl("sums"), optFl("loss_mask")},
       {fl("loss"), optFl("lse")}, {}, kC, kNo, kMem, 0, "the mean loss over (unmasked) tokens, and the lse"),

      // Communication (the dialect's collectives and pipeline messages). A data-parallel
      // bucket's all-reduce has several operands, output k in input k's place.
      make(kAllReduce, "all_reduce", true, {many("input")}, {many("result")},
       {req("group", kS), req("group_size", kI), optStr("reduce", "sum"), optInt("loom.bucket"), optStr("wire_dtype"),
        optInt("row_begin"), optInt("row_end")},
       StreamRule::kOfGroup, Comm::kCollective, kMem, 2,
       "wire_dtype (bf16 / f16, on fp32 buffers): the values travel and are reduced in that dtype, then are widened "
       "back; row_begin / row_end (one operand; 0 / 0: all): only those rows of the flattened input and result",
       nullptr, allReduceBytes),
      make(kAllGather, "all_gather", true, {fl("input")}, {fl("result")}, gatherScatterAttrs(false), StreamRule::kOfGroup,
       Comm::kCollective, kMem, 1, kGatherRowsDoc, nullptr, gatherBytes),
      make(kReduceScatter, "reduce_scatter", true, {fl("input")}, {fl("result")}, gatherScatterAttrs(true),
       StreamRule::kOfGroup, Comm::kCollective, kMem, 1, kGatherRowsDoc, nullptr, scatterBytes),
      make(kSend, "send", true, {fl("input")}, {},
       {req("group", kS), req("group_size", kI), req("peer", kI), optInt("tag")}, StreamRule::kPipeline,
       Comm::kPointToPoint, kMem, 0, "", nullptr, sendBytes),
      make(kRecv, "recv", true, {}, {fl("result")}, {req("group", kS), req("group_size", kI), req("peer", kI), optInt("tag")},
       StreamRule::kPipeline, Comm::kPointToPoint, kMem, 0, "", nullptr, recvBytes),
      make(kShard, "shard", true, {fl("input")}, {fl("result")}, shardAttrs(), kC, kNo, kMem, 0,
       "this rank's slice along dim of a value replicated over group (PTD-P's scatter, section 4.1)"),

      // Context parallelism's ring attention (Megatron-Core's cp_comm_type "p2p"; Liu et al. 2023):
      // the attention cores marked context_parallel_ring, each one collective over `group` ("cp"):
      // context_parallel_size steps, each the rank's queries against one member's two chunks of keys and
      // values while the next member's travel round the ring (the backward passes the keys' and
      // values' gradients on after each step). bytes_moved: what the rank sends.
      make(kRingAttention, "ring_attention", false, {fl("qkv")}, {fl("result"), optFl("lse")}, ringAttentionAttrs(false),
       StreamRule::kOfGroup, Comm::kCollective, kAttnCost, 1,
       "attention (GPT's fused qkv, this rank's tokens) with the keys and values round the ring", attentionFlops<-1>,
       nullptr, "context_parallel_size")
          .withGroupAttr("context_parallel_group"),
      make(kRingAttentionGrad, "ring_attention_grad", false, {fl("qkv"), fl("grad"), fl("lse"), fl("out")},
       {fl("result")}, ringAttentionAttrs(false), StreamRule::kOfGroup, Comm::kCollective, kAttnCost, 2,
       "attention_grad round the ring; out: the forward's result (D = rowsum(dO * O))", attentionGradFlops<1, -1>,
       nullptr, "context_parallel_size")
          .withGroupAttr("context_parallel_group"),
      make(kRingGroupedAttention, "ring_grouped_attention", false, {fl("q"), fl("k"), fl("v")}, {fl("result"), optFl("lse")},
       ringAttentionAttrs(true), StreamRule::kOfGroup, Comm::kCollective, kAttnCost, 1,
       "grouped_attention with k and v round the ring", attentionFlops<-1>, nullptr, "context_parallel_size")
          .withGroupAttr("context_parallel_group"),
      make(kRingGroupedAttentionGrad, "ring_grouped_attention_grad", false,
       {fl("q"), fl("k"), fl("v"), fl("grad"), fl("lse"), fl("out")}, {fl("grad_q"), fl("grad_k"), fl("grad_v")},
       ringAttentionAttrs(true), StreamRule::kOfGroup, Comm::kCollective, kAttnCost, 2,
       "grouped_attention_grad round the ring; out: the forward's result", attentionGradFlops<3, -1>, nullptr,
       "context_parallel_size")
          .withGroupAttr("context_parallel_group"),

      // Expert parallelism (Megatron-Core's expert model parallelism with the all-to-all token
      // dispatcher): a moe whose experts are split over `group` ("ep"), one collective. The rank
      // routes its tokens, sends each kept assignment's row to the member holding its expert
      // (the counts exchanged first, then the rows), computes the rows the others sent to its own
      // experts and returns their outputs; the backward sends the rows with their output
      // gradients and gets the rows' input gradients and outputs back. FLOPs: the rank's own
      // assignments' (uniform routing); bytes_moved: what the rank sends with uniform routing.
      make(kExpertParallelMoe, "expert_parallel_moe", false,
       {fl("input"), fl("logits"), fl("gate"), fl("up"), fl("down"), optFl("routing_stats", 2)}, {fl("result"), f32("aux")}, moeAttrs(false, true), StreamRule::kOfGroup, Comm::kCollective, kGemmCost, 1,
       "moe with its experts split over the group, the assignments exchanged all-to-all", moeFlops, nullptr, "top_k")
          .withGroupAttr("expert_parallel_group"),
      make(kExpertParallelMoeGrad, "expert_parallel_moe_grad", false,
       {fl("input"), fl("logits"), fl("gate"), fl("up"), fl("down"), fl("grad"), optFl("routing_stats", 2)},
       {fl("grad_input"), fl("grad_logits"), fl("grad_gate"), fl("grad_up"), fl("grad_down")}, moeAttrs(true, true),
       StreamRule::kOfGroup, Comm::kCollective, kGemmCost, 2,
       "moe_grad with the experts split over the group; the experts' gradients divided by its size", moeGradFlops,
       nullptr, "top_k")
          .withGroupAttr("expert_parallel_group"),

      // The step's own instructions (compiler/StepPrograms.cpp): accumulation, the loss, the
      // optimizer over the flat buffers.
      make(kAccumulate, "accumulate", false, {fl("input")}, {fl("accumulator")}, {}, kC, kNo, kMem, 0,
       "accumulator += input, in place (gradient and loss accumulation)"),
      make(kFill, "fill", false, {}, {fl("output")}, {optF("value")}, kC, kNo, kMem, 0, "output = value"),
      make(kScale, "scale", false, {fl("input")}, {fl("output")}, {optF("factor", 1.0)}, kC, kNo, kMem, 0,
       "output = factor * input"),
      // 16-bit plans: the fp32 master weights into the 16-bit copies the programs compute with.
      make(kCast, "cast", false, {fl("input")}, {fl("output")}, {}, kC, kNo, kMem, 0,
       "output = input in output's dtype (fp32 -> bf16 / fp16 rounds to nearest, ties to even)"),
      // segments: planattr::FlatSegment's encoding; the grads are the flat elements from
      // flat_offset on, or with shard_group (ZeRO-1) this rank's part: from flat_offset +
      // (rank in the group) x numel(grads).
      make(kSumSquares, "sum_squares", false, {f32("grads")}, {f32("squares")},
       {req("segments", kS), optStr("shard_group"), optStr("replicated_group"), optInt("flat_offset")}, kC, kNo, kMem, 0,
       "the sum of squares of the gradients the norm counts on this rank: segments flagged r (replicated across "
       "replicated_group) only on the group's first member, so the sum over the group counts them once"),
      make(kGradNorm, "grad_norm", false, {f32("squares"), f32("clip_grad"), f32("loss_scale")}, {f32("norm"), f32("factor")},
       {}, kC, kNo, kMem, 0, "norm = sqrt(squares) / loss_scale; factor = the clipping and unscaling factor"),
      make(kAdamw, "adamw", false,
       {f32("params"), f32("grads"), f32("adam_m"), f32("adam_v"), f32("grad_scale"), f32("learning_rate"),
        f32("adam_step"), f32("weight_decay"), f32("adam_beta1"), f32("adam_beta2"), f32("adam_eps")},
       {f32("updated"), f32("adam_m"), f32("adam_v")}, {req("segments", kS), optStr("shard_group"), optInt("flat_offset")},
       kC, kNo, kMem, 0,
       "AdamW with decoupled weight decay over the flat elements that grads covers (as sum_squares'), segment by "
       "segment: params is those elements or the whole flat buffer, updated those elements, the moments in place"),
  };
  for (size_t k = 0; k < ops.size(); ++k)
    if (int(ops[k].id) != int(k) || ops[k].inputs.size() > size_t(kMaxOperands) ||
        ops[k].outputs.size() > size_t(kMaxOperands)) {
      std::fprintf(stderr, "loom: the instruction set's table is out of OpId order at %s\n", ops[k].name);
      std::abort();
    }
  if (ops.size() != size_t(kOpCount)) {
    std::fprintf(stderr, "loom: the instruction set declares %zu ops, OpId has %d\n", ops.size(), kOpCount);
    std::abort();
  }
  return ops;
}

// Attributes any instruction may carry: markers the passes leave on the IR's ops, which the
// lowering copies (loom-dump shows them; no kernel reads them).
const std::vector<A> &commonAttributes() {
  static const std::vector<A> common = {flagA("loom.recomputed")};  // a forward op re-run in the backward
  return common;
}

[[noreturn]] void bug(const OpDecl &d, std::string_view what, std::string_view name) {
  std::fprintf(stderr, "loom: internal error: op %s declares no %.*s '%.*s' (plan/InstructionSet.cpp)\n", d.name,
               int(what.size()), what.data(), int(name.size()), name.data());
  std::abort();
}

const char *attrTypeName(AttrType t) {
  switch (t) {
    case AttrType::kInt: return "an integer";
    case AttrType::kFloat: return "a float";
    case AttrType::kString: return "a string";
    case AttrType::kFlag: return "a flag";
  }
  return "?";
}

bool hasType(const plan::Attribute &a, AttrType t) {
  switch (t) {
    case AttrType::kInt: return a.value_case() == plan::Attribute::kI;
    case AttrType::kFloat: return a.value_case() == plan::Attribute::kF;
    case AttrType::kString: return a.value_case() == plan::Attribute::kS;
    case AttrType::kFlag: return a.value_case() == plan::Attribute::kFlag;
  }
  return false;
}

// Matches operand ids to declared slots. Required slots take the next operand; an optional
// slot takes it when its rank fits and enough operands remain for the required slots after
// it; a variadic slot (the only slot) takes them all.
std::optional<std::string> bindList(const char *what, const std::vector<O> &slots,
                                    const google::protobuf::RepeatedField<int32_t> &ids, const plan::Program &program,
                                    int *bound, std::vector<int> *rest) {
  for (size_t k = 0; k < slots.size(); ++k) bound[k] = -1;
  rest->clear();
  if (slots.size() == 1 && slots[0].arity == O::kVariadic) {
    if (ids.empty()) return std::string("no ") + what + " '" + slots[0].name + "'";
    bound[0] = ids[0];
    rest->assign(ids.begin() + 1, ids.end());
    return std::nullopt;
  }
  auto rankOf = [&](int b) { return b >= 0 && b < program.buffers_size() ? program.buffers(b).shape_size() : -1; };
  int at = 0, n = ids.size();
  for (size_t k = 0; k < slots.size(); ++k) {
    int requiredAfter = 0;
    for (size_t j = k + 1; j < slots.size(); ++j) requiredAfter += slots[j].arity == O::kOne;
    if (slots[k].arity == O::kOne) {
      if (at >= n) return std::string("no ") + what + " '" + slots[k].name + "'";
      bound[k] = ids[at++];
    } else if (at < n && n - at > requiredAfter && (slots[k].rank < 0 || rankOf(ids[at]) == slots[k].rank)) {
      bound[k] = ids[at++];
    }
  }
  if (at != n)
    return std::to_string(n) + " " + what + "s, more than the " + std::to_string(slots.size()) + " declared";
  return std::nullopt;
}

}  // namespace

const std::vector<OpDecl> &instructionSet() {
  static const std::vector<OpDecl> ops = declare();
  return ops;
}

const OpDecl &decl(OpId id) { return instructionSet()[size_t(id)]; }

const OpDecl *find(std::string_view op) {
  static const std::unordered_map<std::string_view, const OpDecl *> byName = [] {
    std::unordered_map<std::string_view, const OpDecl *> m;
    for (const OpDecl &d : instructionSet()) m[d.name] = &d;
    return m;
  }();
  auto it = byName.find(op);
  return it == byName.end() ? nullptr : it->second;
}

plan::Stream streamOf(const OpDecl &d, std::string_view group) {
  switch (d.stream) {
    case StreamRule::kCompute: return plan::COMPUTE;
    case StreamRule::kOfGroup: return streamOfGroup(group);
    case StreamRule::kPipeline: return plan::PP;
  }
  return plan::COMPUTE;
}

bool isCollective(std::string_view op) {
  const OpDecl *d = find(op);
  return d && d->comm == Comm::kCollective;
}
bool isCommunication(std::string_view op) {
  const OpDecl *d = find(op);
  return d && d->comm != Comm::kNone;
}
int ringSteps(std::string_view op, int n) {
  const OpDecl *d = find(op);
  if (!d || d->comm == Comm::kPointToPoint) return 1;
  return d->ringFactor * (n - 1);
}
CostClass costClassOf(std::string_view op) {
  const OpDecl *d = find(op);
  return d ? d->cost : CostClass::kMemory;
}

int64_t ringBytesPerRank(int64_t bytes, int64_t members, int factor) {
  return members <= 1 ? 0 : factor * bytes * (members - 1) / members;
}

double flopsOf(const OpDecl &d, const std::vector<Shape> &inputs, const std::vector<Shape> &outputs,
               int64_t timesAttr) {
  return d.flops ? d.flops(inputs, outputs) * double(std::max<int64_t>(1, timesAttr)) : 0.0;
}

double flopsOf(const OpDecl &d, const plan::Program &program, const plan::Instruction &in) {
  if (!d.flops) return 0.0;
  std::vector<Shape> inputs, outputs;
  for (int b : in.inputs()) inputs.emplace_back(program.buffers(b).shape().begin(), program.buffers(b).shape().end());
  for (int b : in.outputs()) outputs.emplace_back(program.buffers(b).shape().begin(), program.buffers(b).shape().end());
  int64_t times = 1;
  if (d.flopsTimesAttr)
    for (const plan::Attribute &a : in.attributes())
      if (a.name() == d.flopsTimesAttr) times = a.i();
  return flopsOf(d, inputs, outputs, times);
}

bool isRingAttention(OpId id) {
  return id == OpId::kRingAttention || id == OpId::kRingAttentionGrad || id == OpId::kRingGroupedAttention ||
         id == OpId::kRingGroupedAttentionGrad;
}
bool isRingAttention(std::string_view op) {
  const OpDecl *d = find(op);
  return d && isRingAttention(d->id);
}

const OpDecl *expertParallelFormOf(OpId id) {
  switch (id) {
    case OpId::kMoe: return &decl(OpId::kExpertParallelMoe);
    case OpId::kMoeGrad: return &decl(OpId::kExpertParallelMoeGrad);
    default: return nullptr;
  }
}

bool computesToo(const OpDecl &d) {
  return d.comm == Comm::kCollective && (d.cost == CostClass::kGemm || d.cost == CostClass::kAttention);
}
bool computesToo(std::string_view op) {
  const OpDecl *d = find(op);
  return d && computesToo(*d);
}

const OpDecl *ringFormOf(OpId id) {
  switch (id) {
    case OpId::kAttention: return &decl(OpId::kRingAttention);
    case OpId::kAttentionGrad: return &decl(OpId::kRingAttentionGrad);
    case OpId::kGroupedAttention: return &decl(OpId::kRingGroupedAttention);
    case OpId::kGroupedAttentionGrad: return &decl(OpId::kRingGroupedAttentionGrad);
    default: return nullptr;
  }
}

std::optional<std::string> bindOperands(const OpDecl &d, const plan::Program &program, const plan::Instruction &in,
                                        BoundOperands *bound) {
  if (auto e = bindList("input", d.inputs, in.inputs(), program, bound->inputs.data(), &bound->variadicInputs))
    return e;
  return bindList("output", d.outputs, in.outputs(), program, bound->outputs.data(), &bound->variadicOutputs);
}

int inputSlot(const OpDecl &d, std::string_view name) {
  for (size_t k = 0; k < d.inputs.size(); ++k)
    if (name == d.inputs[k].name) return int(k);
  bug(d, "input", name);
}
int outputSlot(const OpDecl &d, std::string_view name) {
  for (size_t k = 0; k < d.outputs.size(); ++k)
    if (name == d.outputs[k].name) return int(k);
  bug(d, "output", name);
}
const AttrDecl &attrDecl(const OpDecl &d, std::string_view name) {
  for (const AttrDecl &a : d.attributes)
    if (name == a.name) return a;
  bug(d, "attribute", name);
}

std::optional<std::string> verifyInstruction(const plan::Program &program, int index) {
  const plan::Instruction &in = program.instructions(index);
  std::string where = "instruction " + std::to_string(index) + " (" + in.op() + "): ";
  const OpDecl *d = find(in.op());
  if (!d) return "instruction " + std::to_string(index) + ": unknown op '" + in.op() + "'";
  for (int b : in.inputs())
    if (b < 0 || b >= program.buffers_size()) return where + "buffer id " + std::to_string(b) + " out of range";
  for (int b : in.outputs())
    if (b < 0 || b >= program.buffers_size()) return where + "buffer id " + std::to_string(b) + " out of range";
  BoundOperands bound;
  if (auto e = bindOperands(*d, program, in, &bound)) return where + *e;
  if (d->inputs.size() == 1 && d->inputs[0].arity == O::kVariadic && d->outputs.size() == 1 &&
      in.inputs_size() != in.outputs_size())
    return where + std::to_string(in.inputs_size()) + " inputs but " + std::to_string(in.outputs_size()) + " outputs";
  auto checkTypes = [&](const std::vector<O> &slots, const std::array<int, kMaxOperands> &ids, const std::vector<int> &rest,
                        const char *what) -> std::optional<std::string> {
    for (size_t k = 0; k < slots.size(); ++k) {
      std::vector<int> all = {ids[k]};
      if (slots[k].arity == O::kVariadic) all.insert(all.end(), rest.begin(), rest.end());
      for (int b : all) {
        if (b < 0) continue;
        plan::DType t = program.buffers(b).dtype();
        if (!(slots[k].dtypes & (1u << int(t))))
          return where + what + " '" + slots[k].name + "' (buffer " + std::to_string(b) + ") is " +
                 plan::DType_Name(t) + ", not an element type the op takes";
      }
    }
    return std::nullopt;
  };
  if (auto e = checkTypes(d->inputs, bound.inputs, bound.variadicInputs, "input")) return e;
  if (auto e = checkTypes(d->outputs, bound.outputs, bound.variadicOutputs, "output")) return e;
  for (const plan::Attribute &a : in.attributes()) {
    const AttrDecl *decl = nullptr;
    for (const AttrDecl &x : d->attributes)
      if (a.name() == x.name) decl = &x;
    for (const AttrDecl &x : commonAttributes())
      if (a.name() == x.name) decl = &x;
    if (!decl) return where + "unknown attribute '" + a.name() + "'";
    if (!hasType(a, decl->type)) return where + "attribute '" + a.name() + "' is not " + attrTypeName(decl->type);
  }
  std::string group;
  for (const AttrDecl &x : d->attributes) {
    bool present = false;
    for (const plan::Attribute &a : in.attributes())
      if (a.name() == x.name) present = true, group = x.name == std::string_view("group") ? a.s() : group;
    if (x.required && !present) return where + "no attribute '" + x.name + "'";
  }
  plan::Stream expected = streamOf(*d, group);
  if (in.stream() != expected)
    return where + "runs on stream " + plan::Stream_Name(in.stream()) + ", declared " + plan::Stream_Name(expected);
  return std::nullopt;
}

std::optional<std::string> verifyProgram(const plan::Program &program) {
  for (int i = 0; i < program.instructions_size(); ++i)
    if (auto e = verifyInstruction(program, i)) return program.name() + ": " + *e;
  return std::nullopt;
}

const plan::Attribute *Attrs::find(const AttrDecl &a) const {
  for (const plan::Attribute &x : in_.attributes())
    if (x.name() == a.name) return &x;
  return nullptr;
}
int64_t Attrs::i64(std::string_view name) const {
  const AttrDecl &a = attrDecl(decl_, name);
  const plan::Attribute *x = find(a);
  return x ? x->i() : a.defaultInt;
}
double Attrs::f64(std::string_view name) const {
  const AttrDecl &a = attrDecl(decl_, name);
  const plan::Attribute *x = find(a);
  return x ? x->f() : a.defaultFloat;
}
std::string Attrs::str(std::string_view name) const {
  const AttrDecl &a = attrDecl(decl_, name);
  const plan::Attribute *x = find(a);
  return x ? x->s() : a.defaultString;
}
bool Attrs::flag(std::string_view name) const { return find(attrDecl(decl_, name)) != nullptr; }

InstructionBuilder::InstructionBuilder(OpId op)
    : decl_(decl(op)), inputs_(decl_.inputs.size()), outputs_(decl_.outputs.size()) {}

InstructionBuilder &InstructionBuilder::in(std::string_view name, int buffer) {
  inputs_[size_t(inputSlot(decl_, name))].push_back(buffer);
  return *this;
}
InstructionBuilder &InstructionBuilder::in(std::string_view name, const std::vector<int> &buffers) {
  auto &slot = inputs_[size_t(inputSlot(decl_, name))];
  slot.insert(slot.end(), buffers.begin(), buffers.end());
  return *this;
}
InstructionBuilder &InstructionBuilder::out(std::string_view name, int buffer) {
  outputs_[size_t(outputSlot(decl_, name))].push_back(buffer);
  return *this;
}
InstructionBuilder &InstructionBuilder::out(std::string_view name, const std::vector<int> &buffers) {
  auto &slot = outputs_[size_t(outputSlot(decl_, name))];
  slot.insert(slot.end(), buffers.begin(), buffers.end());
  return *this;
}

namespace {
void checkAttrType(const OpDecl &d, std::string_view name, AttrType t) {
  if (attrDecl(d, name).type != t) {
    std::fprintf(stderr, "loom: internal error: attribute '%.*s' of %s is declared %s, set as %s\n", int(name.size()),
                 name.data(), d.name, attrTypeName(attrDecl(d, name).type), attrTypeName(t));
    std::abort();
  }
}
}  // namespace

InstructionBuilder &InstructionBuilder::attr(std::string_view name, int64_t v) {
  checkAttrType(decl_, name, AttrType::kInt);
  plan::Attribute &a = attributes_.emplace_back();
  a.set_name(std::string(name)), a.set_i(v);
  return *this;
}
InstructionBuilder &InstructionBuilder::attr(std::string_view name, double v) {
  checkAttrType(decl_, name, AttrType::kFloat);
  plan::Attribute &a = attributes_.emplace_back();
  a.set_name(std::string(name)), a.set_f(v);
  return *this;
}
InstructionBuilder &InstructionBuilder::attr(std::string_view name, const std::string &v) {
  checkAttrType(decl_, name, AttrType::kString);
  plan::Attribute &a = attributes_.emplace_back();
  a.set_name(std::string(name)), a.set_s(v);
  return *this;
}
InstructionBuilder &InstructionBuilder::flag(std::string_view name) {
  checkAttrType(decl_, name, AttrType::kFlag);
  plan::Attribute &a = attributes_.emplace_back();
  a.set_name(std::string(name)), a.set_flag(true);
  return *this;
}

namespace {
std::vector<int> flatten(const OpDecl &d, const std::vector<O> &slots, const std::vector<std::vector<int>> &given,
                         const char *what) {
  std::vector<int> ids;
  for (size_t k = 0; k < slots.size(); ++k) {
    size_t n = given[k].size();
    bool ok = slots[k].arity == O::kOne ? n == 1 : slots[k].arity == O::kOptional ? n <= 1 : n >= 1;
    if (!ok) {
      std::fprintf(stderr, "loom: internal error: %s of %s: %zu buffers for '%s'\n", what, d.name, n, slots[k].name);
      std::abort();
    }
    ids.insert(ids.end(), given[k].begin(), given[k].end());
  }
  return ids;
}
}  // namespace

std::vector<int> InstructionBuilder::inputs() const { return flatten(decl_, decl_.inputs, inputs_, "input"); }
std::vector<int> InstructionBuilder::outputs() const { return flatten(decl_, decl_.outputs, outputs_, "output"); }

void InstructionBuilder::writeTo(plan::Instruction *instruction) const {
  for (const AttrDecl &a : decl_.attributes) {
    bool present = false;
    for (const plan::Attribute &x : attributes_) present |= x.name() == a.name;
    if (a.required && !present) {
      std::fprintf(stderr, "loom: internal error: %s built without its attribute '%s'\n", decl_.name, a.name);
      std::abort();
    }
  }
  instruction->set_op(decl_.name);
  for (int b : inputs()) instruction->add_inputs(b);
  for (int b : outputs()) instruction->add_outputs(b);
  for (const plan::Attribute &a : attributes_) *instruction->add_attributes() = a;
}

}  // namespace loom::isa
