#include "runtime/Executor.h"

#include "runtime/cpu/HalfStorage.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "plan/PlanAttributes.h"
#include "plan/InstructionSet.h"
#include "runtime/cpu/CpuKernelContext.h"
#include "runtime/cpu/Kernels.h"

namespace loom {
namespace {

// The state of one program invocation.
class Run {
 public:
  Run(const plan::Program &p, const ExecutionContext &c) : prog_(p), ctx_(c), done_(p.instructions_size(), false) {}

  Status start(const std::vector<ArgumentView> &args) {
    if (int(args.size()) != prog_.arguments_size())
      return Status::error(prog_.name() + ": expected " + std::to_string(prog_.arguments_size()) + " arguments, got " +
                           std::to_string(args.size()));
    LOOM_RETURN_IF_ERROR(checkProgramStructure(prog_));
    size_t floats = size_t(prog_.workspace_bytes() + 3) / 4;  // the plan's arena, no more
    std::vector<float> &arena = ctx_.workspace ? *ctx_.workspace : arena_;
    if (arena.size() < floats) arena.resize(floats);
    // The attention scratch, then each stream's region for its 16-bit instructions (laid out
    // once: each count walks the program's instructions).
    int64_t parts[5] = {cpuAttentionScratchFloats(prog_)}, need = parts[0];
    for (int stream = 0; stream < 4; ++stream) need += parts[stream + 1] = halfScratchFloats(prog_, stream);
    std::vector<float> &scratch = ctx_.scratch ? *ctx_.scratch : scratch_;
    if (int64_t(scratch.size()) < need) scratch.resize(size_t(need));
    scratchBase_ = scratch.data();
    float *next = scratchBase_ + parts[0];
    for (int stream = 0; stream < 4; ++stream) halfScratch_[stream] = next, next += parts[stream + 1];
    float *base = arena.data();
    ptr_.assign(prog_.buffers_size(), nullptr);
    iptr_.assign(prog_.buffers_size(), nullptr);
    hptr_.assign(prog_.buffers_size(), nullptr);
    for (const plan::Buffer &b : prog_.buffers())
      if (b.kind() == plan::Buffer::ACTIVATION) {
        if (b.dtype() != plan::F32 && !cpu::isHalf(b.dtype()))
          return Status::error(prog_.name() + ": activation buffer " + std::to_string(b.id()) + " is " +
                               plan::DType_Name(b.dtype()) + " (corrupt plan)");
        if (b.offset() + b.bytes() > int64_t(floats) * 4 || b.offset() % 4)
          return Status::error(prog_.name() + ": buffer outside the workspace (corrupt plan)");
        if (cpu::isHalf(b.dtype()))
          hptr_[b.id()] = reinterpret_cast<uint16_t *>(base + b.offset() / 4);
        else
          ptr_[b.id()] = base + b.offset() / 4;
      }
    std::vector<bool> placed(prog_.buffers_size(), false);  // computed in its result slot
    if (ctx_.resultSlots) {
      if (int(ctx_.resultSlots->size()) != prog_.results_size())
        return Status::error(prog_.name() + ": " + std::to_string(ctx_.resultSlots->size()) + " result slots for " +
                             std::to_string(prog_.results_size()) + " results");
      if (ctx_.halfResultSlots && ctx_.halfResultSlots->size() != ctx_.resultSlots->size())
        return Status::error(prog_.name() + ": 16-bit result slots do not match the result slots");
      inPlace_.assign(prog_.results_size(), false);
      for (int i = 0; i < prog_.results_size(); ++i) {
        const plan::Buffer &b = prog_.buffers(prog_.results(i).buffer());
        // A result also bound as another result keeps its first slot (the second is copied).
        if (b.kind() != plan::Buffer::ACTIVATION || placed[b.id()]) continue;
        if (float *slot = (*ctx_.resultSlots)[size_t(i)]; slot && b.dtype() == plan::F32) {
          ptr_[b.id()] = slot, placed[b.id()] = true;
        } else if (cpu::isHalf(b.dtype()) && ctx_.halfResultSlots) {
          if (uint16_t *half = (*ctx_.halfResultSlots)[size_t(i)])
            hptr_[b.id()] = half, placed[b.id()] = true, inPlace_[size_t(i)] = true;
        }
      }
    }
    // A result without a slot (a run outside the step driver, a result bound twice) gets
    // storage of its own: the plan lets the workspace reuse its bytes once the result is handed
    // over, and this executor hands results over after the run.
    {
      std::vector<bool> own(prog_.buffers_size(), false);
      int64_t floats = 0;
      for (const plan::Binding &r : prog_.results()) {
        const plan::Buffer &b = prog_.buffers(r.buffer());
        if (b.kind() != plan::Buffer::ACTIVATION || placed[b.id()] || own[b.id()]) continue;
        own[b.id()] = true;
        floats += (b.bytes() + 3) / 4;
      }
      resultStore_.assign(size_t(floats), 0.0f);
      float *next = resultStore_.data();
      for (int id = 0; id < prog_.buffers_size(); ++id) {
        if (!own[size_t(id)]) continue;
        const plan::Buffer &b = prog_.buffers(id);
        if (cpu::isHalf(b.dtype()))
          hptr_[size_t(id)] = reinterpret_cast<uint16_t *>(next);
        else
          ptr_[size_t(id)] = next;
        next += (b.bytes() + 3) / 4;
      }
    }
    for (int i = 0; i < prog_.arguments_size(); ++i) {
      const plan::Buffer &b = prog_.buffers(prog_.arguments(i).buffer());
      LOOM_RETURN_IF_ERROR(checkArgument(prog_, i, args[i]));
      if (args[i].i)
        iptr_[b.id()] = args[i].i;
      else if (args[i].h)
        hptr_[b.id()] = args[i].h;
      else
        ptr_[b.id()] = args[i].f;
    }
    return Status::ok();
  }

