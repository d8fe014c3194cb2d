#include "runtime/cuda/CudaExecutor.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "runtime/PlanAttributes.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cpu/Optimizer.h"
#include "runtime/cuda/Attention.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/CudaStatus.h"
#include "runtime/cuda/DeviceMemory.h"
#include "runtime/cuda/FlashAttention.h"
#include "runtime/cuda/LtLinear.h"
#include "runtime/cuda/NcclGroup.h"
#include "runtime/cuda/PipelineLinks.h"
#include "runtime/cuda/ProgressEvents.h"

namespace loom::cuda {
namespace {

using planattr::f64;
using planattr::flag;
using planattr::i64;
using planattr::str;

}  // namespace

// One program invocation on the device: the buffers' addresses, the streams' ordering and
// the op dispatch.
class DeviceRun {
 public:
  DeviceRun(CudaExecutor &e, const plan::Program &p, const ExecutionContext &c, char *scratch, const ScratchPlan &sp)
      : e_(e), prog_(p), ctx_(c), ptr_(p.buffers_size()), parameter_(p.buffers_size(), false) {
    for (int k = 0; k < 4; ++k) scratch_[k] = scratch + sp.offset(k);
    for (const plan::Binding &a : p.arguments())
      if (a.role() == plan::Binding::PARAMETER) parameter_[a.buffer()] = true;
  }

  void bind(int buffer, const void *address) { ptr_[buffer] = const_cast<void *>(address); }
  const float *address(int buffer) const { return static_cast<const float *>(ptr_[buffer]); }

