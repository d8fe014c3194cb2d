// The mixture-of-experts instructions (plan ops moe and moe_grad; ir/LoomOps.td has the math):
// the routing, capacity and experts of runtime/cpu/Moe.cpp over one micro-batch's tokens. The
// backward recomputes the routing from the logits (the same top-k, the same drops).
// expert_parallel_moe and its gradient are the same math with the experts split over the "ep"
// group: the assignments travel to their experts' members and back with an all-to-all whose
// counts are exchanged first (Megatron-Core's all-to-all token dispatcher, dropless or after the
// capacity drop).
#include <algorithm>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "plan/PlanAttributes.h"
#include "runtime/cpu/CpuKernelContext.h"
#include "runtime/cpu/HalfStorage.h"
#include "runtime/cpu/Moe.h"

namespace loom::cpu {
namespace {

using isa::OpId;

// One instruction's sizes, from its operands (input [B, S, H], logits [B, S, E], gate [E, F, H]).
struct MoeShape {
  MoeRouting routing;
  MoeExperts experts;
};

MoeShape moeShapeOf(const plan::Program &program, int input, int gate, int64_t topK) {
  const plan::Buffer &x = program.buffers(input), &g = program.buffers(gate);
  int64_t hidden = planattr::dim(x, 2), tokens = planattr::dim(x, 0) * planattr::dim(x, 1);
  int64_t experts = planattr::dim(g, 0), ffn = planattr::dim(g, 1);
  return {{tokens, experts, topK, /*renormalize=*/true}, {tokens, hidden, ffn, experts, topK}};
}

// Floats of scratch: the probabilities [T, E], the weights and their gradients [T, k], the experts'.
int64_t scratchFloats(const MoeShape &s, bool backward, bool bf16Weights) {
  return s.routing.tokens * s.routing.experts + 2 * s.routing.tokens * s.routing.topK +
         moeExpertsScratchFloats(s.experts, backward, bf16Weights);
}

// Whether the instruction's experts' weights are bf16 (a bf16 plan's): its kernels then run the
// experts' products on them as they are (the native kernels below), else on fp32 (copies).
bool expertWeightsBf16(const plan::Program &program, const plan::Instruction &in, const isa::OpDecl &decl) {
  KernelCall call(decl, program, in);
  if (!call.bind().isOk()) return false;
  for (const char *name : {"gate", "up", "down"})
    if (int id = call.in(name); id < 0 || call.buffer(id).dtype() != plan::BF16) return false;
  return true;
}

// The rounding of a 16-bit plan's MoE (runtime/cpu/Moe.h MoeExperts::round): that of the
// instruction's activations' dtype (its input's); null in fp32.
void (*roundingOf(const KernelCall &k))(float *, int64_t) {
  plan::DType d = k.buffer(k.in("input")).dtype();
  return d == plan::BF16 ? roundThroughBf16 : d == plan::F16 ? roundThroughF16 : nullptr;
}

// The routing of the instruction's micro-batch: probabilities, choices, weights and the kept
// assignments (capacity_factor > 0: the rest -1). Returns the number dropped. A 16-bit plan's
// weights are rounded to its dtype (the router's output dtype in Megatron-Core) before the
// capacity drop compares them.
int64_t route(CpuKernelContext &c, const KernelCall &k, const MoeShape &s, float *probs, float *weights,
              std::vector<int32_t> *chosen, std::vector<int32_t> *kept) {
  const MoeRouting &r = s.routing;
  chosen->resize(size_t(r.tokens * r.topK)), kept->resize(chosen->size());
  moeRouteForward(c.f(k.in("logits")), r, probs, chosen->data(), weights);
  s.experts.rounded(weights, r.tokens * r.topK);
  double factor = k.f64("capacity_factor");
  if (factor <= 0) {
    *kept = *chosen;
    return 0;
  }
  return moeDropOverCapacity(chosen->data(), weights, r, moeCapacity(factor, r.tokens, r.topK, r.experts), kept->data());
}

// The load-balancing statistics the aux loss and its gradient use: the instruction's
// routing_stats (a whole sequence's, summed over the ranks that split it) or this routing's.
Status balanceOf(CpuKernelContext &c, const KernelCall &k, const MoeRouting &r, const float *probs,
                 const std::vector<int32_t> &chosen, MoeBalance *b) {
  int stats = k.in("routing_stats");
  if (stats < 0) {
    *b = moeBalanceOf(probs, chosen.data(), r);
    return Status::ok();
  }
  if (k.numel(stats) != 2 * r.experts)
    return Status::error(std::string(k.decl.name) + ": routing_stats has " + std::to_string(k.numel(stats)) +
                         " values, not 2 x " + std::to_string(r.experts) + " experts (corrupt plan)");
  *b = moeBalanceFromStats(c.f(stats), r);
  return Status::ok();
}

// loom-rank --dump-routing: the forward's choices, and with a capacity factor the kept ones.
void logRouting(CpuKernelContext &c, const KernelCall &k, const std::vector<int32_t> &chosen,
                const std::vector<int32_t> &kept) {
  if (c.run->moeRouting)
    c.run->moeRouting->add(k.instruction.layer(), c.run->microBatch, chosen,
                           k.f64("capacity_factor") > 0 ? &kept : nullptr);
}

Status checkShape(const KernelCall &k, const MoeShape &s) {
  if (s.routing.topK < 1 || s.routing.topK > s.routing.experts || k.numel(k.in("logits")) != s.routing.tokens * s.routing.experts)
    return Status::error(std::string(k.decl.name) + ": top_k or the logits do not fit the experts (corrupt plan)");
  return Status::ok();
}

template <typename W>
Status moe(CpuKernelContext &c, const KernelCall &k) {
  MoeShape s = moeShapeOf(*c.program, k.in("input"), k.in("gate"), k.i64("top_k"));
  s.experts.round = roundingOf(k);
  LOOM_RETURN_IF_ERROR(checkShape(k, s));
  const MoeRouting &r = s.routing;
  float *probs = c.scratch, *weights = probs + r.tokens * r.experts, *experts = weights + 2 * r.tokens * r.topK;
  thread_local std::vector<int32_t> chosen, kept;
  int64_t dropped = route(c, k, s, probs, weights, &chosen, &kept);
  logRouting(c, k, chosen, kept);
  MoeBalance balance;
  LOOM_RETURN_IF_ERROR(balanceOf(c, k, r, probs, chosen, &balance));
  float aux = moeLoadBalancingLoss(balance);
  c.f(k.out("aux"))[0] = aux;
  moeExpertsForward(c.f(k.in("input")), kept.data(), weights, c.at<W>(k.in("gate")), c.at<W>(k.in("up")),
                    c.at<W>(k.in("down")), s.experts, c.f(k.out("result")), experts);
  if (c.run->moeTally) c.run->moeTally->add(aux, dropped, r.tokens * r.topK);
  return Status::ok();
}

template <typename W>
Status moeGrad(CpuKernelContext &c, const KernelCall &k) {
  MoeShape s = moeShapeOf(*c.program, k.in("input"), k.in("gate"), k.i64("top_k"));
  s.experts.round = roundingOf(k);
  LOOM_RETURN_IF_ERROR(checkShape(k, s));
  const MoeRouting &r = s.routing;
  float *probs = c.scratch, *weights = probs + r.tokens * r.experts, *dweights = weights + r.tokens * r.topK;
  float *experts = dweights + r.tokens * r.topK;
  thread_local std::vector<int32_t> chosen, kept;
  route(c, k, s, probs, weights, &chosen, &kept);
  moeExpertsBackward(c.f(k.in("input")), kept.data(), weights, c.at<W>(k.in("gate")), c.at<W>(k.in("up")),
                     c.at<W>(k.in("down")), c.f(k.in("grad")), s.experts, c.f(k.out("grad_input")), dweights,
                     c.at<W>(k.out("grad_gate")), c.at<W>(k.out("grad_up")), c.at<W>(k.out("grad_down")), 1.0f, experts);
  // The load-balancing loss's share of the step's loss (Megatron-Core's MoEAuxLossAutoScaler):
  // its coefficient, this run's share (1 / micro-batches) and fp16's loss scale.
  float dAux = float(k.f64("aux_loss_coef") * k.f64("loss_scale")) * c.run->lossScale;
  MoeBalance balance;
  LOOM_RETURN_IF_ERROR(balanceOf(c, k, r, probs, chosen, &balance));
  moeRouteBackward(probs, chosen.data(), dweights, dAux, balance, r, c.f(k.out("grad_logits")));
  return Status::ok();
}

// loom.moe_routing_stats: the counts and probability sums of this rank's tokens ([2, E]).
Status moeRoutingStats(CpuKernelContext &c, const KernelCall &k) {
  const plan::Buffer &logits = c.program->buffers(k.in("logits"));
  int64_t tokens = planattr::dim(logits, 0) * planattr::dim(logits, 1), experts = planattr::dim(logits, 2);
  MoeRouting r{tokens, experts, k.i64("top_k"), /*renormalize=*/true};
  if (r.topK < 1 || r.topK > experts || k.numel(k.out("result")) != 2 * experts)
    return Status::error("moe_routing_stats: top_k or the result do not fit the logits' experts (corrupt plan)");
  float *probs = c.scratch, *weights = probs + tokens * experts;
  thread_local std::vector<int32_t> chosen;
  chosen.resize(size_t(tokens * r.topK));
  moeRouteForward(c.f(k.in("logits")), r, probs, chosen.data(), weights);
  moeWriteStats(moeBalanceOf(probs, chosen.data(), r), c.f(k.out("result")));
  return Status::ok();
}

// ---- Expert parallelism ----

// The "ep" group's members and this rank's place; member q holds experts [q E_l, (q + 1) E_l).
struct ExpertGroup {
  Collectives *col = nullptr;
  std::string group;
  int members = 1, rank = 0;
  int64_t localExperts = 0;
};

// Tags on the group's channel (expert-parallel MoE is the "ep" group's only traffic, in order).
enum ExpertTag : int { kCountsTag = 21, kRowsTag, kGradsTag, kWeightsTag, kReturnTag, kReturnWeightsTag };

// The sizes of an expert-parallel instruction: routing over all E experts (the logits' last dim),
// the rank's E / ep experts (gate's dim 0) run on the rows every member sends, at most ep T k.
struct ExpertParallelShape {
  MoeRouting routing;
  int64_t hidden, ffn, localExperts, members, maxRows;
  MoeExperts local() const { return {maxRows, hidden, ffn, localExperts, 1}; }
};

ExpertParallelShape expertParallelShapeOf(const plan::Program &program, int input, int logits, int gate, int64_t topK,
                                          int64_t members) {
  const plan::Buffer &x = program.buffers(input), &g = program.buffers(gate);
  int64_t tokens = planattr::dim(x, 0) * planattr::dim(x, 1), experts = planattr::dim(program.buffers(logits), 2);
  int64_t pairs = tokens * topK;
  return {{tokens, experts, topK, /*renormalize=*/true}, planattr::dim(x, 2), planattr::dim(g, 1), planattr::dim(g, 0),
          members, members * pairs};
}

// Scratch (floats): the routing's probabilities, weights and weight gradients; the rank's rows out
// (x, output gradients, weights) and back (outputs or input gradients, weight gradients); the
// rows in from every member and their results; the local experts' scratch over the most rows.
struct ExpertParallelScratch {
  float *probs, *weights, *dweights, *xOut, *gOut, *wOut, *back, *wBack, *xIn, *gIn, *wIn, *result, *wResult, *experts;
  int64_t floats;
};

ExpertParallelScratch expertParallelScratch(const ExpertParallelShape &s, bool backward, bool bf16Weights, float *base) {
  const int64_t T = s.routing.tokens, P = T * s.routing.topK, R = s.maxRows, H = s.hidden;
  int64_t sizes[] = {T * s.routing.experts, P, P, P * H, P * H, P, P * H, P, R * H, R * H, R, R * H, R, 0};
  ExpertParallelScratch x{};
  float **order[] = {&x.probs, &x.weights, &x.dweights, &x.xOut, &x.gOut, &x.wOut, &x.back, &x.wBack,
                     &x.xIn, &x.gIn, &x.wIn, &x.result, &x.wResult, &x.experts};
  int64_t at = 0;
  for (size_t i = 0; i < std::size(order); ++i) {
    *order[i] = base ? base + at : nullptr;
    at += sizes[i];
  }
  x.floats = at + moeExpertsScratchFloats(s.local(), backward, bf16Weights);
  return x;
}

Status expertGroupOf(CpuKernelContext &c, const KernelCall &k, const ExpertParallelShape &s, ExpertGroup *g) {
  LOOM_RETURN_IF_ERROR(c.collectives(&g->col));
  g->group = k.str("group");
  g->members = g->col->sizeOf(g->group), g->rank = g->col->rankIn(g->group);
  g->localExperts = s.localExperts;
  if (g->members != k.i64("expert_parallel_size") || g->rank < 0 || g->rank >= g->members ||
      s.localExperts * g->members != s.routing.experts)
    return Status::error(std::string(k.decl.name) + ": group '" + g->group + "' has " + std::to_string(g->members) +
                         " members, the instruction says " + std::to_string(k.i64("expert_parallel_size")) + " with " +
                         std::to_string(s.localExperts) + " of " + std::to_string(s.routing.experts) +
                         " experts each (corrupt plan)");
  if (s.routing.topK < 1 || s.routing.topK > s.routing.experts)
    return Status::error(std::string(k.decl.name) + ": top_k does not fit the experts (corrupt plan)");
  return Status::ok();
}

// All-to-all of rows `width` floats wide: member q gets rows [sendBegin[q], sendBegin[q + 1]) of
// `send`; rows [recvBegin[q], recvBegin[q + 1]) of `recv` come from member q. Sends copy and
// return at once (Collectives::sendBytes), so posting every send before any receive cannot
// deadlock; the pairs go round in rounds (q = r + s, from r - s) as NCCL's all-to-all does.
// `wire`: the rows' dtype on the wire: fp32, or the 16-bit dtype of the plan buffer they were
// copied from (the values are 16-bit ones, so narrowing them is exact), each message narrowed
// into a staging buffer and widened on arrival.
Status allToAllRows(const ExpertGroup &g, const float *send, const std::vector<int64_t> &sendBegin, float *recv,
                    const std::vector<int64_t> &recvBegin, int64_t width, int tag, plan::DType wire = plan::F32) {
  const int n = g.members, r = g.rank;
  const bool half = isHalf(wire);
  const int64_t bytes = int64_t(half ? sizeof(uint16_t) : sizeof(float)) * width;
  thread_local std::vector<uint16_t> staging;
  for (int s = 1; s < n; ++s) {
    int q = (r + s) % n;
    int64_t rows = sendBegin[size_t(q + 1)] - sendBegin[size_t(q)];
    if (rows <= 0) continue;
    const float *rowsOut = send + sendBegin[size_t(q)] * width;
    if (half) {
      staging.resize(size_t(rows * width));
      narrow(wire, rowsOut, staging.data(), rows * width);
    }
    LOOM_RETURN_IF_ERROR(g.col->sendBytes(g.group, q, half ? static_cast<const void *>(staging.data()) : rowsOut,
                                          rows * bytes, tag));
  }
  std::copy(send + sendBegin[size_t(r)] * width, send + sendBegin[size_t(r + 1)] * width, recv + recvBegin[size_t(r)] * width);
  for (int s = 1; s < n; ++s) {
    int q = (r - s + n) % n;
    int64_t rows = recvBegin[size_t(q + 1)] - recvBegin[size_t(q)];
    if (rows <= 0) continue;
    float *rowsIn = recv + recvBegin[size_t(q)] * width;
    if (!half) {
      LOOM_RETURN_IF_ERROR(g.col->recvBytes(g.group, q, rowsIn, rows * bytes, tag));
      continue;
    }
    staging.resize(size_t(rows * width));
    LOOM_RETURN_IF_ERROR(g.col->recvBytes(g.group, q, staging.data(), rows * bytes, tag));
    widen(wire, staging.data(), rowsIn, rows * width);
  }
  return Status::ok();
}

// The dispatch plan of one instruction: this rank's kept assignments grouped by expert (`rows`,
// pair indices t k + j, member-major since each member's experts are consecutive), the rows each
// member gets and sends back, and the local expert of every row that comes in.
struct Dispatch {
  std::vector<int64_t> rows, sendBegin, recvBegin;
  std::vector<int32_t> localExpert;  // per row in: which of this rank's experts
  std::vector<int64_t> rowOfPair;    // pair -> its index in `rows`, -1: dropped
};

Status dispatchOf(const ExpertGroup &g, const int32_t *kept, const MoeRouting &r, int64_t maxRows, Dispatch *d) {
  const int n = g.members;
  const int64_t El = g.localExperts, P = r.tokens * r.topK;
  std::vector<int64_t> begin;
  moeGroupByExpert(kept, P, r.experts, &begin, &d->rows);
  d->rowOfPair.assign(size_t(P), -1);
  for (size_t i = 0; i < d->rows.size(); ++i) d->rowOfPair[size_t(d->rows[i])] = int64_t(i);
  d->sendBegin.resize(size_t(n + 1));
  for (int q = 0; q <= n; ++q) d->sendBegin[size_t(q)] = begin[size_t(q * El)];
  // The counts first: member q learns how many rows of each of its experts come from here.
  std::vector<int32_t> out(size_t(n * El)), in(size_t(n * El));
  for (int64_t e = 0; e < r.experts; ++e) out[size_t(e)] = int32_t(begin[size_t(e + 1)] - begin[size_t(e)]);
  for (int s = 1; s < n; ++s) {
    int q = (g.rank + s) % n;
    LOOM_RETURN_IF_ERROR(g.col->sendBytes(g.group, q, out.data() + q * El, El * int64_t(sizeof(int32_t)), kCountsTag));
  }
  std::copy_n(out.data() + g.rank * El, El, in.data() + g.rank * El);
  for (int s = 1; s < n; ++s) {
    int q = (g.rank - s + n) % n;
    LOOM_RETURN_IF_ERROR(g.col->recvBytes(g.group, q, in.data() + q * El, El * int64_t(sizeof(int32_t)), kCountsTag));
  }
  d->recvBegin.assign(size_t(n + 1), 0);
  d->localExpert.clear();
  for (int q = 0; q < n; ++q) {
    for (int64_t e = 0; e < El; ++e) {
      int32_t count = in[size_t(q * El + e)];
      if (count < 0 || count > P)
        return Status::error("expert-parallel dispatch: member " + std::to_string(q) + " of '" + g.group + "' sent " +
                             std::to_string(count) + " rows for one expert (at most " + std::to_string(P) + ")");
      d->localExpert.insert(d->localExpert.end(), size_t(count), int32_t(e));
    }
    d->recvBegin[size_t(q + 1)] = int64_t(d->localExpert.size());
  }
  if (int64_t(d->localExpert.size()) > maxRows)
    return Status::error("expert-parallel dispatch: more rows came in than " + std::to_string(maxRows) + " (corrupt plan)");
  return Status::ok();
}

// What both expert-parallel kernels do first: the shape and group checked, the scratch laid
// out, this rank's routing (the choices and the kept ones: thread_local, as moe's) and the
// dispatch agreed with the group's members. Returns the assignments dropped.
struct ExpertParallelStart {
  ExpertParallelShape s;
  ExpertGroup g;
  ExpertParallelScratch x;
  int64_t dropped = 0;
};
Status startExpertParallel(CpuKernelContext &c, const KernelCall &k, bool backward, bool bf16Weights,
                           std::vector<int32_t> *chosen,
                           std::vector<int32_t> *kept, Dispatch *d, ExpertParallelStart *out) {
  out->s = expertParallelShapeOf(*c.program, k.in("input"), k.in("logits"), k.in("gate"), k.i64("top_k"),
                                 k.i64("expert_parallel_size"));
  LOOM_RETURN_IF_ERROR(expertGroupOf(c, k, out->s, &out->g));
  const MoeRouting &r = out->s.routing;
  out->x = expertParallelScratch(out->s, backward, bf16Weights, c.scratch);
  MoeShape routeShape{r, {r.tokens, out->s.hidden, out->s.ffn, r.experts, r.topK, roundingOf(k)}};
  out->dropped = route(c, k, routeShape, out->x.probs, out->x.weights, chosen, kept);
  return dispatchOf(out->g, kept->data(), r, out->s.maxRows, d);
}

template <typename W>
Status expertParallelMoe(CpuKernelContext &c, const KernelCall &k) {
  thread_local std::vector<int32_t> chosen, kept;
  thread_local Dispatch d;
  ExpertParallelStart start;
  LOOM_RETURN_IF_ERROR(startExpertParallel(c, k, false, !std::is_same_v<W, float>, &chosen, &kept, &d, &start));
  logRouting(c, k, chosen, kept);
  const ExpertParallelShape &s = start.s;
  const ExpertGroup &g = start.g;
  const ExpertParallelScratch &x = start.x;
  const MoeRouting &r = s.routing;
  const int64_t H = s.hidden, K = r.topK, dropped = start.dropped;
  MoeBalance balance;
  LOOM_RETURN_IF_ERROR(balanceOf(c, k, r, x.probs, chosen, &balance));
  float aux = moeLoadBalancingLoss(balance);
  c.f(k.out("aux"))[0] = aux;
  const float *input = c.f(k.in("input"));
  for (size_t i = 0; i < d.rows.size(); ++i) std::copy_n(input + (d.rows[i] / K) * H, H, x.xOut + int64_t(i) * H);
  // The rows go out in the input's dtype (16-bit values in a 16-bit plan).
  const plan::DType rowsDtype = k.buffer(k.in("input")).dtype();
  LOOM_RETURN_IF_ERROR(allToAllRows(g, x.xOut, d.sendBegin, x.xIn, d.recvBegin, H, kRowsTag, rowsDtype));
  // This rank's experts over the rows that came in, each row one assignment of weight 1.
  int64_t rowsIn = int64_t(d.localExpert.size());
  std::fill_n(x.wIn, rowsIn, 1.0f);
  MoeExperts local{rowsIn, H, s.ffn, s.localExperts, 1, roundingOf(k)};
  moeExpertsForward(x.xIn, d.localExpert.data(), x.wIn, c.at<W>(k.in("gate")), c.at<W>(k.in("up")),
                    c.at<W>(k.in("down")), local, x.result, x.experts);
  // In a 16-bit plan the outputs are rounded ones (MoeExperts::round): they travel in 16 bits.
  LOOM_RETURN_IF_ERROR(allToAllRows(g, x.result, d.recvBegin, x.back, d.sendBegin, H, kReturnTag,
                                    local.round ? rowsDtype : plan::F32));
  // The combine: y_t = sum_j w_tj out_tj over the kept choices, in order (as moe; in a 16-bit
  // plan each w_tj out_tj rounded, as moe's).
  float *y = c.f(k.out("result"));
  for (int64_t t = 0; t < r.tokens; ++t) {
    float *yt = y + t * H;
    std::fill(yt, yt + H, 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      int64_t row = d.rowOfPair[size_t(t * K + j)];
      if (row < 0) continue;
      local.addWeighted(yt, x.weights[t * K + j], x.back + row * H);
    }
  }
  if (c.run->moeTally) c.run->moeTally->add(aux, dropped, r.tokens * K);
  return Status::ok();
}

template <typename W>
Status expertParallelMoeGrad(CpuKernelContext &c, const KernelCall &k) {
  thread_local std::vector<int32_t> chosen, kept;
  thread_local Dispatch d;
  ExpertParallelStart start;
  LOOM_RETURN_IF_ERROR(startExpertParallel(c, k, true, !std::is_same_v<W, float>, &chosen, &kept, &d, &start));
  const ExpertParallelShape &s = start.s;
  const ExpertGroup &g = start.g;
  const ExpertParallelScratch &x = start.x;
  const MoeRouting &r = s.routing;
  const int64_t H = s.hidden, K = r.topK, P = r.tokens * K;
  // Out: each kept assignment's input row, its token's output gradient and its weight.
  const float *input = c.f(k.in("input")), *grad = c.f(k.in("grad"));
  for (size_t i = 0; i < d.rows.size(); ++i) {
    int64_t pair = d.rows[i], t = pair / K;
    std::copy_n(input + t * H, H, x.xOut + int64_t(i) * H);
    std::copy_n(grad + t * H, H, x.gOut + int64_t(i) * H);
    x.wOut[i] = x.weights[pair];
  }
  LOOM_RETURN_IF_ERROR(allToAllRows(g, x.xOut, d.sendBegin, x.xIn, d.recvBegin, H, kRowsTag, k.buffer(k.in("input")).dtype()));
  LOOM_RETURN_IF_ERROR(allToAllRows(g, x.gOut, d.sendBegin, x.gIn, d.recvBegin, H, kGradsTag, k.buffer(k.in("grad")).dtype()));
  LOOM_RETURN_IF_ERROR(allToAllRows(g, x.wOut, d.sendBegin, x.wIn, d.recvBegin, 1, kWeightsTag));
  // This rank's experts: each row's input gradient and its weight's gradient (g . out), and the
  // experts' weight gradients over every member's rows, divided by the members: the group's
  // mean, which the "edp" average then makes the data-parallel mean (Megatron-Core scales
  // expert gradients by 1 / dp as well).
  int64_t rowsIn = int64_t(d.localExpert.size());
  moeExpertsBackward(x.xIn, d.localExpert.data(), x.wIn, c.at<W>(k.in("gate")), c.at<W>(k.in("up")),
                     c.at<W>(k.in("down")), x.gIn, {rowsIn, H, s.ffn, s.localExperts, 1, roundingOf(k)}, x.result,
                     x.wResult, c.at<W>(k.out("grad_gate")), c.at<W>(k.out("grad_up")), c.at<W>(k.out("grad_down")),
                     1.0f / float(g.members), x.experts);
  LOOM_RETURN_IF_ERROR(allToAllRows(g, x.result, d.recvBegin, x.back, d.sendBegin, H, kReturnTag));
  LOOM_RETURN_IF_ERROR(allToAllRows(g, x.wResult, d.recvBegin, x.wBack, d.sendBegin, 1, kReturnWeightsTag));
  // dx_t: the sum over its kept choices, in order; dweights of a dropped choice 0.
  float *dx = c.f(k.out("grad_input"));
  std::fill_n(x.dweights, P, 0.0f);
  for (int64_t t = 0; t < r.tokens; ++t) {
    float *dt = dx + t * H;
    std::fill(dt, dt + H, 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      int64_t row = d.rowOfPair[size_t(t * K + j)];
      if (row < 0) continue;
      x.dweights[t * K + j] = x.wBack[row];
      const float *b = x.back + row * H;
      for (int64_t col = 0; col < H; ++col) dt[col] += b[col];
    }
  }
  float dAux = float(k.f64("aux_loss_coef") * k.f64("loss_scale")) * c.run->lossScale;
  MoeBalance balance;
  LOOM_RETURN_IF_ERROR(balanceOf(c, k, r, x.probs, chosen, &balance));
  moeRouteBackward(x.probs, chosen.data(), x.dweights, dAux, balance, r, c.f(k.out("grad_logits")));
  return Status::ok();
}

}  // namespace

int64_t moeScratchOf(const plan::Program &program, const plan::Instruction &in) {
  const isa::OpDecl *d = isa::find(in.op());
  if (d && d->id == OpId::kMoeRoutingStats && in.inputs_size() == 1) {  // the probabilities and weights
    const plan::Buffer &logits = program.buffers(in.inputs(0));
    if (logits.shape_size() != 3) return 0;  // checkProgram's
    int64_t tokens = planattr::dim(logits, 0) * planattr::dim(logits, 1);
    return tokens * (planattr::dim(logits, 2) + std::max<int64_t>(1, planattr::i64(in, "top_k")));
  }
  if (!d || in.inputs_size() < 3) return 0;
  bool expertParallel = d->id == OpId::kExpertParallelMoe || d->id == OpId::kExpertParallelMoeGrad;
  if (d->id != OpId::kMoe && d->id != OpId::kMoeGrad && !expertParallel) return 0;
  auto rank3 = [&](int b) { return b >= 0 && b < program.buffers_size() && program.buffers(b).shape_size() == 3; };
  if (!rank3(in.inputs(0)) || !rank3(in.inputs(1)) || !rank3(in.inputs(2))) return 0;  // checkProgram's
  if (expertParallel) {
    ExpertParallelShape s = expertParallelShapeOf(program, in.inputs(0), in.inputs(1), in.inputs(2),
                                                  planattr::i64(in, "top_k"),
                                                  std::max<int64_t>(1, planattr::i64(in, "expert_parallel_size")));
    return expertParallelScratch(s, d->id == OpId::kExpertParallelMoeGrad, expertWeightsBf16(program, in, *d), nullptr)
        .floats;
  }
  MoeShape s = moeShapeOf(program, in.inputs(0), in.inputs(2), planattr::i64(in, "top_k"));
  return scratchFloats(s, d->id == OpId::kMoeGrad, expertWeightsBf16(program, in, *d));
}

void registerMoeKernels(CpuKernelRegistry &r) {
  r.add(OpId::kMoe, moe<float>);
  r.add(OpId::kMoeGrad, moeGrad<float>);
  r.add(OpId::kMoeRoutingStats, moeRoutingStats);
  r.add(OpId::kExpertParallelMoe, expertParallelMoe<float>);
  r.add(OpId::kExpertParallelMoeGrad, expertParallelMoeGrad<float>);
}

namespace {

// ---- A bf16 plan's MoE instructions ----
// The experts' weights and their gradients (E x F x H each, the bulk of the instruction's bytes)
// stay bf16 and their products run on oneDNN's bf16 GEMM (runtime/cpu/Moe.h); every other
// 16-bit operand (the tokens' rows, the logits, the outputs and their gradients: T x H) is widened
// into the instruction's scratch and its result rounded once after, as the executor's widened
// path does (runtime/Executor.cpp).

bool isExpertWeight(const KernelCall &k, int id) {
  auto weight = [](std::string_view name) {
    for (std::string_view w : {"gate", "up", "down", "grad_gate", "grad_up", "grad_down"})
      if (name == w) return true;
    return false;
  };
  for (size_t i = 0; i < k.decl.inputs.size(); ++i)
    if (k.bound.inputs[i] == id && weight(k.decl.inputs[i].name)) return true;
  for (size_t i = 0; i < k.decl.outputs.size(); ++i)
    if (k.bound.outputs[i] == id && weight(k.decl.outputs[i].name)) return true;
  return false;
}

bool bf16MoeTakes(const KernelCall &k) {
  // bf16 rows too: the experts' activation operands must be bf16 values (MoeExperts::round).
  bool takes = k.buffer(k.in("input")).dtype() == plan::BF16;
  forEachOperand(k, [&](int id) {
    plan::DType d = k.buffer(id).dtype();
    if (d == plan::F16 || (isExpertWeight(k, id) && d != plan::BF16)) takes = false;
  });
  return takes;
}

// The widened copies of the operands that are not the experts' weights (each once).
template <typename Body>
void forEachWidened(const KernelCall &k, const Body &body) {
  std::vector<int> seen;
  forEachOperand(k, [&](int id) {
    if (k.buffer(id).dtype() != plan::BF16 || isExpertWeight(k, id) ||
        std::find(seen.begin(), seen.end(), id) != seen.end())
      return;
    seen.push_back(id);
    body(id);
  });
}

int64_t bf16MoeScratchFloats(const KernelCall &k) {
  int64_t floats = 0;
  forEachWidened(k, [&](int id) { floats += k.numel(id); });
  return floats;
}

template <Status (*Body)(CpuKernelContext &, const KernelCall &)>
Status bf16Moe(CpuKernelContext &c, const KernelCall &k) {
  std::vector<float *> floats = *c.floats;
  float *copy = c.halfScratch;
  forEachWidened(k, [&](int id) {
    widen(plan::BF16, c.h(id), copy, k.numel(id));
    floats[size_t(id)] = copy;
    copy += k.numel(id);
  });
  CpuKernelContext widened = c;
  widened.floats = &floats;
  Status st = Body(widened, k);
  for (size_t i = 0; i < k.decl.outputs.size(); ++i)
    if (int id = k.bound.outputs[i]; id >= 0 && !isExpertWeight(k, id) && k.buffer(id).dtype() == plan::BF16)
      narrow(plan::BF16, floats[size_t(id)], c.h(id), k.numel(id));
  return st;
}

}  // namespace

void registerBf16MoeKernels(HalfKernelTable &t) {
  t.add(OpId::kMoe, {bf16MoeTakes, bf16Moe<moe<uint16_t>>, bf16MoeScratchFloats});
  t.add(OpId::kMoeGrad, {bf16MoeTakes, bf16Moe<moeGrad<uint16_t>>, bf16MoeScratchFloats});
  t.add(OpId::kExpertParallelMoe, {bf16MoeTakes, bf16Moe<expertParallelMoe<uint16_t>>, bf16MoeScratchFloats});
  t.add(OpId::kExpertParallelMoeGrad, {bf16MoeTakes, bf16Moe<expertParallelMoeGrad<uint16_t>>, bf16MoeScratchFloats});
}

}  // namespace loom::cpu