  Status execute() {
    std::vector<std::thread> streams;
    if (ctx_.computeOnCallingThread) {
      // No fresh compute thread per run: gpt-tiny's step went 10.3-10.6 -> 8.4-10.0 ms (A/B of
      // two builds alternated, medians), more than the thread starts alone (a GEMM on a fresh
      // thread is not slower by itself; the cause is not proven). The per-thread kernel
      // scratch (thread_local) also lives on instead of being allocated every run.
      bool used[4] = {};
      for (const plan::Instruction &in : prog_.instructions()) used[int(in.stream()) & 3] = true;
      for (int s = 1; s < 4; ++s)
        if (used[s]) streams.emplace_back([this, s] { runStream(s); });
      runStream(plan::COMPUTE);
    } else {
      for (int s = 0; s < 4; ++s) streams.emplace_back([this, s] { runStream(s); });
    }
    for (auto &t : streams) t.join();
    std::lock_guard<std::mutex> lock(mu_);
    return failure_.empty() ? Status::ok() : Status::error(failure_);
  }

  // A 16-bit result is handed over widened to fp32 (its values exactly), unless it was
  // computed in its 16-bit slot.
  void results(const ResultConsumer &consume) {
    std::vector<float> wide;
    for (int i = 0; i < prog_.results_size(); ++i) {
      const plan::Buffer &b = prog_.buffers(prog_.results(i).buffer());
      int64_t n = planattr::numel(b);
      if (!inPlace_.empty() && inPlace_[size_t(i)]) continue;  // computed in its 16-bit slot
      if (hptr_[b.id()]) {
        wide.resize(size_t(n));
        cpu::widen(b.dtype(), hptr_[b.id()], wide.data(), n);
        consume(i, wide.data(), n);
      } else {
        consume(i, ptr_[b.id()], n);
      }
    }
  }