  // Runs the program; each result goes to `consume` right after the instruction that produces
  // it, on that instruction's stream (results not produced here: at the end, on compute).
  Status execute(const CudaExecutor::DeviceResultConsumer &consume) {
    // Every stream starts after what the compute stream holds (the arguments' uploads, the
    // previous run's result consumers), and the compute stream ends after every stream.
    std::vector<bool> awaited(prog_.instructions_size(), false);
    for (const plan::Instruction &in : prog_.instructions())
      for (int w : in.wait_for()) awaited[w] = true;
    std::vector<int> producer(prog_.buffers_size(), -1);
    for (int i = 0; i < prog_.instructions_size(); ++i)
      for (int b : prog_.instructions(i).outputs()) producer[b] = i;
    std::vector<std::vector<int>> resultsOf(prog_.instructions_size());
    std::vector<int> atEnd;
    for (int r = 0; r < prog_.results_size(); ++r) {
      int i = producer[prog_.results(r).buffer()];
      (i >= 0 ? resultsOf[i] : atEnd).push_back(r);
    }
    auto hand = [&](int r) {
      int id = prog_.results(r).buffer();
      return consume(r, address(id), planattr::numel(prog_.buffers(id)), st_);
    };
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(e_.streamEnd_[0], e_.streams_[0]), "event"));
    for (int k = 1; k < 4; ++k)
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamWaitEvent(e_.streams_[k], e_.streamEnd_[0], 0), "stream wait"));
    // loom-rank --trace: each executed instruction between two timing events on its stream,
    // read back once the program has run (device times placed after the host time it was queued).
    std::vector<bool> traced(prog_.instructions_size(), false);
    int64_t run = e_.runs_++;
    auto hostBase = std::chrono::steady_clock::now();
    if (ctx_.trace) {
      LOOM_RETURN_IF_ERROR(e_.reserveTraceEvents(prog_.instructions_size()));
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(e_.traceBase_, e_.streams_[0]), "event"));
    }
    for (int i = 0; i < prog_.instructions_size(); ++i) {
      const plan::Instruction &in = prog_.instructions(i);
      int k = int(in.stream());
      st_ = e_.streams_[k];
      Status s = Status::ok();
      if (in.last_micro_batch() && !ctx_.lastRun) {  // not this run: its event marks nothing pending
        if (awaited[i]) s = cudaStatus(cudaEventRecord(e_.events_[i], st_), "event");
        if (!s.isOk()) return Status::error(prog_.name() + " instruction " + std::to_string(i) + ": " + s.message());
        continue;
      }
      for (int w : in.wait_for())
        if (s.isOk()) s = cudaStatus(cudaStreamWaitEvent(st_, e_.events_[w], 0), "stream wait");
      if (s.isOk() && k != plan::COMPUTE && !planattr::isCommunication(in.op()) &&
          in.op() != "identity")
        s = Status::error("a compute op on communication stream " + plan::Stream_Name(in.stream()) +
                          " (corrupt plan: the compute stream's scratch is not shared)");
      if (s.isOk() && ctx_.trace) s = cudaStatus(cudaEventRecord(e_.traceStart_[i], st_), "event");
      // The hang tests' kernel that does not return (an hour), in place of the instruction.
      bool stall = ctx_.testStallOp && k == plan::COMPUTE && in.op() == ctx_.testStallOp;
      if (s.isOk() && stall) spinOnDevice(3600, st_);
      if (s.isOk() && !stall) s = instruction(in, k);
      if (s.isOk()) s = cudaStatus(cudaGetLastError(), "kernel launch");
      if (s.isOk() && ctx_.trace) s = cudaStatus(cudaEventRecord(e_.traceEnd_[i], st_), "event"), traced[i] = true;
      // The event first: other streams wait for the instruction, not for what consumers queue.
      if (s.isOk() && awaited[i]) s = cudaStatus(cudaEventRecord(e_.events_[i], st_), "event");
      if (s.isOk() && ctx_.progress) {
        if (!e_.progressEvents_) e_.progressEvents_ = std::make_unique<ProgressEvents>();
        s = e_.progressEvents_->issue(ctx_.progress, prog_, ctx_.microBatch, i, run, st_);
      }
      for (int r : resultsOf[i])
        if (s.isOk()) s = hand(r);
      if (!s.isOk())
        return Status::error(prog_.name() + " instruction " + std::to_string(i) + " (" + in.op() + "): " + s.message());
    }
    for (int k = 1; k < 4; ++k) {
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(e_.streamEnd_[k], e_.streams_[k]), "event"));
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamWaitEvent(e_.streams_[0], e_.streamEnd_[k], 0), "stream wait"));
    }
    st_ = e_.streams_[0];
    for (int r : atEnd) LOOM_RETURN_IF_ERROR(hand(r));
    if (ctx_.trace) {
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(e_.streams_[0]), "synchronize for the trace"));
      for (int i = 0; i < prog_.instructions_size(); ++i) {
        if (!traced[i]) continue;
        float startMs = 0, durationMs = 0;
        LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventElapsedTime(&startMs, e_.traceBase_, e_.traceStart_[i]), "trace"));
        LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventElapsedTime(&durationMs, e_.traceStart_[i], e_.traceEnd_[i]), "trace"));
        auto start = hostBase + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double, std::milli>(startMs));
        auto end = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double, std::milli>(durationMs));
        ctx_.trace->record(prog_, prog_.instructions(i), ctx_.traceMicroBatch, start, end);
      }
    }
    return Status::ok();
  }

 private:
  Precision precision() const { return e_.options_.precision; }
  float *f(int id) { return static_cast<float *>(ptr_[id]); }
  int32_t *ints(int id) { return static_cast<int32_t *>(ptr_[id]); }
  int64_t numel(int id) { return planattr::numel(prog_.buffers(id)); }
  int64_t dim(int id, int k) { return planattr::dim(prog_.buffers(id), k); }
  int64_t shardStart(const std::string &group, int64_t rows) { return loom::shardStart(ctx_.collectives, group, rows); }
  uint64_t dropoutStream(int64_t stream, bool rankDistinct) {
    return loom::dropoutStream(ctx_.collectives, stream, rankDistinct);
  }
  Status group(const std::string &name, NcclGroup **out) {
    if (!e_.options_.groups)
      return Status::error("the program communicates over '" + name + "' but the CUDA executor has no NCCL groups");
    return e_.options_.groups->find(name, out);
  }

  // Row-major c[M,N] = op(a)[M,K] op(b)[K,N] through column-major SGEMM: c^T = op(b)^T op(a)^T
  // (a stored [K,M] when transposeA, b stored [N,K] when transposeB).
  Status sgemm(int64_t m, int64_t k, int64_t n, const float *a, bool transposeA, const float *b, bool transposeB,
               float *c) {
    float alpha = 1.0f, beta = 0.0f;
    LOOM_RETURN_IF_ERROR(blasStatus(cublasSetStream(e_.blas_, st_), "set stream"));
    return blasStatus(cublasSgemm(e_.blas_, transposeB ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  transposeA ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b,
                                  int(transposeB ? k : n), a, int(transposeA ? m : k), &beta, c, int(n)),
                      "sgemm");
  }

  // Buffer `id` as a 16-bit GEMM operand: a parameter's copy made once per optimizer step,
  // anything else rounded into `scratch` now.
  Status half(int id, void *scratch, const void **out) {
    HalfType type = halfTypeOf(precision());
    if (!parameter_[id]) {
      floatToHalf(f(id), scratch, numel(id), type, st_);
      return *out = scratch, Status::ok();
    }
    CudaExecutor::HalfCopy &copy = e_.halfParameters_[ptr_[id]];
    if (copy.count != numel(id)) {
      if (copy.data) {
        LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(st_), "synchronize before resizing a 16-bit parameter"));
        cudaFree(copy.data);
      }
      copy = CudaExecutor::HalfCopy{};
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&copy.data, size_t(numel(id)) * 2), "allocating a 16-bit parameter"));
      copy.count = numel(id);
    }
    if (!copy.current) floatToHalf(f(id), copy.data, numel(id), type, st_);
    copy.current = true;
    return *out = copy.data, Status::ok();
  }

  Status linear(const plan::Instruction &in) {
    int x = in.inputs(0), w = in.inputs(1), bias = optionalInput(in, 2), y = in.outputs(0);
    int64_t k = dim(x, -1), n = dim(y, -1), m = numel(x) / k;
    bool transposeW = flag(in, "transpose_weight");
    if (precision() == Precision::kFp32) {
      LOOM_RETURN_IF_ERROR(sgemm(m, k, n, f(x), false, f(w), transposeW, f(y)));
      if (bias >= 0) addBroadcast(f(y), f(bias), f(y), m * n, n, st_);
      return Status::ok();
    }
    const void *x16, *w16;
    LOOM_RETURN_IF_ERROR(half(x, scratch_[0], &x16));
    LOOM_RETURN_IF_ERROR(half(w, scratch_[0] + aligned(size_t(numel(x)) * 2), &w16));
    LinearShape shape{m, k, n, transposeW, halfTypeOf(precision()),
                      bias >= 0 ? LinearEpilogue::kBias : LinearEpilogue::kNone};
    return e_.lt_->forward(shape, x16, w16, bias >= 0 ? f(bias) : nullptr, f(y), st_);
  }

  // dW = x^T g ([K,N]), or g^T x ([N,K]) for a transposed weight.
  Status weightGrad(const plan::Instruction &in) {
    int x = in.inputs(0), g = in.inputs(1), dw = in.outputs(0);
    int64_t k = dim(x, -1), n = dim(g, -1), m = numel(x) / k;
    bool transposeW = flag(in, "transpose_weight");
    if (precision() == Precision::kFp32)
      return transposeW ? sgemm(n, m, k, f(g), true, f(x), false, f(dw)) : sgemm(k, m, n, f(x), true, f(g), false, f(dw));
    const void *x16, *g16;
    LOOM_RETURN_IF_ERROR(half(x, scratch_[0], &x16));
    LOOM_RETURN_IF_ERROR(half(g, scratch_[0] + aligned(size_t(numel(x)) * 2), &g16));
    LinearShape shape{m, k, n, transposeW, halfTypeOf(precision()), LinearEpilogue::kNone};
    return e_.lt_->weightGrad(shape, x16, g16, f(dw), /*accumulate=*/false, st_);
  }

  // db[N] = the column sums of g[M,N], as g^T 1 by cuBLAS SGEMV (column-major g^T is [N,M]):
  // a few wide columns over many rows, which one thread per column would leave to a few SMs.
  Status biasGrad(const plan::Instruction &in) {
    int g = in.inputs(0);
    int64_t n = dim(g, -1), m = numel(g) / n;
    LOOM_RETURN_IF_ERROR(e_.reserve(&e_.ones_, &e_.onesBytes_, size_t(m) * sizeof(float)));
    if (e_.onesFilled_ != e_.onesBytes_) {  // filled once per allocation
      fillValue(static_cast<float *>(e_.ones_), int64_t(e_.onesBytes_ / sizeof(float)), 1.0f, st_);
      e_.onesFilled_ = e_.onesBytes_;
    }
    float alpha = 1.0f, beta = 0.0f;
    LOOM_RETURN_IF_ERROR(blasStatus(cublasSetStream(e_.blas_, st_), "set stream"));
    return blasStatus(cublasSgemv(e_.blas_, CUBLAS_OP_N, int(n), int(m), &alpha, f(g), int(n),
                                  static_cast<const float *>(e_.ones_), 1, &beta, f(in.outputs(0)), 1),
                      "sgemv (bias gradient)");
  }

  template <typename T>
  Status toHost(std::vector<T> &host, const T *device, int64_t count) {
    host.resize(size_t(count));
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost, st_),
                                    "copy to host"));
    return cudaStatus(cudaStreamSynchronize(st_), "synchronize");
  }

  // Per-token max, sum of exponentials and target logit in the scratch (3 x tokens) over a
  // whole vocabulary (a vocab-parallel cross-entropy comes as its steps, cross_entropy_max ...).
  Status crossEntropyStats(const plan::Instruction &in, int64_t *colStart) {
    int logits = in.inputs(0), labels = in.inputs(1);
    int64_t cols = dim(logits, -1), tokens = numel(logits) / cols;
    if (!str(in, "vocab_parallel_group").empty())
      return Status::error(in.op() + " over a vocab-parallel group: a plan of another version (corrupt plan)");
    *colStart = 0;
    float *stats = reinterpret_cast<float *>(scratch_[0]);
    crossEntropyLocalMax(f(logits), stats, tokens, cols, 0, i64(in, "valid_vocab"), st_);
    crossEntropyLocalSums(f(logits), ints(labels), stats, stats + tokens, stats + 2 * tokens, tokens, cols, 0,
                          i64(in, "valid_vocab"), st_);
    return Status::ok();
  }

  // A cross-entropy's outputs from its per-token statistics (host copies): the mean loss and,
  // when the plan keeps it for the backward, the log-sum-exp.
  Status lossAndStatistics(const plan::Instruction &in, const float *mx, const float *sums, const float *target,
                           const float *mask, int64_t tokens) {
    float loss = cpu::crossEntropyLoss(mx, sums, target, mask, tokens);
    LOOM_RETURN_IF_ERROR(
        cudaStatus(cudaMemcpyAsync(f(in.outputs(0)), &loss, sizeof(float), cudaMemcpyHostToDevice, st_), "copy loss"));
    std::vector<float> lse;
    if (in.outputs_size() > 1) {
      lse.resize(size_t(tokens));
      cpu::crossEntropyLogSumExp(mx, sums, lse.data(), tokens);
      LOOM_RETURN_IF_ERROR(cudaStatus(
          cudaMemcpyAsync(f(in.outputs(1)), lse.data(), tokens * sizeof(float), cudaMemcpyHostToDevice, st_),
          "copy lse"));
    }
    return cudaStatus(cudaStreamSynchronize(st_), "copy loss");  // `loss` and `lse` live on this stack frame
  }

  // The loss gradient per counted token of a cross-entropy backward: its optional operands from
  // `first` on (the incoming gradient, a scalar, and the loss mask, told apart by shape); g is
  // the gradient (or the loss_scale attribute) times fp16's loss scale over the mask's count.
  Status lossGradient(const plan::Instruction &in, int first, int64_t tokens, int *mask, float *gradOverCount) {
    int grad = -1;
    *mask = -1;
    for (int k = first; k < in.inputs_size(); ++k) (prog_.buffers(in.inputs(k)).shape_size() == 0 ? grad : *mask) = in.inputs(k);
    float g = float(f64(in, "loss_scale", 1.0));
    std::vector<float> host;
    if (grad >= 0) {
      LOOM_RETURN_IF_ERROR(toHost(host, f(grad), 1));
      g = host[0];
    }
    double count = double(tokens);
    if (*mask >= 0) {
      LOOM_RETURN_IF_ERROR(toHost(host, f(*mask), tokens));
      count = 0;
      for (float m : host) count += m;
    }
    *gradOverCount = count > 0 ? float(g * ctx_.lossScale / count) : 0.0f;
    return Status::ok();
  }

  // Sequence parallelism's all-gather / reduce-scatter along `dim` (runtime/Executor.cpp has
  // the same layout on the CPU): member r's block is slice r of the large tensor along dim.
  Status gatherOrScatter(const plan::Instruction &in, int stream) {
    bool gather = in.op() == "all_gather";
    int small = gather ? in.inputs(0) : in.outputs(0), large = gather ? in.outputs(0) : in.inputs(0);
    NcclGroup *comm;
    LOOM_RETURN_IF_ERROR(group(str(in, "group"), &comm));
    int64_t g = i64(in, "group_size"), d = i64(in, "dim"), n = numel(small);
    if (g != comm->size())
      return Status::error("group_size " + std::to_string(g) + " of group " + str(in, "group") +
                           " but the communicator has " + std::to_string(comm->size()) +
                           " members (a plan for another layout)");
    int64_t outer = 1, inner = 1;
    const plan::Buffer &sb = prog_.buffers(small);
    for (int k = 0; k < sb.shape_size(); ++k) (k < d ? outer : inner) *= sb.shape(k);
    if (outer == 1) {  // the blocks are already contiguous in rank order
      if (gather) return comm->allGather(f(small), f(large), n, st_);
      LOOM_RETURN_IF_ERROR(comm->reduceScatterSum(f(large), f(small), n, st_));
      if (str(in, "reduce") == "avg") scaleInPlace(f(small), n, 1.0f / float(g), st_);
      return Status::ok();
    }
    float *blocks = reinterpret_cast<float *>(scratch_[stream]);
    size_t row = size_t(inner) * sizeof(float), wide = size_t(g) * row;
    if (gather) LOOM_RETURN_IF_ERROR(comm->allGather(f(small), blocks, n, st_));
    for (int64_t r = 0; r < g; ++r) {
      cudaError_t err = gather ? cudaMemcpy2DAsync(f(large) + r * inner, wide, blocks + r * n, row, row, size_t(outer),
                                                   cudaMemcpyDeviceToDevice, st_)
                               : cudaMemcpy2DAsync(blocks + r * n, row, f(large) + r * inner, wide, row, size_t(outer),
                                                   cudaMemcpyDeviceToDevice, st_);
      LOOM_RETURN_IF_ERROR(cudaStatus(err, "re-laying out the blocks"));
    }
    return gather ? Status::ok() : comm->reduceScatterSum(blocks, f(small), n, st_);
  }

  Status instruction(const plan::Instruction &in, int stream) {
    const std::string &op = in.op();
    auto out = [&](int k = 0) { return in.outputs(k); };
    auto inp = [&](int k) { return in.inputs(k); };
    if (op == "embedding") {
      int tok = inp(0), w = inp(1), pos = optionalInput(in, 2);
      int64_t rows = dim(w, 0), hidden = dim(w, 1);
      embeddingForward(ints(tok), f(w), pos >= 0 ? f(pos) : nullptr, f(out()), numel(tok), dim(tok, 1), hidden,
                       shardStart(str(in, "vocab_parallel_group"), rows), rows, st_);
    } else if (op == "add_position") {
      int64_t first = shardStart(str(in, "sequence_parallel_group"), dim(inp(0), 1)), hidden = dim(inp(0), 2);
      addBroadcast(f(inp(0)), f(inp(1)) + first * hidden, f(out()), numel(inp(0)), dim(inp(0), 1) * hidden, st_);
    } else if (op == "layer_norm") {
      int64_t n = dim(inp(0), -1);
      layerNormForward(f(inp(0)), f(inp(1)), f(inp(2)), f(out()), numel(inp(0)) / n, n, float(f64(in, "epsilon", 1e-5)),
                       st_);
    } else if (op == "linear") {
      return linear(in);
    } else if (op == "add_bias") {
      addBroadcast(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)), numel(inp(1)), st_);
    } else if (op == "add") {
      addBroadcast(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)), numel(inp(0)), st_);
    } else if (op == "gelu") {
      geluForward(f(inp(0)), f(out()), numel(inp(0)), st_);
    } else if (op == "gelu_grad") {
      geluBackward(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)), st_);
    } else if (op == "attention" || op == "attention_grad") {
      bool fwd = op == "attention";
      if (!fwd && in.inputs_size() < 3) return Status::error("attention_grad: no softmax statistics input (corrupt plan)");
      int qkv = inp(0), mask = optionalInput(in, fwd ? 1 : 3);
      float *lse = fwd ? (in.outputs_size() > 1 ? f(out(1)) : nullptr) : f(inp(2));
      cpu::AttentionShape shape = attentionShapeOf(prog_, in);
      if (shape.heads < 1 || dim(qkv, 2) % (3 * shape.heads) != 0)
        return Status::error("attention: bad num_heads (corrupt plan)");
      shape.dropout = ctx_.training ? float(f64(in, "dropout")) : 0.0f;
      shape.seed = ctx_.seed;
      shape.stream = dropoutStream(i64(in, "stream"), flag(in, "rank_distinct_dropout"));
      const float *m = mask >= 0 ? f(mask) : nullptr;
      if (useFlash(shape, precision(), e_.options_.attention))
        return fwd ? flashAttentionForward(f(qkv), m, f(out()), lse, shape, st_)
                   : flashAttentionBackward(f(qkv), m, f(inp(1)), f(out()), shape, scratch_[0], st_);
      return fwd ? attentionForward(e_.blas_, precision(), f(qkv), m, f(out()), lse, shape, scratch_[0], st_)
                 : attentionBackward(e_.blas_, precision(), f(qkv), m, f(inp(1)), lse, f(out()), shape, scratch_[0],
                                     st_);
    } else if (op == "grouped_attention" || op == "grouped_attention_grad") {
      cpu::GroupedAttentionShape shape;
      LOOM_RETURN_IF_ERROR(groupedAttentionShape(
          prog_, in, [&](const std::string &g, int64_t rows) { return shardStart(g, rows); }, &shape));
      shape.dropout = ctx_.training ? float(f64(in, "dropout")) : 0.0f;
      shape.seed = ctx_.seed;
      shape.stream = dropoutStream(i64(in, "stream"), flag(in, "rank_distinct_dropout"));
      if (op == "grouped_attention")
        return groupedAttentionForward(e_.blas_, precision(), f(inp(0)), f(inp(1)), f(inp(2)), f(out()),
                                       in.outputs_size() > 1 ? f(out(1)) : nullptr, shape, scratch_[0], st_);
      if (in.inputs_size() < 5)
        return Status::error("grouped_attention_grad: no softmax statistics input (corrupt plan)");
      return groupedAttentionBackward(e_.blas_, precision(), f(inp(0)), f(inp(1)), f(inp(2)), f(inp(3)), f(inp(4)),
                                      f(out(0)), f(out(1)), f(out(2)), shape, scratch_[0], st_);
    } else if (op == "rms_norm") {
      int64_t n = dim(inp(0), -1);
      rmsNormForward(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)) / n, n, float(f64(in, "epsilon", 1e-6)), st_);
    } else if (op == "rms_norm_grad") {
      int64_t n = dim(inp(0), -1);
      rmsNormBackward(f(inp(0)), f(inp(1)), f(inp(2)), f(out(0)), f(out(1)), numel(inp(0)) / n, n,
                      float(f64(in, "epsilon", 1e-6)), st_);
    } else if (op == "rotary") {
      int64_t hd = i64(in, "head_dim");
      if (hd < 2 || hd % 2 || dim(inp(0), 2) % hd) return Status::error("rotary: bad head_dim (corrupt plan)");
      rotary(f(inp(0)), f(out()), dim(inp(0), 0), dim(inp(0), 1), dim(inp(0), 2) / hd, hd, float(f64(in, "theta")),
             flag(in, "inverse"), st_);
    } else if (op == "swiglu") {
      swigluForward(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)), st_);
    } else if (op == "swiglu_grad") {
      swigluBackward(f(inp(0)), f(inp(1)), f(inp(2)), f(out(0)), f(out(1)), numel(inp(0)), st_);
    } else if (op == "dropout") {
      dropoutForward(f(inp(0)), f(out()), numel(inp(0)), ctx_.training ? float(f64(in, "rate")) : 0.0f, ctx_.seed,
                     dropoutStream(i64(in, "stream"), flag(in, "rank_distinct")), st_);
    } else if (op == "identity") {
      return cudaStatus(
          cudaMemcpyAsync(f(out()), f(inp(0)), numel(inp(0)) * sizeof(float), cudaMemcpyDeviceToDevice, st_), "copy");
    } else if (op == "cross_entropy") {  // -> loss[, lse]
      int64_t colStart, tokens = numel(inp(0)) / dim(inp(0), -1);
      LOOM_RETURN_IF_ERROR(crossEntropyStats(in, &colStart));
      const float *stats = reinterpret_cast<const float *>(scratch_[0]);
      std::vector<float> host, mask;
      LOOM_RETURN_IF_ERROR(toHost(host, stats, 3 * tokens));
      int maskId = optionalInput(in, 2);
      if (maskId >= 0) LOOM_RETURN_IF_ERROR(toHost(mask, f(maskId), tokens));
      return lossAndStatistics(in, host.data(), host.data() + tokens, host.data() + 2 * tokens,
                               maskId >= 0 ? mask.data() : nullptr, tokens);
    } else if (op == "cross_entropy_grad") {
      // (logits, labels, lse, then the optional grad and mask): the softmax from the kept lse.
      if (in.inputs_size() < 3) return Status::error("cross_entropy_grad: no lse operand (corrupt plan)");
      int64_t cols = dim(inp(0), -1), tokens = numel(inp(0)) / cols;
      if (numel(inp(2)) != tokens) return Status::error("cross_entropy_grad: wrong lse (corrupt plan)");
      int mask = -1;
      float gradOverCount = 0;
      LOOM_RETURN_IF_ERROR(lossGradient(in, 3, tokens, &mask, &gradOverCount));
      crossEntropyBackward(f(inp(0)), ints(inp(1)), mask >= 0 ? f(mask) : nullptr, f(inp(2)), gradOverCount, f(out()),
                           tokens, cols, shardStart(str(in, "vocab_parallel_group"), cols), i64(in, "valid_vocab"), st_);
    } else if (op == "cross_entropy_max") {  // vocab-parallel cross-entropy, step by step (see Lowering)
      int64_t cols = dim(inp(0), -1), tokens = numel(inp(0)) / cols;
      if (numel(out()) != tokens) return Status::error("cross_entropy_max: wrong output (corrupt plan)");
      crossEntropyLocalMax(f(inp(0)), f(out()), tokens, cols, shardStart(str(in, "vocab_parallel_group"), cols),
                           i64(in, "valid_vocab"), st_);
    } else if (op == "cross_entropy_sums") {  // (logits, labels, max) -> [2, tokens]: exponentials, target logit
      int64_t cols = dim(inp(0), -1), tokens = numel(inp(0)) / cols;
      if (numel(out(0)) != 2 * tokens) return Status::error("cross_entropy_sums: wrong output (corrupt plan)");
      crossEntropyLocalSums(f(inp(0)), ints(inp(1)), f(inp(2)), f(out(0)), f(out(0)) + tokens, tokens, cols,
                            shardStart(str(in, "vocab_parallel_group"), cols), i64(in, "valid_vocab"), st_);
    } else if (op == "cross_entropy_loss") {  // (max, sums[, mask]) -> the mean loss[, lse]
      int64_t tokens = numel(inp(0));
      std::vector<float> mx, sums, mask;
      LOOM_RETURN_IF_ERROR(toHost(mx, f(inp(0)), tokens));
      LOOM_RETURN_IF_ERROR(toHost(sums, f(inp(1)), 2 * tokens));
      int maskId = optionalInput(in, 2);
      if (maskId >= 0) LOOM_RETURN_IF_ERROR(toHost(mask, f(maskId), tokens));
      return lossAndStatistics(in, mx.data(), sums.data(), sums.data() + tokens, maskId >= 0 ? mask.data() : nullptr,
                               tokens);
    } else if (op == "weight_grad") {
      return weightGrad(in);
    } else if (op == "bias_grad") {
      return biasGrad(in);
    } else if (op == "layer_norm_grad") {
      int64_t n = dim(inp(0), -1);
      layerNormBackward(f(inp(0)), f(inp(1)), f(inp(2)), f(out(0)), f(out(1)), f(out(2)), numel(inp(0)) / n, n,
                        float(f64(in, "epsilon", 1e-5)), st_);
    } else if (op == "embedding_grad") {
      int64_t rows = dim(out(), 0), hidden = dim(out(), 1);
      embeddingBackward(ints(inp(0)), f(inp(1)), f(out()), numel(inp(0)), hidden,
                        shardStart(str(in, "vocab_parallel_group"), rows), rows, st_);
    } else if (op == "position_grad") {
      int64_t first = shardStart(str(in, "sequence_parallel_group"), dim(inp(0), 1)), hidden = dim(inp(0), 2);
      LOOM_RETURN_IF_ERROR(
          cudaStatus(cudaMemsetAsync(f(out()), 0, numel(out()) * sizeof(float), st_), "zero the position gradient"));
      sumRows(f(inp(0)), f(out()) + first * hidden, dim(inp(0), 0), dim(inp(0), 1) * hidden, st_);
    } else if (op == "all_reduce") {
      if (in.inputs_size() != in.outputs_size()) return Status::error("all_reduce: inputs and outputs differ (corrupt plan)");
      NcclGroup *comm;
      LOOM_RETURN_IF_ERROR(group(str(in, "group"), &comm));
      std::vector<NcclGroup::Part> parts;  // a data-parallel bucket: one grouped call, no packing
      for (int k = 0; k < in.inputs_size(); ++k) parts.push_back({f(inp(k)), f(out(k)), numel(inp(k))});
      return comm->allReduce(parts, reduceOpOf(str(in, "reduce")), st_);
    } else if (op == "all_gather" || op == "reduce_scatter") {
      return gatherOrScatter(in, stream);
    } else if (op == "send" || op == "recv") {
      PipelineLinks *links = e_.options_.links;
      if (!links) return Status::error("a pipeline message but the CUDA executor has no pipeline links");
      int peer = int(i64(in, "peer"));
      return op == "send" ? links->send(peer, f(inp(0)), numel(inp(0)), st_)
                          : links->recv(peer, f(out()), numel(out()), st_);
    } else if (op == "accumulate") {  // gradient or loss accumulation, in place
      addBroadcast(f(out()), f(inp(0)), f(out()), numel(out()), numel(out()), st_);
    } else if (op == "fill") {
      fillValue(f(out()), numel(out()), float(f64(in, "value")), st_);
    } else if (op == "scale") {
      if (f(out()) != f(inp(0)))
        LOOM_RETURN_IF_ERROR(cudaStatus(
            cudaMemcpyAsync(f(out()), f(inp(0)), numel(out()) * sizeof(float), cudaMemcpyDeviceToDevice, st_), "copy"));
      scaleInPlace(f(out()), numel(out()), float(f64(in, "factor", 1.0)), st_);
    } else if (op == "sum_squares" || op == "adamw") {
      return optimizerOp(in);
    } else if (op == "grad_norm") {
      if (in.inputs_size() != 3 || in.outputs_size() != 2) return Status::error("grad_norm: wrong operands (corrupt plan)");
      std::vector<float> squares, clip, scale;
      LOOM_RETURN_IF_ERROR(toHost(squares, f(inp(0)), 1));
      LOOM_RETURN_IF_ERROR(toHost(clip, f(inp(1)), 1));
      LOOM_RETURN_IF_ERROR(toHost(scale, f(inp(2)), 1));
      float result[2];
      cpu::gradNorm(squares[0], clip[0], scale[0], &result[0], &result[1]);
      for (int k = 0; k < 2; ++k)
        LOOM_RETURN_IF_ERROR(cudaStatus(
            cudaMemcpyAsync(f(out(k)), &result[k], sizeof(float), cudaMemcpyHostToDevice, st_), "copy the norm"));
      return cudaStatus(cudaStreamSynchronize(st_), "copy the norm");  // `result` lives on this stack frame
    } else {
      return Status::error("the CUDA backend has no kernel for op '" + op + "'");
    }
    return Status::ok();
  }

  // The optimizer over the flat buffer, segment by segment (as the CPU executor's): the sum of
  // squares in double on the device, AdamW per segment with its decay flag.
  Status optimizerOp(const plan::Instruction &in) {
    std::vector<planattr::FlatSegment> segments;
    if (!planattr::decodeSegments(str(in, "segments"), &segments))
      return Status::error(in.op() + ": malformed segments attribute (corrupt plan)");
    std::string shardGroup = str(in, "shard_group");
    bool adam = in.op() == "adamw";
    int64_t shard = numel(adam ? in.inputs(1) : in.inputs(0));
    int64_t begin = shardGroup.empty() ? 0 : shardStart(shardGroup, shard), end = begin + shard;
    auto forEach = [&](auto body) {  // body(local offset, elements, segment)
      planattr::forEachSegmentIn(segments, begin, shard, [&](int64_t lo, int64_t hi, const planattr::FlatSegment &sg) {
        body(lo, hi - lo, sg);
      });
    };
    if (!adam) {
      bool countReplicated = !ctx_.collectives || ctx_.collectives->rankIn("tp") == 0;
      double *sum = reinterpret_cast<double *>(scratch_[0]);
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(sum, 0, sizeof(double), st_), "zero the sum of squares"));
      const float *g = f(in.inputs(0));
      forEach([&](int64_t at, int64_t n, const planattr::FlatSegment &sg) {
        if (sg.norm || (sg.normAtTp0 && countReplicated)) accumulateSquares(g + at, n, sum, st_);
      });
      std::vector<double> host;
      LOOM_RETURN_IF_ERROR(toHost(host, sum, 1));
      float value = float(host[0]);
      LOOM_RETURN_IF_ERROR(cudaStatus(
          cudaMemcpyAsync(f(in.outputs(0)), &value, sizeof(float), cudaMemcpyHostToDevice, st_), "copy the squares"));
      return cudaStatus(cudaStreamSynchronize(st_), "copy the squares");
    }
    // adamw(params, grads, m, v, grad_scale, lr, step, weight_decay, beta1, beta2, eps)
    if (in.inputs_size() != 11 || in.outputs_size() != 3) return Status::error("adamw: wrong operands (corrupt plan)");
    if (numel(in.inputs(0)) < end) return Status::error("adamw: shard outside the parameters (corrupt plan)");
    float h[7];
    for (int k = 0; k < 7; ++k) {
      std::vector<float> v;
      LOOM_RETURN_IF_ERROR(toHost(v, f(in.inputs(4 + k)), 1));
      h[k] = v[0];
    }
    float *param = f(in.inputs(0)) + begin, *grad = f(in.inputs(1)), *out = f(in.outputs(0));
    if (out != param)
      LOOM_RETURN_IF_ERROR(cudaStatus(
          cudaMemcpyAsync(out, param, size_t(shard) * sizeof(float), cudaMemcpyDeviceToDevice, st_), "copy the shard"));
    if (h[0] == 0.0f) return Status::ok();      // skipped: non-finite gradients
    if (h[0] != 1.0f) scaleInPlace(grad, shard, h[0], st_);  // clipping and loss-scale removal
    forEach([&](int64_t at, int64_t n, const planattr::FlatSegment &sg) {
      adamwUpdate(out + at, grad + at, f(in.inputs(2)) + at, f(in.inputs(3)) + at, n, h[1], h[4], h[5], h[6], h[3],
                  int64_t(h[2]), sg.decay, st_);
    });
    e_.parametersChanged();  // the 16-bit copies are remade on next use
    return Status::ok();
  }

  CudaExecutor &e_;
  const plan::Program &prog_;
  const ExecutionContext &ctx_;
  cudaStream_t st_ = nullptr;  // the current instruction's stream
  char *scratch_[4] = {};
  std::vector<void *> ptr_;
  std::vector<bool> parameter_;
};

