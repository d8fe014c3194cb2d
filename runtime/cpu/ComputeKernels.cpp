// The CPU kernels of the model's ops (the loom dialect's compute ops and the vocab-parallel
// cross-entropy's steps), registered by declared op: each reads its operands by their
// declared names and its attributes with their declared defaults (plan/InstructionSet.cpp).
#include <algorithm>
#include <climits>
#include <cstring>

#include "runtime/cpu/CpuKernelContext.h"
#include "runtime/cpu/Kernels.h"

namespace loom::cpu {
namespace {

using isa::OpId;

// Context parallelism's global positions of an operand's `rows` sequence rows (a sequence-
// parallel slice of them starting at `first` of the rank's `local` tokens), checked against a
// table of `tableRows` rows.
Status contextPositions(CpuKernelContext &c, const KernelCall &k, int64_t first, int64_t rows, int64_t local,
                        int64_t tableRows, std::vector<int64_t> *out) {
  ContextChunks ch = c.chunks(k.str("context_parallel_group"), local);
  if (local % 2 || ch.rank < 0 || ch.rank >= ch.c)
    return Status::error(std::string(k.decl.name) + ": " + std::to_string(local) +
                         " local tokens are not two chunks (corrupt plan)");
  *out = c.positions(k.str("context_parallel_group"), first, rows, local);
  for (int64_t p : *out)
    if (p < 0 || p >= tableRows)
      return Status::error(std::string(k.decl.name) + ": global position " + std::to_string(p) +
                           " is outside the position table of " + std::to_string(tableRows) + " rows (corrupt plan)");
  return Status::ok();
}

Status embedding(CpuKernelContext &c, const KernelCall &k) {
  int tok = k.in("tokens"), w = k.in("word"), pos = k.in("position"), out = k.out("result");
  int64_t rows = k.dim(w, 0), hidden = k.dim(w, 1), seq = k.dim(tok, 1);
  bool chunked = pos >= 0 && !k.str("context_parallel_group").empty();
  embeddingForward(c.i(tok), c.f(w), chunked ? nullptr : c.f(pos), c.f(out), k.numel(tok), seq, hidden,
                   c.shardStart(k.str("vocab_parallel_group"), rows), rows);
  if (chunked) {  // the positions of this rank's chunks, added in place
    std::vector<int64_t> at;
    LOOM_RETURN_IF_ERROR(contextPositions(c, k, 0, seq, seq, k.dim(pos, 0), &at));
    addPositionForward(c.f(out), c.f(pos), c.f(out), k.dim(tok, 0), seq, hidden, at.data());
  }
  return Status::ok();
}

// A sequence-parallel slice starts at its rank's offset of the positions (fp32 or bf16: T);
// with context parallelism each row's global position is looked up.
template <typename T>
Status addPosition(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input"), pos = k.in("position");
  std::string sp = k.str("sequence_parallel_group");
  int64_t rows = k.dim(x, 1), first = c.shardStart(sp, rows);
  if (!k.str("context_parallel_group").empty()) {
    std::vector<int64_t> at;
    LOOM_RETURN_IF_ERROR(contextPositions(c, k, first, rows, rows * c.groupSize(sp), k.dim(pos, 0), &at));
    addPositionForward(c.at<T>(x), c.at<T>(pos), c.at<T>(k.out("result")), k.dim(x, 0), rows, k.dim(x, 2), at.data());
    return Status::ok();
  }
  addPositionForward(c.at<T>(x), c.at<T>(pos) + first * k.dim(x, 2), c.at<T>(k.out("result")), k.dim(x, 0), rows,
                     k.dim(x, 2));
  return Status::ok();
}

// BERT's segment embeddings (fp32; a bf16 plan's calls go through the widened fallback): row
// (b, s) of the input plus the table's row of its token type (a sequence-parallel slice's types
// start at its rank's offset), and the table's gradient, the sum of the gradient's rows per type.
Status tokenTypeRows(const KernelCall &k, int types, int64_t rows, int64_t first, int64_t tableRows,
                     const int32_t *typeIds) {
  if (first + rows > k.dim(types, 1))
    return Status::error(std::string(k.decl.name) + ": slice outside the sequence (corrupt plan)");
  for (int64_t b = 0; b < k.dim(types, 0); ++b)
    for (int64_t s = 0; s < rows; ++s) {
      int32_t t = typeIds[b * k.dim(types, 1) + first + s];
      if (t < 0 || t >= tableRows)
        return Status::error(std::string(k.decl.name) + ": token type " + std::to_string(t) + " is outside the table of " +
                             std::to_string(tableRows) + " types (bad token_types input)");
    }
  return Status::ok();
}

Status addTokenType(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input"), types = k.in("token_types"), table = k.in("table");
  int64_t batch = k.dim(x, 0), rows = k.dim(x, 1), hidden = k.dim(x, 2), seq = k.dim(types, 1);
  int64_t first = c.shardStart(k.str("sequence_parallel_group"), rows);
  const int32_t *ids = c.i(types);
  LOOM_RETURN_IF_ERROR(tokenTypeRows(k, types, rows, first, k.dim(table, 0), ids));
  const float *in = c.f(x), *tab = c.f(table);
  float *out = c.f(k.out("result"));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < rows; ++s) {
      const float *row = tab + int64_t(ids[b * seq + first + s]) * hidden;
      int64_t at = (b * rows + s) * hidden;
      for (int64_t h = 0; h < hidden; ++h) out[at + h] = in[at + h] + row[h];
    }
  return Status::ok();
}

Status tokenTypeGrad(CpuKernelContext &c, const KernelCall &k) {
  int g = k.in("grad"), types = k.in("token_types"), y = k.out("result");
  int64_t batch = k.dim(g, 0), rows = k.dim(g, 1), hidden = k.dim(g, 2), tableRows = k.dim(y, 0), seq = k.dim(types, 1);
  int64_t first = c.shardStart(k.str("sequence_parallel_group"), rows);
  const int32_t *ids = c.i(types);
  LOOM_RETURN_IF_ERROR(tokenTypeRows(k, types, rows, first, tableRows, ids));
  float *out = c.f(y);
  std::fill_n(out, tableRows * hidden, 0.0f);
  const float *grad = c.f(g);
  for (int64_t b = 0; b < batch; ++b)  // in a fixed order: the same sums for any thread count
    for (int64_t s = 0; s < rows; ++s) {
      float *to = out + int64_t(ids[b * seq + first + s]) * hidden;
      const float *row = grad + (b * rows + s) * hidden;
      for (int64_t h = 0; h < hidden; ++h) to[h] += row[h];
    }
  return Status::ok();
}

template <typename T>
Status tanhKernel(CpuKernelContext &c, const KernelCall &k) {
  tanhForward(c.at<T>(k.in("input")), c.at<T>(k.out("result")), k.numel(k.in("input")));
  return Status::ok();
}

template <typename T>
Status tanhGrad(CpuKernelContext &c, const KernelCall &k) {
  tanhBackward(c.at<T>(k.in("input")), c.at<T>(k.in("grad")), c.at<T>(k.out("result")), k.numel(k.in("input")));
  return Status::ok();
}

// The kernels below come for fp32 (T = float) and for bf16 operands (T = uint16_t, every
// operand bf16: registerBf16ComputeKernels), one wrapper each.
template <typename T>
Status layerNorm(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input");
  int64_t n = k.dim(x, -1);
  layerNormForward(c.at<T>(x), c.at<T>(k.in("gamma")), c.at<T>(k.in("beta")), c.at<T>(k.out("result")),
                   k.numel(x) / n, n, float(k.f64("epsilon")));
  return Status::ok();
}

Status linear(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input"), y = k.out("result");
  int64_t kk = k.dim(x, -1), n = k.dim(y, -1), begin, end;
  LOOM_RETURN_IF_ERROR(k.rowRange(k.numel(x) / kk, &begin, &end));
  linearForward(c.f(x) + begin * kk, c.f(k.in("weight")), c.f(k.in("bias")), c.f(y) + begin * n, end - begin, kk, n,
                k.flag("transpose_weight"));
  return Status::ok();
}

template <typename T>
Status addBias(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input"), b = k.in("bias");
  int64_t n = k.numel(b);
  if (n < 1 || k.numel(x) % n) return Status::error("add_bias: the input's size is not a multiple of the bias's (corrupt plan)");
  addBiasForward(c.at<T>(x), c.at<T>(b), c.at<T>(k.out("result")), k.numel(x) / n, n);
  return Status::ok();
}

template <typename T>
Status gelu(CpuKernelContext &c, const KernelCall &k) {
  geluForward(c.at<T>(k.in("input")), c.at<T>(k.out("result")), k.numel(k.in("input")));
  return Status::ok();
}

Status add(CpuKernelContext &c, const KernelCall &k) {
  const float *a = c.f(k.in("lhs")), *b = c.f(k.in("rhs"));
  float *y = c.f(k.out("result"));
  for (int64_t i = 0, n = k.numel(k.in("lhs")); i < n; ++i) y[i] = a[i] + b[i];
  return Status::ok();
}

Status identity(CpuKernelContext &c, const KernelCall &k) {
  std::memcpy(c.f(k.out("result")), c.f(k.in("input")), size_t(k.numel(k.in("input"))) * sizeof(float));
  return Status::ok();
}

// With context parallelism the input [B, L, ...] holds the rank's two chunks of L / 2 tokens and
// each element takes the counter of its global position in the [B, L c, ...] sequence, so that
// the masks are those of c = 1 cut into chunks (a sequence-parallel slice, L = S / (c t) with
// its own tp stream, is counted as if it were the sequence: distinct, not c = 1's).
template <typename T>
Status dropout(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input");
  const T *in = c.at<T>(x);
  T *out = c.at<T>(k.out("result"));
  float rate = c.dropout(k.f64("rate"));
  uint64_t stream = c.dropoutStream(k.i64("stream"), k.str("rank_distinct"));
  std::string cp = k.str("context_parallel_group");
  if (cp.empty() || k.buffer(x).shape_size() < 2) {
    dropoutForward(in, out, k.numel(x), rate, c.run->seed, stream);
    return Status::ok();
  }
  int64_t B = k.dim(x, 0), L = k.dim(x, 1), width = k.numel(x) / std::max<int64_t>(1, B * L);
  ContextChunks ch = c.chunks(cp, L);
  if (L % 2) return Status::error("dropout: " + std::to_string(L) + " local tokens are not two chunks (corrupt plan)");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t which = 0; which < 2; ++which) {
      int64_t at = (b * L + which * ch.chunk()) * width, global = b * ch.seq + ch.globalOf(which * ch.chunk());
      dropoutForward(in + at, out + at, ch.chunk() * width, rate, c.run->seed, stream, uint64_t(global * width));
    }
  return Status::ok();
}