 private:
  void runStream(int stream) {
    for (int i = 0; i < prog_.instructions_size(); ++i) {
      const plan::Instruction &in = prog_.instructions(i);
      if (in.stream() != stream) continue;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] {
          if (!failure_.empty()) return true;
          for (int w : in.wait_for())
            if (!done_[w]) return false;
          return true;
        });
        if (!failure_.empty()) return;
      }
      if ((in.last_micro_batch() && !ctx_.lastRun) || (in.first_micro_batch() && !ctx_.firstRun)) {
        // not this run: passed over, done at once
        std::lock_guard<std::mutex> lock(mu_);
        done_[i] = true;
        cv_.notify_all();
        continue;
      }
      auto start = std::chrono::steady_clock::now();
      if (ctx_.progress) ctx_.progress->started(prog_, ctx_.microBatch, i);
      if (ctx_.testStallOp && in.stream() == plan::COMPUTE && in.op() == ctx_.testStallOp)
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // a kernel that never returns
      Status st = instruction(in);
      if (ctx_.testSlowdown > 0 && in.stream() == plan::COMPUTE && !planattr::isCommunication(in.op()))
        std::this_thread::sleep_for((std::chrono::steady_clock::now() - start) * ctx_.testSlowdown);
      if (ctx_.progress) ctx_.progress->finished(prog_, i);
      if (ctx_.trace) ctx_.trace->record(prog_, i, ctx_.traceMicroBatch, start, std::chrono::steady_clock::now());
      std::lock_guard<std::mutex> lock(mu_);
      if (!st.isOk() && failure_.empty()) failure_ = prog_.name() + " instruction " + std::to_string(i) + " (" + in.op() + "): " + st.message();
      done_[i] = true;
      cv_.notify_all();
      if (!failure_.empty()) return;
    }
  }

  // Through the CPU backend's kernel registry (runtime/cpu/CpuKernelContext.h). A 16-bit
  // operand goes to a native 16-bit kernel where one takes the instruction's dtypes
  // (runtime/cpu/HalfKernels.cpp); otherwise the fp32 kernel sees fp32 copies of the 16-bit
  // operands (widened exactly), and its 16-bit outputs are rounded from its fp32 results once,
  // after it (outputs are widened first too, for the kernels that update them in place). The
  // copies are the instruction's own, in its stream's part of the planned scratch
  // (halfScratchFloats): another stream reading the same buffer at the same time reads its
  // 16-bit storage.
  Status instruction(const plan::Instruction &in) {
    auto half = [&](int b) { return b >= 0 && hptr_[size_t(b)] != nullptr; };
    bool any = false;
    for (int b : in.inputs()) any |= half(b);
    for (int b : in.outputs()) any |= half(b);
    if (!any) {
      cpu::CpuKernelContext kernels{&prog_, &ctx_, &ptr_, &iptr_, scratchBase_};
      return cpu::cpuKernels().run(kernels, prog_, in);
    }
    float *halfScratch = halfScratch_[int(in.stream()) & 3];
    if (const isa::OpDecl *decl = isa::find(in.op())) {
      KernelCall call(*decl, prog_, in);
      if (call.bind().isOk())
        if (const cpu::HalfKernel *native = cpu::cpuHalfKernels().find(call)) {
          cpu::CpuKernelContext kernels{&prog_, &ctx_, &ptr_, &iptr_, scratchBase_, &hptr_, halfScratch};
          return native->run(kernels, call);
        }
    }
    std::vector<float *> floats = ptr_;
    float *copy = halfScratch;  // halfScratchFloats(prog_, in) floats
    auto widen = [&](int b) {
      if (!half(b) || floats[size_t(b)]) return;
      const plan::Buffer &buf = prog_.buffers(b);
      cpu::widen(buf.dtype(), hptr_[size_t(b)], copy, planattr::numel(buf));
      floats[size_t(b)] = copy;
      copy += planattr::numel(buf);
    };
    for (int b : in.inputs()) widen(b);
    for (int b : in.outputs()) widen(b);
    cpu::CpuKernelContext kernels{&prog_, &ctx_, &floats, &iptr_, scratchBase_};
    Status st = cpu::cpuKernels().run(kernels, prog_, in);
    for (int b : in.outputs())
      if (half(b)) cpu::narrow(prog_.buffers(b).dtype(), floats[size_t(b)], hptr_[size_t(b)], planattr::numel(prog_.buffers(b)));
    return st;
  }

  const plan::Program &prog_;
  const ExecutionContext &ctx_;
  std::vector<float> arena_, scratch_;
  std::vector<float> resultStore_;  // results without a slot
  float *scratchBase_ = nullptr;
  float *halfScratch_[4] = {};  // per stream: its 16-bit instructions' fp32 scratch
  std::vector<float *> ptr_;
  std::vector<int32_t *> iptr_;
  std::vector<uint16_t *> hptr_;  // 16-bit buffers (bf16 or fp16 storage)
  std::vector<bool> inPlace_;     // per result: computed in its 16-bit result slot
  std::vector<bool> done_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string failure_;
};

}  // namespace

ReduceOp reduceOpOf(const std::string &name) {
  return name == "max" ? ReduceOp::kMax : name == "avg" ? ReduceOp::kAvg : ReduceOp::kSum;
}

int64_t shardStart(const Collectives *collectives, const std::string &group, int64_t rows) {
  if (group.empty() || !collectives) return 0;
  return int64_t(collectives->rankIn(group)) * rows;
}

uint64_t dropoutStream(const Collectives *collectives, int64_t stream, const std::string &distinctGroup) {
  if (distinctGroup.empty() || !collectives) return uint64_t(stream);
  return uint64_t(stream) | (uint64_t(collectives->rankIn(distinctGroup) + 1) << 32);
}