bool parseAttentionKernel(const std::string &name, AttentionKernel *out) {
  if (name == "auto") return *out = AttentionKernel::kAuto, true;
  if (name == "unfused") return *out = AttentionKernel::kUnfused, true;
  if (name == "flash") return *out = AttentionKernel::kFlash, true;
  return false;
}

CudaExecutor::CudaExecutor(const CudaExecutorOptions &options) : options_(options) {}

Status CudaExecutor::create(const CudaExecutorOptions &options, std::unique_ptr<CudaExecutor> *out) {
  std::unique_ptr<CudaExecutor> e(new CudaExecutor(options));
  for (int k = 0; k < 4; ++k) {
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamCreateWithFlags(&e->streams_[k], cudaStreamNonBlocking), "stream"));
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventCreateWithFlags(&e->streamEnd_[k], cudaEventDisableTiming), "event"));
  }
  LOOM_RETURN_IF_ERROR(blasStatus(cublasCreate(&e->blas_), "create"));
  if (options.precision != Precision::kFp32) LOOM_RETURN_IF_ERROR(LtLinear::create(kLtWorkspaceBytes, &e->lt_));
  *out = std::move(e);
  return Status::ok();
}

CudaExecutor::~CudaExecutor() {
  cudaDeviceSynchronize();
  for (auto &[address, copy] : halfParameters_) cudaFree(copy.data);
  for (void *p : {arena_, arguments_, scratch_, ones_})
    if (p) cudaFree(p);
  for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
  for (cudaEvent_t ev : traceStart_) cudaEventDestroy(ev);
  for (cudaEvent_t ev : traceEnd_) cudaEventDestroy(ev);
  if (traceBase_) cudaEventDestroy(traceBase_);
  lt_.reset();
  if (blas_) cublasDestroy(blas_);
  for (int k = 0; k < 4; ++k) {
    if (streamEnd_[k]) cudaEventDestroy(streamEnd_[k]);
    if (streams_[k]) cudaStreamDestroy(streams_[k]);
  }
}

