// The CPU kernels that read and write 16-bit buffers natively (bf16 plans: issue 34): the
// GEMMs on oneDNN's bf16 matmul (runtime/cpu/Gemm.h), the memory-bound ops whose widened
// copies would cost more than their arithmetic (the residual adds, the gradient accumulation,
// the casts of the flat weights, the embedding table, the vocabulary-sized logits). Each computes
// in fp32 registers and rounds a 16-bit output once: the same values as the widened path
// (runtime/Executor.cpp) but for the GEMMs' order of summation.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "runtime/cpu/CpuKernelContext.h"
#include "runtime/cpu/Gemm.h"
#include "runtime/cpu/HalfStorage.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Parallel.h"

namespace loom::cpu {
namespace {

using isa::OpId;

#define LOOM_HALF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

plan::DType dtypeOf(const KernelCall &k, int id) { return k.buffer(id).dtype(); }

// Every bound operand of these (absent optional ones aside) is bf16.
bool allBf16(const KernelCall &k, std::initializer_list<int> ids) {
  for (int id : ids)
    if (id >= 0 && dtypeOf(k, id) != plan::BF16) return false;
  return true;
}

bool linearTakes(const KernelCall &k) {
  return allBf16(k, {k.in("input"), k.in("weight"), k.in("bias"), k.out("result")});
}

Status linear(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input"), y = k.out("result");
  int64_t kk = k.dim(x, -1), n = k.dim(y, -1), begin, end;
  LOOM_RETURN_IF_ERROR(k.rowRange(k.numel(x) / kk, &begin, &end));
  bool tw = k.flag("transpose_weight");
  gemmBf16(false, tw, end - begin, n, kk, c.h(x) + begin * kk, kk, c.h(k.in("weight")), tw ? kk : n, c.h(k.in("bias")),
           c.h(y) + begin * n, GemmOut::kBf16, n);
  return Status::ok();
}

// dW from bf16 activations and gradients, into a bf16 or an fp32 gradient.
bool weightGradTakes(const KernelCall &k) {
  plan::DType out = dtypeOf(k, k.out("result"));
  return allBf16(k, {k.in("input"), k.in("grad")}) && (out == plan::BF16 || out == plan::F32);
}

Status weightGrad(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input"), g = k.in("grad"), r = k.out("result");
  int64_t kk = k.dim(x, -1), n = k.dim(g, -1), m = k.numel(x) / kk;
  bool half = dtypeOf(k, r) == plan::BF16;
  void *dw = half ? static_cast<void *>(c.h(r)) : static_cast<void *>(c.f(r));
  GemmOut out = half ? GemmOut::kBf16 : GemmOut::kF32;
  if (k.flag("transpose_weight"))  // dW[N,K] = g^T x
    gemmBf16(true, false, n, kk, m, c.h(g), n, c.h(x), kk, nullptr, dw, out, kk);
  else  // dW[K,N] = x^T g
    gemmBf16(true, false, kk, n, m, c.h(x), kk, c.h(g), n, nullptr, dw, out, n);
  return Status::ok();
}

LOOM_HALF_CLONES void addRange(const uint16_t *__restrict a, const uint16_t *__restrict b, uint16_t *__restrict y,
                               int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float s = bf16ToFloat(a[i]) + bf16ToFloat(b[i]);
    uint32_t u;
    std::memcpy(&u, &s, 4);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    y[i] = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
  }
}

bool addTakes(const KernelCall &k) { return allBf16(k, {k.in("lhs"), k.in("rhs"), k.out("result")}); }

Status add(CpuKernelContext &c, const KernelCall &k) {
  const uint16_t *a = c.h(k.in("lhs")), *b = c.h(k.in("rhs"));
  uint16_t *y = c.h(k.out("result"));
  parallelFor(k.numel(k.in("lhs")), 65536, [&](int64_t lo, int64_t hi) { addRange(a + lo, b + lo, y + lo, hi - lo); });
  return Status::ok();
}

// A 16-bit gradient into its fp32 main gradient (Megatron's main_grad), in place.
LOOM_HALF_CLONES void accumulateRange(const uint16_t *__restrict x, float *__restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += bf16ToFloat(x[i]);
}

bool accumulateTakes(const KernelCall &k) {
  return dtypeOf(k, k.in("input")) == plan::BF16 && dtypeOf(k, k.out("accumulator")) == plan::F32;
}

Status accumulate(CpuKernelContext &c, const KernelCall &k) {
  const uint16_t *x = c.h(k.in("input"));
  float *y = c.f(k.out("accumulator"));
  parallelFor(k.numel(k.out("accumulator")), 65536,
              [&](int64_t lo, int64_t hi) { accumulateRange(x + lo, y + lo, hi - lo); });
  return Status::ok();
}

// fp32 <-> 16-bit (the flat weights' copy after each update), or a copy of one dtype.
bool castTakes(const KernelCall &k) {
  plan::DType from = dtypeOf(k, k.in("input")), to = dtypeOf(k, k.out("output"));
  return (from == plan::F32 && isHalf(to)) || (isHalf(from) && to == plan::F32) || (isHalf(from) && from == to);
}

Status cast(CpuKernelContext &c, const KernelCall &k) {
  int x = k.in("input"), y = k.out("output");
  plan::DType from = dtypeOf(k, x), to = dtypeOf(k, y);
  int64_t n = k.numel(y);
  if (from == plan::F32)
    narrow(to, c.f(x), c.h(y), n);
  else if (to == plan::F32)
    widen(from, c.h(x), c.f(y), n);
  else if (c.h(x) != c.h(y))
    std::memcpy(c.h(y), c.h(x), size_t(n) * 2);
  return Status::ok();
}

// out[t] = word[tokens[t] - rowStart] (0 outside the shard) + position[t % seq], rounded once.
// Context parallelism's chunked forms run as fp32 over widened copies (their kernels are fp32).
bool chunked(const KernelCall &k) { return !k.str("context_parallel_group").empty(); }

bool embeddingTakes(const KernelCall &k) {
  return !chunked(k) && allBf16(k, {k.in("word"), k.in("position"), k.out("result")});
}

Status embedding(CpuKernelContext &c, const KernelCall &k) {
  int tok = k.in("tokens"), w = k.in("word");
  int64_t rows = k.dim(w, 0), hidden = k.dim(w, 1), count = k.numel(tok), seq = k.dim(tok, 1);
  int64_t start = c.shardStart(k.str("vocab_parallel_group"), rows);
  const int32_t *tokens = c.i(tok);
  const uint16_t *word = c.h(w), *position = c.h(k.in("position"));
  uint16_t *out = c.h(k.out("result"));
  parallelFor(count, grainFor(hidden), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t row = int64_t(tokens[t]) - start;
      bool held = row >= 0 && row < rows;
      uint16_t *o = out + t * hidden;
      if (!position) {
        if (held)
          std::memcpy(o, word + row * hidden, size_t(hidden) * 2);
        else
          std::fill(o, o + hidden, uint16_t(0));
        continue;
      }
      const uint16_t *p = position + (t % seq) * hidden;
      for (int64_t i = 0; i < hidden; ++i)
        o[i] = floatToBf16((held ? bf16ToFloat(word[row * hidden + i]) : 0.0f) + bf16ToFloat(p[i]));
    }
  });
  return Status::ok();
}