// Context parallelism's members and this rank's place among them for an attention instruction
// whose queries hold `local` tokens and keys `keys` (the gathered sequence).
Status contextMembers(CpuKernelContext &c, const KernelCall &k, int64_t local, int64_t keys, int *members,
                      int *rank) {
  ContextChunks ch = c.chunks(k.str("context_parallel_group"), local);
  *members = ch.c, *rank = ch.rank;
  if (local % 2 || ch.seq != keys || ch.rank < 0 || ch.rank >= ch.c)
    return Status::error(std::string(k.decl.name) + ": " + std::to_string(local) + " queries against " +
                         std::to_string(keys) + " keys do not fit the " + std::to_string(ch.c) +
                         " members of group '" + k.str("context_parallel_group") + "' (corrupt plan)");
  return Status::ok();
}

Status attention(CpuKernelContext &c, const KernelCall &k) {
  AttentionShape s;
  LOOM_RETURN_IF_ERROR(attentionShapeOf(c, k, &s));
  if (!k.str("context_parallel_group").empty()) {
    int members, rank;
    LOOM_RETURN_IF_ERROR(contextMembers(c, k, k.dim(k.out("result"), 1), s.seq, &members, &rank));
    contextAttentionForward(c.f(k.in("qkv")), c.f(k.out("result")), c.f(k.out("lse")), s, members, rank, c.scratch);
    return Status::ok();
  }
  attentionForward(c.f(k.in("qkv")), c.f(k.in("key_mask")), c.f(k.out("result")), c.f(k.out("lse")), s, c.scratch);
  return Status::ok();
}

