// Executes one plan::Program on the GPU: each plan stream (compute, tp, pp, dp) on its own
// CUDA stream, the plan's wait_for dependencies as CUDA events between them; activations in
// one device arena at the compiler's memory-plan offsets (grown on the first run of the
// largest program, then reused: the step loop allocates nothing).
//
// Numerics. An fp32 plan: Precision::kFp32 computes in fp32 throughout (cuBLAS SGEMM); kBf16
// and kFp16 round the GEMM operands to 16 bits with fp32 accumulation and fp32 outputs (linear
// and weight_grad through cuBLASLt, with the bias in the epilogue; attention's batched GEMMs),
// as torch.autocast does. Parameters' 16-bit copies are made once per optimizer step
// (parametersChanged()). A 16-bit plan (issue 34, Megatron's mixed precision): its buffers are
// bf16 or fp16 in memory as the plan says, its GEMMs read them in place (16-bit outputs, fp32
// accumulation), every other kernel reads and writes the 16-bit storage with fp32 arithmetic
// and rounds each result once (runtime/cuda/DeviceArray.h), and its collectives and pipeline
// messages move 16-bit elements; fp32 master weights, main gradients and AdamW stay fp32.
//
// Communication: tensor- and data-parallel collectives (all_reduce, all_gather, reduce_scatter,
// vocab-parallel cross-entropy) through NCCL on the instruction's stream, with communicators
// from `CudaExecutorOptions::groups`; pipeline send/recv through `CudaExecutorOptions::links`
// (runtime/cuda/PipelineLinks.h: per-link streams and message slots, so a program never waits
// for its peer to receive).
//
// Progress (ExecutionContext::progress): each issued instruction is followed by an event on its
// stream (runtime/cuda/ProgressEvents.h), so a rank's heartbeat says what the device, not the
// host, is at: the kernel it runs or the collective it waits in.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <string>
#include <memory>
#include <vector>

#include "protos/plan.pb.h"
#include "runtime/Executor.h"
#include "support/Status.h"
#include "runtime/Tensor.h"
#include "runtime/cuda/DeviceArray.h"
#include "runtime/cuda/HalfPrecision.h"

namespace loom::cuda {

class LtLinear;
class NcclGroups;
class PipelineLinks;
class ProgressEvents;

bool parseAttentionKernel(const std::string &name, AttentionKernel *out);
// Every op of `program` has a CUDA kernel, none of them context-parallel (a one-line error
// naming the instruction and op otherwise).
Status checkCudaKernels(const plan::Program &program);

struct CudaExecutorOptions {
  Precision precision = Precision::kFp32;
  AttentionKernel attention = AttentionKernel::kAuto;
  const NcclGroups *groups = nullptr;  // required by programs with collectives
  PipelineLinks *links = nullptr;      // required by programs with send/recv
};

class CudaExecutor {
 public:
  static Status create(const CudaExecutorOptions &options, std::unique_ptr<CudaExecutor> *out);
  ~CudaExecutor();
  CudaExecutor(const CudaExecutor &) = delete;
  CudaExecutor &operator=(const CudaExecutor &) = delete;

  // Host tensors in and out (tests; callers without device-resident state). As
  // loom::executeProgram: `args` follow program.arguments(), `results` program.results().
  // ctx.collectives places this rank (shard offsets, tensor-parallel dropout streams).
  Status run(const plan::Program &program, const std::vector<const HostTensor *> &args,
             std::vector<HostTensor> &results, const ExecutionContext &ctx);

  // Device-resident: args[i] is the device address of argument i (fp32, or int32 where the
  // plan says I32). consume(i, data, count, stream) is called for each result as soon as the
  // instruction producing it is queued, with that instruction's stream: work the consumer
  // queues there (copy, accumulate, record an event for a collective elsewhere) runs right
  // after the producer, while the rest of the program goes on; results no instruction
  // produces come at the end on the compute stream. The call returns without waiting for the
  // device; the program's streams have all joined the compute stream when it returns.
  // `data` is typed: a 16-bit plan's 16-bit results come as they are (DeviceArray.h).
  using DeviceResultConsumer = std::function<Status(int index, In data, int64_t count, cudaStream_t s)>;
  Status runOnDevice(const plan::Program &program, const std::vector<const void *> &args,
                     const DeviceResultConsumer &consume, const ExecutionContext &ctx);

  // Sizes the arena, scratch and events for every program of a set now, so that no run has
  // to grow them (growing drains the device: in a pipeline, mid-step, that could wait on a
  // peer that waits on this rank).
  Status prepare(const plan::ProgramSet &programs);

  // The parameters changed (an optimizer step): their 16-bit copies are remade on next use.
  void parametersChanged();
  // Device bytes the executor holds: arena, scratch, 16-bit parameter copies, cuBLASLt's workspace.
  int64_t allocatedBytes() const;
  // Work the caller queues after runOnDevice goes here (the stream results are consumed on).
  cudaStream_t computeStream() const { return streams_[0]; }

 private:
  explicit CudaExecutor(const CudaExecutorOptions &options);
  Status reserve(void **buffer, size_t *capacity, size_t bytes);
  Status reserveFor(const plan::Program &program);
  Status reserveTraceEvents(int count);  // timing events for loom-rank --trace
  friend class DeviceRun;

  CudaExecutorOptions options_;
  cudaStream_t streams_[4] = {};  // indexed by plan::Stream
  cublasHandle_t blas_ = nullptr;
  std::unique_ptr<LtLinear> lt_;
  std::vector<cudaEvent_t> events_;  // one per instruction index (a program's wait_for targets)
  std::unique_ptr<ProgressEvents> progressEvents_;  // after each instruction, for ctx.progress
  int64_t runs_ = 0;                                // program runs issued (progress reports)
  std::vector<cudaEvent_t> traceStart_, traceEnd_;  // per instruction index, with timing (--trace)
  cudaEvent_t traceBase_ = nullptr;
  cudaEvent_t streamEnd_[4] = {};
  void *arena_ = nullptr, *arguments_ = nullptr, *scratch_ = nullptr, *ones_ = nullptr;
  size_t arenaBytes_ = 0, argumentBytes_ = 0, scratchBytes_ = 0, onesBytes_ = 0, onesFilled_ = 0;
  ElementType onesType_ = ElementType::kF32;  // bias gradients' ones: of the gradient's type
  struct HalfCopy {
    void *data = nullptr;
    int64_t count = 0;  // the parameter bound at this address may change (host runs): resized then
    bool current = false;
  };
  std::map<const void *, HalfCopy> halfParameters_;  // 16-bit copies by the parameter's address
};

}  // namespace loom::cuda
