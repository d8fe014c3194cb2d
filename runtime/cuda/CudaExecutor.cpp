#include "runtime/cuda/CudaExecutor.h"

#include <cstring>
#include <string>

#include "runtime/PlanAttributes.h"
#include "runtime/cpu/Kernels.h"
#include "runtime/cuda/Attention.h"
#include "runtime/cuda/CudaKernels.h"

namespace loom::cuda {
namespace {

using planattr::f64;
using planattr::flag;
using planattr::i64;
using planattr::str;

Status cudaStatus(cudaError_t err, const std::string &what) {
  if (err == cudaSuccess) return Status::ok();
  return Status::error("CUDA " + what + ": " + cudaGetErrorString(err));
}

Status blasStatus(cublasStatus_t st, const std::string &what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status::error("cuBLAS " + what + ": status " + std::to_string(int(st)));
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// One program invocation on the device (the buffers' addresses and the op dispatch).
class DeviceRun {
 public:
  DeviceRun(const plan::Program &p, const ExecutionContext &c, cudaStream_t s, cublasHandle_t blas, void *scratch)
      : prog_(p), ctx_(c), s_(s), blas_(blas), scratch_(static_cast<float *>(scratch)), ptr_(p.buffers_size()) {}

  void bind(int buffer, void *address) { ptr_[buffer] = address; }
  const void *address(int buffer) const { return ptr_[buffer]; }

  Status execute() {
    for (int i = 0; i < prog_.instructions_size(); ++i) {
      const plan::Instruction &in = prog_.instructions(i);
      Status st = instruction(in);
      if (st.isOk()) st = cudaStatus(cudaGetLastError(), "kernel launch");
      if (!st.isOk())
        return Status::error(prog_.name() + " instruction " + std::to_string(i) + " (" + in.op() + "): " + st.message());
    }
    return Status::ok();
  }

  static int64_t scratchFloats(const plan::Program &p) {  // cross-entropy statistics: 3 per token
    int64_t most = 0;
    for (const plan::Instruction &in : p.instructions())
      if (in.op() == "cross_entropy" || in.op() == "cross_entropy_grad") {
        const plan::Buffer &logits = p.buffers(in.inputs(0));
        most = std::max(most, 3 * planattr::numel(logits) / planattr::dim(logits, -1));
      }
    return most;
  }

 private:
  float *f(int id) { return static_cast<float *>(ptr_[id]); }
  int32_t *ints(int id) { return static_cast<int32_t *>(ptr_[id]); }
  int64_t numel(int id) { return planattr::numel(prog_.buffers(id)); }
  int64_t dim(int id, int k) { return planattr::dim(prog_.buffers(id), k); }
  int64_t shardStart(const std::string &group, int64_t rows) { return loom::shardStart(ctx_.collectives, group, rows); }
  uint64_t dropoutStream(int64_t stream, bool rankDistinct) {
    return loom::dropoutStream(ctx_.collectives, stream, rankDistinct);
  }

  // Row-major c[M,N] = op(a)[M,K] op(b)[K,N] (+ c when accumulate) through column-major
  // SGEMM: c^T = op(b)^T op(a)^T (a stored [K,M] when transposeA, b stored [N,K] when transposeB).
  Status gemm(int64_t m, int64_t k, int64_t n, const float *a, bool transposeA, const float *b, bool transposeB,
              float *c, bool accumulate) {
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return blasStatus(cublasSgemm(blas_, transposeB ? CUBLAS_OP_T : CUBLAS_OP_N, transposeA ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  int(n), int(m), int(k), &alpha, b, int(transposeB ? k : n), a,
                                  int(transposeA ? m : k), &beta, c, int(n)),
                      "sgemm");
  }

  template <typename T>
  Status toHost(std::vector<T> &host, const T *device, int64_t count) {
    host.resize(size_t(count));
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost, s_),
                                    "copy to host"));
    return cudaStatus(cudaStreamSynchronize(s_), "synchronize");
  }