// dword[row] = the sum, in token order, of the gradient rows of the tokens that read it (fp32),
// rounded once; rows no token read are 0.
bool embeddingGradTakes(const KernelCall &k) {
  plan::DType out = dtypeOf(k, k.out("result"));
  return dtypeOf(k, k.in("grad")) == plan::BF16 && (out == plan::BF16 || out == plan::F32);
}

Status embeddingGrad(CpuKernelContext &c, const KernelCall &k) {
  int y = k.out("result"), tok = k.in("tokens");
  int64_t rows = k.dim(y, 0), hidden = k.dim(y, 1), count = k.numel(tok);
  int64_t start = c.shardStart(k.str("vocab_parallel_group"), rows);
  const int32_t *tokens = c.i(tok);
  const uint16_t *g = c.h(k.in("grad"));
  bool half = dtypeOf(k, y) == plan::BF16;
  // The tokens of each row read, in token order (a counting sort by row).
  std::vector<int64_t> rowOf(static_cast<size_t>(count)), order, firstOf, hitRows;
  {
    std::vector<int64_t> tokensOfRow;  // per row read (in order of first reading): its tokens
    std::vector<int32_t> slot(size_t(rows), -1);
    for (int64_t t = 0; t < count; ++t) {
      int64_t row = int64_t(tokens[t]) - start;
      rowOf[size_t(t)] = row >= 0 && row < rows ? row : -1;
      if (rowOf[size_t(t)] < 0) continue;
      if (slot[size_t(row)] < 0) slot[size_t(row)] = int32_t(hitRows.size()), hitRows.push_back(row), tokensOfRow.push_back(0);
      ++tokensOfRow[size_t(slot[size_t(row)])];
    }
    firstOf.assign(hitRows.size() + 1, 0);
    for (size_t r = 0; r < hitRows.size(); ++r) firstOf[r + 1] = firstOf[r] + tokensOfRow[r];
    order.resize(size_t(firstOf.back()));
    std::vector<int64_t> next(firstOf.begin(), firstOf.end() - 1);
    for (int64_t t = 0; t < count; ++t)
      if (rowOf[size_t(t)] >= 0) order[size_t(next[size_t(slot[size_t(rowOf[size_t(t)])])]++)] = t;
  }
  uint16_t *dh = half ? c.h(y) : nullptr;
  float *df = half ? nullptr : c.f(y);
  parallelFor(rows * hidden, 1 << 18, [&](int64_t lo, int64_t hi) {
    if (half)
      std::fill(dh + lo, dh + hi, uint16_t(0));
    else
      std::fill(df + lo, df + hi, 0.0f);
  });
  int64_t hits = int64_t(hitRows.size());
  parallelFor(hits, grainFor(hidden), [&](int64_t r0, int64_t r1) {
    std::vector<float> sum(static_cast<size_t>(hidden));
    for (int64_t r = r0; r < r1; ++r) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t j = firstOf[size_t(r)]; j < firstOf[size_t(r) + 1]; ++j) {
        const uint16_t *gt = g + order[size_t(j)] * hidden;
        for (int64_t i = 0; i < hidden; ++i) sum[size_t(i)] += bf16ToFloat(gt[i]);
      }
      int64_t row = hitRows[size_t(r)];
      if (half)
        narrowToBf16(sum.data(), dh + row * hidden, hidden);
      else
        std::copy(sum.begin(), sum.end(), df + row * hidden);
    }
  });
  return Status::ok();
}