Status attentionGrad(CpuKernelContext &c, const KernelCall &k) {
  AttentionShape s;
  LOOM_RETURN_IF_ERROR(attentionShapeOf(c, k, &s));
  if (!k.str("context_parallel_group").empty()) {
    int members, rank;
    LOOM_RETURN_IF_ERROR(contextMembers(c, k, k.dim(k.in("grad"), 1), s.seq, &members, &rank));
    contextAttentionBackward(c.f(k.in("qkv")), c.f(k.in("grad")), c.f(k.in("lse")), c.f(k.out("result")), s, members,
                             rank, c.scratch);
    return Status::ok();
  }
  attentionBackward(c.f(k.in("qkv")), c.f(k.in("key_mask")), c.f(k.in("grad")), c.f(k.in("lse")), c.f(k.out("result")),
                    s, c.scratch);
  return Status::ok();
}

}  // namespace

Status groupedAttentionShapeOf(CpuKernelContext &c, const KernelCall &k, GroupedAttentionShape *s) {
  LOOM_RETURN_IF_ERROR(loom::groupedAttentionShape(
      k.program, k.instruction, [&](const std::string &g, int64_t rows) { return c.shardStart(g, rows); }, s));
  s->dropout = c.dropout(k.f64("dropout"));
  s->seed = c.run->seed;
  s->stream = c.dropoutStream(k.i64("stream"), k.str("rank_distinct_dropout"));
  return Status::ok();
}

