// The CPU kernels of the plan's communication (collectives over Gloo or threads, pipeline
// messages), registered by declared op. A buffer travels in its own dtype: fp32, or a 16-bit
// plan's bf16 / fp16 (runtime/Collectives.h has how 16-bit values are reduced).
#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/cpu/CpuKernelContext.h"
#include "runtime/cpu/HalfPrecision.h"
#include "runtime/cpu/HalfStorage.h"

namespace loom::cpu {
namespace {

using isa::OpId;

Status groupSizeMismatch(const KernelCall &k, Collectives *c) {
  return Status::error("group_size " + std::to_string(k.i64("group_size")) + " of group " + k.str("group") +
                       " but the communicator has " + std::to_string(c->sizeOf(k.str("group"))) +
                       " members (a plan for another layout)");
}

// Every bound operand of one 16-bit dtype (a 16-bit plan's activations or their gradients).
bool oneHalfDtype(const KernelCall &k) {
  plan::DType first = plan::F32;
  bool seen = false, same = true;
  forEachOperand(k, [&](int id) {
    plan::DType d = k.buffer(id).dtype();
    if (!seen) first = d, seen = true;
    same &= d == first && (d == plan::BF16 || d == plan::F16);
  });
  return seen && same;
}

// An operand's storage as bytes, its dtype and its element size.
struct Bytes {
  char *data;
  plan::DType dtype;
  size_t element;
};
// A 16-bit buffer given as itself (a native call), or as its fp32 copy (the executor's widened
// path, which never happens for these ops but costs nothing to honour) travels as what it is.
Bytes bytesOf(const CpuKernelContext &ctx, const KernelCall &k, int id) {
  if (uint16_t *h = ctx.h(id)) return {reinterpret_cast<char *>(h), k.buffer(id).dtype(), 2};
  return {reinterpret_cast<char *>(ctx.f(id)), plan::F32, 4};
}

// The dtype a collective's values travel in: its buffers', or the plan's wire_dtype for fp32
// buffers (grad_reduce_in_bf16).
Status wireDtypeOf(const KernelCall &k, plan::DType buffers, plan::DType *wire) {
  std::string name = k.str("wire_dtype");
  *wire = buffers;
  if (name.empty()) return Status::ok();
  if (buffers != plan::F32 || (name != "bf16" && name != "f16"))
    return Status::error(std::string(k.decl.name) + ": wire_dtype '" + name + "' on " + plan::DType_Name(buffers) +
                         " buffers (expected bf16 or f16 on F32 buffers; corrupt plan)");
  *wire = name == "bf16" ? plan::BF16 : plan::F16;
  return Status::ok();
}

// n fp32 values into `wire` (16-bit) values at the front of their own storage, front to back a
// block at a time (a block's 16-bit values land on floats already read), and back (back to
// front, likewise): a reduction in 16-bit needs no second buffer.
constexpr int64_t kWireBlock = 4096;
void narrowInPlace(plan::DType wire, float *data, int64_t n) {
  uint16_t block[kWireBlock];
  char *bytes = reinterpret_cast<char *>(data);
  for (int64_t i = 0; i < n; i += kWireBlock) {
    int64_t len = std::min(kWireBlock, n - i);
    wire == plan::BF16 ? narrowBf16Row(data + i, block, len) : narrowF16Row(data + i, block, len);
    std::memcpy(bytes + 2 * i, block, size_t(len) * 2);
  }
}
void widenInPlace(plan::DType wire, float *data, int64_t n) {
  uint16_t block[kWireBlock];
  float wide[kWireBlock];
  char *bytes = reinterpret_cast<char *>(data);
  for (int64_t i = (n - 1) / kWireBlock * kWireBlock; n > 0 && i >= 0; i -= kWireBlock) {
    int64_t len = std::min(kWireBlock, n - i);
    std::memcpy(block, bytes + 2 * i, size_t(len) * 2);
    wire == plan::BF16 ? widenBf16Row(block, wide, len) : widenF16Row(block, wide, len);
    std::memcpy(data + i, wide, size_t(len) * 4);
  }
}

// An all-reduce of n values at `data` travelling as `wire`: fp32 values are reduced as 16-bit
// ones in place and widened back; an average is summed on the wire and divided in fp32.
Status allReduceAs(Collectives *c, const std::string &group, char *data, int64_t n, plan::DType dtype,
                   plan::DType wire, ReduceOp op) {
  if (wire == dtype) return c->allReduce(group, data, n, dtype, op);
  float *values = reinterpret_cast<float *>(data);
  narrowInPlace(wire, values, n);
  LOOM_RETURN_IF_ERROR(c->allReduce(group, data, n, wire, op == ReduceOp::kAvg ? ReduceOp::kSum : op));
  widenInPlace(wire, values, n);
  if (op == ReduceOp::kAvg) divideElements(plan::F32, values, n, float(c->sizeOf(group)));
  return Status::ok();
}

Status allReduce(CpuKernelContext &ctx, const KernelCall &k) {
  Collectives *c;
  LOOM_RETURN_IF_ERROR(ctx.collectives(&c));
  const plan::Instruction &in = k.instruction;
  std::string group = k.str("group");
  ReduceOp reduce = reduceOpOf(k.str("reduce"));
  plan::DType wire;
  LOOM_RETURN_IF_ERROR(wireDtypeOf(k, bytesOf(ctx, k, in.inputs(0)).dtype, &wire));
  if (in.inputs_size() == 1) {
    Bytes x = bytesOf(ctx, k, in.inputs(0)), y = bytesOf(ctx, k, in.outputs(0));
    // tp_comm_overlap: one chunk of rows (the rest is another instruction's).
    const plan::Buffer &yb = k.buffer(in.outputs(0));
    int64_t cols = yb.shape_size() > 0 ? std::max<int64_t>(yb.shape(yb.shape_size() - 1), 1) : 1, begin, end;
    LOOM_RETURN_IF_ERROR(k.rowRange(k.numel(in.outputs(0)) / cols, &begin, &end));
    size_t at = size_t(begin * cols) * y.element;
    int64_t n = (end - begin) * cols;
    if (y.data != x.data) std::memcpy(y.data + at, x.data + at, size_t(n) * y.element);
    return allReduceAs(c, group, y.data + at, n, y.dtype, wire, reduce);
  }
  // A data-parallel bucket. Its gradients are usually one range of the flat gradient buffer
  // (the compiler lays them out in bucket order; the gaps are zero padding, in place, reduced
  // too): one collective over the range, no staging copy.
  Bytes first = bytesOf(ctx, k, in.inputs(0));
  bool inPlace = true;
  for (int j = 0; j < in.inputs_size(); ++j)
    inPlace &= in.inputs(j) == in.outputs(j) && bytesOf(ctx, k, in.inputs(j)).dtype == first.dtype;
  if (inPlace) {
    std::vector<std::pair<char *, int64_t>> parts;  // (start, elements)
    for (int b : in.inputs()) parts.push_back({bytesOf(ctx, k, b).data, k.numel(b)});
    std::sort(parts.begin(), parts.end());
    bool contiguous = true;
    for (size_t j = 1; j < parts.size(); ++j) {
      char *end = parts[j - 1].first + parts[j - 1].second * int64_t(first.element);
      // Only alignment padding between them: every parameter starts 16-aligned, so a gap of
      // fewer than 16 elements holds no other parameter.
      contiguous &= parts[j].first >= end && parts[j].first - end < 16 * int64_t(first.element);
    }
    if (contiguous) {
      char *begin = parts.front().first, *end = parts.back().first + parts.back().second * int64_t(first.element);
      return allReduceAs(c, group, begin, (end - begin) / int64_t(first.element), first.dtype, wire, reduce);
    }
  }
  // Otherwise: the members packed back to back (one dtype: the plan's check).
  int64_t total = 0;
  for (int b : in.inputs()) total += k.numel(b);
  std::vector<char> packed(size_t(total) * first.element);
  size_t at = 0;
  for (int b : in.inputs()) {
    size_t bytes = size_t(k.numel(b)) * first.element;
    std::memcpy(&packed[at], bytesOf(ctx, k, b).data, bytes), at += bytes;
  }
  LOOM_RETURN_IF_ERROR(allReduceAs(c, group, packed.data(), total, first.dtype, wire, reduce));
  at = 0;
  for (int b : in.outputs()) {
    size_t bytes = size_t(k.numel(b)) * first.element;
    std::memcpy(bytesOf(ctx, k, b).data, &packed[at], bytes), at += bytes;
  }
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
  Bytes s = bytesOf(ctx, k, small), l = bytesOf(ctx, k, large);
  plan::DType wire = s.dtype;
  if (!gather) LOOM_RETURN_IF_ERROR(wireDtypeOf(k, s.dtype, &wire));
  if (wire != s.dtype) {  // fp32 blocks reduced as 16-bit values (ZeRO-1 with grad_reduce_in_bf16)
    if (d != 0) return Status::error("reduce_scatter: wire_dtype only along dim 0 (corrupt plan)");
    std::vector<uint16_t> all(static_cast<size_t>(g * n)), mine(static_cast<size_t>(n));
    narrow(wire, reinterpret_cast<const float *>(l.data), all.data(), g * n);
    LOOM_RETURN_IF_ERROR(c->reduceScatter(group, all.data(), mine.data(), n, wire));
    float *out = reinterpret_cast<float *>(s.data);
    widen(wire, mine.data(), out, n);
    if (k.str("reduce") == "avg") divideElements(plan::F32, out, n, float(g));
    return Status::ok();
  }
  int64_t outer = 1, inner = 1;
  const plan::Buffer &sb = k.buffer(small), &lb = k.buffer(large);
  for (int j = 0; j < sb.shape_size(); ++j) (j < d ? outer : inner) *= sb.shape(j);
  // tp_comm_overlap with sequence parallelism: slices [a0, a1) before `dim` only.
  int64_t a0 = 0, a1 = outer, cols = lb.shape_size() > 0 ? std::max<int64_t>(lb.shape(lb.shape_size() - 1), 1) : 1;
  LOOM_RETURN_IF_ERROR(k.sliceRange(outer, k.numel(large) / cols, &a0, &a1));
  if (d == 0) {  // along the first dimension the members' blocks are contiguous: no re-layout
    if (gather && s.data >= l.data && s.data < l.data + size_t(g * n) * s.element) {
      // In place (ZeRO-1's parameter gather: the rank's part inside the whole): from a copy, as
      // the collective writes every block.
      std::vector<char> mine(s.data, s.data + size_t(n) * s.element);
      return c->allGather(group, mine.data(), l.data, n, s.dtype);
    }
    if (gather) return c->allGather(group, s.data, l.data, n, s.dtype);
    LOOM_RETURN_IF_ERROR(c->reduceScatter(group, l.data, s.data, n, s.dtype));
    if (k.str("reduce") == "avg") divideElements(s.dtype, s.data, n, float(g));
    return Status::ok();
  }
  size_t e = s.element, row = size_t(inner) * e;
  s.data += size_t(a0 * inner) * e, l.data += size_t(a0 * g * inner) * e;
  outer = a1 - a0, n = outer * inner;
  std::vector<char> blocks(size_t(g * n) * e);
  if (gather) {
    LOOM_RETURN_IF_ERROR(c->allGather(group, s.data, blocks.data(), n, s.dtype));
    for (int64_t r = 0; r < g; ++r)
      for (int64_t a = 0; a < outer; ++a)
        std::memcpy(l.data + size_t((a * g + r) * inner) * e, &blocks[size_t(r * n + a * inner) * e], row);
    return Status::ok();
  }
  for (int64_t r = 0; r < g; ++r)
    for (int64_t a = 0; a < outer; ++a)
      std::memcpy(&blocks[size_t(r * n + a * inner) * e], l.data + size_t((a * g + r) * inner) * e, row);
  LOOM_RETURN_IF_ERROR(c->reduceScatter(group, blocks.data(), s.data, n, s.dtype));
  if (k.str("reduce") == "avg") divideElements(s.dtype, s.data, n, float(g));
  return Status::ok();
}
Status allGather(CpuKernelContext &c, const KernelCall &k) { return gatherOrScatter(c, k, true); }
Status reduceScatter(CpuKernelContext &c, const KernelCall &k) { return gatherOrScatter(c, k, false); }

// PTD-P's scatter (section 4.1): member r of the group keeps slice r along `dim` of a value
// every member holds (a pipeline message sent in t slices, all-gathered where it arrives).
Status shard(CpuKernelContext &ctx, const KernelCall &k) {
  Collectives *c;
  LOOM_RETURN_IF_ERROR(ctx.collectives(&c));
  int x = k.in("input"), y = k.out("result");
  std::string group = k.str("group");
  int64_t g = k.i64("group_size"), d = k.i64("dim");
  if (g != c->sizeOf(group)) return groupSizeMismatch(k, c);
  Bytes in = bytesOf(ctx, k, x), out = bytesOf(ctx, k, y);
  if (in.dtype != out.dtype) return Status::error("shard: input and result of different dtypes (corrupt plan)");
  int64_t outer = 1, inner = 1, r = c->rankIn(group);
  const plan::Buffer &yb = k.buffer(y);
  for (int j = 0; j < yb.shape_size(); ++j) (j < d ? outer : inner) *= yb.shape(j);
  size_t row = size_t(inner) * out.element;
  for (int64_t a = 0; a < outer; ++a) std::memcpy(out.data + size_t(a) * row, in.data + size_t(a * g + r) * row, row);
  return Status::ok();
}

// Pipeline messages: the micro-batch's channel is added to the plan's tag.
Status send(CpuKernelContext &ctx, const KernelCall &k) {
  Collectives *c;
  LOOM_RETURN_IF_ERROR(ctx.collectives(&c));
  int x = k.in("input");
  Bytes b = bytesOf(ctx, k, x);
  return c->sendBytes(k.str("group"), int(k.i64("peer")), b.data, k.numel(x) * int64_t(b.element),
                      int(k.i64("tag") + ctx.run->messageTag));
}
Status recv(CpuKernelContext &ctx, const KernelCall &k) {
  Collectives *c;
  LOOM_RETURN_IF_ERROR(ctx.collectives(&c));
  int y = k.out("result");
  Bytes b = bytesOf(ctx, k, y);
  return c->recvBytes(k.str("group"), int(k.i64("peer")), b.data, k.numel(y) * int64_t(b.element),
                      int(k.i64("tag") + ctx.run->messageTag));
}

}  // namespace

void registerCommunicationKernels(CpuKernelRegistry &r) {
  r.add(OpId::kAllReduce, allReduce);
  r.add(OpId::kAllGather, allGather);
  r.add(OpId::kReduceScatter, reduceScatter);
  r.add(OpId::kSend, send);
  r.add(OpId::kRecv, recv);
  r.add(OpId::kShard, shard);
}

// The same kernels move 16-bit buffers in their own dtype (half the bytes of widened copies).
void registerHalfCommunicationKernels(HalfKernelTable &t) {
  t.add(OpId::kAllReduce, {oneHalfDtype, allReduce});
  t.add(OpId::kAllGather, {oneHalfDtype, allGather});
  t.add(OpId::kReduceScatter, {oneHalfDtype, reduceScatter});
  t.add(OpId::kSend, {oneHalfDtype, send});
  t.add(OpId::kRecv, {oneHalfDtype, recv});
  t.add(OpId::kShard, {oneHalfDtype, shard});
}

}  // namespace loom::cpu