// Attention over bf16 qkv (FlashAttention's rounding points: runtime/cpu/Kernels.h): the key
// mask and the statistics fp32, the result (forward out, backward dqkv) and grad bf16.
bool attentionTakes(const KernelCall &k) {
  if (chunked(k)) return false;
  bool backward = k.decl.id == OpId::kAttentionGrad;
  int mask = k.in("key_mask"), lse = backward ? k.in("lse") : k.out("lse");
  return allBf16(k, {k.in("qkv"), k.out("result"), backward ? k.in("grad") : -1}) &&
         (mask < 0 || dtypeOf(k, mask) == plan::F32) && (lse < 0 || dtypeOf(k, lse) == plan::F32) &&
         (backward ? lse >= 0 : true);
}

int64_t attentionScratch(const KernelCall &k) {
  int qkv = k.in("qkv");
  if (k.buffer(qkv).shape_size() != 3) return 0;  // a corrupt plan, refused before it runs
  int64_t heads = std::max<int64_t>(1, k.i64("num_heads"));
  return attentionScratchFloatsBf16(k.dim(qkv, 1), k.dim(qkv, 2) / (3 * heads), k.decl.id == OpId::kAttentionGrad);
}

Status attention(CpuKernelContext &c, const KernelCall &k) {
  AttentionShape s;
  LOOM_RETURN_IF_ERROR(attentionShapeOf(c, k, &s));
  attentionForwardBf16(c.h(k.in("qkv")), c.f(k.in("key_mask")), c.h(k.out("result")), c.f(k.out("lse")), s,
                       c.halfScratch);
  return Status::ok();
}