  // Per-token max, sum of exponentials and target logit in scratch_ (3 x tokens). Over a
  // vocab-parallel group they need all-reduces, which this executor does not do yet.
  Status crossEntropyStats(const plan::Instruction &in, int64_t *colStart) {
    if (!str(in, "vocab_parallel_group").empty())  // the CPU executor's all-reduces of the statistics
      return Status::error("vocab-parallel cross-entropy needs NCCL all-reduces (not wired into the CUDA executor yet)");
    int logits = in.inputs(0), labels = in.inputs(1);
    int64_t cols = dim(logits, -1), tokens = numel(logits) / cols;
    *colStart = 0;
    crossEntropyLocalMax(f(logits), scratch_, tokens, cols, 0, i64(in, "valid_vocab"), s_);
    crossEntropyLocalSums(f(logits), ints(labels), scratch_, scratch_ + tokens, scratch_ + 2 * tokens, tokens, cols, 0,
                          i64(in, "valid_vocab"), s_);
    return Status::ok();
  }

  Status instruction(const plan::Instruction &in) {
    const std::string &op = in.op();
    auto out = [&](int k = 0) { return in.outputs(k); };
    auto inp = [&](int k) { return in.inputs(k); };
    if (op == "embedding") {
      int tok = inp(0), w = inp(1), pos = optionalInput(in, 2);
      int64_t rows = dim(w, 0), hidden = dim(w, 1);
      embeddingForward(ints(tok), f(w), pos >= 0 ? f(pos) : nullptr, f(out()), numel(tok), dim(tok, 1), hidden,
                       shardStart(str(in, "vocab_parallel_group"), rows), rows, s_);
    } else if (op == "add_position") {
      int64_t first = shardStart(str(in, "sequence_parallel_group"), dim(inp(0), 1)), hidden = dim(inp(0), 2);
      addBroadcast(f(inp(0)), f(inp(1)) + first * hidden, f(out()), numel(inp(0)), dim(inp(0), 1) * hidden, s_);
    } else if (op == "layer_norm") {
      int64_t n = dim(inp(0), -1);
      layerNormForward(f(inp(0)), f(inp(1)), f(inp(2)), f(out()), numel(inp(0)) / n, n, float(f64(in, "epsilon", 1e-5)),
                       s_);
    } else if (op == "linear") {
      int64_t k = dim(inp(0), -1), n = dim(out(), -1), m = numel(inp(0)) / k;
      LOOM_RETURN_IF_ERROR(gemm(m, k, n, f(inp(0)), false, f(inp(1)), flag(in, "transpose_weight"), f(out()), false));
      int bias = optionalInput(in, 2);
      if (bias >= 0) addBroadcast(f(out()), f(bias), f(out()), m * n, n, s_);
    } else if (op == "add_bias") {
      addBroadcast(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)), numel(inp(1)), s_);
    } else if (op == "add") {
      addBroadcast(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)), numel(inp(0)), s_);
    } else if (op == "gelu") {
      geluForward(f(inp(0)), f(out()), numel(inp(0)), s_);
    } else if (op == "gelu_grad") {
      geluBackward(f(inp(0)), f(inp(1)), f(out()), numel(inp(0)), s_);
    } else if (op == "attention" || op == "attention_grad") {
      bool fwd = op == "attention";
      int qkv = inp(0), mask = optionalInput(in, fwd ? 1 : 2);
      int64_t heads = i64(in, "num_heads");
      if (heads < 1 || dim(qkv, 2) % (3 * heads) != 0) return Status::error("attention: bad num_heads (corrupt plan)");
      cpu::AttentionShape shape{dim(qkv, 0), dim(qkv, 1), heads, dim(qkv, 2) / (3 * heads), flag(in, "causal"),
                                ctx_.training ? float(f64(in, "dropout")) : 0.0f, ctx_.seed,
                                dropoutStream(i64(in, "stream"), flag(in, "rank_distinct_dropout"))};
      const float *m = mask >= 0 ? f(mask) : nullptr;
      return fwd ? attentionForward(f(qkv), m, f(out()), shape, s_)
                 : attentionBackward(f(qkv), m, f(inp(1)), f(out()), shape, s_);
    } else if (op == "dropout") {
      dropoutForward(f(inp(0)), f(out()), numel(inp(0)), ctx_.training ? float(f64(in, "rate")) : 0.0f, ctx_.seed,
                     dropoutStream(i64(in, "stream"), flag(in, "rank_distinct")), s_);
    } else if (op == "identity") {
      return cudaStatus(cudaMemcpyAsync(f(out()), f(inp(0)), numel(inp(0)) * sizeof(float), cudaMemcpyDeviceToDevice, s_),
                        "copy");
    } else if (op == "cross_entropy") {
      int64_t colStart, tokens = numel(inp(0)) / dim(inp(0), -1);
      LOOM_RETURN_IF_ERROR(crossEntropyStats(in, &colStart));
      std::vector<float> stats, mask;
      LOOM_RETURN_IF_ERROR(toHost(stats, scratch_, 3 * tokens));
      int maskId = optionalInput(in, 2);
      if (maskId >= 0) LOOM_RETURN_IF_ERROR(toHost(mask, f(maskId), tokens));
      float loss = cpu::crossEntropyLoss(stats.data(), stats.data() + tokens, stats.data() + 2 * tokens,
                                         maskId >= 0 ? mask.data() : nullptr, tokens);
      LOOM_RETURN_IF_ERROR(
          cudaStatus(cudaMemcpyAsync(f(out()), &loss, sizeof(float), cudaMemcpyHostToDevice, s_), "copy loss"));
      return cudaStatus(cudaStreamSynchronize(s_), "copy loss");  // `loss` lives on this stack frame
    } else if (op == "cross_entropy_grad") {
      int64_t colStart, cols = dim(inp(0), -1), tokens = numel(inp(0)) / cols;
      LOOM_RETURN_IF_ERROR(crossEntropyStats(in, &colStart));
      int grad = -1, mask = -1;  // the optional grad and mask, told apart by shape
      for (int k = 2; k < in.inputs_size(); ++k) (prog_.buffers(inp(k)).shape_size() == 0 ? grad : mask) = inp(k);
      float g = float(f64(in, "loss_scale", 1.0));
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
      float gradOverCount = count > 0 ? float(g / count) : 0.0f;
      crossEntropyBackward(f(inp(0)), ints(inp(1)), mask >= 0 ? f(mask) : nullptr, scratch_, scratch_ + tokens,
                           gradOverCount, f(out()), tokens, cols, colStart, i64(in, "valid_vocab"), s_);
    } else if (op == "weight_grad") {
      int64_t k = dim(inp(0), -1), n = dim(inp(1), -1), m = numel(inp(0)) / k;
      if (flag(in, "transpose_weight"))  // dW[N,K] = g^T x
        return gemm(n, m, k, f(inp(1)), true, f(inp(0)), false, f(out()), false);
      return gemm(k, m, n, f(inp(0)), true, f(inp(1)), false, f(out()), false);  // dW[K,N] = x^T g
    } else if (op == "bias_grad") {
      int64_t n = dim(inp(0), -1);
      sumRows(f(inp(0)), f(out()), numel(inp(0)) / n, n, s_);
    } else if (op == "layer_norm_grad") {
      int64_t n = dim(inp(0), -1);
      layerNormBackward(f(inp(0)), f(inp(1)), f(inp(2)), f(out(0)), f(out(1)), f(out(2)), numel(inp(0)) / n, n,
                        float(f64(in, "epsilon", 1e-5)), s_);
    } else if (op == "embedding_grad") {
      int64_t rows = dim(out(), 0), hidden = dim(out(), 1);
      embeddingBackward(ints(inp(0)), f(inp(1)), f(out()), numel(inp(0)), hidden,
                        shardStart(str(in, "vocab_parallel_group"), rows), rows, s_);
    } else if (op == "position_grad") {
      int64_t first = shardStart(str(in, "sequence_parallel_group"), dim(inp(0), 1)), hidden = dim(inp(0), 2);
      LOOM_RETURN_IF_ERROR(
          cudaStatus(cudaMemsetAsync(f(out()), 0, numel(out()) * sizeof(float), s_), "zero the position gradient"));
      sumRows(f(inp(0)), f(out()) + first * hidden, dim(inp(0), 0), dim(inp(0), 1) * hidden, s_);
    } else if (op == "all_reduce" || op == "all_gather" || op == "reduce_scatter" || op == "send" || op == "recv") {
      return Status::error("the CUDA executor does not run communication yet (NcclGroup is not wired in): op '" + op + "'");
    } else {
      return Status::error("the CUDA backend has no kernel for op '" + op + "'");
    }
    return Status::ok();
  }

  const plan::Program &prog_;
  const ExecutionContext &ctx_;
  cudaStream_t s_;
  cublasHandle_t blas_;
  float *scratch_;
  std::vector<void *> ptr_;
};

}  // namespace

