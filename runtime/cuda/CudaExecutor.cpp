#include "runtime/cuda/CudaExecutor.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "plan/InstructionSet.h"
#include "runtime/KernelRegistry.h"
#include "plan/PlanAttributes.h"
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

ElementType elementTypeOf(plan::DType d) {
  return d == plan::BF16 ? ElementType::kBf16 : d == plan::F16 ? ElementType::kF16 : ElementType::kF32;
}
cudaDataType cudaTypeOf(ElementType t) {
  return t == ElementType::kF32 ? CUDA_R_32F : t == ElementType::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
}

}  // namespace

class DeviceRun;
// The CUDA backend's kernels by declared op (DeviceRun::registerKernels).
const KernelRegistry<DeviceRun> &cudaKernels();

// One program invocation on the device: the buffers' addresses, the streams' ordering and
// the op dispatch.
class DeviceRun {
  friend const KernelRegistry<DeviceRun> &cudaKernels();

 public:
  DeviceRun(CudaExecutor &e, const plan::Program &p, const ExecutionContext &c, char *scratch, const ScratchPlan &sp)
      : e_(e), prog_(p), ctx_(c), ptr_(p.buffers_size()), parameter_(p.buffers_size(), false),
        precision_(programPrecision(p, e.options_.precision)), computeScratchBytes_(sp.bytes[0]) {
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
      return consume(r, typed(id), planattr::numel(prog_.buffers(id)), st_);
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
      if ((in.last_micro_batch() && !ctx_.lastRun) || (in.first_micro_batch() && !ctx_.firstRun)) {
        // not this run: its event marks nothing pending
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
        ctx_.trace->record(prog_, i, ctx_.traceMicroBatch, start, end);
      }
    }
    return Status::ok();
  }

 private:
  // The GEMMs' precision: a 16-bit plan's own type, else the launch's (--precision).
  Precision precision() const { return precision_; }
  ElementType typeOf(int id) const { return elementTypeOf(prog_.buffers(id).dtype()); }
  // Buffer `id` as a typed operand (fp32, bf16 or fp16 storage; runtime/cuda/DeviceArray.h);
  // absent (-1): a null one.
  Out typed(int id) { return id < 0 ? Out() : Out(ptr_[id], typeOf(id)); }
  // Buffer `id` where a kernel reads or writes fp32 only (statistics, the loss, masks, the
  // optimizer's state); a 16-bit buffer there is a plan this backend cannot run: the
  // instruction fails with a message naming it.
  float *f(int id) {
    plan::DType d = prog_.buffers(id).dtype();
    if (d != plan::F32 && d != plan::I32 && typeError_.empty())
      typeError_ = "buffer " + std::to_string(id) + " is " + plan::DType_Name(d) +
                   " where the CUDA kernel reads fp32 (a plan this backend cannot run)";
    return static_cast<float *>(ptr_[id]);
  }
  float *fOrNull(int id) { return id < 0 ? nullptr : f(id); }  // an optional operand (-1: absent)
  // An output the kernel accumulates in fp32 (cuda::accumulatedInFp32): itself in an fp32 plan;
  // in a 16-bit plan fp32 scratch at the end of the compute stream's, rounded into the buffer
  // once the kernel is queued (instruction()).
  float *wide(int id) {
    if (typeOf(id) == ElementType::kF32) return f(id);
    float *at = reinterpret_cast<float *>(wideBase_ + wideUsed_);
    wideUsed_ += aligned(size_t(numel(id)) * sizeof(float));
    pendingWide_.push_back({id, at});
    return at;
  }
  int32_t *ints(int id) { return static_cast<int32_t *>(ptr_[id]); }
  int64_t numel(int id) { return planattr::numel(prog_.buffers(id)); }
  int64_t dim(int id, int k) { return planattr::dim(prog_.buffers(id), k); }
  int64_t shardStart(const std::string &group, int64_t rows) { return loom::shardStart(ctx_.collectives, group, rows); }
  uint64_t dropoutStream(int64_t stream, const std::string &distinctGroup) {
    return loom::dropoutStream(ctx_.collectives, stream, distinctGroup);
  }
  Status group(const std::string &name, NcclGroup **out) {
    if (!e_.options_.groups)
      return Status::error("the program communicates over '" + name + "' but the CUDA executor has no NCCL groups");
    return e_.options_.groups->find(name, out);
  }
  // The communicator of the instruction's group, which must have its group_size members.
  Status groupOf(const KernelCall &call, NcclGroup **out) {
    LOOM_RETURN_IF_ERROR(group(call.str("group"), out));
    if (call.i64("group_size") != (*out)->size())
      return Status::error("group_size " + std::to_string(call.i64("group_size")) + " of group " + call.str("group") +
                           " but the communicator has " + std::to_string((*out)->size()) +
                           " members (a plan for another layout)");
    return Status::ok();
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
  // An activation's rows [first, first + count) only, where given (a row block's GEMM).
  Status half(int id, void *scratch, const void **out, int64_t first = 0, int64_t count = -1) {
    HalfType type = halfTypeOf(precision());
    if (!parameter_[id]) {
      floatToHalf(f(id) + first, scratch, count < 0 ? numel(id) : count, type, st_);
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

  // A 16-bit plan's GEMM: its operands as they are, its output (and bias) in their 16-bit type.
  Status nativeOperands(const KernelCall &call, int a, int b) {
    if (typeOf(a) != typeOf(b) || typeOf(a) != elementTypeOf(precision() == Precision::kBf16 ? plan::BF16 : plan::F16))
      return Status::error(std::string(call.decl.name) + ": operands of " + elementTypeName(typeOf(a)) + " and " +
                           elementTypeName(typeOf(b)) + " in a " + precisionName(precision()) + " plan (corrupt plan)");
    return Status::ok();
  }

  // y = x W (+ bias) over rows [begin, end) of x and y (tp_comm_overlap's row blocks; all rows
  // without them).
  Status linear(const KernelCall &call) {
    int x = call.in("input"), w = call.in("weight"), bias = call.in("bias"), y = call.out("result");
    int64_t k = dim(x, -1), n = dim(y, -1), begin, end;
    LOOM_RETURN_IF_ERROR(call.rowRange(numel(x) / k, &begin, &end));
    int64_t m = end - begin;
    Out xs = typed(x).at(begin * k), ys = typed(y).at(begin * n);
    bool transposeW = call.flag("transpose_weight");
    if (typeOf(x) != ElementType::kF32) {
      LOOM_RETURN_IF_ERROR(nativeOperands(call, x, w));
      LinearShape shape{m, k, n, transposeW, halfTypeOf(precision()),
                        bias >= 0 ? LinearEpilogue::kBias : LinearEpilogue::kNone};
      return e_.lt_->forward(shape, xs.data, ptr_[w], typed(bias), ys, st_);
    }
    float *xf = f(x) + begin * k, *yf = f(y) + begin * n;
    if (precision() == Precision::kFp32) {
      LOOM_RETURN_IF_ERROR(sgemm(m, k, n, xf, false, f(w), transposeW, yf));
      if (bias >= 0) addBroadcast(yf, f(bias), yf, m * n, n, st_);
      return Status::ok();
    }
    const void *x16, *w16;
    LOOM_RETURN_IF_ERROR(half(x, scratch_[0], &x16, begin * k, m * k));
    LOOM_RETURN_IF_ERROR(half(w, scratch_[0] + aligned(size_t(numel(x)) * 2), &w16));
    LinearShape shape{m, k, n, transposeW, halfTypeOf(precision()),
                      bias >= 0 ? LinearEpilogue::kBias : LinearEpilogue::kNone};
    return e_.lt_->forward(shape, x16, w16, bias >= 0 ? f(bias) : nullptr, yf, st_);
  }

  // dW = x^T g ([K,N]), or g^T x ([N,K]) for a transposed weight.
  Status weightGrad(const KernelCall &call) {
    int x = call.in("input"), g = call.in("grad"), dw = call.out("result");
    int64_t k = dim(x, -1), n = dim(g, -1), m = numel(x) / k;
    bool transposeW = call.flag("transpose_weight");
    if (typeOf(x) != ElementType::kF32) {
      LOOM_RETURN_IF_ERROR(nativeOperands(call, x, g));
      LinearShape shape{m, k, n, transposeW, halfTypeOf(precision()), LinearEpilogue::kNone};
      return e_.lt_->weightGrad(shape, ptr_[x], ptr_[g], typed(dw), /*accumulate=*/false, st_);
    }
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
  // A 16-bit plan's: g^T 1 as a GEMM with 16-bit operands (ones of g's type), fp32
  // accumulation, the result rounded once.
  Status biasGrad(const KernelCall &call) {
    int g = call.in("grad"), db = call.out("result");
    int64_t n = dim(g, -1), m = numel(g) / n;
    ElementType type = typeOf(g);
    LOOM_RETURN_IF_ERROR(e_.reserve(&e_.ones_, &e_.onesBytes_, size_t(m) * elementBytes(type)));
    if (e_.onesFilled_ != e_.onesBytes_ || e_.onesType_ != type) {  // filled once per allocation
      fillValue(Out(e_.ones_, type), int64_t(e_.onesBytes_ / elementBytes(type)), 1.0f, st_);
      e_.onesFilled_ = e_.onesBytes_, e_.onesType_ = type;
    }
    float alpha = 1.0f, beta = 0.0f;
    LOOM_RETURN_IF_ERROR(blasStatus(cublasSetStream(e_.blas_, st_), "set stream"));
    if (type != ElementType::kF32)
      return blasStatus(cublasGemmEx(e_.blas_, CUBLAS_OP_N, CUBLAS_OP_N, int(n), 1, int(m), &alpha, ptr_[g],
                                     cudaTypeOf(type), int(n), e_.ones_, cudaTypeOf(type), int(m), &beta, ptr_[db],
                                     cudaTypeOf(typeOf(db)), int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                        "GEMM (16-bit bias gradient)");
    return blasStatus(cublasSgemv(e_.blas_, CUBLAS_OP_N, int(n), int(m), &alpha, f(g), int(n),
                                  static_cast<const float *>(e_.ones_), 1, &beta, f(call.out("result")), 1),
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
  Status crossEntropyStats(const KernelCall &call) {
    int logits = call.in("logits"), labels = call.in("labels");
    int64_t cols = dim(logits, -1), tokens = numel(logits) / cols;
    if (!call.str("vocab_parallel_group").empty())
      return Status::error("cross_entropy over a vocab-parallel group: a plan of another version (corrupt plan)");
    float *stats = reinterpret_cast<float *>(scratch_[0]);
    crossEntropyLocalMax(typed(logits), stats, tokens, cols, 0, call.i64("valid_vocab"), st_);
    crossEntropyLocalSums(typed(logits), ints(labels), stats, stats + tokens, stats + 2 * tokens, tokens, cols, 0,
                          call.i64("valid_vocab"), st_);
    return Status::ok();
  }

  // A cross-entropy's outputs from its per-token statistics (host copies): the mean loss and,
  // when the plan keeps it for the backward, the log-sum-exp.
  Status lossAndStatistics(const KernelCall &call, const float *mx, const float *sums, const float *target,
                           const float *mask, int64_t tokens) {
    float loss = cpu::crossEntropyLoss(mx, sums, target, mask, tokens);
    LOOM_RETURN_IF_ERROR(
        cudaStatus(cudaMemcpyAsync(f(call.out("loss")), &loss, sizeof(float), cudaMemcpyHostToDevice, st_), "copy loss"));
    std::vector<float> lse;
    if (call.out("lse") >= 0) {
      lse.resize(size_t(tokens));
      cpu::crossEntropyLogSumExp(mx, sums, lse.data(), tokens);
      LOOM_RETURN_IF_ERROR(cudaStatus(
          cudaMemcpyAsync(f(call.out("lse")), lse.data(), tokens * sizeof(float), cudaMemcpyHostToDevice, st_),
          "copy lse"));
    }
    return cudaStatus(cudaStreamSynchronize(st_), "copy loss");  // `loss` and `lse` live on this stack frame
  }

  // The loss gradient per counted token of a cross-entropy backward: the incoming gradient
  // (or the loss_scale attribute) times fp16's loss scale over the loss mask's count.
  Status lossGradient(const KernelCall &call, int64_t tokens, float *gradOverCount) {
    int grad = call.in("grad"), mask = call.in("loss_mask");
    float g = float(call.f64("loss_scale"));
    std::vector<float> host;
    if (grad >= 0) {
      LOOM_RETURN_IF_ERROR(toHost(host, f(grad), 1));
      g = host[0];
    }
    double count = double(tokens);
    if (mask >= 0) {
      LOOM_RETURN_IF_ERROR(toHost(host, f(mask), tokens));
      count = 0;
      for (float m : host) count += m;
    }
    *gradOverCount = count > 0 ? float(g * ctx_.lossScale / count) : 0.0f;
    return Status::ok();
  }

  // Sequence parallelism's all-gather / reduce-scatter along `dim` (runtime/Executor.cpp has
  // the same layout on the CPU): member r's block is slice r of the large tensor along dim.
  // grad_reduce_in_bf16's 16-bit wire is the CPU backend's only (loomc refuses it for GPU
  // clusters); a plan that asks for it here is refused rather than reduced in fp32 silently.
  static Status refuseWireDtype(const KernelCall &call) {
    if (call.str("wire_dtype").empty()) return Status::ok();
    return Status::error(std::string(call.decl.name) + ": wire_dtype '" + call.str("wire_dtype") +
                         "' is not run by the CUDA backend (compile without parallel.grad_reduce_in_bf16)");
  }

  Status gatherOrScatter(const KernelCall &call) {
    LOOM_RETURN_IF_ERROR(refuseWireDtype(call));
    bool gather = call.decl.id == isa::OpId::kAllGather;
    int small = gather ? call.in("input") : call.out("result"), large = gather ? call.out("result") : call.in("input");
    NcclGroup *comm;
    LOOM_RETURN_IF_ERROR(groupOf(call, &comm));
    int64_t g = call.i64("group_size"), d = call.i64("dim"), n = numel(small);
    int64_t outer = 1, inner = 1;
    const plan::Buffer &sb = prog_.buffers(small);
    for (int k = 0; k < sb.shape_size(); ++k) (k < d ? outer : inner) *= sb.shape(k);
    ElementType type = typeOf(small);  // the message's type: 16-bit in a 16-bit plan
    size_t e = size_t(elementBytes(type));
    char *smallAt = static_cast<char *>(ptr_[small]), *largeAt = static_cast<char *>(ptr_[large]);
    // tp_comm_overlap with sequence parallelism: slices [a0, a1) before `dim` only.
    int64_t a0 = 0, a1 = outer;
    LOOM_RETURN_IF_ERROR(call.sliceRange(outer, numel(large) / std::max<int64_t>(1, dim(large, -1)), &a0, &a1));
    smallAt += size_t(a0 * inner) * e, largeAt += size_t(a0 * g * inner) * e;
    outer = a1 - a0, n = outer * inner;
    // reduce "avg": the sum's slice [smallAt, + n) divided by the group (what the CPU kernel does).
    auto average = [&] {
      if (call.str("reduce") == "avg") scaleInPlace(Out(smallAt, type), n, 1.0f / float(g), st_);
      return Status::ok();
    };
    if (outer == 1) {  // the blocks are already contiguous in rank order
      if (gather) return comm->allGather(smallAt, largeAt, n, st_, type);
      LOOM_RETURN_IF_ERROR(comm->reduceScatterSum(largeAt, smallAt, n, st_, type));
      return average();
    }
    char *blocks = scratch_[stream_];
    size_t row = size_t(inner) * e, wide = size_t(g) * row;
    if (gather) LOOM_RETURN_IF_ERROR(comm->allGather(smallAt, blocks, n, st_, type));
    for (int64_t r = 0; r < g; ++r) {
      cudaError_t err = gather ? cudaMemcpy2DAsync(largeAt + r * row, wide, blocks + r * n * e, row, row, size_t(outer),
                                                   cudaMemcpyDeviceToDevice, st_)
                               : cudaMemcpy2DAsync(blocks + r * n * e, row, largeAt + r * row, wide, row, size_t(outer),
                                                   cudaMemcpyDeviceToDevice, st_);
      LOOM_RETURN_IF_ERROR(cudaStatus(err, "re-laying out the blocks"));
    }
    if (gather) return Status::ok();
    LOOM_RETURN_IF_ERROR(comm->reduceScatterSum(blocks, smallAt, n, st_, type));
    return average();
  }

  // PTD-P's scatter (section 4.1): this member's slice r along `dim`, one strided copy.
  Status shard(const KernelCall &call) {
    NcclGroup *comm;
    LOOM_RETURN_IF_ERROR(groupOf(call, &comm));
    int64_t g = call.i64("group_size"), d = call.i64("dim");
    int y = call.out("result");
    int64_t outer = 1, inner = 1;
    const plan::Buffer &yb = prog_.buffers(y);
    for (int k = 0; k < yb.shape_size(); ++k) (k < d ? outer : inner) *= yb.shape(k);
    size_t row = size_t(inner) * elementBytes(typeOf(y));
    const char *input = static_cast<const char *>(ptr_[call.in("input")]);
    return cudaStatus(cudaMemcpy2DAsync(ptr_[y], row, input + comm->rank() * row, size_t(g) * row, row,
                                        size_t(outer), cudaMemcpyDeviceToDevice, st_),
                      "shard");
  }

  // Through the CUDA backend's kernel registry (cudaKernels(), below).
  Status instruction(const plan::Instruction &in, int stream) {
    stream_ = stream;
    size_t wideBytes = wideOutputBytes(prog_, in);
    wideBase_ = scratch_[0] + computeScratchBytes_ - wideBytes, wideUsed_ = 0;
    pendingWide_.clear();
    typeError_.clear();
    Status s = cudaKernels().run(*this, prog_, in);
    if (s.isOk() && !typeError_.empty()) s = Status::error(typeError_);
    if (s.isOk() && wideUsed_ > wideBytes)
      s = Status::error("fp32 outputs beyond their planned scratch (cuda::accumulatedInFp32 disagrees with the kernel)");
    for (const auto &[id, at] : pendingWide_)
      if (s.isOk()) convertElements(at, typed(id), numel(id), st_);
    return s;
  }

  // The CUDA kernels by declared op: each reads its operands by their declared names and its
  // attributes with their declared defaults (plan/InstructionSet.cpp).
  static void registerKernels(KernelRegistry<DeviceRun> &r) {
    using isa::OpId;
#define LOOM_KERNEL(op, member) r.add(OpId::op, [](DeviceRun &d, const KernelCall &k) { return d.member(k); })
    LOOM_KERNEL(kEmbedding, embedding);
    LOOM_KERNEL(kAddPosition, addPosition);
    LOOM_KERNEL(kLayerNorm, layerNorm);
    LOOM_KERNEL(kLinear, linear);
    LOOM_KERNEL(kAddBias, addBias);
    LOOM_KERNEL(kAdd, add);
    LOOM_KERNEL(kGelu, gelu);
    LOOM_KERNEL(kGeluGrad, geluGrad);
    LOOM_KERNEL(kAttention, attention);
    LOOM_KERNEL(kAttentionGrad, attention);
    LOOM_KERNEL(kGroupedAttention, groupedAttention);
    LOOM_KERNEL(kGroupedAttentionGrad, groupedAttention);
    LOOM_KERNEL(kRmsNorm, rmsNorm);
    LOOM_KERNEL(kRmsNormGrad, rmsNormGrad);
    LOOM_KERNEL(kRotary, rotaryKernel);
    LOOM_KERNEL(kSwiglu, swiglu);
    LOOM_KERNEL(kSwigluGrad, swigluGrad);
    LOOM_KERNEL(kDropout, dropout);
    LOOM_KERNEL(kIdentity, identity);
    LOOM_KERNEL(kCrossEntropy, crossEntropy);
    LOOM_KERNEL(kCrossEntropyGrad, crossEntropyGrad);
    LOOM_KERNEL(kCrossEntropyMax, crossEntropyMax);
    LOOM_KERNEL(kCrossEntropySums, crossEntropySums);
    LOOM_KERNEL(kCrossEntropyLoss, crossEntropyLoss);
    LOOM_KERNEL(kWeightGrad, weightGrad);
    LOOM_KERNEL(kBiasGrad, biasGrad);
    LOOM_KERNEL(kLayerNormGrad, layerNormGrad);
    LOOM_KERNEL(kEmbeddingGrad, embeddingGrad);
    LOOM_KERNEL(kPositionGrad, positionGrad);
    LOOM_KERNEL(kAllReduce, allReduce);
    LOOM_KERNEL(kAllGather, gatherOrScatter);
    LOOM_KERNEL(kReduceScatter, gatherOrScatter);
    LOOM_KERNEL(kSend, message);
    LOOM_KERNEL(kRecv, message);
    LOOM_KERNEL(kShard, shard);
    LOOM_KERNEL(kAccumulate, accumulate);
    LOOM_KERNEL(kFill, fill);
    LOOM_KERNEL(kScale, scale);
    LOOM_KERNEL(kCast, cast);
    LOOM_KERNEL(kSumSquares, optimizerOp);
    LOOM_KERNEL(kAdamw, optimizerOp);
    LOOM_KERNEL(kGradNorm, gradNorm);
    LOOM_KERNEL(kTanh, tanh);
    LOOM_KERNEL(kTanhGrad, tanhGrad);
    LOOM_KERNEL(kAddTokenType, tokenType);
    LOOM_KERNEL(kTokenTypeGrad, tokenType);
#undef LOOM_KERNEL
  }

  Status embedding(const KernelCall &k) {
    int tok = k.in("tokens"), w = k.in("word");
    int64_t rows = k.dim(w, 0), hidden = k.dim(w, 1);
    embeddingForward(ints(tok), typed(w), typed(k.in("position")), typed(k.out("result")), k.numel(tok), k.dim(tok, 1),
                     hidden, shardStart(k.str("vocab_parallel_group"), rows), rows, st_);
    return Status::ok();
  }
  Status addPosition(const KernelCall &k) {
    int x = k.in("input");
    int64_t first = shardStart(k.str("sequence_parallel_group"), k.dim(x, 1)), hidden = k.dim(x, 2);
    addBroadcast(typed(x), typed(k.in("position")).at(first * hidden), typed(k.out("result")), k.numel(x),
                 k.dim(x, 1) * hidden, st_);
    return Status::ok();
  }
  Status layerNorm(const KernelCall &k) {
    int x = k.in("input");
    int64_t n = k.dim(x, -1);
    layerNormForward(typed(x), typed(k.in("gamma")), typed(k.in("beta")), typed(k.out("result")), k.numel(x) / n, n,
                     float(k.f64("epsilon")), st_);
    return Status::ok();
  }
  Status addBias(const KernelCall &k) {
    addBroadcast(typed(k.in("input")), typed(k.in("bias")), typed(k.out("result")), k.numel(k.in("input")),
                 k.numel(k.in("bias")), st_);
    return Status::ok();
  }
  Status add(const KernelCall &k) {
    int64_t n = k.numel(k.in("lhs"));
    addBroadcast(typed(k.in("lhs")), typed(k.in("rhs")), typed(k.out("result")), n, n, st_);
    return Status::ok();
  }
  Status gelu(const KernelCall &k) {
    geluForward(typed(k.in("input")), typed(k.out("result")), k.numel(k.in("input")), st_);
    return Status::ok();
  }
  Status geluGrad(const KernelCall &k) {
    geluBackward(typed(k.in("input")), typed(k.in("grad")), typed(k.out("result")), k.numel(k.in("input")), st_);
    return Status::ok();
  }
  // attention and attention_grad.
  Status attention(const KernelCall &k) {
    bool fwd = k.decl.id == isa::OpId::kAttention;
    int qkv = k.in("qkv");
    float *lse = fwd ? fOrNull(k.out("lse")) : f(k.in("lse"));
    Out x = typed(qkv), y = typed(k.out("result"));
    cpu::AttentionShape shape = attentionShapeOf(prog_, k.instruction);
    if (shape.heads < 1 || k.dim(qkv, 2) % (3 * shape.heads) != 0)
      return Status::error("attention: bad num_heads (corrupt plan)");
    shape.dropout = ctx_.training ? float(k.f64("dropout")) : 0.0f;
    shape.seed = ctx_.seed;
    shape.stream = dropoutStream(k.i64("stream"), k.str("rank_distinct_dropout"));
    const float *m = fOrNull(k.in("key_mask"));
    if (useFlash(shape, precision(), e_.options_.attention))
      return fwd ? flashAttentionForward(x, m, y, lse, shape, st_)
                 : flashAttentionBackward(x, m, typed(k.in("grad")), y, shape, scratch_[0], st_);
    return fwd ? attentionForward(e_.blas_, precision(), x, m, y, lse, shape, scratch_[0], st_)
               : attentionBackward(e_.blas_, precision(), x, m, typed(k.in("grad")), lse, y, shape, scratch_[0], st_);
  }
  // grouped_attention and grouped_attention_grad.
  Status groupedAttention(const KernelCall &k) {
    cpu::GroupedAttentionShape shape;
    LOOM_RETURN_IF_ERROR(groupedAttentionShape(
        prog_, k.instruction, [&](const std::string &g, int64_t rows) { return shardStart(g, rows); }, &shape));
    shape.dropout = ctx_.training ? float(k.f64("dropout")) : 0.0f;
    shape.seed = ctx_.seed;
    shape.stream = dropoutStream(k.i64("stream"), k.str("rank_distinct_dropout"));
    if (k.decl.id == isa::OpId::kGroupedAttention)
      return groupedAttentionForward(e_.blas_, precision(), typed(k.in("q")), typed(k.in("k")), typed(k.in("v")),
                                     typed(k.out("result")), fOrNull(k.out("lse")), shape, scratch_[0], st_);
    return groupedAttentionBackward(e_.blas_, precision(), typed(k.in("q")), typed(k.in("k")), typed(k.in("v")),
                                    typed(k.in("grad")), f(k.in("lse")), typed(k.out("grad_q")), wide(k.out("grad_k")),
                                    wide(k.out("grad_v")), shape, scratch_[0], st_);
  }
  Status rmsNorm(const KernelCall &k) {
    int x = k.in("input");
    int64_t n = k.dim(x, -1);
    rmsNormForward(typed(x), typed(k.in("gamma")), typed(k.out("result")), k.numel(x) / n, n, float(k.f64("epsilon")),
                   st_);
    return Status::ok();
  }
  Status rmsNormGrad(const KernelCall &k) {
    int x = k.in("input");
    int64_t n = k.dim(x, -1);
    rmsNormBackward(typed(x), typed(k.in("gamma")), typed(k.in("grad")), typed(k.out("grad_input")), wide(k.out("grad_gamma")),
                    k.numel(x) / n, n, float(k.f64("epsilon")), st_);
    return Status::ok();
  }
  Status rotaryKernel(const KernelCall &k) {
    int x = k.in("input");
    int64_t hd = k.i64("head_dim");
    if (hd < 2 || hd % 2 || k.dim(x, 2) % hd) return Status::error("rotary: bad head_dim (corrupt plan)");
    rotary(typed(x), typed(k.out("result")), k.dim(x, 0), k.dim(x, 1), k.dim(x, 2) / hd, hd, float(k.f64("theta")),
           k.flag("inverse"), st_);
    return Status::ok();
  }
  Status swiglu(const KernelCall &k) {
    swigluForward(typed(k.in("gate")), typed(k.in("up")), typed(k.out("result")), k.numel(k.in("gate")), st_);
    return Status::ok();
  }
  Status swigluGrad(const KernelCall &k) {
    swigluBackward(typed(k.in("gate")), typed(k.in("up")), typed(k.in("grad")), typed(k.out("grad_gate")),
                   typed(k.out("grad_up")),
                   k.numel(k.in("gate")), st_);
    return Status::ok();
  }
  Status dropout(const KernelCall &k) {
    dropoutForward(typed(k.in("input")), typed(k.out("result")), k.numel(k.in("input")),
                   ctx_.training ? float(k.f64("rate")) : 0.0f, ctx_.seed,
                   dropoutStream(k.i64("stream"), k.str("rank_distinct")), st_);
    return Status::ok();
  }
  Status identity(const KernelCall &k) {
    int x = k.in("input");
    return cudaStatus(cudaMemcpyAsync(ptr_[k.out("result")], ptr_[x], k.numel(x) * elementBytes(typeOf(x)),
                                      cudaMemcpyDeviceToDevice, st_),
                      "copy");
  }
  Status crossEntropy(const KernelCall &k) {  // -> loss[, lse]
    int64_t tokens = k.numel(k.in("logits")) / k.dim(k.in("logits"), -1);
    LOOM_RETURN_IF_ERROR(crossEntropyStats(k));
    const float *stats = reinterpret_cast<const float *>(scratch_[0]);
    std::vector<float> host, mask;
    LOOM_RETURN_IF_ERROR(toHost(host, stats, 3 * tokens));
    int maskId = k.in("loss_mask");
    if (maskId >= 0) LOOM_RETURN_IF_ERROR(toHost(mask, f(maskId), tokens));
    return lossAndStatistics(k, host.data(), host.data() + tokens, host.data() + 2 * tokens,
                             maskId >= 0 ? mask.data() : nullptr, tokens);
  }
  // (logits, labels, lse[, grad][, mask]): the softmax from the kept lse.
  Status crossEntropyGrad(const KernelCall &k) {
    int logits = k.in("logits");
    int64_t cols = k.dim(logits, -1), tokens = k.numel(logits) / cols;
    if (k.numel(k.in("lse")) != tokens) return Status::error("cross_entropy_grad: wrong lse (corrupt plan)");
    float gradOverCount = 0;
    LOOM_RETURN_IF_ERROR(lossGradient(k, tokens, &gradOverCount));
    crossEntropyBackward(typed(logits), ints(k.in("labels")), fOrNull(k.in("loss_mask")), f(k.in("lse")), gradOverCount,
                         typed(k.out("result")), tokens, cols, shardStart(k.str("vocab_parallel_group"), cols),
                         k.i64("valid_vocab"), st_);
    return Status::ok();
  }
  Status crossEntropyMax(const KernelCall &k) {  // vocab-parallel cross-entropy, step by step (see Lowering)
    int logits = k.in("logits"), mx = k.out("max");
    int64_t cols = k.dim(logits, -1), tokens = k.numel(logits) / cols;
    if (k.numel(mx) != tokens) return Status::error("cross_entropy_max: wrong output (corrupt plan)");
    crossEntropyLocalMax(typed(logits), f(mx), tokens, cols, shardStart(k.str("vocab_parallel_group"), cols),
                         k.i64("valid_vocab"), st_);
    return Status::ok();
  }
  Status crossEntropySums(const KernelCall &k) {  // (logits, labels, max) -> [2, tokens]
    int logits = k.in("logits"), sums = k.out("sums");
    int64_t cols = k.dim(logits, -1), tokens = k.numel(logits) / cols;
    if (k.numel(sums) != 2 * tokens) return Status::error("cross_entropy_sums: wrong output (corrupt plan)");
    crossEntropyLocalSums(typed(logits), ints(k.in("labels")), f(k.in("max")), f(sums), f(sums) + tokens, tokens, cols,
                          shardStart(k.str("vocab_parallel_group"), cols), k.i64("valid_vocab"), st_);
    return Status::ok();
  }
  Status crossEntropyLoss(const KernelCall &k) {  // (max, sums[, mask]) -> the mean loss[, lse]
    int64_t tokens = k.numel(k.in("max"));
    std::vector<float> mx, sums, mask;
    LOOM_RETURN_IF_ERROR(toHost(mx, f(k.in("max")), tokens));
    LOOM_RETURN_IF_ERROR(toHost(sums, f(k.in("sums")), 2 * tokens));
    int maskId = k.in("loss_mask");
    if (maskId >= 0) LOOM_RETURN_IF_ERROR(toHost(mask, f(maskId), tokens));
    return lossAndStatistics(k, mx.data(), sums.data(), sums.data() + tokens, maskId >= 0 ? mask.data() : nullptr,
                             tokens);
  }
  Status layerNormGrad(const KernelCall &k) {
    int x = k.in("input");
    int64_t n = k.dim(x, -1);
    layerNormBackward(typed(x), typed(k.in("gamma")), typed(k.in("grad")), typed(k.out("grad_input")),
                      wide(k.out("grad_gamma")), wide(k.out("grad_beta")), k.numel(x) / n, n, float(k.f64("epsilon")), st_);
    return Status::ok();
  }
  Status embeddingGrad(const KernelCall &k) {
    int y = k.out("result"), tok = k.in("tokens");
    int64_t rows = k.dim(y, 0), hidden = k.dim(y, 1);
    embeddingBackward(ints(tok), typed(k.in("grad")), wide(y), k.numel(tok), hidden,
                      shardStart(k.str("vocab_parallel_group"), rows), rows, st_);
    return Status::ok();
  }
  Status tanh(const KernelCall &k) {
    tanhForward(typed(k.in("input")), typed(k.out("result")), k.numel(k.in("input")), st_);
    return Status::ok();
  }
  Status tanhGrad(const KernelCall &k) {
    tanhBackward(typed(k.in("input")), typed(k.in("grad")), typed(k.out("result")), k.numel(k.in("input")), st_);
    return Status::ok();
  }
  // add_token_type and token_type_grad: the rank's rows of each sample (its slice of the
  // sequence under sequence parallelism) against the whole samples' token types.
  Status tokenType(const KernelCall &k) {
    bool fwd = k.decl.id == isa::OpId::kAddTokenType;
    int x = fwd ? k.in("input") : k.in("grad"), types = k.in("token_types");
    int table = fwd ? k.in("table") : k.out("result");
    int64_t batch = k.dim(x, 0), rows = k.dim(x, 1), hidden = k.dim(x, 2), seq = k.dim(types, 1);
    int64_t first = shardStart(k.str("sequence_parallel_group"), rows), tableRows = k.dim(table, 0);
    if (k.dim(types, 0) != batch || first + rows > seq || k.dim(table, 1) != hidden)
      return Status::error(std::string(k.decl.name) + ": token_types [" + std::to_string(k.dim(types, 0)) + ", " +
                           std::to_string(seq) + "] do not cover rows " + std::to_string(first) + ".." +
                           std::to_string(first + rows) + " of " + std::to_string(batch) + " samples (corrupt plan)");
    if (fwd)
      addTokenType(typed(x), ints(types), typed(table), typed(k.out("result")), batch, rows, seq, first, hidden,
                   tableRows, st_);
    else
      tokenTypeGrad(ints(types), typed(x), typed(table), batch, rows, seq, first, hidden, tableRows, st_);
    return Status::ok();
  }
  Status positionGrad(const KernelCall &k) {
    int g = k.in("grad"), y = k.out("result");
    int64_t first = shardStart(k.str("sequence_parallel_group"), k.dim(g, 1)), hidden = k.dim(g, 2);
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(ptr_[y], 0, k.numel(y) * elementBytes(typeOf(y)), st_),
                                    "zero the position gradient"));
    sumRows(typed(g), typed(y).at(first * hidden), k.dim(g, 0), k.dim(g, 1) * hidden, st_);
    return Status::ok();
  }
  Status allReduce(const KernelCall &k) {
    LOOM_RETURN_IF_ERROR(refuseWireDtype(k));
    const plan::Instruction &in = k.instruction;
    NcclGroup *comm;
    LOOM_RETURN_IF_ERROR(group(k.str("group"), &comm));
    std::vector<NcclGroup::Part> parts;  // a data-parallel bucket: one grouped call, no packing
    if (in.inputs_size() == 1) {  // one tensor, or tp_comm_overlap's block of its rows
      int x = in.inputs(0), y = in.outputs(0);
      int64_t cols = std::max<int64_t>(1, prog_.buffers(y).shape_size() > 0 ? dim(y, -1) : 1), begin, end;
      LOOM_RETURN_IF_ERROR(k.rowRange(k.numel(y) / cols, &begin, &end));
      parts.push_back({typed(x).at(begin * cols).data, typed(y).at(begin * cols).data, (end - begin) * cols, typeOf(x)});
      return comm->allReduce(parts, reduceOpOf(k.str("reduce")), st_);
    }
    for (int j = 0; j < in.inputs_size(); ++j)
      parts.push_back({ptr_[in.inputs(j)], ptr_[in.outputs(j)], k.numel(in.inputs(j)), typeOf(in.inputs(j))});
    return comm->allReduce(parts, reduceOpOf(k.str("reduce")), st_);
  }
  Status message(const KernelCall &k) {  // send or recv
    PipelineLinks *links = e_.options_.links;
    if (!links) return Status::error("a pipeline message but the CUDA executor has no pipeline links");
    int peer = int(k.i64("peer"));
    if (k.decl.id == isa::OpId::kSend) return links->send(peer, typed(k.in("input")), k.numel(k.in("input")), st_);
    return links->recv(peer, typed(k.out("result")), k.numel(k.out("result")), st_);
  }
  Status accumulate(const KernelCall &k) {  // gradient or loss accumulation, in place
    int y = k.out("accumulator");
    addBroadcast(typed(y), typed(k.in("input")), typed(y), k.numel(y), k.numel(y), st_);
    return Status::ok();
  }
  Status fill(const KernelCall &k) {
    fillValue(typed(k.out("output")), k.numel(k.out("output")), float(k.f64("value")), st_);
    return Status::ok();
  }
  Status scale(const KernelCall &k) {
    int x = k.in("input"), y = k.out("output");
    if (typeOf(x) != typeOf(y)) return Status::error("scale between types (corrupt plan)");
    if (ptr_[y] != ptr_[x])
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(ptr_[y], ptr_[x], k.numel(y) * elementBytes(typeOf(y)),
                                                      cudaMemcpyDeviceToDevice, st_),
                                      "copy"));
    scaleInPlace(typed(y), k.numel(y), float(k.f64("factor")), st_);
    return Status::ok();
  }
  // Between any two of fp32, bf16 and fp16 (the optimizer's fp32 masters into the 16-bit
  // weights a 16-bit plan computes with): rounded to nearest even, or widened exactly.
  Status cast(const KernelCall &k) {
    int x = k.in("input"), y = k.out("output");
    if (typeOf(x) != typeOf(y)) return convertElements(typed(x), typed(y), k.numel(y), st_), Status::ok();
    if (ptr_[y] != ptr_[x])
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(ptr_[y], ptr_[x], k.numel(y) * elementBytes(typeOf(y)),
                                                      cudaMemcpyDeviceToDevice, st_),
                                      "copy"));
    return Status::ok();
  }
  Status gradNorm(const KernelCall &k) {
    std::vector<float> squares, clip, scale;
    LOOM_RETURN_IF_ERROR(toHost(squares, f(k.in("squares")), 1));
    LOOM_RETURN_IF_ERROR(toHost(clip, f(k.in("clip_grad")), 1));
    LOOM_RETURN_IF_ERROR(toHost(scale, f(k.in("loss_scale")), 1));
    float result[2];
    cpu::gradNorm(squares[0], clip[0], scale[0], &result[0], &result[1]);
    int outs[2] = {k.out("norm"), k.out("factor")};
    for (int j = 0; j < 2; ++j)
      LOOM_RETURN_IF_ERROR(cudaStatus(
          cudaMemcpyAsync(f(outs[j]), &result[j], sizeof(float), cudaMemcpyHostToDevice, st_), "copy the norm"));
    return cudaStatus(cudaStreamSynchronize(st_), "copy the norm");  // `result` lives on this stack frame
  }

  // The optimizer over the flat buffer, segment by segment (as the CPU executor's): the sum of
  // squares in double on the device, AdamW per segment with its decay flag.
  // sum_squares and adamw.
  Status optimizerOp(const KernelCall &call) {
    std::vector<planattr::FlatSegment> segments;
    if (!planattr::decodeSegments(call.str("segments"), &segments))
      return Status::error(std::string(call.decl.name) + ": malformed segments attribute (corrupt plan)");
    std::string shardGroup = call.str("shard_group");
    bool adam = call.decl.id == isa::OpId::kAdamw;
    int64_t shard = numel(call.in("grads"));  // the shard (ZeRO-1) or the whole flat buffer
    int64_t begin = call.i64("flat_offset") + (shardGroup.empty() ? 0 : shardStart(shardGroup, shard)), end = begin + shard;
    auto forEach = [&](auto body) {  // body(local offset, elements, segment)
      planattr::forEachSegmentIn(segments, begin, shard, [&](int64_t lo, int64_t hi, const planattr::FlatSegment &sg) {
        body(lo, hi - lo, sg);
      });
    };
    if (!adam) {
      std::string replicated = call.str("replicated_group");
      bool countReplicated = replicated.empty() || !ctx_.collectives || ctx_.collectives->rankIn(replicated) == 0;
      double *sum = reinterpret_cast<double *>(scratch_[0]);
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(sum, 0, sizeof(double), st_), "zero the sum of squares"));
      const float *g = f(call.in("grads"));
      forEach([&](int64_t at, int64_t n, const planattr::FlatSegment &sg) {
        if (sg.norm || (sg.normAtTp0 && countReplicated)) accumulateSquares(g + at, n, sum, st_);
      });
      std::vector<double> host;
      LOOM_RETURN_IF_ERROR(toHost(host, sum, 1));
      float value = float(host[0]);
      LOOM_RETURN_IF_ERROR(cudaStatus(
          cudaMemcpyAsync(f(call.out("squares")), &value, sizeof(float), cudaMemcpyHostToDevice, st_), "copy the squares"));
      return cudaStatus(cudaStreamSynchronize(st_), "copy the squares");
    }
    // params: exactly the updated elements (ZeRO-1's buckets, in place) or the whole flat buffer.
    bool exact = numel(call.in("params")) == shard;
    if (!exact && numel(call.in("params")) < end) return Status::error("adamw: shard outside the parameters (corrupt plan)");
    // The hyperparameters: grad_scale, learning_rate, adam_step, weight_decay, beta1, beta2, eps.
    float h[7];
    const char *hyper[7] = {"grad_scale", "learning_rate", "adam_step", "weight_decay", "adam_beta1", "adam_beta2",
                            "adam_eps"};
    for (int k = 0; k < 7; ++k) {
      std::vector<float> v;
      LOOM_RETURN_IF_ERROR(toHost(v, f(call.in(hyper[k])), 1));
      h[k] = v[0];
    }
    float *param = f(call.in("params")) + (exact ? 0 : begin), *grad = f(call.in("grads")), *out = f(call.out("updated"));
    if (out != param)
      LOOM_RETURN_IF_ERROR(cudaStatus(
          cudaMemcpyAsync(out, param, size_t(shard) * sizeof(float), cudaMemcpyDeviceToDevice, st_), "copy the shard"));
    if (h[0] == 0.0f) return Status::ok();      // skipped: non-finite gradients
    if (h[0] != 1.0f) scaleInPlace(grad, shard, h[0], st_);  // clipping and loss-scale removal
    forEach([&](int64_t at, int64_t n, const planattr::FlatSegment &sg) {
      adamwUpdate(out + at, grad + at, f(call.in("adam_m")) + at, f(call.in("adam_v")) + at, n, h[1], h[4], h[5], h[6], h[3],
                  int64_t(h[2]), sg.decay, st_);
    });
    e_.parametersChanged();  // the 16-bit copies are remade on next use
    return Status::ok();
  }

  CudaExecutor &e_;
  const plan::Program &prog_;
  const ExecutionContext &ctx_;
  cudaStream_t st_ = nullptr;  // the current instruction's stream
  int stream_ = 0;             // and its index
  char *scratch_[4] = {};
  std::vector<void *> ptr_;
  std::vector<bool> parameter_;
  Precision precision_;
  size_t computeScratchBytes_;
  // The current instruction's fp32 outputs in scratch (wide()) and an fp32 read of a 16-bit
  // buffer (f()).
  char *wideBase_ = nullptr;
  size_t wideUsed_ = 0;
  std::vector<std::pair<int, float *>> pendingWide_;
  std::string typeError_;
};