Status attentionGrad(CpuKernelContext &c, const KernelCall &k) {
  AttentionShape s;
  LOOM_RETURN_IF_ERROR(attentionShapeOf(c, k, &s));
  attentionBackwardBf16(c.h(k.in("qkv")), c.f(k.in("key_mask")), c.h(k.in("grad")), c.f(k.in("lse")),
                        c.h(k.out("result")), s, c.halfScratch);
  return Status::ok();
}

// Grouped-query attention over bf16 q, k, v (and grad, grad_q/k/v); lse fp32.
bool groupedAttentionTakes(const KernelCall &k) {
  if (chunked(k)) return false;
  bool backward = k.decl.id == OpId::kGroupedAttentionGrad;
  int lse = backward ? k.in("lse") : k.out("lse");
  if (backward)
    return allBf16(k, {k.in("q"), k.in("k"), k.in("v"), k.in("grad"), k.out("grad_q"), k.out("grad_k"),
                       k.out("grad_v")}) &&
           dtypeOf(k, lse) == plan::F32;
  return allBf16(k, {k.in("q"), k.in("k"), k.in("v"), k.out("result")}) && (lse < 0 || dtypeOf(k, lse) == plan::F32);
}

int64_t groupedAttentionScratch(const KernelCall &k) {
  int q = k.in("q"), kk = k.in("k");
  if (k.buffer(q).shape_size() != 3 || k.buffer(kk).shape_size() != 3) return 0;  // corrupt: refused before it runs
  int64_t heads = std::max<int64_t>(1, k.i64("num_heads")), hd = std::max<int64_t>(1, k.dim(q, 2) / heads);
  GroupedAttentionShape s{k.dim(q, 0), k.dim(q, 1), heads, k.dim(kk, 2) / hd, hd, 0, 1, false, 0.0f, 0, 0};
  return groupedAttentionScratchFloatsBf16(s, k.decl.id == OpId::kGroupedAttentionGrad);
}

Status groupedAttention(CpuKernelContext &c, const KernelCall &k) {
  GroupedAttentionShape s;
  LOOM_RETURN_IF_ERROR(groupedAttentionShapeOf(c, k, &s));
  groupedAttentionForwardBf16(c.h(k.in("q")), c.h(k.in("k")), c.h(k.in("v")), c.h(k.out("result")), c.f(k.out("lse")),
                              s, c.halfScratch);
  return Status::ok();
}

Status groupedAttentionGrad(CpuKernelContext &c, const KernelCall &k) {
  GroupedAttentionShape s;
  LOOM_RETURN_IF_ERROR(groupedAttentionShapeOf(c, k, &s));
  groupedAttentionBackwardBf16(c.h(k.in("q")), c.h(k.in("k")), c.h(k.in("v")), c.h(k.in("grad")), c.f(k.in("lse")),
                               c.h(k.out("grad_q")), c.h(k.out("grad_k")), c.h(k.out("grad_v")), s, c.halfScratch);
  return Status::ok();
}

// The cross-entropy steps over bf16 logits: their rows widened a few at a time into the
// stream's scratch (each token's statistics come from its own row alone), and
// cross_entropy_grad's fp32 rows beside them before they are rounded.
int64_t rowChunk(int64_t cols) { return std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(1, cols)); }

int64_t logitsScratchFloats(const KernelCall &k) {
  int logits = k.in("logits");
  if (k.buffer(logits).shape_size() < 1) return 0;  // a corrupt plan, refused before it runs
  int64_t cols = k.dim(logits, -1), tokens = cols > 0 ? k.numel(logits) / cols : 0;
  return 2 * std::min(rowChunk(cols), tokens) * cols;
}