namespace {

Status groupedAttention(CpuKernelContext &c, const KernelCall &k) {
  GroupedAttentionShape s;
  LOOM_RETURN_IF_ERROR(groupedAttentionShapeOf(c, k, &s));
  if (!k.str("context_parallel_group").empty()) {
    int members, rank;
    LOOM_RETURN_IF_ERROR(contextMembers(c, k, s.seq, k.dim(k.in("k"), 1), &members, &rank));
    contextGroupedAttentionForward(c.f(k.in("q")), c.f(k.in("k")), c.f(k.in("v")), c.f(k.out("result")),
                                   c.f(k.out("lse")), s, members, rank, c.scratch);
    return Status::ok();
  }
  groupedAttentionForward(c.f(k.in("q")), c.f(k.in("k")), c.f(k.in("v")), c.f(k.out("result")), c.f(k.out("lse")), s,
                          c.scratch);
  return Status::ok();
}

Status groupedAttentionGrad(CpuKernelContext &c, const KernelCall &k) {
  GroupedAttentionShape s;
  LOOM_RETURN_IF_ERROR(groupedAttentionShapeOf(c, k, &s));
  if (!k.str("context_parallel_group").empty()) {
    int members, rank;
    LOOM_RETURN_IF_ERROR(contextMembers(c, k, s.seq, k.dim(k.in("k"), 1), &members, &rank));
    contextGroupedAttentionBackward(c.f(k.in("q")), c.f(k.in("k")), c.f(k.in("v")), c.f(k.in("grad")),
                                    c.f(k.in("lse")), c.f(k.out("grad_q")), c.f(k.out("grad_k")),
                                    c.f(k.out("grad_v")), s, members, rank, c.scratch);
    return Status::ok();
  }
  groupedAttentionBackward(c.f(k.in("q")), c.f(k.in("k")), c.f(k.in("v")), c.f(k.in("grad")), c.f(k.in("lse")),
                           c.f(k.out("grad_q")), c.f(k.out("grad_k")), c.f(k.out("grad_v")), s, c.scratch);
  return Status::ok();
}

template <typename T>
Status rmsNorm(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input");
  int64_t n = k.dim(x, -1);
  rmsNormForward(c.at<T>(x), c.at<T>(k.in("gamma")), c.at<T>(k.out("result")), k.numel(x) / n, n, float(k.f64("epsilon")));
  return Status::ok();
}

template <typename T>
Status rmsNormGrad(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input");
  int64_t n = k.dim(x, -1);
  rmsNormBackward(c.at<T>(x), c.at<T>(k.in("gamma")), c.at<T>(k.in("grad")), c.at<T>(k.out("grad_input")),
                  c.at<T>(k.out("grad_gamma")),
                  k.numel(x) / n, n, float(k.f64("epsilon")));
  return Status::ok();
}

template <typename T>
Status rotaryKernel(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input");
  int64_t hd = k.i64("head_dim");
  if (hd < 2 || hd % 2 || k.dim(x, 2) % hd) return Status::error("rotary: bad head_dim (corrupt plan)");
  std::vector<int64_t> at;  // context parallelism: the chunks' global positions
  if (!k.str("context_parallel_group").empty())
    LOOM_RETURN_IF_ERROR(contextPositions(c, k, 0, k.dim(x, 1), k.dim(x, 1), INT64_MAX, &at));
  rotary(c.at<T>(x), c.at<T>(k.out("result")), k.dim(x, 0), k.dim(x, 1), k.dim(x, 2) / hd, hd, float(k.f64("theta")),
         k.flag("inverse"), at.empty() ? nullptr : at.data());
  return Status::ok();
}

template <typename T>
Status swiglu(CpuKernelContext &c, const KernelCall &k) {
  swigluForward(c.at<T>(k.in("gate")), c.at<T>(k.in("up")), c.at<T>(k.out("result")), k.numel(k.in("gate")));
  return Status::ok();
}

template <typename T>
Status swigluGrad(CpuKernelContext &c, const KernelCall &k) {
  swigluBackward(c.at<T>(k.in("gate")), c.at<T>(k.in("up")), c.at<T>(k.in("grad")), c.at<T>(k.out("grad_gate")),
                 c.at<T>(k.out("grad_up")), k.numel(k.in("gate")));
  return Status::ok();
}

Status weightGrad(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input"), g = k.in("grad");
  int64_t kk = k.dim(x, -1), n = k.dim(g, -1);
  linearWeightGrad(c.f(x), c.f(g), c.f(k.out("result")), k.numel(x) / kk, kk, n, k.flag("transpose_weight"));
  return Status::ok();
}

template <typename T>
Status biasGradKernel(CpuKernelContext &c, const KernelCall &k) {
  int g = k.in("grad");
  int64_t n = k.dim(g, -1);
  biasGrad(c.at<T>(g), c.at<T>(k.out("result")), k.numel(g) / n, n);
  return Status::ok();
}

template <typename T>
Status layerNormGrad(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input");
  int64_t n = k.dim(x, -1);
  layerNormBackward(c.at<T>(x), c.at<T>(k.in("gamma")), c.at<T>(k.in("grad")), c.at<T>(k.out("grad_input")),
                    c.at<T>(k.out("grad_gamma")), c.at<T>(k.out("grad_beta")), k.numel(x) / n, n,
                    float(k.f64("epsilon")));
  return Status::ok();
}

template <typename T>
Status geluGrad(CpuKernelContext &c, const KernelCall &k) {
  geluBackward(c.at<T>(k.in("input")), c.at<T>(k.in("grad")), c.at<T>(k.out("result")), k.numel(k.in("input")));
  return Status::ok();
}

Status embeddingGrad(CpuKernelContext &c, const KernelCall &k) {
  int y = k.out("result"), tok = k.in("tokens");
  int64_t rows = k.dim(y, 0), hidden = k.dim(y, 1);
  embeddingBackward(c.i(tok), c.f(k.in("grad")), c.f(y), k.numel(tok), hidden,
                    c.shardStart(k.str("vocab_parallel_group"), rows), rows);
  return Status::ok();
}

template <typename T>
Status positionGrad(CpuKernelContext &c, const KernelCall &k) {
  int g = k.in("grad"), y = k.out("result");
  std::string sp = k.str("sequence_parallel_group");
  int64_t rows = k.dim(g, 1), first = c.shardStart(sp, rows), hidden = k.dim(g, 2);
  if (!k.str("context_parallel_group").empty()) {  // each row into its global position's
    std::vector<int64_t> at;
    LOOM_RETURN_IF_ERROR(contextPositions(c, k, first, rows, rows * c.groupSize(sp), k.dim(y, 0), &at));
    positionBackward(c.at<T>(g), c.at<T>(y), k.dim(g, 0), rows, hidden, k.dim(y, 0), at.data());
    return Status::ok();
  }
  std::fill_n(c.at<T>(y), k.numel(y), T(0));
  positionBackward(c.at<T>(g), c.at<T>(y) + first * hidden, k.dim(g, 0), k.dim(g, 1), hidden, k.dim(y, 0) - first);
  return Status::ok();
}

// A whole-vocabulary cross-entropy (a vocab-parallel one comes as its steps, below, with
// visible all-reduces): per-token max, sums of exponentials and target logits, then the loss.
Status crossEntropy(CpuKernelContext &c, const KernelCall &k) {
  int logits = k.in("logits"), labels = k.in("labels");
  if (!k.str("vocab_parallel_group").empty())
    return Status::error("cross_entropy over a vocab-parallel group: a plan of another version (corrupt plan)");
  int64_t cols = k.dim(logits, -1), tokens = k.numel(logits) / cols, valid = k.i64("valid_vocab");
  std::vector<float> mx(size_t(tokens), 0), sum(size_t(tokens), 0), target(size_t(tokens), 0);
  crossEntropyLocalMax(c.f(logits), mx.data(), tokens, cols, 0, valid);
  crossEntropyLocalSums(c.f(logits), c.i(labels), mx.data(), sum.data(), target.data(), tokens, cols, 0, valid);
  c.f(k.out("loss"))[0] = crossEntropyLoss(mx.data(), sum.data(), target.data(), c.f(k.in("loss_mask")), tokens);
  if (int lse = k.out("lse"); lse >= 0) crossEntropyLogSumExp(mx.data(), sum.data(), c.f(lse), tokens);
  return Status::ok();
}

// (logits, labels, lse[, grad][, mask]) -> dlogits; vocab-parallel, this rank's shard of them.
Status crossEntropyGrad(CpuKernelContext &c, const KernelCall &k) {
  int logits = k.in("logits"), grad = k.in("grad");
  int64_t cols = k.dim(logits, -1), tokens = k.numel(logits) / cols;
  if (k.numel(k.in("lse")) != tokens) return Status::error("cross_entropy_grad: wrong lse (corrupt plan)");
  float g = (grad >= 0 ? c.f(grad)[0] : float(k.f64("loss_scale"))) * c.run->lossScale;
  crossEntropyBackward(c.f(logits), c.i(k.in("labels")), c.f(k.in("loss_mask")), c.f(k.in("lse")), g,
                       c.f(k.out("result")), tokens, cols, c.shardStart(k.str("vocab_parallel_group"), cols),
                       k.i64("valid_vocab"));
  return Status::ok();
}

Status crossEntropyMax(CpuKernelContext &c, const KernelCall &k) {
  int logits = k.in("logits"), mx = k.out("max");
  int64_t cols = k.dim(logits, -1), tokens = k.numel(logits) / cols;
  if (k.numel(mx) != tokens) return Status::error("cross_entropy_max: wrong output (corrupt plan)");
  crossEntropyLocalMax(c.f(logits), c.f(mx), tokens, cols, c.shardStart(k.str("vocab_parallel_group"), cols),
                       k.i64("valid_vocab"));
  return Status::ok();
}

// (logits, labels, max) -> [2, tokens]: sums of exponentials, then target logits.
Status crossEntropySums(CpuKernelContext &c, const KernelCall &k) {
  int logits = k.in("logits"), sums = k.out("sums");
  int64_t cols = k.dim(logits, -1), tokens = k.numel(logits) / cols;
  if (k.numel(sums) != 2 * tokens) return Status::error("cross_entropy_sums: wrong output (corrupt plan)");
  crossEntropyLocalSums(c.f(logits), c.i(k.in("labels")), c.f(k.in("max")), c.f(sums), c.f(sums) + tokens, tokens,
                        cols, c.shardStart(k.str("vocab_parallel_group"), cols), k.i64("valid_vocab"));
  return Status::ok();
}

// (max, sums[, mask]) -> the mean loss[, lse]
Status crossEntropyLossKernel(CpuKernelContext &c, const KernelCall &k) {
  int mx = k.in("max"), sums = k.in("sums");
  int64_t tokens = k.numel(mx);
  c.f(k.out("loss"))[0] = crossEntropyLoss(c.f(mx), c.f(sums), c.f(sums) + tokens, c.f(k.in("loss_mask")), tokens);
  if (int lse = k.out("lse"); lse >= 0) crossEntropyLogSumExp(c.f(mx), c.f(sums), c.f(lse), tokens);
  return Status::ok();
}

}  // namespace

