// Shape and attribute verifiers of the `loom` ops. Each error names the operand and the
// dimension that is wrong, with both sizes, so a user can fix the IR from the message alone.
#include "ir/LoomDialect.h"

namespace loom {
namespace {

using mlir::LogicalResult;
using mlir::RankedTensorType;
using mlir::Value;

RankedTensorType tensorOf(Value v) { return mlir::cast<RankedTensorType>(v.getType()); }

// Shapes are static except the batch: dim 0 of a tensor of rank >= 2 may be dynamic (`?`);
// the compiler specialises it to the cluster's micro-batch (loom-specialize-batch).
LogicalResult requireStatic(mlir::Operation *op, Value v, llvm::StringRef what) {
  RankedTensorType t = tensorOf(v);
  for (int64_t d = 0; d < t.getRank(); ++d)
    if (t.isDynamicDim(d) && !(d == 0 && t.getRank() >= 2))
      return op->emitOpError() << what << " dim " << d << " is dynamic (only the batch, dim 0, may be), got "
                               << v.getType();
  return mlir::success();
}

LogicalResult requireRank(mlir::Operation *op, Value v, llvm::StringRef what, int64_t rank) {
  if (failed(requireStatic(op, v, what))) return mlir::failure();
  if (tensorOf(v).getRank() != rank)
    return op->emitOpError() << what << " must have rank " << rank << ", got " << v.getType();
  return mlir::success();
}

LogicalResult requireDim(mlir::Operation *op, llvm::StringRef what, int64_t dim, int64_t got,
                         int64_t expected, llvm::StringRef because) {
  auto size = [](int64_t n) { return mlir::ShapedType::isDynamic(n) ? std::string("?") : std::to_string(n); };
  if (got != expected)
    return op->emitOpError() << what << " dim " << dim << " is " << size(got) << " but must be "
                             << size(expected) << " (" << because << ")";
  return mlir::success();
}

LogicalResult requireSameElementType(mlir::Operation *op, Value a, llvm::StringRef aName, Value b,
                                     llvm::StringRef bName) {
  if (tensorOf(a).getElementType() != tensorOf(b).getElementType())
    return op->emitOpError() << aName << " element type " << tensorOf(a).getElementType()
                             << " differs from " << bName << " element type "
                             << tensorOf(b).getElementType();
  return mlir::success();
}

LogicalResult requireGroup(mlir::Operation *op, llvm::StringRef group, int64_t groupSize) {
  if (group.empty()) return op->emitOpError() << "group must name a process group";
  if (groupSize < 1) return op->emitOpError() << "group_size must be >= 1, got " << groupSize;
  return mlir::success();
}

// A statistics result or operand `lse` (optional: null passes): `expected` gives each dim's
// size and why.
LogicalResult requireStatisticsShape(mlir::Operation *op, Value lse,
                                     llvm::ArrayRef<std::pair<int64_t, llvm::StringRef>> expected) {
  if (!lse) return mlir::success();
  if (failed(requireRank(op, lse, "lse", int64_t(expected.size())))) return mlir::failure();
  auto l = tensorOf(lse).getShape();
  for (auto [d, dim] : llvm::enumerate(expected))
    if (failed(requireDim(op, "lse", int64_t(d), l[d], dim.first, dim.second))) return mlir::failure();
  return mlir::success();
}

// Attention's softmax statistics: `lse` is [batch, heads, seq] for queries [batch, seq, ...].
LogicalResult requireStatistics(mlir::Operation *op, Value lse, Value queries, int64_t heads) {
  auto q = tensorOf(queries).getShape();
  return requireStatisticsShape(op, lse, {{q[0], "batch"}, {heads, "num_heads"}, {q[1], "sequence"}});
}

// Cross-entropy's softmax statistics: `lse` is [batch, seq] for logits [batch, seq, vocab].
LogicalResult requireTokenStatistics(mlir::Operation *op, Value lse, Value logits) {
  auto x = tensorOf(logits).getShape();
  return requireStatisticsShape(op, lse, {{x[0], "batch of logits"}, {x[1], "sequence of logits"}});
}

}  // namespace

LogicalResult EmbeddingOp::verify() {
  if (failed(requireRank(*this, getTokens(), "tokens", 2)) ||
      failed(requireRank(*this, getWord(), "word", 2)) ||
      failed(requireRank(*this, getResult(), "result", 3)) ||
      failed(requireSameElementType(*this, getWord(), "word", getResult(), "result")))
    return mlir::failure();
  auto tokens = tensorOf(getTokens()).getShape();
  auto word = tensorOf(getWord()).getShape();
  auto out = tensorOf(getResult()).getShape();
  if (failed(requireDim(*this, "result", 0, out[0], tokens[0], "batch of tokens")) ||
      failed(requireDim(*this, "result", 1, out[1], tokens[1], "sequence of tokens")) ||
      failed(requireDim(*this, "result", 2, out[2], word[1], "hidden size of word")))
    return mlir::failure();
  if (Value pos = getPosition()) {
    if (failed(requireRank(*this, pos, "position", 2)) ||
        failed(requireSameElementType(*this, pos, "position", getResult(), "result")))
      return mlir::failure();
    auto p = tensorOf(pos).getShape();
    if (failed(requireDim(*this, "position", 1, p[1], word[1], "hidden size of word")))
      return mlir::failure();
    if (p[0] < tokens[1])
      return emitOpError() << "position dim 0 (" << p[0]
                           << " positions) is smaller than the sequence length " << tokens[1];
  }
  return mlir::success();
}

LogicalResult LayerNormOp::verify() {
  if (failed(requireStatic(*this, getInput(), "input")) ||
      failed(requireRank(*this, getGamma(), "gamma", 1)) ||
      failed(requireRank(*this, getBeta(), "beta", 1)))
    return mlir::failure();
  auto in = tensorOf(getInput());
  if (in.getRank() < 1) return emitOpError() << "input must have rank >= 1";
  int64_t h = in.getShape().back();
  if (failed(requireDim(*this, "gamma", 0, tensorOf(getGamma()).getDimSize(0), h,
                        "last dim of input")) ||
      failed(requireDim(*this, "beta", 0, tensorOf(getBeta()).getDimSize(0), h,
                        "last dim of input")))
    return mlir::failure();
  if (getResult().getType() != in)
    return emitOpError() << "result type " << getResult().getType() << " must equal input type "
                         << in;
  if (!(getEpsilon().convertToFloat() > 0)) return emitOpError() << "epsilon must be > 0";
  return mlir::success();
}

LogicalResult LinearOp::verify() {
  if (failed(requireStatic(*this, getInput(), "input")) ||
      failed(requireRank(*this, getWeight(), "weight", 2)) ||
      failed(requireStatic(*this, getResult(), "result")) ||
      failed(requireSameElementType(*this, getWeight(), "weight", getInput(), "input")))
    return mlir::failure();
  auto in = tensorOf(getInput()).getShape();
  auto w = tensorOf(getWeight()).getShape();
  auto out = tensorOf(getResult()).getShape();
  if (in.empty()) return emitOpError() << "input must have rank >= 1";
  int64_t kDim = getTransposeWeight() ? 1 : 0;
  int64_t n = w[1 - kDim];
  if (failed(requireDim(*this, "weight", kDim, w[kDim], in.back(), "last dim of input")))
    return mlir::failure();
  if (out.size() != in.size())
    return emitOpError() << "result rank " << out.size() << " must equal input rank " << in.size();
  for (size_t i = 0; i + 1 < in.size(); ++i)
    if (failed(requireDim(*this, "result", i, out[i], in[i], "same as input")))
      return mlir::failure();
  if (failed(requireDim(*this, "result", out.size() - 1, out.back(), n,
                        getTransposeWeight() ? "weight dim 0, weight is transposed"
                                             : "weight dim 1")))
    return mlir::failure();
  if (Value b = getBias()) {
    if (failed(requireRank(*this, b, "bias", 1)) ||
        failed(requireDim(*this, "bias", 0, tensorOf(b).getDimSize(0), n, "output features")))
      return mlir::failure();
  }
  return mlir::success();
}

LogicalResult AttentionOp::verify() {
  if (failed(requireRank(*this, getQkv(), "qkv", 3)) ||
      failed(requireRank(*this, getResult(), "result", 3)) ||
      failed(requireSameElementType(*this, getQkv(), "qkv", getResult(), "result")))
    return mlir::failure();
  int64_t heads = getNumHeads();
  if (heads < 1) return emitOpError() << "num_heads must be >= 1, got " << heads;
  auto qkv = tensorOf(getQkv()).getShape();
  auto out = tensorOf(getResult()).getShape();
  if (qkv[2] % (3 * heads) != 0)
    return emitOpError() << "qkv dim 2 (" << qkv[2] << ") must be 3 * num_heads (" << heads
                         << ") * head_dim";
  int64_t hidden = qkv[2] / 3;
  // Context parallelism: the queries are this rank's S / c rows of the gathered sequence.
  bool chunked = bool(getContextParallelGroup());
  if (failed(requireDim(*this, "result", 0, out[0], qkv[0], "batch of qkv")) ||
      (!chunked && failed(requireDim(*this, "result", 1, out[1], qkv[1], "sequence of qkv"))) ||
      failed(requireDim(*this, "result", 2, out[2], hidden, "qkv dim 2 / 3")))
    return mlir::failure();
  if (chunked && (out[1] < 1 || qkv[1] % out[1] != 0))
    return emitOpError() << "result dim 1 (" << out[1] << ") must divide qkv dim 1 (" << qkv[1]
                         << ": the sequence gathered over context_parallel_group)";
  if (chunked && getKeyMask()) return emitOpError() << "key_mask with context_parallel_group is not supported";
  if (Value m = getKeyMask()) {
    if (failed(requireRank(*this, m, "key_mask", 2)) ||
        failed(requireDim(*this, "key_mask", 0, tensorOf(m).getDimSize(0), qkv[0], "batch")) ||
        failed(requireDim(*this, "key_mask", 1, tensorOf(m).getDimSize(1), qkv[1], "sequence")))
      return mlir::failure();
  }
  float p = getDropout().convertToFloat();
  if (!(p >= 0 && p < 1)) return emitOpError() << "dropout must be in [0, 1), got " << p;
  return requireStatistics(*this, getLse(), getResult(), heads);
}

LogicalResult AttentionGradOp::verify() {
  if (failed(requireRank(*this, getQkv(), "qkv", 3))) return mlir::failure();
  if (getNumHeads() < 1) return emitOpError() << "num_heads must be >= 1, got " << getNumHeads();
  if (getResult().getType() != getQkv().getType())
    return emitOpError() << "result type " << getResult().getType() << " must equal qkv's type " << getQkv().getType();
  return requireStatistics(*this, getLse(), getContextParallelGroup() ? getGrad() : getQkv(), getNumHeads());
}

LogicalResult RmsNormOp::verify() {
  if (failed(requireStatic(*this, getInput(), "input")) || failed(requireRank(*this, getGamma(), "gamma", 1)))
    return mlir::failure();
  auto in = tensorOf(getInput());
  if (in.getRank() < 1) return emitOpError() << "input must have rank >= 1";
  if (failed(requireDim(*this, "gamma", 0, tensorOf(getGamma()).getDimSize(0), in.getShape().back(),
                        "last dim of input")))
    return mlir::failure();
  if (getResult().getType() != in)
    return emitOpError() << "result type " << getResult().getType() << " must equal input type " << in;
  if (!(getEpsilon().convertToFloat() > 0)) return emitOpError() << "epsilon must be > 0";
  return mlir::success();
}

LogicalResult RotaryOp::verify() {
  if (failed(requireRank(*this, getInput(), "input", 3))) return mlir::failure();
  int64_t hd = getHeadDim(), last = tensorOf(getInput()).getShape().back();
  if (hd < 2 || hd % 2 != 0)
    return emitOpError() << "head_dim must be even and >= 2 (rotate-half pairs its two halves), got " << hd;
  if (last % hd != 0) return emitOpError() << "input dim 2 (" << last << ") is not a multiple of head_dim (" << hd << ")";
  if (!(getTheta().convertToFloat() > 0)) return emitOpError() << "theta must be > 0, got " << getTheta().convertToFloat();
  return mlir::success();
}

LogicalResult GroupedAttentionOp::verify() {
  if (failed(requireRank(*this, getQ(), "q", 3)) || failed(requireRank(*this, getK(), "k", 3)) ||
      failed(requireRank(*this, getV(), "v", 3)) || failed(requireRank(*this, getResult(), "result", 3)))
    return mlir::failure();
  int64_t heads = getNumHeads(), kvHeads = getNumKvHeads(), groupSize = getGroupSize();
  if (heads < 1 || kvHeads < 1 || groupSize < 1)
    return emitOpError() << "num_heads (" << heads << "), num_kv_heads (" << kvHeads << ") and group_size ("
                         << groupSize << ") must be >= 1";
  // The query heads of the whole group share the KV heads evenly.
  int64_t allHeads = getKvReplicatedGroup() ? heads * groupSize : heads;
  if (allHeads % kvHeads != 0)
    return emitOpError() << "num_kv_heads (" << kvHeads << ") must divide the " << allHeads << " query heads";
  auto q = tensorOf(getQ()).getShape(), k = tensorOf(getK()).getShape(), v = tensorOf(getV()).getShape();
  if (q[2] % heads != 0) return emitOpError() << "q dim 2 (" << q[2] << ") must be num_heads (" << heads << ") * head_dim";
  int64_t hd = q[2] / heads;
  for (auto [name, shape] : {std::pair{"k", k}, std::pair{"v", v}})
    if (failed(requireDim(*this, name, 0, shape[0], q[0], "batch of q")) ||
        (!getContextParallelGroup() && failed(requireDim(*this, name, 1, shape[1], q[1], "sequence of q"))) ||
        failed(requireDim(*this, name, 2, shape[2], kvHeads * hd, "num_kv_heads * head_dim")))
      return mlir::failure();
  if (getContextParallelGroup() && (k[1] != v[1] || q[1] < 1 || k[1] % q[1] != 0))
    return emitOpError() << "q dim 1 (" << q[1] << ") must divide k and v dim 1 (" << k[1] << ", " << v[1]
                         << ": the sequence gathered over context_parallel_group)";
  if (getResult().getType() != getQ().getType())
    return emitOpError() << "result type " << getResult().getType() << " must equal q's type " << getQ().getType();
  float p = getDropout().convertToFloat();
  if (!(p >= 0 && p < 1)) return emitOpError() << "dropout must be in [0, 1), got " << p;
  return requireStatistics(*this, getLse(), getQ(), heads);
}

LogicalResult GroupedAttentionGradOp::verify() {
  if (failed(requireRank(*this, getQ(), "q", 3))) return mlir::failure();
  if (getNumHeads() < 1) return emitOpError() << "num_heads must be >= 1, got " << getNumHeads();
  return requireStatistics(*this, getLse(), getQ(), getNumHeads());
}

// A mixture-of-experts MLP's operands (loom.moe and its gradient): input [B, S, H], logits
// [B, S, E], gate and up [E, F, H], down [E, H, F], 1 <= top_k <= E, capacity_factor >= 0.
static LogicalResult verifyMoeOperands(mlir::Operation *op, Value input, Value logits, Value gate, Value up, Value down,
                                       int64_t topK, float capacityFactor, int64_t expertParallel, Value stats) {
  for (auto [v, name] : {std::pair{input, "input"}, std::pair{logits, "logits"}, std::pair{gate, "gate"},
                         std::pair{up, "up"}, std::pair{down, "down"}})
    if (failed(requireRank(op, v, name, 3))) return mlir::failure();
  auto x = tensorOf(input).getShape(), l = tensorOf(logits).getShape(), g = tensorOf(gate).getShape();
  auto u = tensorOf(up).getShape(), d = tensorOf(down).getShape();
  if (expertParallel < 1) return op->emitOpError() << "expert_parallel_size must be >= 1, got " << expertParallel;
  int64_t E = g[0] * expertParallel, F = g[1], H = x[2];
  if (failed(requireDim(op, "logits", 0, l[0], x[0], "batch of input")) ||
      failed(requireDim(op, "logits", 1, l[1], x[1], "sequence of input")) ||
      failed(requireDim(op, "logits", 2, l[2], E,
                        expertParallel > 1 ? "gate's experts times expert_parallel_size" : "the experts of gate, dim 0")) ||
      failed(requireDim(op, "gate", 2, g[2], H, "hidden size of input")) ||
      failed(requireDim(op, "up", 0, u[0], g[0], "experts of gate")) ||
      failed(requireDim(op, "up", 1, u[1], F, "ffn of gate")) || failed(requireDim(op, "up", 2, u[2], H, "hidden size of input")) ||
      failed(requireDim(op, "down", 0, d[0], g[0], "experts of gate")) ||
      failed(requireDim(op, "down", 1, d[1], H, "hidden size of input")) ||
      failed(requireDim(op, "down", 2, d[2], F, "ffn of gate")))
    return mlir::failure();
  if (topK < 1 || topK > E) return op->emitOpError() << "top_k must be in 1.." << E << " (the experts), got " << topK;
  if (!(capacityFactor >= 0)) return op->emitOpError() << "capacity_factor must be >= 0 (0: dropless), got " << capacityFactor;
  for (auto [v, name] : {std::pair{logits, "logits"}, std::pair{gate, "gate"}, std::pair{up, "up"}, std::pair{down, "down"}})
    if (failed(requireSameElementType(op, v, name, input, "input"))) return mlir::failure();
  if (stats) {
    // The whole sequence's statistics while this op routes a slice: a capacity would need the
    // whole sequence's drops too.
    if (capacityFactor > 0)
      return op->emitOpError() << "routing_stats (a sequence split over ranks) needs capacity_factor 0 (dropless), got "
                               << capacityFactor;
    if (failed(requireRank(op, stats, "routing_stats", 2)) ||
        failed(requireDim(op, "routing_stats", 0, tensorOf(stats).getShape()[0], 2, "2 (counts, probability sums)")) ||
        failed(requireDim(op, "routing_stats", 1, tensorOf(stats).getShape()[1], E, "the experts of logits")))
      return mlir::failure();
  }
  return mlir::success();
}

LogicalResult MoeRoutingStatsOp::verify() {
  if (failed(requireRank(*this, getLogits(), "logits", 3)) || failed(requireRank(*this, getResult(), "result", 2)))
    return mlir::failure();
  int64_t E = tensorOf(getLogits()).getShape()[2];
  auto r = tensorOf(getResult()).getShape();
  if (failed(requireDim(*this, "result", 0, r[0], 2, "2 (counts, probability sums)")) ||
      failed(requireDim(*this, "result", 1, r[1], E, "the experts of logits")))
    return mlir::failure();
  if (getTopK() < 1 || getTopK() > E) return emitOpError() << "top_k must be in 1.." << E << " (the experts), got " << getTopK();
  return mlir::success();
}

LogicalResult MoeOp::verify() {
  if (failed(verifyMoeOperands(*this, getInput(), getLogits(), getGate(), getUp(), getDown(), getTopK(),
                               getCapacityFactor().convertToFloat(), getExpertParallelSize(), getRoutingStats())))
    return mlir::failure();
  if (getResult().getType() != getInput().getType())
    return emitOpError() << "result type " << getResult().getType() << " must equal input type " << getInput().getType();
  return mlir::success();
}

LogicalResult MoeGradOp::verify() {
  if (failed(verifyMoeOperands(*this, getInput(), getLogits(), getGate(), getUp(), getDown(), getTopK(),
                               getCapacityFactor().convertToFloat(), getExpertParallelSize(), getRoutingStats())))
    return mlir::failure();
  for (auto [result, operand, name] :
       {std::tuple{getGradInput(), getInput(), "input"}, std::tuple{getGradLogits(), getLogits(), "logits"},
        std::tuple{getGradGate(), getGate(), "gate"}, std::tuple{getGradUp(), getUp(), "up"},
        std::tuple{getGradDown(), getDown(), "down"}})
    if (result.getType() != operand.getType())
      return emitOpError() << "grad_" << name << " type " << result.getType() << " must equal " << name << "'s type "
                           << operand.getType();
  if (getGrad().getType() != getInput().getType())
    return emitOpError() << "grad type " << getGrad().getType() << " must equal input type " << getInput().getType();
  return mlir::success();
}

LogicalResult DropoutOp::verify() {
  float p = getRate().convertToFloat();
  if (!(p >= 0 && p < 1)) return emitOpError() << "rate must be in [0, 1), got " << p;
  return mlir::success();
}

LogicalResult CrossEntropyOp::verify() {
  if (failed(requireRank(*this, getLogits(), "logits", 3)) ||
      failed(requireRank(*this, getLabels(), "labels", 2)))
    return mlir::failure();
  auto logits = tensorOf(getLogits()).getShape();
  auto labels = tensorOf(getLabels()).getShape();
  if (failed(requireDim(*this, "labels", 0, labels[0], logits[0], "batch of logits")) ||
      failed(requireDim(*this, "labels", 1, labels[1], logits[1], "sequence of logits")))
    return mlir::failure();
  if (Value m = getLossMask()) {
    if (failed(requireRank(*this, m, "loss_mask", 2)) ||
        failed(requireDim(*this, "loss_mask", 0, tensorOf(m).getDimSize(0), logits[0], "batch")) ||
        failed(requireDim(*this, "loss_mask", 1, tensorOf(m).getDimSize(1), logits[1], "sequence")))
      return mlir::failure();
  }
  if (getValidVocab() < 1) return emitOpError() << "valid_vocab must be >= 1";
  if (getVocabParallelGroup().has_value() != getVocabParallelSize().has_value())
    return emitOpError() << "vocab_parallel_group and vocab_parallel_size go together";
  if (getVocabParallelSize() && *getVocabParallelSize() < 1) return emitOpError() << "vocab_parallel_size must be >= 1";
  if (!getVocabParallelGroup() && getValidVocab() > logits[2])
    return emitOpError() << "valid_vocab (" << getValidVocab() << ") exceeds logits dim 2 ("
                         << logits[2] << ")";
  return requireTokenStatistics(*this, getLse(), getLogits());
}

LogicalResult CrossEntropyGradOp::verify() {
  if (failed(requireRank(*this, getLogits(), "logits", 3))) return mlir::failure();
  if (getResult().getType() != getLogits().getType())
    return emitOpError() << "result type " << getResult().getType() << " must equal logits' type "
                         << getLogits().getType();
  return requireTokenStatistics(*this, getLse(), getLogits());
}

LogicalResult AllReduceOp::verify() {
  if (failed(requireGroup(*this, getGroup(), getGroupSize()))) return mlir::failure();
  if (getReduce() != "sum" && getReduce() != "max" && getReduce() != "avg")
    return emitOpError() << "reduce must be \"sum\", \"max\" or \"avg\", got \"" << getReduce()
                         << "\"";
  return mlir::success();
}

// all_gather and reduce_scatter differ only in which side holds the group_size-times
// larger dimension.
template <typename Op>
static LogicalResult verifyGatherOrScatter(Op op, Value small, llvm::StringRef smallName,
                                           Value large, llvm::StringRef largeName) {
  if (failed(requireGroup(op, op.getGroup(), op.getGroupSize())) ||
      failed(requireStatic(op, small, smallName)) || failed(requireStatic(op, large, largeName)) ||
      failed(requireSameElementType(op, small, smallName, large, largeName)))
    return mlir::failure();
  auto s = tensorOf(small).getShape();
  auto l = tensorOf(large).getShape();
  int64_t dim = op.getDim();
  if (s.size() != l.size())
    return op.emitOpError() << "input and result must have the same rank";
  if (dim < 0 || dim >= (int64_t)s.size())
    return op.emitOpError() << "dim " << dim << " is out of range for rank " << s.size();
  for (int64_t i = 0; i < (int64_t)s.size(); ++i) {
    int64_t expected = i == dim ? s[i] * op.getGroupSize() : s[i];
    if (failed(requireDim(op, largeName, i, l[i], expected,
                          i == dim ? "group_size times the other side along dim" : "unchanged")))
      return mlir::failure();
  }
  return mlir::success();
}

LogicalResult AllGatherOp::verify() {
  return verifyGatherOrScatter(*this, getInput(), "input", getResult(), "result");
}

LogicalResult ReduceScatterOp::verify() {
  return verifyGatherOrScatter(*this, getResult(), "result", getInput(), "input");
}

LogicalResult ShardOp::verify() { return verifyGatherOrScatter(*this, getResult(), "result", getInput(), "input"); }

template <typename Op>
static LogicalResult verifyPeer(Op op) {
  if (failed(requireGroup(op, op.getGroup(), op.getGroupSize()))) return mlir::failure();
  if (op.getPeer() < 0 || op.getPeer() >= op.getGroupSize())
    return op.emitOpError() << "peer " << op.getPeer() << " is outside group of size "
                            << op.getGroupSize();
  return mlir::success();
}

LogicalResult SendOp::verify() { return verifyPeer(*this); }
LogicalResult RecvOp::verify() { return verifyPeer(*this); }

LogicalResult AddPositionOp::verify() {
  if (failed(requireRank(*this, getInput(), "input", 3)) ||
      failed(requireRank(*this, getPosition(), "position", 2)))
    return mlir::failure();
  auto in = tensorOf(getInput()).getShape();
  auto p = tensorOf(getPosition()).getShape();
  if (failed(requireDim(*this, "position", 1, p[1], in[2], "hidden size of input")))
    return mlir::failure();
  if (p[0] < in[1])
    return emitOpError() << "position dim 0 (" << p[0]
                         << " positions) is smaller than the sequence length " << in[1];
  if (getResult().getType() != getInput().getType())
    return emitOpError() << "result type must equal input type";
  return mlir::success();
}

LogicalResult AddTokenTypeOp::verify() {
  if (failed(requireRank(*this, getInput(), "input", 3)) || failed(requireRank(*this, getTokenTypes(), "token_types", 2)) ||
      failed(requireRank(*this, getTable(), "table", 2)))
    return mlir::failure();
  auto in = tensorOf(getInput()).getShape();
  auto types = tensorOf(getTokenTypes()).getShape();
  auto table = tensorOf(getTable()).getShape();
  if (failed(requireDim(*this, "table", 1, table[1], in[2], "hidden size of input")) ||
      failed(requireDim(*this, "token_types", 0, types[0], in[0], "batch of input")))
    return mlir::failure();
  // Under sequence parallelism the input holds a slice of the sequence the types cover whole.
  if (!mlir::ShapedType::isDynamic(in[1]) && !mlir::ShapedType::isDynamic(types[1]) &&
      (getSequenceParallelGroup() ? types[1] % in[1] != 0 : types[1] != in[1]))
    return emitOpError() << "token_types dim 1 (" << types[1] << ") does not match the input's sequence (" << in[1]
                         << (getSequenceParallelGroup() ? ", a slice of it" : "") << ")";
  if (getResult().getType() != getInput().getType())
    return emitOpError() << "result type must equal input type";
  return mlir::success();
}

LogicalResult AddBiasOp::verify() {
  auto in = tensorOf(getInput()).getShape();
  auto b = tensorOf(getBias()).getShape();
  if (in.empty() || b.size() != 1 || b[0] != in.back())
    return emitOpError() << "bias must be rank 1 with the size of input's last dim";
  if (getResult().getType() != getInput().getType())
    return emitOpError() << "result type must equal input type";
  return mlir::success();
}

LogicalResult WeightGradOp::verify() {
  if (failed(requireStatic(*this, getInput(), "input")) || failed(requireStatic(*this, getGrad(), "grad")) ||
      failed(requireStatic(*this, getResult(), "result")))
    return mlir::failure();
  auto in = tensorOf(getInput()).getShape();
  auto g = tensorOf(getGrad()).getShape();
  auto out = tensorOf(getResult()).getShape();
  if (in.empty() || g.empty() || out.size() != 2)
    return emitOpError() << "expects input and grad of rank >= 1 and a rank-2 result";
  int64_t k = in.back(), n = g.back();
  if (k == 0 || n == 0) return emitOpError() << "input and grad need a non-empty last dimension";
  int64_t r0 = getTransposeWeight() ? n : k, r1 = getTransposeWeight() ? k : n;
  if (failed(requireDim(*this, "result", 0, out[0], r0, "weight layout")) ||
      failed(requireDim(*this, "result", 1, out[1], r1, "weight layout")))
    return mlir::failure();
  if (tensorOf(getInput()).getNumElements() / k != tensorOf(getGrad()).getNumElements() / n)
    return emitOpError() << "input and grad must have the same number of rows";
  return mlir::success();
}

LogicalResult BiasGradOp::verify() {
  auto g = tensorOf(getGrad()).getShape();
  auto out = tensorOf(getResult()).getShape();
  if (g.empty() || out.size() != 1 || out[0] != g.back())
    return emitOpError() << "result must be the last dimension of grad";
  return mlir::success();
}

}  // namespace loom