template <typename Body>
void inRowChunks(float *wide, const uint16_t *logits, int64_t tokens, int64_t cols, const Body &body) {
  int64_t chunk = rowChunk(cols);
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    int64_t t1 = std::min(tokens, t0 + chunk);
    widenBf16(logits + t0 * cols, wide, (t1 - t0) * cols);
    body(wide, t0, t1);
  }
}

// bf16 logits; every other operand fp32 (labels int32), cross_entropy_grad's result bf16 or fp32.
bool logitsTakes(const KernelCall &k) {
  int logits = k.in("logits");
  if (dtypeOf(k, logits) != plan::BF16) return false;
  for (size_t i = 0; i < k.decl.inputs.size(); ++i) {
    int id = k.bound.inputs[i];
    if (id >= 0 && id != logits && isHalf(dtypeOf(k, id))) return false;
  }
  for (size_t i = 0; i < k.decl.outputs.size(); ++i) {
    int id = k.bound.outputs[i];
    bool bf16Grad = k.decl.id == OpId::kCrossEntropyGrad && dtypeOf(k, id) == plan::BF16;
    if (id >= 0 && dtypeOf(k, id) != plan::F32 && !bf16Grad) return false;
  }
  return true;
}

Status crossEntropy(CpuKernelContext &c, const KernelCall &k) {
  int logits = k.in("logits"), labels = k.in("labels");
  if (!k.str("vocab_parallel_group").empty())
    return Status::error("cross_entropy over a vocab-parallel group: a plan of another version (corrupt plan)");
  int64_t cols = k.dim(logits, -1), tokens = k.numel(logits) / cols, valid = k.i64("valid_vocab");
  std::vector<float> mx(size_t(tokens), 0), sum(size_t(tokens), 0), target(size_t(tokens), 0);
  const int32_t *l = c.i(labels);
  inRowChunks(c.halfScratch, c.h(logits), tokens, cols, [&](const float *rows, int64_t t0, int64_t t1) {
    crossEntropyLocalMax(rows, mx.data() + t0, t1 - t0, cols, 0, valid);
    crossEntropyLocalSums(rows, l + t0, mx.data() + t0, sum.data() + t0, target.data() + t0, t1 - t0, cols, 0, valid);
  });
  c.f(k.out("loss"))[0] = crossEntropyLoss(mx.data(), sum.data(), target.data(), c.f(k.in("loss_mask")), tokens);
  if (int lse = k.out("lse"); lse >= 0) crossEntropyLogSumExp(mx.data(), sum.data(), c.f(lse), tokens);
  return Status::ok();
}

Status crossEntropyMax(CpuKernelContext &c, const KernelCall &k) {
  int logits = k.in("logits"), mx = k.out("max");
  int64_t cols = k.dim(logits, -1), tokens = k.numel(logits) / cols;
  if (k.numel(mx) != tokens) return Status::error("cross_entropy_max: wrong output (corrupt plan)");
  int64_t start = c.shardStart(k.str("vocab_parallel_group"), cols), valid = k.i64("valid_vocab");
  inRowChunks(c.halfScratch, c.h(logits), tokens, cols, [&](const float *rows, int64_t t0, int64_t t1) {
    crossEntropyLocalMax(rows, c.f(mx) + t0, t1 - t0, cols, start, valid);
  });
  return Status::ok();
}

Status crossEntropySums(CpuKernelContext &c, const KernelCall &k) {
  int logits = k.in("logits"), sums = k.out("sums");
  int64_t cols = k.dim(logits, -1), tokens = k.numel(logits) / cols;
  if (k.numel(sums) != 2 * tokens) return Status::error("cross_entropy_sums: wrong output (corrupt plan)");
  int64_t start = c.shardStart(k.str("vocab_parallel_group"), cols), valid = k.i64("valid_vocab");
  const int32_t *labels = c.i(k.in("labels"));
  const float *mx = c.f(k.in("max"));
  float *sumExp = c.f(sums), *target = c.f(sums) + tokens;
  inRowChunks(c.halfScratch, c.h(logits), tokens, cols, [&](const float *rows, int64_t t0, int64_t t1) {
    crossEntropyLocalSums(rows, labels + t0, mx + t0, sumExp + t0, target + t0, t1 - t0, cols, start, valid);
  });
  return Status::ok();
}