Status groupedAttentionShape(const plan::Program &prog, const plan::Instruction &in,
                             const std::function<int64_t(const std::string &, int64_t)> &shardStartOf,
                             cpu::GroupedAttentionShape *s) {
  const plan::Buffer &q = prog.buffers(in.inputs(0)), &k = prog.buffers(in.inputs(1));
  int64_t heads = planattr::i64(in, "num_heads"), kvHeads = planattr::i64(in, "num_kv_heads");
  int64_t groupSize = planattr::i64(in, "group_size", 1);
  std::string replicated = planattr::str(in, "kv_replicated_group");
  int64_t allHeads = replicated.empty() ? heads : heads * groupSize;
  if (heads < 1 || kvHeads < 1 || allHeads % kvHeads || planattr::dim(q, 2) % heads ||
      planattr::dim(k, 2) != kvHeads * (planattr::dim(q, 2) / heads))
    return Status::error("grouped_attention: bad num_heads / num_kv_heads (corrupt plan)");
  *s = {planattr::dim(q, 0), planattr::dim(q, 1), heads, kvHeads, planattr::dim(q, 2) / heads,
        replicated.empty() ? 0 : shardStartOf(replicated, heads), allHeads / kvHeads, planattr::flag(in, "causal"),
        0.0f, 0, 0};
  return Status::ok();
}

namespace {
bool hasHalfOperand(const plan::Program &program, const plan::Instruction &in) {
  auto half = [&](int b) { return b >= 0 && b < program.buffers_size() && cpu::isHalf(program.buffers(b).dtype()); };
  bool any = false;
  for (int b : in.inputs()) any |= half(b);
  for (int b : in.outputs()) any |= half(b);
  return any;
}

// The native 16-bit kernel that runs `in` (null: none, or no 16-bit operand).
const cpu::HalfKernel *nativeHalfKernel(const plan::Program &program, const plan::Instruction &in) {
  const isa::OpDecl *decl = isa::find(in.op());
  if (!decl || !hasHalfOperand(program, in)) return nullptr;
  KernelCall call(*decl, program, in);
  if (!call.bind().isOk()) return nullptr;  // checkProgram's
  return cpu::cpuHalfKernels().find(call);
}
}  // namespace

int64_t cpuAttentionScratchFloats(const plan::Program &program) {
  int64_t floats = 0;
  using isa::OpId;
  for (const plan::Instruction &in : program.instructions()) {
    floats = std::max(floats, cpu::ringAttentionScratchOf(program, in));  // context parallelism's ring
    floats = std::max(floats, cpu::moeScratchOf(program, in));  // mixture of experts
    const isa::OpDecl *d = isa::find(in.op());
    if (!d) continue;
    bool grouped = d->id == OpId::kGroupedAttention || d->id == OpId::kGroupedAttentionGrad;
    bool backward = d->id == OpId::kAttentionGrad || d->id == OpId::kGroupedAttentionGrad;
    if (!(grouped || backward || d->id == OpId::kAttention) || in.inputs_size() == 0) continue;
    int input = in.inputs(0);
    if (input < 0 || input >= program.buffers_size() || program.buffers(input).shape_size() < 2) continue;  // checkProgram's
    if (nativeHalfKernel(program, in)) continue;  // a bf16 attention: its scratch is its stream's (below)
    if (!planattr::str(in, "context_parallel_group").empty()) {
      // Context parallelism: blocks of half the rank's tokens (the queries: grouped q, else the
      // forward's result or the backward's incoming gradient), head_dim from the queries.
      KernelCall call(*d, program, in);
      if (!call.bind().isOk()) continue;  // checkProgram's
      int queries = grouped ? call.in("q") : backward ? call.in("grad") : call.out("result");
      int64_t heads = std::max<int64_t>(1, planattr::i64(in, "num_heads"));
      if (queries < 0 || program.buffers(queries).shape_size() != 3) continue;
      const plan::Buffer &qb = program.buffers(queries);
      floats = std::max(floats, cpu::contextAttentionScratchFloats(planattr::dim(qb, 1) / 2, planattr::dim(qb, 2) / heads,
                                                                   backward));
      continue;
    }
    floats = std::max(floats, cpu::attentionScratchFloats(planattr::dim(program.buffers(input), 1), backward));
  }
  return floats;
}

