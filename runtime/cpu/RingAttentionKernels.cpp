// Context parallelism's ring attention instructions (plan ops ring_attention,
// ring_grouped_attention and their gradients: attention cores marked context_parallel_ring, a
// collective over their `group`): the math is runtime/cpu/Kernels.cpp's ringAttention*, the
// ring's steps Collectives::exchangeBytes with the next and previous members.
#include <algorithm>

#include "plan/PlanAttributes.h"
#include "runtime/cpu/CpuKernelContext.h"
#include "runtime/cpu/Kernels.h"

namespace loom::cpu {
namespace {

using isa::OpId;

// The ring's tag on its group's channel (the ring is the group's only traffic in ring mode).
constexpr int kRingTag = 7;

// How the keys travel: in their buffer's dtype (a 16-bit plan's K | V are 16-bit values).
RingAttentionShape::Wire keyWireOf(plan::DType keys) {
  using Wire = RingAttentionShape::Wire;
  return keys == plan::BF16 ? Wire::kBf16 : keys == plan::F16 ? Wire::kF16 : Wire::kF32;
}

// The members and this rank's place, checked against the instruction; the exchange with the
// ring's neighbours.
Status ringOf(CpuKernelContext &c, const KernelCall &k, int64_t local, RingAttentionShape *s, RingExchange *exchange) {
  Collectives *col;
  LOOM_RETURN_IF_ERROR(c.collectives(&col));
  std::string group = k.str("group");
  int members = col->sizeOf(group), rank = col->rankIn(group);
  if (members != k.i64("context_parallel_size") || local % 2 || rank < 0 || rank >= members)
    return Status::error(std::string(k.decl.name) + ": group '" + group + "' has " + std::to_string(members) +
                         " members, the instruction says " + std::to_string(k.i64("context_parallel_size")) +
                         " (or its " + std::to_string(local) + " tokens are not two chunks): corrupt plan");
  s->c = members, s->rank = rank;
  *exchange = [col, group, members, rank](const void *send, void *recv, int64_t bytes) {
    return col->exchangeBytes(group, (rank + 1) % members, send, (rank - 1 + members) % members, recv, bytes, kRingTag);
  };
  return Status::ok();
}

// GPT's fused qkv [B, L, 3H] (per head [3, hd]): the ring's shape and exchange, and K | V
// packed [B, L, H] each.
Status fusedRing(CpuKernelContext &c, const KernelCall &k, RingAttentionShape *s, RingExchange *exchange) {
  AttentionShape a;
  LOOM_RETURN_IF_ERROR(attentionShapeOf(c, k, &a));
  *s = {a.batch, a.heads, a.heads, a.headDim, a.seq, 0, 1, 1, 0, a.causal, a.dropout, a.seed, a.stream,
        keyWireOf(k.buffer(k.in("qkv")).dtype())};
  return ringOf(c, k, s->local, s, exchange);
}
void packKeys(const float *qkv, const RingAttentionShape &s, float *k, float *v) {
  int64_t hd = s.headDim, H = s.heads * hd;
  for (int64_t r = 0; r < s.batch * s.local; ++r)
    for (int64_t h = 0; h < s.heads; ++h) {
      const float *src = qkv + r * 3 * H + h * 3 * hd;
      std::copy(src + hd, src + 2 * hd, k + r * H + h * hd);
      std::copy(src + 2 * hd, src + 3 * hd, v + r * H + h * hd);
    }
}
float *packedArea(CpuKernelContext &c, const RingAttentionShape &s, bool backward) {
  return c.scratch + ringAttentionScratchFloats(s, backward, true) - 4 * s.batch * s.local * s.kvHeads * s.headDim;
}

Status ringAttention(CpuKernelContext &c, const KernelCall &k) {
  RingAttentionShape s;
  RingExchange exchange;
  LOOM_RETURN_IF_ERROR(fusedRing(c, k, &s, &exchange));
  int64_t kv = s.batch * s.local * s.heads * s.headDim;
  float *packed = packedArea(c, s, false);
  const float *qkv = c.f(k.in("qkv"));
  packKeys(qkv, s, packed, packed + kv);
  return ringAttentionForward(qkv, 3 * s.heads * s.headDim, 3 * s.headDim, packed, packed + kv, c.f(k.out("result")),
                              c.f(k.out("lse")), s, c.scratch, exchange);
}

Status ringAttentionGrad(CpuKernelContext &c, const KernelCall &k) {
  RingAttentionShape s;
  RingExchange exchange;
  LOOM_RETURN_IF_ERROR(fusedRing(c, k, &s, &exchange));
  int64_t hd = s.headDim, H = s.heads * hd, kv = s.batch * s.local * H;
  float *packed = packedArea(c, s, true), *dk = packed + 2 * kv, *dv = dk + kv;
  const float *qkv = c.f(k.in("qkv"));
  float *dqkv = c.f(k.out("result"));
  packKeys(qkv, s, packed, packed + kv);
  std::fill(dqkv, dqkv + 3 * kv, 0.0f);
  LOOM_RETURN_IF_ERROR(ringAttentionBackward(qkv, 3 * H, 3 * hd, packed, packed + kv, c.f(k.in("grad")),
                                             c.f(k.in("out")), c.f(k.in("lse")), dqkv, dk, dv, s, c.scratch,
                                             exchange));
  for (int64_t r = 0; r < s.batch * s.local; ++r)  // dK and dV into their places in dqkv
    for (int64_t h = 0; h < s.heads; ++h) {
      float *dst = dqkv + r * 3 * H + h * 3 * hd;
      std::copy(dk + r * H + h * hd, dk + r * H + (h + 1) * hd, dst + hd);
      std::copy(dv + r * H + h * hd, dv + r * H + (h + 1) * hd, dst + 2 * hd);
    }
  return Status::ok();
}

// Grouped-query attention's separate q, k, v: the ring's shape and exchange.
Status groupedRing(CpuKernelContext &c, const KernelCall &k, RingAttentionShape *s, RingExchange *exchange) {
  GroupedAttentionShape g;
  LOOM_RETURN_IF_ERROR(groupedAttentionShapeOf(c, k, &g));
  if (k.dim(k.in("k"), 1) != g.seq)
    return Status::error(std::string(k.decl.name) + ": k's tokens differ from q's (corrupt plan)");
  if (k.buffer(k.in("k")).dtype() != k.buffer(k.in("v")).dtype())
    return Status::error(std::string(k.decl.name) + ": k and v differ in dtype (corrupt plan)");
  *s = {g.batch, g.heads, g.kvHeads, g.headDim, g.seq, g.firstHead, g.headsPerKv, 1, 0, g.causal, g.dropout, g.seed,
        g.stream, keyWireOf(k.buffer(k.in("k")).dtype())};
  return ringOf(c, k, s->local, s, exchange);
}

Status ringGroupedAttention(CpuKernelContext &c, const KernelCall &k) {
  RingAttentionShape s;
  RingExchange exchange;
  LOOM_RETURN_IF_ERROR(groupedRing(c, k, &s, &exchange));
  int64_t H = s.heads * s.headDim;
  return ringAttentionForward(c.f(k.in("q")), H, s.headDim, c.f(k.in("k")), c.f(k.in("v")), c.f(k.out("result")),
                              c.f(k.out("lse")), s, c.scratch, exchange);
}

Status ringGroupedAttentionGrad(CpuKernelContext &c, const KernelCall &k) {
  RingAttentionShape s;
  RingExchange exchange;
  LOOM_RETURN_IF_ERROR(groupedRing(c, k, &s, &exchange));
  int64_t H = s.heads * s.headDim;
  return ringAttentionBackward(c.f(k.in("q")), H, s.headDim, c.f(k.in("k")), c.f(k.in("v")), c.f(k.in("grad")),
                               c.f(k.in("out")), c.f(k.in("lse")), c.f(k.out("grad_q")), c.f(k.out("grad_k")),
                               c.f(k.out("grad_v")), s, c.scratch, exchange);
}

}  // namespace

int64_t ringAttentionScratchOf(const plan::Program &program, const plan::Instruction &in) {
  const isa::OpDecl *d = isa::find(in.op());
  if (!d || !isa::isRingAttention(d->id) || in.inputs_size() < 1) return 0;
  bool grouped = d->id == OpId::kRingGroupedAttention || d->id == OpId::kRingGroupedAttentionGrad;
  bool backward = d->id == OpId::kRingAttentionGrad || d->id == OpId::kRingGroupedAttentionGrad;
  auto shapeOf = [&](int b) -> const plan::Buffer * {
    return b >= 0 && b < program.buffers_size() && program.buffers(b).shape_size() == 3 ? &program.buffers(b) : nullptr;
  };
  const plan::Buffer *q = shapeOf(in.inputs(0)), *k = grouped && in.inputs_size() > 1 ? shapeOf(in.inputs(1)) : q;
  int64_t heads = std::max<int64_t>(1, planattr::i64(in, "num_heads"));
  if (!q || !k) return 0;  // checkProgram's
  int64_t width = planattr::dim(*q, 2), hd = grouped ? width / heads : width / (3 * heads);
  int64_t kvHeads = grouped ? std::max<int64_t>(1, planattr::dim(*k, 2) / std::max<int64_t>(1, hd)) : heads;
  RingAttentionShape s{planattr::dim(*q, 0), heads, kvHeads, hd, planattr::dim(*q, 1), 0, 1, 1, 0, true, 0, 0, 0,
                       keyWireOf(k->dtype())};
  return ringAttentionScratchFloats(s, backward, !grouped);
}

void registerRingAttentionKernels(CpuKernelRegistry &r) {
  r.add(OpId::kRingAttention, ringAttention);
  r.add(OpId::kRingAttentionGrad, ringAttentionGrad);
  r.add(OpId::kRingGroupedAttention, ringGroupedAttention);
  r.add(OpId::kRingGroupedAttentionGrad, ringGroupedAttentionGrad);
}

}  // namespace loom::cpu
