// The mixture-of-experts instructions (plan ops moe and moe_grad; ir/LoomOps.td has the math):
// the routing, capacity and experts of runtime/cpu/Moe.cpp over one micro-batch's tokens. The
// backward recomputes the routing from the logits (the same top-k, the same drops).
#include <algorithm>
#include <vector>

#include "plan/PlanAttributes.h"
#include "runtime/cpu/CpuKernelContext.h"
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
int64_t scratchFloats(const MoeShape &s, bool backward) {
  return s.routing.tokens * s.routing.experts + 2 * s.routing.tokens * s.routing.topK +
         moeExpertsScratchFloats(s.experts, backward);
}

// The routing of the instruction's micro-batch: probabilities, choices, weights and the kept
// assignments (capacity_factor > 0: the rest -1). Returns the number dropped.
int64_t route(CpuKernelContext &c, const KernelCall &k, const MoeShape &s, float *probs, float *weights,
              std::vector<int32_t> *chosen, std::vector<int32_t> *kept) {
  const MoeRouting &r = s.routing;
  chosen->resize(size_t(r.tokens * r.topK)), kept->resize(chosen->size());
  moeRouteForward(c.f(k.in("logits")), r, probs, chosen->data(), weights);
  double factor = k.f64("capacity_factor");
  if (factor <= 0) {
    *kept = *chosen;
    return 0;
  }
  return moeDropOverCapacity(chosen->data(), weights, r, moeCapacity(factor, r.tokens, r.topK, r.experts), kept->data());
}

Status checkShape(const KernelCall &k, const MoeShape &s) {
  if (s.routing.topK < 1 || s.routing.topK > s.routing.experts || k.numel(k.in("logits")) != s.routing.tokens * s.routing.experts)
    return Status::error(std::string(k.decl.name) + ": top_k or the logits do not fit the experts (corrupt plan)");
  return Status::ok();
}

Status moe(CpuKernelContext &c, const KernelCall &k) {
  MoeShape s = moeShapeOf(*c.program, k.in("input"), k.in("gate"), k.i64("top_k"));
  LOOM_RETURN_IF_ERROR(checkShape(k, s));
  const MoeRouting &r = s.routing;
  float *probs = c.scratch, *weights = probs + r.tokens * r.experts, *experts = weights + 2 * r.tokens * r.topK;
  thread_local std::vector<int32_t> chosen, kept;
  int64_t dropped = route(c, k, s, probs, weights, &chosen, &kept);
  float aux = moeLoadBalancingLoss(probs, chosen.data(), r);
  c.f(k.out("aux"))[0] = aux;
  moeExpertsForward(c.f(k.in("input")), kept.data(), weights, c.f(k.in("gate")), c.f(k.in("up")), c.f(k.in("down")),
                    s.experts, c.f(k.out("result")), experts);
  if (c.run->moeTally) c.run->moeTally->add(aux, dropped, r.tokens * r.topK);
  return Status::ok();
}

Status moeGrad(CpuKernelContext &c, const KernelCall &k) {
  MoeShape s = moeShapeOf(*c.program, k.in("input"), k.in("gate"), k.i64("top_k"));
  LOOM_RETURN_IF_ERROR(checkShape(k, s));
  const MoeRouting &r = s.routing;
  float *probs = c.scratch, *weights = probs + r.tokens * r.experts, *dweights = weights + r.tokens * r.topK;
  float *experts = dweights + r.tokens * r.topK;
  thread_local std::vector<int32_t> chosen, kept;
  route(c, k, s, probs, weights, &chosen, &kept);
  moeExpertsBackward(c.f(k.in("input")), kept.data(), weights, c.f(k.in("gate")), c.f(k.in("up")), c.f(k.in("down")),
                     c.f(k.in("grad")), s.experts, c.f(k.out("grad_input")), dweights, c.f(k.out("grad_gate")),
                     c.f(k.out("grad_up")), c.f(k.out("grad_down")), experts);
  // The load-balancing loss's share of the step's loss (Megatron-Core's MoEAuxLossAutoScaler):
  // its coefficient, this run's share (1 / micro-batches) and fp16's loss scale.
  float dAux = float(k.f64("aux_loss_coef") * k.f64("loss_scale")) * c.run->lossScale;
  moeRouteBackward(probs, chosen.data(), dweights, dAux, r, c.f(k.out("grad_logits")));
  return Status::ok();
}

}  // namespace

int64_t moeScratchOf(const plan::Program &program, const plan::Instruction &in) {
  const isa::OpDecl *d = isa::find(in.op());
  if (!d || (d->id != OpId::kMoe && d->id != OpId::kMoeGrad) || in.inputs_size() < 3) return 0;
  auto rank3 = [&](int b) { return b >= 0 && b < program.buffers_size() && program.buffers(b).shape_size() == 3; };
  if (!rank3(in.inputs(0)) || !rank3(in.inputs(2))) return 0;  // checkProgram's
  MoeShape s = moeShapeOf(program, in.inputs(0), in.inputs(2), planattr::i64(in, "top_k"));
  return scratchFloats(s, d->id == OpId::kMoeGrad);
}

void registerMoeKernels(CpuKernelRegistry &r) {
  r.add(OpId::kMoe, moe);
  r.add(OpId::kMoeGrad, moeGrad);
}

}  // namespace loom::cpu