const KernelRegistry<DeviceRun> &cudaKernels() {
  static const KernelRegistry<DeviceRun> registry = [] {
    KernelRegistry<DeviceRun> r("CUDA");
    DeviceRun::registerKernels(r);
    return r;
  }();
  return registry;
}

Status checkCudaKernels(const plan::Program &program) {
  LOOM_RETURN_IF_ERROR(cudaKernels().covers(program));
  // Context parallelism's chunked positions and attention (the CPU kernels' ContextChunks) have
  // no CUDA kernels: such an instruction would run as if the rank held the whole sequence.
  for (int i = 0; i < program.instructions_size(); ++i) {
    const plan::Instruction &in = program.instructions(i);
    if (!planattr::str(in, "context_parallel_group").empty())
      return Status::error(program.name() + ": instruction " + std::to_string(i) + ": the CUDA backend has no " +
                           "context-parallel kernel for op '" + in.op() + "' (context parallelism runs on CPU clusters)");
  }
  return Status::ok();
}

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
  // (a 16-bit plan's GEMMs need cuBLASLt whatever --precision said: reserveFor makes it then)
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
  if (!lt_ && programPrecision(program, options_.precision) != Precision::kFp32)
    LOOM_RETURN_IF_ERROR(LtLinear::create(kLtWorkspaceBytes, &lt_));
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
      LOOM_RETURN_IF_ERROR(reserve(&ones_, &onesBytes_, rows * size_t(planattr::elementBytes(g.dtype()))));
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
  LOOM_RETURN_IF_ERROR(checkProgramStructure(program));
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
  LOOM_RETURN_IF_ERROR(checkProgramStructure(program));
  if (int(args.size()) != program.arguments_size())
    return Status::error(program.name() + ": expected " + std::to_string(program.arguments_size()) + " arguments, got " +
                         std::to_string(args.size()));
  parametersChanged();  // the uploads below reuse the same addresses with new values
  // Arguments: checked as the CPU executor checks them, then copied up back to back (host
  // tensors are fp32 or int32: a 16-bit argument is uploaded in fp32 and rounded beside it).
  // 16-bit results are widened into fp32 staging before they come down.
  auto bytesOf = [&](const plan::Buffer &b, int64_t elementBytes) { return aligned(size_t(planattr::numel(b) * elementBytes)); };
  size_t argumentBytes = 0, resultBytes = 0;
  for (int i = 0; i < program.arguments_size(); ++i) {
    const plan::Buffer &b = program.buffers(program.arguments(i).buffer());
    if (planattr::elementBytes(b.dtype()) == 2) {  // an fp32 host tensor, rounded on the device
      ArgumentView wide = ArgumentView::of(*args[i]);
      if (args[i]->isInt || wide.count != planattr::numel(b))
        return Status::error(program.name() + ": argument '" + program.arguments(i).name() + "' (" +
                             plan::DType_Name(b.dtype()) + ") needs " + std::to_string(planattr::numel(b)) +
                             " floats");
    } else {
      LOOM_RETURN_IF_ERROR(checkArgument(program, i, *args[i]));
    }
    argumentBytes += bytesOf(b, 4) + (planattr::elementBytes(b.dtype()) == 2 ? bytesOf(b, 2) : 0);
  }
  for (const plan::Binding &r : program.results()) resultBytes += bytesOf(program.buffers(r.buffer()), 4);
  LOOM_RETURN_IF_ERROR(reserve(&arguments_, &argumentBytes_, argumentBytes + resultBytes + 256));
  std::vector<const void *> device;
  char *at = static_cast<char *>(arguments_);
  for (int i = 0; i < program.arguments_size(); ++i) {
    const void *host = args[i]->isInt ? static_cast<const void *>(args[i]->ints.data())
                                      : static_cast<const void *>(args[i]->data.data());
    const plan::Buffer &b = program.buffers(program.arguments(i).buffer());
    size_t bytes = size_t(planattr::numel(b)) * 4;
    LOOM_RETURN_IF_ERROR(
        cudaStatus(cudaMemcpyAsync(at, host, bytes, cudaMemcpyHostToDevice, streams_[0]), "argument copy"));
    device.push_back(at);
    at += aligned(bytes);
    if (planattr::elementBytes(b.dtype()) == 2) {
      convertElements(static_cast<const float *>(device.back()), Out(at, elementTypeOf(b.dtype())), planattr::numel(b),
                      streams_[0]);
      device.back() = at;
      at += bytesOf(b, 2);
    }
  }
  std::vector<char *> staging;
  for (const plan::Binding &r : program.results()) staging.push_back(at), at += bytesOf(program.buffers(r.buffer()), 4);
  results.assign(program.results_size(), HostTensor{});
  auto copyDown = [&](int i, In data, int64_t count, cudaStream_t s) {
    const plan::Buffer &b = program.buffers(program.results(i).buffer());
    results[i].shape.assign(b.shape().begin(), b.shape().end());
    results[i].data.resize(size_t(count));
    const void *wide = data.data;
    if (data.type != ElementType::kF32) {
      convertElements(data, reinterpret_cast<float *>(staging[size_t(i)]), count, s);
      wide = staging[size_t(i)];
    }
    return cudaStatus(cudaMemcpyAsync(results[i].data.data(), wide, size_t(count) * sizeof(float),
                                      cudaMemcpyDeviceToHost, s),
                      "result copy");
  };
  LOOM_RETURN_IF_ERROR(runOnDevice(program, device, copyDown, ctx));
  return cudaStatus(cudaStreamSynchronize(streams_[0]), program.name());
}

}  // namespace loom::cuda
