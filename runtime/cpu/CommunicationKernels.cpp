// The CPU kernels of the plan's communication (collectives over Gloo or threads, pipeline
// messages), registered by declared op.
#include <algorithm>
#include <cstring>

#include "runtime/cpu/CpuKernelContext.h"

namespace loom::cpu {
namespace {

using isa::OpId;

Status groupSizeMismatch(const KernelCall &k, Collectives *c) {
  return Status::error("group_size " + std::to_string(k.i64("group_size")) + " of group " + k.str("group") +
                       " but the communicator has " + std::to_string(c->sizeOf(k.str("group"))) +
                       " members (a plan for another layout)");
}

Status allReduce(CpuKernelContext &ctx, const KernelCall &k) {
  Collectives *c;
  LOOM_RETURN_IF_ERROR(ctx.collectives(&c));
  const plan::Instruction &in = k.instruction;
  std::string group = k.str("group");
  ReduceOp reduce = reduceOpOf(k.str("reduce"));
  if (in.inputs_size() == 1) {
    float *y = ctx.f(in.outputs(0));
    if (y != ctx.f(in.inputs(0))) std::memcpy(y, ctx.f(in.inputs(0)), size_t(k.numel(in.inputs(0))) * sizeof(float));
    return c->allReduce(group, y, k.numel(in.outputs(0)), reduce);
  }
  // A data-parallel bucket. Its gradients are usually one range of the flat gradient buffer
  // (the compiler lays them out in bucket order; the gaps are zero padding, in place, reduced
  // too): one collective over the range, no staging copy.
  bool inPlace = true;
  for (int j = 0; j < in.inputs_size(); ++j) inPlace &= in.inputs(j) == in.outputs(j);
  if (inPlace) {
    std::vector<std::pair<float *, int64_t>> parts;
    for (int b : in.inputs()) parts.push_back({ctx.f(b), k.numel(b)});
    std::sort(parts.begin(), parts.end());
    bool contiguous = true;
    for (size_t j = 1; j < parts.size(); ++j) {
      float *end = parts[j - 1].first + parts[j - 1].second;
      // Only alignment padding between them: every parameter starts 16-aligned, so a gap of
      // fewer than 16 elements holds no other parameter.
      contiguous &= parts[j].first >= end && parts[j].first - end < 16;
    }
    if (contiguous) {
      float *begin = parts.front().first, *end = parts.back().first + parts.back().second;
      return c->allReduce(group, begin, end - begin, reduce);
    }
  }
  // Otherwise: the members packed back to back.
  int64_t total = 0;
  for (int b : in.inputs()) total += k.numel(b);
  std::vector<float> packed(static_cast<size_t>(total));
  int64_t at = 0;
  for (int b : in.inputs()) std::memcpy(&packed[size_t(at)], ctx.f(b), size_t(k.numel(b)) * sizeof(float)), at += k.numel(b);
  LOOM_RETURN_IF_ERROR(c->allReduce(group, packed.data(), total, reduce));
  at = 0;
  for (int b : in.outputs()) std::memcpy(ctx.f(b), &packed[size_t(at)], size_t(k.numel(b)) * sizeof(float)), at += k.numel(b);
  return Status::ok();
}

// all_gather and reduce_scatter: member r's block is slice r along `dim` of the large buffer.
Status gatherOrScatter(CpuKernelContext &ctx, const KernelCall &k, bool gather) {
  Collectives *c;
  LOOM_RETURN_IF_ERROR(ctx.collectives(&c));
  int small = gather ? k.in("input") : k.out("result"), large = gather ? k.out("result") : k.in("input");
  std::string group = k.str("group");
  int64_t g = k.i64("group_size"), d = k.i64("dim"), n = k.numel(small);
  if (g != c->sizeOf(group) || (d == 0 && k.numel(large) != g * n)) return groupSizeMismatch(k, c);
  if (d == 0) {  // along the first dimension the members' blocks are contiguous: no re-layout
    if (gather) return c->allGather(group, ctx.f(small), ctx.f(large), n);
    LOOM_RETURN_IF_ERROR(c->reduceScatter(group, ctx.f(large), ctx.f(small), n));
    if (k.str("reduce") == "avg")
      for (float *x = ctx.f(small), *e = x + n; x < e; ++x) *x /= float(g);
    return Status::ok();
  }
  int64_t outer = 1, inner = 1;
  const plan::Buffer &sb = k.buffer(small);
  for (int j = 0; j < sb.shape_size(); ++j) (j < d ? outer : inner) *= sb.shape(j);
  std::vector<float> blocks(size_t(g * n));
  if (gather) {
    LOOM_RETURN_IF_ERROR(c->allGather(group, ctx.f(small), blocks.data(), n));
    for (int64_t r = 0; r < g; ++r)
      for (int64_t a = 0; a < outer; ++a)
        std::memcpy(ctx.f(large) + (a * g + r) * inner, &blocks[size_t(r * n + a * inner)], size_t(inner) * sizeof(float));
    return Status::ok();
  }
  for (int64_t r = 0; r < g; ++r)
    for (int64_t a = 0; a < outer; ++a)
      std::memcpy(&blocks[size_t(r * n + a * inner)], ctx.f(large) + (a * g + r) * inner, size_t(inner) * sizeof(float));
  return c->reduceScatter(group, blocks.data(), ctx.f(small), n);
}
Status allGather(CpuKernelContext &c, const KernelCall &k) { return gatherOrScatter(c, k, true); }
Status reduceScatter(CpuKernelContext &c, const KernelCall &k) { return gatherOrScatter(c, k, false); }

// Pipeline messages: the micro-batch's channel is added to the plan's tag.
Status send(CpuKernelContext &ctx, const KernelCall &k) {
  Collectives *c;
  LOOM_RETURN_IF_ERROR(ctx.collectives(&c));
  int x = k.in("input");
  return c->send(k.str("group"), int(k.i64("peer")), ctx.f(x), k.numel(x), int(k.i64("tag") + ctx.run->messageTag));
}
Status recv(CpuKernelContext &ctx, const KernelCall &k) {
  Collectives *c;
  LOOM_RETURN_IF_ERROR(ctx.collectives(&c));
  int y = k.out("result");
  return c->recv(k.str("group"), int(k.i64("peer")), ctx.f(y), k.numel(y), int(k.i64("tag") + ctx.run->messageTag));
}

}  // namespace

void registerCommunicationKernels(CpuKernelRegistry &r) {
  r.add(OpId::kAllReduce, allReduce);
  r.add(OpId::kAllGather, allGather);
  r.add(OpId::kReduceScatter, reduceScatter);
  r.add(OpId::kSend, send);
  r.add(OpId::kRecv, recv);
}

}  // namespace loom::cpu