int64_t CudaExecutor::allocatedBytes() const {
  int64_t bytes = int64_t(arenaBytes_ + argumentBytes_ + scratchBytes_ + onesBytes_);
  for (auto &[address, copy] : halfParameters_) bytes += 2 * copy.count;
  if (lt_) bytes += int64_t(kLtWorkspaceBytes);
  return bytes;
}

void CudaExecutor::parametersChanged() {
  for (auto &[address, copy] : halfParameters_) copy.current = false;
}

// Grows a device buffer to `bytes` (never shrinks: steady-state runs allocate nothing).
Status CudaExecutor::reserve(void **buffer, size_t *capacity, size_t bytes) {
  if (bytes <= *capacity) return Status::ok();
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaDeviceSynchronize(), "synchronize before growing a buffer"));
  if (*buffer) cudaFree(*buffer);
  *buffer = nullptr, *capacity = 0;
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMalloc(buffer, bytes), "allocating " + std::to_string(bytes) + " bytes"));
  *capacity = bytes;
  return Status::ok();
}

// What a program needs beyond its arguments: the arena, the scratch, events, the ones of
// bias gradients. Grown, never shrunk; growing drains the device first.
Status CudaExecutor::reserveFor(const plan::Program &program) {
  size_t workspace = aligned(size_t(program.workspace_bytes()));
  ScratchPlan scratch = scratchFor(program, options_.precision, options_.attention);
  LOOM_RETURN_IF_ERROR(reserve(&arena_, &arenaBytes_, workspace + 256));
  LOOM_RETURN_IF_ERROR(reserve(&scratch_, &scratchBytes_, scratch.total() + 256));
  while (events_.size() < size_t(program.instructions_size())) {
    cudaEvent_t ev;
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "event"));
    events_.push_back(ev);
  }
  for (const plan::Instruction &in : program.instructions())
    if (in.op() == "bias_grad") {
      const plan::Buffer &g = program.buffers(in.inputs(0));
      size_t rows = size_t(planattr::numel(g) / std::max<int64_t>(1, planattr::dim(g, -1)));
      LOOM_RETURN_IF_ERROR(reserve(&ones_, &onesBytes_, rows * sizeof(float)));
    }
  return Status::ok();
}

