#include "runtime/Executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "runtime/PlanAttributes.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Optimizer.h"

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
    LOOM_RETURN_IF_ERROR(checkProgram(prog_));
    size_t floats = prog_.workspace_bytes() / 4 + 16;
    std::vector<float> &arena = ctx_.workspace ? *ctx_.workspace : arena_;
    if (arena.size() < floats) arena.resize(floats);
    std::vector<float> &scratch = ctx_.scratch ? *ctx_.scratch : scratch_;
    if (int64_t need = cpuScratchFloats(prog_); int64_t(scratch.size()) < need) scratch.resize(size_t(need));
    scratchBase_ = scratch.data();
    float *base = arena.data();
    ptr_.assign(prog_.buffers_size(), nullptr);
    iptr_.assign(prog_.buffers_size(), nullptr);
    for (const plan::Buffer &b : prog_.buffers())
      if (b.kind() == plan::Buffer::ACTIVATION) {
        if (b.dtype() != plan::F32)
          return Status::error(prog_.name() + ": the CPU backend computes in fp32; buffer " + std::to_string(b.id()) +
                               " is " + plan::DType_Name(b.dtype()) + " (compile an fp32 model for CPU clusters)");
        if (b.offset() + b.bytes() > int64_t(floats) * 4)
          return Status::error(prog_.name() + ": buffer outside the workspace (corrupt plan)");
        ptr_[b.id()] = base + b.offset() / 4;
      }
    if (ctx_.resultSlots) {
      if (int(ctx_.resultSlots->size()) != prog_.results_size())
        return Status::error(prog_.name() + ": " + std::to_string(ctx_.resultSlots->size()) + " result slots for " +
                             std::to_string(prog_.results_size()) + " results");
      std::vector<bool> placed(prog_.buffers_size(), false);
      for (int i = 0; i < prog_.results_size(); ++i) {
        const plan::Buffer &b = prog_.buffers(prog_.results(i).buffer());
        float *slot = (*ctx_.resultSlots)[size_t(i)];
        // A result also bound as another result keeps its first slot (the second is copied).
        if (slot && b.kind() == plan::Buffer::ACTIVATION && b.dtype() == plan::F32 && !placed[b.id()])
          ptr_[b.id()] = slot, placed[b.id()] = true;
      }
    }
    for (int i = 0; i < prog_.arguments_size(); ++i) {
      const plan::Buffer &b = prog_.buffers(prog_.arguments(i).buffer());
      LOOM_RETURN_IF_ERROR(checkArgument(prog_, i, args[i]));
      if (args[i].i)
        iptr_[b.id()] = args[i].i;
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

  void results(const ResultConsumer &consume) {
    for (int i = 0; i < prog_.results_size(); ++i) {
      const plan::Buffer &b = prog_.buffers(prog_.results(i).buffer());
      consume(i, ptr_[b.id()], planattr::numel(b));
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
      if (in.last_micro_batch() && !ctx_.lastRun) {  // not this run: passed over, done at once
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
      if (ctx_.trace) ctx_.trace->record(prog_, in, ctx_.traceMicroBatch, start, std::chrono::steady_clock::now());
      std::lock_guard<std::mutex> lock(mu_);
      if (!st.isOk() && failure_.empty()) failure_ = prog_.name() + " instruction " + std::to_string(i) + " (" + in.op() + "): " + st.message();
      done_[i] = true;
      cv_.notify_all();
      if (!failure_.empty()) return;
    }
  }

  // Attribute lookups (runtime/PlanAttributes.h) and buffer access.
  int64_t i64(const plan::Instruction &in, const char *name, int64_t dflt = 0) { return planattr::i64(in, name, dflt); }
  double f64(const plan::Instruction &in, const char *name, double dflt = 0) { return planattr::f64(in, name, dflt); }
  std::string str(const plan::Instruction &in, const char *name) { return planattr::str(in, name); }
  bool flag(const plan::Instruction &in, const char *name) { return planattr::flag(in, name); }

  const plan::Buffer &buf(int id) { return prog_.buffers(id); }
  float *f(int id) { return ptr_[id]; }
  int32_t *ints(int id) { return iptr_[id]; }
  int64_t numel(int id) { return planattr::numel(buf(id)); }
  int64_t dim(int id, int k) { return planattr::dim(buf(id), k); }

  Collectives *comm(Status &st) {
    if (!ctx_.collectives) st = Status::error("needs collectives but none were given");
    return ctx_.collectives;
  }
  int64_t shardStart(const std::string &group, int64_t rows) { return loom::shardStart(ctx_.collectives, group, rows); }
  uint64_t dropoutStream(int64_t stream, bool rankDistinct) {
    return loom::dropoutStream(ctx_.collectives, stream, rankDistinct);
  }
  // Per-token max, sum of exponentials and target logit of the logits (a whole vocabulary: a
  // vocab-parallel cross-entropy comes as its steps, cross_entropy_max ... with visible
  // all-reduces).
  Status crossEntropyStats(const plan::Instruction &in, std::vector<float> &mx, std::vector<float> &sum,
                           std::vector<float> &target, int64_t &colStart) {
    int logits = in.inputs(0), labels = in.inputs(1);
    int64_t cols = dim(logits, -1), tokens = numel(logits) / cols, valid = i64(in, "valid_vocab");
    if (!str(in, "vocab_parallel_group").empty())
      return Status::error(in.op() + " over a vocab-parallel group: a plan of another version (corrupt plan)");
    colStart = 0;
    mx.assign(tokens, 0), sum.assign(tokens, 0), target.assign(tokens, 0);
    cpu::crossEntropyLocalMax(f(logits), mx.data(), tokens, cols, colStart, valid);
    cpu::crossEntropyLocalSums(f(logits), ints(labels), mx.data(), sum.data(), target.data(), tokens, cols, colStart,
                               valid);
    return Status::ok();
  }

  // The optimizer over the flat buffer, segment by segment (planattr::FlatSegment); with a
  // shard_group, the instruction sees only this rank's shard of it (ZeRO-1).
  Status optimizerOp(const plan::Instruction &in) {
    auto out = [&](int k = 0) { return in.outputs(k); };
    auto inp = [&](int k) { return in.inputs(k); };
    std::vector<planattr::FlatSegment> segments;
    if (!planattr::decodeSegments(str(in, "segments"), &segments))
      return Status::error(in.op() + ": malformed segments attribute (corrupt plan)");
    std::string shardGroup = str(in, "shard_group");
    int64_t shard = in.op() == "adamw" ? numel(inp(1)) : numel(inp(0));
    int64_t begin = shardGroup.empty() ? 0 : shardStart(shardGroup, shard);
    cpu::FlatRange range{begin, shard};
    if (in.op() == "sum_squares") {
      bool countReplicated = !ctx_.collectives || ctx_.collectives->rankIn("tp") == 0;
      f(out())[0] = cpu::sumSquares(f(inp(0)), segments, range, countReplicated);
      return Status::ok();
    }
    // adamw(params, grads, m, v, grad_scale, lr, step, weight_decay, beta1, beta2, eps) ->
    // (params or the updated shard, m, v)
    if (in.inputs_size() != 11 || in.outputs_size() != 3) return Status::error("adamw: wrong operands (corrupt plan)");
    if (numel(inp(0)) < begin + shard) return Status::error("adamw: shard outside the parameters (corrupt plan)");
    cpu::AdamWHyper h{f(inp(4))[0], f(inp(5))[0], f(inp(6))[0], f(inp(7))[0], f(inp(8))[0], f(inp(9))[0], f(inp(10))[0]};
    cpu::adamwFlat(f(inp(0)) + begin, f(inp(1)), f(inp(2)), f(inp(3)), f(out(0)), segments, range, h);
    return Status::ok();
  }

  Status instruction(const plan::Instruction &in) {
    const std::string &op = in.op();
    auto out = [&](int k = 0) { return in.outputs(k); };
    auto inp = [&](int k) { return in.inputs(k); };
    if (op == "embedding") {
      int tok = inp(0), w = inp(1), pos = optionalInput(in, 2);
      int64_t rows = dim(w, 0), hidden = dim(w, 1);
      cpu::embeddingForward(ints(tok), f(w), pos >= 0 ? f(pos) : nullptr, f(out()), numel(tok), dim(tok, 1), hidden,
                            shardStart(str(in, "vocab_parallel_group"), rows), rows);
    } else if (op == "add_position") {  // a sequence slice starts at its rank's offset
      int64_t first = shardStart(str(in, "sequence_parallel_group"), dim(inp(0), 1));
      cpu::addPositionForward(f(inp(0)), f(inp(1)) + first * dim(inp(0), 2), f(out()), dim(inp(0), 0), dim(inp(0), 1),
                              dim(inp(0), 2));
    } else if (op == "layer_norm") {
      int64_t n = dim(inp(0), -1);
      cpu::layerNormForward(f(inp(0)), f(inp(1)), f(inp(2)), f(out()), numel(inp(0)) / n, n,
                            float(f64(in, "epsilon", 1e-5)));
    } else if (op == "linear") {
      int64_t k = dim(inp(0), -1), n = dim(out(), -1);
      int bias = optionalInput(in, 2);
      cpu::linearForward(f(inp(0)), f(inp(1)), bias >= 0 ? f(bias) : nullptr, f(out()), numel(inp(0)) / k, k, n,
                         flag(in, "transpose_weight"));
    } else if (op == "add_bias") {
      int64_t n = numel(inp(1)), total = numel(inp(0));
      float *x = f(inp(0)), *b = f(inp(1)), *y = f(out());
      for (int64_t i = 0; i < total; ++i) y[i] = x[i] + b[i % n];
    } else if (op == "gelu") {
      cpu::geluForward(f(inp(0)), f(out()), numel(inp(0)));
    } else if (op == "attention" || op == "attention_grad") {
      bool fwd = op == "attention";
      if (!fwd && in.inputs_size() < 3) return Status::error("attention_grad: no softmax statistics input (corrupt plan)");
      int qkv = inp(0), mask = optionalInput(in, fwd ? 1 : 3);
      int64_t heads = i64(in, "num_heads");
      if (heads < 1 || dim(qkv, 2) % (3 * heads) != 0) return Status::error("attention: bad num_heads (corrupt plan)");
      cpu::AttentionShape s{dim(qkv, 0),
                            dim(qkv, 1),
                            heads,
                            dim(qkv, 2) / (3 * heads),
                            flag(in, "causal"),
                            ctx_.training ? float(f64(in, "dropout")) : 0.0f,
                            ctx_.seed,
                            dropoutStream(i64(in, "stream"), flag(in, "rank_distinct_dropout"))};
      if (fwd)
        cpu::attentionForward(f(qkv), mask >= 0 ? f(mask) : nullptr, f(out()),
                              in.outputs_size() > 1 ? f(out(1)) : nullptr, s, scratchBase_);
      else
        cpu::attentionBackward(f(qkv), mask >= 0 ? f(mask) : nullptr, f(inp(1)), f(inp(2)), f(out()), s, scratchBase_);
    } else if (op == "grouped_attention" || op == "grouped_attention_grad") {
      cpu::GroupedAttentionShape s;
      LOOM_RETURN_IF_ERROR(loom::groupedAttentionShape(
          prog_, in, [&](const std::string &g, int64_t rows) { return shardStart(g, rows); }, &s));
      s.dropout = ctx_.training ? float(f64(in, "dropout")) : 0.0f;
      s.seed = ctx_.seed;
      s.stream = dropoutStream(i64(in, "stream"), flag(in, "rank_distinct_dropout"));
      if (op == "grouped_attention")
        cpu::groupedAttentionForward(f(inp(0)), f(inp(1)), f(inp(2)), f(out()),
                                     in.outputs_size() > 1 ? f(out(1)) : nullptr, s, scratchBase_);
      else if (in.inputs_size() < 5)
        return Status::error("grouped_attention_grad: no softmax statistics input (corrupt plan)");
      else
        cpu::groupedAttentionBackward(f(inp(0)), f(inp(1)), f(inp(2)), f(inp(3)), f(inp(4)), f(out(0)), f(out(1)),
                                      f(out(2)), s, scratchBase_);
    } else if (op == "rms_norm") {
      int64_t n = dim(inp(0), -1);
      cpu::rmsNormForward(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)) / n, n, float(f64(in, "epsilon", 1e-6)));
    } else if (op == "rms_norm_grad") {
      int64_t n = dim(inp(0), -1);
      cpu::rmsNormBackward(f(inp(0)), f(inp(1)), f(inp(2)), f(out(0)), f(out(1)), numel(inp(0)) / n, n,
                           float(f64(in, "epsilon", 1e-6)));
    } else if (op == "rotary") {
      int64_t hd = i64(in, "head_dim");
      if (hd < 2 || hd % 2 || dim(inp(0), 2) % hd) return Status::error("rotary: bad head_dim (corrupt plan)");
      cpu::rotary(f(inp(0)), f(out()), dim(inp(0), 0), dim(inp(0), 1), dim(inp(0), 2) / hd, hd,
                  float(f64(in, "theta")), flag(in, "inverse"));
    } else if (op == "swiglu") {
      cpu::swigluForward(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)));
    } else if (op == "swiglu_grad") {
      cpu::swigluBackward(f(inp(0)), f(inp(1)), f(inp(2)), f(out(0)), f(out(1)), numel(inp(0)));
    } else if (op == "dropout") {
      cpu::dropoutForward(f(inp(0)), f(out()), numel(inp(0)), ctx_.training ? float(f64(in, "rate")) : 0.0f, ctx_.seed,
                          dropoutStream(i64(in, "stream"), flag(in, "rank_distinct")));
    } else if (op == "add") {
      float *a = f(inp(0)), *b = f(inp(1)), *y = f(out());
      for (int64_t i = 0, n = numel(inp(0)); i < n; ++i) y[i] = a[i] + b[i];
    } else if (op == "identity") {
      std::memcpy(f(out()), f(inp(0)), numel(inp(0)) * sizeof(float));
    } else if (op == "cross_entropy") {  // -> loss[, lse]
      std::vector<float> mx, sum, target;
      int64_t colStart;
      LOOM_RETURN_IF_ERROR(crossEntropyStats(in, mx, sum, target, colStart));
      int mask = optionalInput(in, 2);
      f(out())[0] = cpu::crossEntropyLoss(mx.data(), sum.data(), target.data(), mask >= 0 ? f(mask) : nullptr,
                                          int64_t(mx.size()));
      if (in.outputs_size() > 1) cpu::crossEntropyLogSumExp(mx.data(), sum.data(), f(out(1)), int64_t(mx.size()));
    } else if (op == "cross_entropy_grad") {
      // (logits, labels, lse, then the optional grad and mask, told apart by shape) -> dlogits;
      // vocab-parallel, this rank's shard of them.
      if (in.inputs_size() < 3) return Status::error("cross_entropy_grad: no lse operand (corrupt plan)");
      int64_t cols = dim(inp(0), -1), tokens = numel(inp(0)) / cols;
      if (numel(inp(2)) != tokens) return Status::error("cross_entropy_grad: wrong lse (corrupt plan)");
      int grad = -1, mask = -1;
      for (int k = 3; k < in.inputs_size(); ++k) (buf(inp(k)).shape_size() == 0 ? grad : mask) = inp(k);
      float g = (grad >= 0 ? f(grad)[0] : float(f64(in, "loss_scale", 1.0))) * ctx_.lossScale;
      cpu::crossEntropyBackward(f(inp(0)), ints(inp(1)), mask >= 0 ? f(mask) : nullptr, f(inp(2)), g, f(out()), tokens,
                                cols, shardStart(str(in, "vocab_parallel_group"), cols), i64(in, "valid_vocab"));
    } else if (op == "cross_entropy_max") {  // vocab-parallel cross-entropy, step by step (see Lowering)
      int64_t cols = dim(inp(0), -1), tokens = numel(inp(0)) / cols;
      if (numel(out()) != tokens) return Status::error("cross_entropy_max: wrong output (corrupt plan)");
      cpu::crossEntropyLocalMax(f(inp(0)), f(out()), tokens, cols, shardStart(str(in, "vocab_parallel_group"), cols),
                                i64(in, "valid_vocab"));
    } else if (op == "cross_entropy_sums") {  // (logits, labels, max) -> [2, tokens]: exponentials, target logit
      int64_t cols = dim(inp(0), -1), tokens = numel(inp(0)) / cols;
      if (numel(out(0)) != 2 * tokens) return Status::error("cross_entropy_sums: wrong output (corrupt plan)");
      cpu::crossEntropyLocalSums(f(inp(0)), ints(inp(1)), f(inp(2)), f(out(0)), f(out(0)) + tokens, tokens, cols,
                                 shardStart(str(in, "vocab_parallel_group"), cols), i64(in, "valid_vocab"));
    } else if (op == "cross_entropy_loss") {  // (max, sums[, mask]) -> the mean loss[, lse]
      int64_t tokens = numel(inp(0));
      int mask = optionalInput(in, 2);
      f(out())[0] = cpu::crossEntropyLoss(f(inp(0)), f(inp(1)), f(inp(1)) + tokens, mask >= 0 ? f(mask) : nullptr, tokens);
      if (in.outputs_size() > 1) cpu::crossEntropyLogSumExp(f(inp(0)), f(inp(1)), f(out(1)), tokens);
    } else if (op == "weight_grad") {
      int64_t k = dim(inp(0), -1), n = dim(inp(1), -1);
      cpu::linearWeightGrad(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)) / k, k, n, flag(in, "transpose_weight"));
    } else if (op == "bias_grad") {
      int64_t n = dim(inp(0), -1);
      cpu::biasGrad(f(inp(0)), f(out()), numel(inp(0)) / n, n);
    } else if (op == "layer_norm_grad") {
      int64_t n = dim(inp(0), -1);
      cpu::layerNormBackward(f(inp(0)), f(inp(1)), f(inp(2)), f(out(0)), f(out(1)), f(out(2)), numel(inp(0)) / n, n,
                             float(f64(in, "epsilon", 1e-5)));
    } else if (op == "gelu_grad") {
      cpu::geluBackward(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)));
    } else if (op == "embedding_grad") {
      int64_t rows = dim(out(), 0), hidden = dim(out(), 1);
      cpu::embeddingBackward(ints(inp(0)), f(inp(1)), f(out()), numel(inp(0)), hidden,
                             shardStart(str(in, "vocab_parallel_group"), rows), rows);
    } else if (op == "position_grad") {
      int64_t first = shardStart(str(in, "sequence_parallel_group"), dim(inp(0), 1)), hidden = dim(inp(0), 2);
      std::fill_n(f(out()), numel(out()), 0.0f);
      cpu::positionBackward(f(inp(0)), f(out()) + first * hidden, dim(inp(0), 0), dim(inp(0), 1), hidden,
                            dim(out(), 0) - first);
    } else if (op == "all_reduce") {
      Status st;
      Collectives *c = comm(st);
      if (!c) return st;
      if (in.inputs_size() != in.outputs_size()) return Status::error("all_reduce: inputs and outputs differ (corrupt plan)");
      if (in.inputs_size() == 1) {
        if (f(out()) != f(inp(0))) std::memcpy(f(out()), f(inp(0)), numel(inp(0)) * sizeof(float));
        return c->allReduce(str(in, "group"), f(out()), numel(out()), reduceOpOf(str(in, "reduce")));
      }
      // A data-parallel bucket. Its gradients are usually one range of the flat gradient buffer
      // (the compiler lays them out in bucket order; the gaps are zero padding, in place,
      // reduced too): one collective over the range, no staging copy.
      bool inPlace = true;
      for (int k = 0; k < in.inputs_size(); ++k) inPlace &= in.inputs(k) == in.outputs(k);
      if (inPlace) {
        std::vector<std::pair<float *, int64_t>> parts;
        for (int b : in.inputs()) parts.push_back({f(b), numel(b)});
        std::sort(parts.begin(), parts.end());
        bool contiguous = true;
        for (size_t k = 1; k < parts.size(); ++k) {
          float *end = parts[k - 1].first + parts[k - 1].second;
          // Only alignment padding between them: every parameter starts 16-aligned, so a gap
          // of fewer than 16 elements holds no other parameter.
          contiguous &= parts[k].first >= end && parts[k].first - end < 16;
        }
        if (contiguous) {
          float *begin = parts.front().first, *end = parts.back().first + parts.back().second;
          return c->allReduce(str(in, "group"), begin, end - begin, reduceOpOf(str(in, "reduce")));
        }
      }
      // Otherwise: the members packed back to back.
      int64_t total = 0;
      for (int k = 0; k < in.inputs_size(); ++k) total += numel(inp(k));
      std::vector<float> packed(total);
      int64_t at = 0;
      for (int k = 0; k < in.inputs_size(); at += numel(inp(k)), ++k)
        std::memcpy(&packed[at], f(inp(k)), numel(inp(k)) * sizeof(float));
      LOOM_RETURN_IF_ERROR(c->allReduce(str(in, "group"), packed.data(), total, reduceOpOf(str(in, "reduce"))));
      at = 0;
      for (int k = 0; k < in.outputs_size(); at += numel(out(k)), ++k)
        std::memcpy(f(out(k)), &packed[at], numel(out(k)) * sizeof(float));
    } else if ((op == "all_gather" || op == "reduce_scatter") && i64(in, "dim") == 0) {
      // Along the first dimension the members' blocks are contiguous: no re-layout.
      Status st;
      Collectives *c = comm(st);
      if (!c) return st;
      bool gather = op == "all_gather";
      int small = gather ? inp(0) : out(), large = gather ? out() : inp(0);
      int64_t g = i64(in, "group_size"), n = numel(small);
      if (g != c->sizeOf(str(in, "group")) || numel(large) != g * n)
        return Status::error("group_size " + std::to_string(g) + " of group " + str(in, "group") + " but the communicator has " +
                             std::to_string(c->sizeOf(str(in, "group"))) + " members (a plan for another layout)");
      if (gather) return c->allGather(str(in, "group"), f(small), f(large), n);
      LOOM_RETURN_IF_ERROR(c->reduceScatter(str(in, "group"), f(large), f(small), n));
      if (str(in, "reduce") == "avg")
        for (float *x = f(small), *e = x + n; x < e; ++x) *x /= float(g);
    } else if (op == "all_gather" || op == "reduce_scatter") {
      Status st;
      Collectives *c = comm(st);
      if (!c) return st;
      bool gather = op == "all_gather";
      int small = gather ? inp(0) : out(), large = gather ? out() : inp(0);
      int64_t g = i64(in, "group_size"), d = i64(in, "dim"), n = numel(small);
      if (g != c->sizeOf(str(in, "group")))
        return Status::error("group_size " + std::to_string(g) + " of group " + str(in, "group") + " but the communicator has " +
                             std::to_string(c->sizeOf(str(in, "group"))) + " members (a plan for another layout)");
      int64_t outer = 1, inner = 1;
      for (int k = 0; k < buf(small).shape_size(); ++k) (k < d ? outer : inner) *= buf(small).shape(k);
      std::vector<float> blocks(g * n);  // member r's block = slice r along dim
      if (gather) {
        LOOM_RETURN_IF_ERROR(c->allGather(str(in, "group"), f(small), blocks.data(), n));
        for (int64_t r = 0; r < g; ++r)
          for (int64_t a = 0; a < outer; ++a)
            std::memcpy(f(large) + (a * g + r) * inner, &blocks[r * n + a * inner], inner * sizeof(float));
      } else {
        for (int64_t r = 0; r < g; ++r)
          for (int64_t a = 0; a < outer; ++a)
            std::memcpy(&blocks[r * n + a * inner], f(large) + (a * g + r) * inner, inner * sizeof(float));
        return c->reduceScatter(str(in, "group"), blocks.data(), f(small), n);
      }
    } else if (op == "send" || op == "recv") {
      Status st;
      Collectives *c = comm(st);
      if (!c) return st;
      int tag = int(i64(in, "tag") + ctx_.messageTag);
      if (op == "send") return c->send(str(in, "group"), int(i64(in, "peer")), f(inp(0)), numel(inp(0)), tag);
      return c->recv(str(in, "group"), int(i64(in, "peer")), f(out()), numel(out()), tag);
    } else if (op == "accumulate") {  // gradient or loss accumulation, in place
      const float *x = f(inp(0));
      float *y = f(out());
      for (int64_t i = 0, n = numel(out()); i < n; ++i) y[i] += x[i];
    } else if (op == "fill") {
      std::fill_n(f(out()), numel(out()), float(f64(in, "value")));
    } else if (op == "scale") {
      const float *x = f(inp(0));
      float *y = f(out()), a = float(f64(in, "factor", 1.0));
      for (int64_t i = 0, n = numel(out()); i < n; ++i) y[i] = x[i] * a;
    } else if (op == "sum_squares" || op == "adamw") {
      return optimizerOp(in);
    } else if (op == "grad_norm") {
      if (in.inputs_size() != 3 || in.outputs_size() != 2) return Status::error("grad_norm: wrong operands (corrupt plan)");
      cpu::gradNorm(f(inp(0))[0], f(inp(1))[0], f(inp(2))[0], f(out(0)), f(out(1)));
    } else {
      return Status::error("the CPU backend has no kernel for op '" + op + "'");
    }
    return Status::ok();
  }

  const plan::Program &prog_;
  const ExecutionContext &ctx_;
  std::vector<float> arena_, scratch_;
  float *scratchBase_ = nullptr;
  std::vector<float *> ptr_;
  std::vector<int32_t *> iptr_;
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