Status CudaExecutor::create(std::unique_ptr<CudaExecutor> *out) {
  std::unique_ptr<CudaExecutor> e(new CudaExecutor());
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamCreate(&e->stream_), "stream"));
  LOOM_RETURN_IF_ERROR(blasStatus(cublasCreate(&e->blas_), "create"));
  LOOM_RETURN_IF_ERROR(blasStatus(cublasSetStream(e->blas_, e->stream_), "set stream"));
  *out = std::move(e);
  return Status::ok();
}

CudaExecutor::~CudaExecutor() {
  if (arena_) cudaFree(arena_);
  if (arguments_) cudaFree(arguments_);
  if (blas_) cublasDestroy(blas_);
  if (stream_) cudaStreamDestroy(stream_);
}

// Grows a device buffer to `bytes` (never shrinks: steady-state runs allocate nothing).
Status CudaExecutor::reserve(void **buffer, size_t *capacity, size_t bytes) {
  if (bytes <= *capacity) return Status::ok();
  if (*buffer) cudaFree(*buffer);
  *buffer = nullptr, *capacity = 0;
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMalloc(buffer, bytes), "allocating " + std::to_string(bytes) + " bytes"));
  *capacity = bytes;
  return Status::ok();
}

Status CudaExecutor::run(const plan::Program &program, const std::vector<const HostTensor *> &args,
                         std::vector<HostTensor> &results, const ExecutionContext &ctx) {
  LOOM_RETURN_IF_ERROR(checkProgram(program));
  if (int(args.size()) != program.arguments_size())
    return Status::error(program.name() + ": expected " + std::to_string(program.arguments_size()) + " arguments, got " +
                         std::to_string(args.size()));
  // The arena: activations at their planned offsets, then the cross-entropy scratch.
  size_t workspace = aligned(size_t(program.workspace_bytes()));
  size_t scratch = size_t(DeviceRun::scratchFloats(program)) * sizeof(float);
  LOOM_RETURN_IF_ERROR(reserve(&arena_, &arenaBytes_, workspace + scratch + 256));
  char *base = static_cast<char *>(arena_);
  DeviceRun run(program, ctx, stream_, blas_, base + workspace);
  for (const plan::Buffer &b : program.buffers())
    if (b.kind() == plan::Buffer::ACTIVATION) {
      if (b.dtype() != plan::F32)
        return Status::error(program.name() + ": the CUDA executor computes in fp32 so far; buffer " +
                             std::to_string(b.id()) + " is " + plan::DType_Name(b.dtype()));
      if (b.offset() < 0 || size_t(b.offset() + b.bytes()) > workspace)
        return Status::error(program.name() + ": buffer outside the workspace (corrupt plan)");
      run.bind(b.id(), base + b.offset());
    }
  // Arguments: checked as the CPU executor checks them, then copied up back to back.
  size_t argumentBytes = 0;
  for (int i = 0; i < program.arguments_size(); ++i)
    argumentBytes += aligned(size_t(planattr::numel(program.buffers(program.arguments(i).buffer()))) * 4);
  LOOM_RETURN_IF_ERROR(reserve(&arguments_, &argumentBytes_, argumentBytes + 256));
  char *at = static_cast<char *>(arguments_);
  for (int i = 0; i < program.arguments_size(); ++i) {
    const plan::Buffer &b = program.buffers(program.arguments(i).buffer());
    LOOM_RETURN_IF_ERROR(checkArgument(program, i, *args[i]));
    const void *host = args[i]->isInt ? static_cast<const void *>(args[i]->ints.data())
                                      : static_cast<const void *>(args[i]->data.data());
    size_t bytes = size_t(planattr::numel(b)) * 4;
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(at, host, bytes, cudaMemcpyHostToDevice, stream_), "argument copy"));
    run.bind(b.id(), at);
    at += aligned(bytes);
  }
  LOOM_RETURN_IF_ERROR(run.execute());
  results.assign(program.results_size(), HostTensor{});
  for (int i = 0; i < program.results_size(); ++i) {
    const plan::Buffer &b = program.buffers(program.results(i).buffer());
    results[i].shape.assign(b.shape().begin(), b.shape().end());
    results[i].data.resize(size_t(planattr::numel(b)));
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(results[i].data.data(), run.address(b.id()),
                                                    results[i].data.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                                    stream_),
                                    "result copy"));
  }
  return cudaStatus(cudaStreamSynchronize(stream_), program.name());
}

}  // namespace loom::cuda