Status CudaExecutor::reserveTraceEvents(int count) {
  if (!traceBase_) LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventCreate(&traceBase_), "event"));
  while (traceStart_.size() < size_t(count)) {
    cudaEvent_t a, b;
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventCreate(&a), "event"));
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventCreate(&b), "event"));
    traceStart_.push_back(a), traceEnd_.push_back(b);
  }
  return Status::ok();
}

Status CudaExecutor::prepare(const plan::ProgramSet &programs) {
  for (const plan::Program &p : programs.programs()) {
    LOOM_RETURN_IF_ERROR(checkProgram(p));
    LOOM_RETURN_IF_ERROR(reserveFor(p));
  }
  return Status::ok();
}

Status CudaExecutor::runOnDevice(const plan::Program &program, const std::vector<const void *> &args,
                                 const DeviceResultConsumer &consume, const ExecutionContext &ctx) {
  LOOM_RETURN_IF_ERROR(checkProgram(program));
  if (int(args.size()) != program.arguments_size())
    return Status::error(program.name() + ": expected " + std::to_string(program.arguments_size()) + " arguments, got " +
                         std::to_string(args.size()));
  LOOM_RETURN_IF_ERROR(reserveFor(program));
  size_t workspace = aligned(size_t(program.workspace_bytes()));
  ScratchPlan scratch = scratchFor(program, options_.precision, options_.attention);
  char *base = static_cast<char *>(arena_);
  DeviceRun run(*this, program, ctx, static_cast<char *>(scratch_), scratch);
  for (const plan::Buffer &b : program.buffers())
    if (b.kind() == plan::Buffer::ACTIVATION) {
      if (b.dtype() != plan::F32 && b.dtype() != plan::I32)
        return Status::error(program.name() + ": the CUDA executor runs fp32 plans (bf16/fp16 come from its precision "
                             "setting, as autocast); buffer " + std::to_string(b.id()) + " is " +
                             plan::DType_Name(b.dtype()));
      if (b.offset() < 0 || size_t(b.offset() + b.bytes()) > workspace)
        return Status::error(program.name() + ": buffer outside the workspace (corrupt plan)");
      run.bind(b.id(), base + b.offset());
    }
  for (int i = 0; i < program.arguments_size(); ++i) {
    if (!args[i]) return Status::error(program.name() + ": argument " + std::to_string(i) + " has no device address");
    run.bind(program.arguments(i).buffer(), args[i]);
  }
  LOOM_RETURN_IF_ERROR(run.execute(consume));
  return cudaStatus(cudaGetLastError(), program.name());
}