// dlogits rows from the kept log-sum-exp, computed in fp32 a few rows at a time and rounded.
Status crossEntropyGrad(CpuKernelContext &c, const KernelCall &k) {
  int logits = k.in("logits"), grad = k.in("grad"), result = k.out("result");
  int64_t cols = k.dim(logits, -1), tokens = k.numel(logits) / cols;
  if (k.numel(k.in("lse")) != tokens) return Status::error("cross_entropy_grad: wrong lse (corrupt plan)");
  float g = (grad >= 0 ? c.f(grad)[0] : float(k.f64("loss_scale"))) * c.run->lossScale;
  const int32_t *labels = c.i(k.in("labels"));
  const float *mask = c.f(k.in("loss_mask")), *lse = c.f(k.in("lse"));
  double count = crossEntropyMaskCount(mask, tokens);
  int64_t start = c.shardStart(k.str("vocab_parallel_group"), cols), valid = k.i64("valid_vocab");
  bool half = dtypeOf(k, result) == plan::BF16;
  float *gradRows = c.halfScratch + std::min(rowChunk(cols), tokens) * cols;
  inRowChunks(c.halfScratch, c.h(logits), tokens, cols, [&](const float *rows, int64_t t0, int64_t t1) {
    float *d = half ? gradRows : c.f(result) + t0 * cols;
    crossEntropyBackwardRows(rows, labels + t0, mask ? mask + t0 : nullptr, lse + t0, g, count, d, t1 - t0, cols, start,
                             valid);
    if (half) narrowToBf16(d, c.h(result) + t0 * cols, (t1 - t0) * cols);
  });
  return Status::ok();
}

}  // namespace

bool everyOperandBf16(const KernelCall &k) {
  bool all = true;
  forEachOperand(k, [&](int id) { all &= dtypeOf(k, id) == plan::BF16; });
  return all;
}

const HalfKernelTable &cpuHalfKernels() {
  static const HalfKernelTable table = [] {
    HalfKernelTable t;
    registerBf16ComputeKernels(t);
    registerHalfCommunicationKernels(t);
    registerBf16MoeKernels(t);
    t.add(OpId::kLinear, {linearTakes, linear});
    t.add(OpId::kWeightGrad, {weightGradTakes, weightGrad});
    t.add(OpId::kAdd, {addTakes, add});
    t.add(OpId::kAccumulate, {accumulateTakes, accumulate});
    t.add(OpId::kCast, {castTakes, cast});
    t.add(OpId::kEmbedding, {embeddingTakes, embedding});
    t.add(OpId::kEmbeddingGrad, {embeddingGradTakes, embeddingGrad});
    t.add(OpId::kAttention, {attentionTakes, attention, attentionScratch});
    t.add(OpId::kAttentionGrad, {attentionTakes, attentionGrad, attentionScratch});
    t.add(OpId::kGroupedAttention, {groupedAttentionTakes, groupedAttention, groupedAttentionScratch});
    t.add(OpId::kGroupedAttentionGrad, {groupedAttentionTakes, groupedAttentionGrad, groupedAttentionScratch});
    t.add(OpId::kCrossEntropy, {logitsTakes, crossEntropy, logitsScratchFloats});
    t.add(OpId::kCrossEntropyMax, {logitsTakes, crossEntropyMax, logitsScratchFloats});
    t.add(OpId::kCrossEntropySums, {logitsTakes, crossEntropySums, logitsScratchFloats});
    t.add(OpId::kCrossEntropyGrad, {logitsTakes, crossEntropyGrad, logitsScratchFloats});
    return t;
  }();
  return table;
}

}  // namespace loom::cpu