uint64_t dropoutStream(const Collectives *collectives, int64_t stream, bool rankDistinct) {
  if (!rankDistinct || !collectives) return uint64_t(stream);
  return uint64_t(stream) | (uint64_t(collectives->rankIn("tp") + 1) << 32);
}

int optionalInput(const plan::Instruction &in, int fixed) { return in.inputs_size() > fixed ? in.inputs(fixed) : -1; }

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

int64_t cpuScratchFloats(const plan::Program &program) {
  int64_t floats = 0;
  for (const plan::Instruction &in : program.instructions()) {
    const std::string &op = in.op();
    bool backward = op == "attention_grad" || op == "grouped_attention_grad";
    if (!(backward || op == "attention" || op == "grouped_attention") || in.inputs_size() == 0) continue;
    int input = in.inputs(0);
    if (input < 0 || input >= program.buffers_size() || program.buffers(input).shape_size() < 2) continue;  // checkProgram's
    floats = std::max(floats, cpu::attentionScratchFloats(planattr::dim(program.buffers(input), 1), backward));
  }
  return floats;
}

Status checkProgram(const plan::Program &prog) {
  for (int i = 0; i < prog.instructions_size(); ++i) {
    const plan::Instruction &in = prog.instructions(i);
    if (in.stream() < plan::COMPUTE || in.stream() > plan::DP)
      return Status::error(prog.name() + ": instruction " + std::to_string(i) + " names an unknown stream");
    for (int w : in.wait_for())
      if (w < 0 || w >= i)
        return Status::error(prog.name() + ": instruction " + std::to_string(i) + " waits on " + std::to_string(w) +
                             " (corrupt plan)");
    for (int b : in.inputs())
      if (b < 0 || b >= prog.buffers_size()) return Status::error(prog.name() + ": buffer id out of range (corrupt plan)");
    for (int b : in.outputs())
      if (b < 0 || b >= prog.buffers_size()) return Status::error(prog.name() + ": buffer id out of range (corrupt plan)");
  }
  for (const plan::Binding &b : prog.arguments())
    if (b.buffer() < 0 || b.buffer() >= prog.buffers_size())
      return Status::error(prog.name() + ": argument buffer id out of range (corrupt plan)");
  // Only inout arguments may be written.
  std::vector<bool> writable(prog.buffers_size(), true);
  for (const plan::Binding &b : prog.arguments()) writable[b.buffer()] = b.inout();
  for (int i = 0; i < prog.instructions_size(); ++i)
    for (int b : prog.instructions(i).outputs())
      if (!writable[b])
        return Status::error(prog.name() + ": instruction " + std::to_string(i) + " writes argument '" +
                             [&] {
                               for (const plan::Binding &a : prog.arguments())
                                 if (a.buffer() == b) return a.name();
                               return std::string();
                             }() +
                             "', which is not inout (corrupt plan)");
  for (const plan::Binding &b : prog.results())
    if (b.buffer() < 0 || b.buffer() >= prog.buffers_size())
      return Status::error(prog.name() + ": result buffer id out of range (corrupt plan)");
  return Status::ok();
}

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
  if ((v.i != nullptr) != (b.dtype() == plan::I32) || (!v.i && (!v.f && planattr::numel(b) > 0)))
    return Status::error(prog.name() + ": argument '" + name + "' has the wrong element type");
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