Status CudaExecutor::run(const plan::Program &program, const std::vector<const HostTensor *> &args,
                         std::vector<HostTensor> &results, const ExecutionContext &ctx) {
  LOOM_RETURN_IF_ERROR(checkProgram(program));
  if (int(args.size()) != program.arguments_size())
    return Status::error(program.name() + ": expected " + std::to_string(program.arguments_size()) + " arguments, got " +
                         std::to_string(args.size()));
  parametersChanged();  // the uploads below reuse the same addresses with new values
  // Arguments: checked as the CPU executor checks them, then copied up back to back.
  size_t argumentBytes = 0;
  for (int i = 0; i < program.arguments_size(); ++i) {
    LOOM_RETURN_IF_ERROR(checkArgument(program, i, *args[i]));
    argumentBytes += aligned(size_t(planattr::numel(program.buffers(program.arguments(i).buffer()))) * 4);
  }
  LOOM_RETURN_IF_ERROR(reserve(&arguments_, &argumentBytes_, argumentBytes + 256));
  std::vector<const void *> device;
  char *at = static_cast<char *>(arguments_);
  for (int i = 0; i < program.arguments_size(); ++i) {
    const void *host = args[i]->isInt ? static_cast<const void *>(args[i]->ints.data())
                                      : static_cast<const void *>(args[i]->data.data());
    size_t bytes = size_t(planattr::numel(program.buffers(program.arguments(i).buffer()))) * 4;
    LOOM_RETURN_IF_ERROR(
        cudaStatus(cudaMemcpyAsync(at, host, bytes, cudaMemcpyHostToDevice, streams_[0]), "argument copy"));
    device.push_back(at);
    at += aligned(bytes);
  }
  results.assign(program.results_size(), HostTensor{});
  auto copyDown = [&](int i, const float *data, int64_t count, cudaStream_t s) {
    const plan::Buffer &b = program.buffers(program.results(i).buffer());
    results[i].shape.assign(b.shape().begin(), b.shape().end());
    results[i].data.resize(size_t(count));
    return cudaStatus(cudaMemcpyAsync(results[i].data.data(), data, size_t(count) * sizeof(float),
                                      cudaMemcpyDeviceToHost, s),
                      "result copy");
  };
  LOOM_RETURN_IF_ERROR(runOnDevice(program, device, copyDown, ctx));
  return cudaStatus(cudaStreamSynchronize(streams_[0]), program.name());
}

}  // namespace loom::cuda