int64_t halfScratchFloats(const plan::Program &program, const plan::Instruction &in) {
  if (!hasHalfOperand(program, in)) return 0;
  const isa::OpDecl *decl = isa::find(in.op());
  if (!decl) return 0;
  KernelCall call(*decl, program, in);
  if (!call.bind().isOk()) return 0;  // checkProgram's
  auto half = [&](int b) { return b >= 0 && cpu::isHalf(program.buffers(b).dtype()); };
  if (const cpu::HalfKernel *native = cpu::cpuHalfKernels().find(call))
    return native->scratchFloats ? native->scratchFloats(call) : 0;
  std::vector<int> widened;  // each 16-bit operand once
  int64_t floats = 0;
  auto widen = [&](int b) {
    if (!half(b) || std::find(widened.begin(), widened.end(), b) != widened.end()) return;
    widened.push_back(b);
    floats += planattr::numel(program.buffers(b));
  };
  for (int b : in.inputs()) widen(b);
  for (int b : in.outputs()) widen(b);
  return floats;
}

int64_t halfScratchFloats(const plan::Program &program, int stream) {
  int64_t floats = 0;
  for (const plan::Instruction &in : program.instructions())
    if ((int(in.stream()) & 3) == stream) floats = std::max(floats, halfScratchFloats(program, in));
  return floats;
}

int64_t cpuScratchFloats(const plan::Program &program) {
  int64_t floats = cpuAttentionScratchFloats(program);
  for (int stream = 0; stream < 4; ++stream) floats += halfScratchFloats(program, stream);
  return floats;
}

Status checkCpuKernels(const plan::Program &program) { return cpu::cpuKernels().covers(program); }

Status checkArgument(const plan::Program &prog, int index, const HostTensor &t) {
  const plan::Buffer &b = prog.buffers(prog.arguments(index).buffer());
  int64_t n = planattr::numel(b);
  const std::string &name = prog.arguments(index).name();
  if (t.isInt != (b.dtype() == plan::I32) || (!t.isInt && b.dtype() != plan::F32))
    return Status::error(prog.name() + ": argument '" + name + "' has the wrong element type");
  if (t.numel() != n || int64_t(t.isInt ? t.ints.size() : t.data.size()) != n)
    return Status::error(prog.name() + ": argument '" + name + "' has " + std::to_string(t.numel()) +
                         " elements, expected " + std::to_string(n));
  return Status::ok();
}

Status checkArgument(const plan::Program &prog, int index, const ArgumentView &v) {
  const plan::Buffer &b = prog.buffers(prog.arguments(index).buffer());
  const std::string &name = prog.arguments(index).name();
  bool empty = planattr::numel(b) == 0;
  bool fits = b.dtype() == plan::I32    ? v.i != nullptr || empty
              : cpu::isHalf(b.dtype()) ? v.h != nullptr || empty
                                        : (v.f != nullptr || empty) && !v.i && !v.h;
  if (!fits)
    return Status::error(prog.name() + ": argument '" + name + "' has the wrong element type (" +
                         plan::DType_Name(b.dtype()) + ")");
  if (v.count != planattr::numel(b))
    return Status::error(prog.name() + ": argument '" + name + "' has " + std::to_string(v.count) +
                         " elements, expected " + std::to_string(planattr::numel(b)));
  return Status::ok();
}

Status executeProgram(const plan::Program &program, const std::vector<const HostTensor *> &args,
                      const ResultConsumer &consume, const ExecutionContext &ctx) {
  if (int(args.size()) != program.arguments_size())
    return Status::error(program.name() + ": expected " + std::to_string(program.arguments_size()) + " arguments, got " +
                         std::to_string(args.size()));
  std::vector<ArgumentView> views;
  for (const HostTensor *t : args) {
    if (!t) return Status::error(program.name() + ": a null argument");
    LOOM_RETURN_IF_ERROR(checkArgument(program, int(views.size()), *t));
    views.push_back(ArgumentView::of(*t));
  }
  return executeProgram(program, views, consume, ctx);
}

Status executeProgram(const plan::Program &program, const std::vector<ArgumentView> &args,
                      const ResultConsumer &consume, const ExecutionContext &ctx) {
  Run run(program, ctx);
  LOOM_RETURN_IF_ERROR(run.start(args));
  LOOM_RETURN_IF_ERROR(run.execute());
  run.results(consume);
  return Status::ok();
}

Status executeProgram(const plan::Program &program, const std::vector<const HostTensor *> &args,
                      std::vector<HostTensor> &results, const ExecutionContext &ctx) {
  results.assign(program.results_size(), HostTensor{});
  return executeProgram(
      program, args,
      [&](int i, const float *data, int64_t n) {
        const plan::Buffer &b = program.buffers(program.results(i).buffer());
        results[i].shape.assign(b.shape().begin(), b.shape().end());
        results[i].data.assign(data, data + n);
      },
      ctx);
}

}  // namespace loom