Status attentionShapeOf(CpuKernelContext &c, const KernelCall &k, AttentionShape *s) {
  int qkv = k.in("qkv");
  int64_t heads = k.i64("num_heads");
  if (heads < 1 || k.dim(qkv, 2) % (3 * heads) != 0) return Status::error("attention: bad num_heads (corrupt plan)");
  *s = {k.dim(qkv, 0),
        k.dim(qkv, 1),
        heads,
        k.dim(qkv, 2) / (3 * heads),
        k.flag("causal"),
        c.dropout(k.f64("dropout")),
        c.run->seed,
        c.dropoutStream(k.i64("stream"), k.str("rank_distinct_dropout"))};
  return Status::ok();
}

void registerComputeKernels(CpuKernelRegistry &r) {
  r.add(OpId::kEmbedding, embedding);
  r.add(OpId::kAddPosition, addPosition<float>);
  r.add(OpId::kLayerNorm, layerNorm<float>);
  r.add(OpId::kLinear, linear);
  r.add(OpId::kAddBias, addBias<float>);
  r.add(OpId::kGelu, gelu<float>);
  r.add(OpId::kAttention, attention);
  r.add(OpId::kDropout, dropout<float>);
  r.add(OpId::kAdd, add);
  r.add(OpId::kIdentity, identity);
  r.add(OpId::kCrossEntropy, crossEntropy);
  r.add(OpId::kRmsNorm, rmsNorm<float>);
  r.add(OpId::kRotary, rotaryKernel<float>);
  r.add(OpId::kSwiglu, swiglu<float>);
  r.add(OpId::kGroupedAttention, groupedAttention);
  r.add(OpId::kWeightGrad, weightGrad);
  r.add(OpId::kBiasGrad, biasGradKernel<float>);
  r.add(OpId::kLayerNormGrad, layerNormGrad<float>);
  r.add(OpId::kGeluGrad, geluGrad<float>);
  r.add(OpId::kAttentionGrad, attentionGrad);
  r.add(OpId::kEmbeddingGrad, embeddingGrad);
  r.add(OpId::kPositionGrad, positionGrad<float>);
  r.add(OpId::kCrossEntropyGrad, crossEntropyGrad);
  r.add(OpId::kRmsNormGrad, rmsNormGrad<float>);
  r.add(OpId::kSwigluGrad, swigluGrad<float>);
  r.add(OpId::kGroupedAttentionGrad, groupedAttentionGrad);
  r.add(OpId::kCrossEntropyMax, crossEntropyMax);
  r.add(OpId::kCrossEntropySums, crossEntropySums);
  r.add(OpId::kCrossEntropyLoss, crossEntropyLossKernel);
  r.add(OpId::kTanh, tanhKernel<float>);
  r.add(OpId::kTanhGrad, tanhGrad<float>);
  r.add(OpId::kAddTokenType, addTokenType);
  r.add(OpId::kTokenTypeGrad, tokenTypeGrad);
}

