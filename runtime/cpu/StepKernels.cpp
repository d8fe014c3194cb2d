// The CPU kernels of the step's own instructions (compiler/StepPrograms.cpp): accumulation,
// the loss, and the optimizer over the flat buffers, registered by declared op.
#include <algorithm>

#include "plan/PlanAttributes.h"
#include "runtime/cpu/CpuKernelContext.h"
#include "runtime/cpu/Optimizer.h"

namespace loom::cpu {
namespace {

using isa::OpId;

Status accumulate(CpuKernelContext &c, const KernelCall &k) {  // gradient or loss accumulation, in place
  const float *x = c.f(k.in("input"));
  float *y = c.f(k.out("accumulator"));
  for (int64_t i = 0, n = k.numel(k.out("accumulator")); i < n; ++i) y[i] += x[i];
  return Status::ok();
}

Status fill(CpuKernelContext &c, const KernelCall &k) {
  std::fill_n(c.f(k.out("output")), k.numel(k.out("output")), float(k.f64("value")));
  return Status::ok();
}

Status scale(CpuKernelContext &c, const KernelCall &k) {
  const float *x = c.f(k.in("input"));
  float *y = c.f(k.out("output")), a = float(k.f64("factor"));
  for (int64_t i = 0, n = k.numel(k.out("output")); i < n; ++i) y[i] = x[i] * a;
  return Status::ok();
}

// The kernels see fp32: the executor widens a 16-bit input before the kernel and rounds a
// 16-bit output after it (runtime/Executor.cpp), so a cast is a copy between them.
Status cast(CpuKernelContext &c, const KernelCall &k) {
  const float *x = c.f(k.in("input"));
  float *y = c.f(k.out("output"));
  if (y != x) std::copy_n(x, k.numel(k.out("output")), y);
  return Status::ok();
}

// The flat buffer's segments (planattr::FlatSegment) and, with a shard_group, this rank's
// shard of `count` elements (ZeRO-1).
Status flatRange(CpuKernelContext &c, const KernelCall &k, int64_t count, std::vector<planattr::FlatSegment> *segments,
                 FlatRange *range) {
  if (!planattr::decodeSegments(k.str("segments"), segments))
    return Status::error(std::string(k.decl.name) + ": malformed segments attribute (corrupt plan)");
  std::string shardGroup = k.str("shard_group");
  *range = {k.i64("flat_offset") + (shardGroup.empty() ? 0 : c.shardStart(shardGroup, count)), count};
  return Status::ok();
}

Status sumSquaresKernel(CpuKernelContext &c, const KernelCall &k) {
  int g = k.in("grads");
  std::vector<planattr::FlatSegment> segments;
  FlatRange range;
  LOOM_RETURN_IF_ERROR(flatRange(c, k, k.numel(g), &segments, &range));
  std::string replicated = k.str("replicated_group");
  bool countReplicated = replicated.empty() || !c.run->collectives || c.run->collectives->rankIn(replicated) == 0;
  c.f(k.out("squares"))[0] = sumSquares(c.f(g), segments, range, countReplicated);
  return Status::ok();
}

Status gradNormKernel(CpuKernelContext &c, const KernelCall &k) {
  gradNorm(c.f(k.in("squares"))[0], c.f(k.in("clip_grad"))[0], c.f(k.in("loss_scale"))[0], c.f(k.out("norm")),
           c.f(k.out("factor")));
  return Status::ok();
}

// AdamW over the parameters' shard (all of them without ZeRO-1): params may be the whole flat
// buffer while grads and the moments are the shard.
Status adamw(CpuKernelContext &c, const KernelCall &k) {
  int params = k.in("params"), grads = k.in("grads");
  std::vector<planattr::FlatSegment> segments;
  FlatRange range;
  LOOM_RETURN_IF_ERROR(flatRange(c, k, k.numel(grads), &segments, &range));
  // params: exactly the updated elements (ZeRO-1's buckets, in place) or the whole flat buffer.
  bool exact = k.numel(params) == range.count;
  if (!exact && k.numel(params) < range.begin + range.count)
    return Status::error("adamw: shard outside the parameters (corrupt plan)");
  auto scalar = [&](const char *name) { return c.f(k.in(name))[0]; };
  AdamWHyper h{scalar("grad_scale"),   scalar("learning_rate"), scalar("adam_step"), scalar("weight_decay"),
               scalar("adam_beta1"),   scalar("adam_beta2"),    scalar("adam_eps")};
  adamwFlat(c.f(params) + (exact ? 0 : range.begin), c.f(grads), c.f(k.in("adam_m")), c.f(k.in("adam_v")), c.f(k.out("updated")),
            segments, range, h);
  return Status::ok();
}

}  // namespace

void registerStepKernels(CpuKernelRegistry &r) {
  r.add(OpId::kAccumulate, accumulate);
  r.add(OpId::kFill, fill);
  r.add(OpId::kScale, scale);
  r.add(OpId::kCast, cast);
  r.add(OpId::kSumSquares, sumSquaresKernel);
  r.add(OpId::kGradNorm, gradNormKernel);
  r.add(OpId::kAdamw, adamw);
}

const CpuKernelRegistry &cpuKernels() {
  static const CpuKernelRegistry registry = [] {
    CpuKernelRegistry r("CPU");
    registerComputeKernels(r);
    registerCommunicationKernels(r);
    registerStepKernels(r);
    registerRingAttentionKernels(r);
    registerMoeKernels(r);
    return r;
  }();
  return registry;
}

}  // namespace loom::cpu