// The memory-bound model ops over bf16 operands (the same wrappers with T = uint16_t).
void registerBf16ComputeKernels(HalfKernelTable &t) {
  auto bf16 = [](CpuKernelRegistry::Kernel run) { return HalfKernel{everyOperandBf16, run}; };
  t.add(OpId::kLayerNorm, bf16(layerNorm<uint16_t>));
  t.add(OpId::kLayerNormGrad, bf16(layerNormGrad<uint16_t>));
  t.add(OpId::kRmsNorm, bf16(rmsNorm<uint16_t>));
  t.add(OpId::kRmsNormGrad, bf16(rmsNormGrad<uint16_t>));
  t.add(OpId::kGelu, bf16(gelu<uint16_t>));
  t.add(OpId::kGeluGrad, bf16(geluGrad<uint16_t>));
  t.add(OpId::kSwiglu, bf16(swiglu<uint16_t>));
  t.add(OpId::kSwigluGrad, bf16(swigluGrad<uint16_t>));
  t.add(OpId::kRotary, bf16(rotaryKernel<uint16_t>));
  t.add(OpId::kDropout, bf16(dropout<uint16_t>));
  t.add(OpId::kBiasGrad, bf16(biasGradKernel<uint16_t>));
  t.add(OpId::kAddBias, bf16(addBias<uint16_t>));
  t.add(OpId::kAddPosition, bf16(addPosition<uint16_t>));
  t.add(OpId::kPositionGrad, bf16(positionGrad<uint16_t>));
  t.add(OpId::kTanh, bf16(tanhKernel<uint16_t>));
  t.add(OpId::kTanhGrad, bf16(tanhGrad<uint16_t>));
}

}  // namespace loom::cpu
