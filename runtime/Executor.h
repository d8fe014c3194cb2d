// Executes one plan::Program on the CPU: one thread per stream (compute, tp, pp, dp) running
// its instructions in order, waiting on the events (wait_for) of other streams, so that
// communication overlaps independent compute as it does on CUDA streams. Activations live in
// one workspace arena at the offsets of the compiler's memory plan.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/cpu/Kernels.h"

#include "plan/ProgramCheck.h"
#include "protos/plan.pb.h"
#include "runtime/Collectives.h"
#include "runtime/Progress.h"
#include "support/Status.h"
#include "runtime/Tensor.h"
#include "runtime/Trace.h"

namespace loom {


// Mixture of experts' statistics over runs of programs (the CPU moe kernel adds each
// instruction's): the load-balancing losses, their count, and the assignments dropped by
// capacity out of all assigned.
struct MoeTally {
  double auxSum = 0;
  int64_t layers = 0, dropped = 0, assigned = 0;
  void add(double aux, int64_t droppedNow, int64_t assignedNow) {
    auxSum += aux, ++layers, dropped += droppedNow, assigned += assignedNow;
  }
};

// Mixture of experts' routing decisions (loom-rank --dump-routing, which the oracle reads): each
// moe forward's chosen experts [tokens, top_k] and, with a capacity factor, the kept ones (the
// dropped assignments -1; empty when dropless), by (layer, micro-batch). The moe and the
// expert-parallel moe run on different streams: added under a lock.
struct MoeRoutingChoice {
  std::vector<int32_t> chosen, kept;
};
using MoeRoutingByLayer = std::map<std::pair<int, int>, MoeRoutingChoice>;
struct MoeRoutingLog {
  MoeRoutingByLayer choices;
  std::mutex mutex;
  void add(int layer, int microBatch, const std::vector<int32_t> &chosen, const std::vector<int32_t> *kept) {
    std::lock_guard<std::mutex> lock(mutex);
    choices[{layer, microBatch}] = {chosen, kept ? *kept : std::vector<int32_t>{}};
  }
};

struct ExecutionContext {
  Collectives *collectives = nullptr;  // required by programs with communication
  uint64_t seed = 1234;                // dropout seed of this step and micro-batch
  int64_t messageTag = 0;              // added to send/recv tags (the micro-batch's channel)
  bool training = true;                // false: dropout off (validation, inference)
  float lossScale = 1.0f;              // multiplies the loss gradient (fp16 dynamic loss scaling)
  // A workspace reused across runs of the same program (no fresh, zeroed pages each time);
  // null: a temporary one.
  std::vector<float> *workspace = nullptr;
  // The CPU kernels' scratch (cpuScratchFloats), likewise kept across runs; null: a temporary.
  std::vector<float> *scratch = nullptr;
  // Where each result is to be kept (one entry per program.results(), null: none): a result the
  // workspace would hold is computed there directly, so the caller's consume finds it in place
  // (no copy out of the workspace); others are handed over from where they are.
  const std::vector<float *> *resultSlots = nullptr;
  // The same for 16-bit results (one entry per result, null: none): a 16-bit result computed
  // straight into its slot is not handed to consume (it is in place already; no widened copy).
  const std::vector<uint16_t *> *halfResultSlots = nullptr;
  // When set, every executed instruction is recorded (loom-rank --trace), with this
  // micro-batch (-1: none).
  TraceRecorder *trace = nullptr;
  int traceMicroBatch = -1;
  // The step's last run of this program: its last_micro_batch instructions (gradient sync)
  // run; in earlier runs they are passed over.
  bool lastRun = true;
  // The step's first run of this program: its first_micro_batch instructions (ZeRO-1's
  // parameter all-gathers) run; later runs pass over them.
  bool firstRun = true;
  // Where the rank is, for its heartbeat (null: not reported), and this run's micro-batch.
  Progress *progress = nullptr;
  int microBatch = -1;
  // The compute stream on the calling thread, and a thread only for each other stream with
  // instructions (the CPU backend's training runs). Otherwise every stream gets a fresh
  // thread per run, as loomc calibrate measures kernels: run on its long-lived rank threads,
  // its memory-bound ops timed 2-5x slower (accumulate, adamw, sum_squares, the gradient
  // embeddings) while training's own got faster, not explained; its device files, and so the
  // simulator's predictions, stay those of the thread-per-stream executor (docs/progress.md).
  bool computeOnCallingThread = false;
  // Fault injection for the hang tests: the first compute instruction with this op never
  // finishes (null: none).
  const char *testStallOp = nullptr;
  // Fault injection for the straggler report: each compute-stream kernel is followed by a
  // sleep of this many times its own duration (0: none), inside the instruction, so the rank
  // is that much slower at its own work.
  double testSlowdown = 0;
  // Where the moe instructions add their statistics (null: nowhere).
  MoeTally *moeTally = nullptr;
  // Where the moe forwards record their routing (null: nowhere).
  MoeRoutingLog *moeRouting = nullptr;
};

// One argument's storage, owned by the caller: fp32 (f), int32 (i) or 16-bit (h: bf16 or fp16,
// as the argument's buffer says) elements, read, or written in place where the plan's binding
// is inout.
struct ArgumentView {
  float *f = nullptr;
  int32_t *i = nullptr;
  uint16_t *h = nullptr;
  int64_t count = 0;
  static ArgumentView of(const HostTensor &t) {
    ArgumentView v;
    if (t.isInt)
      v.i = const_cast<int32_t *>(t.ints.data()), v.count = int64_t(t.ints.size());
    else
      v.f = const_cast<float *>(t.data.data()), v.count = int64_t(t.data.size());
    return v;
  }
};

// Every op of `program` has a CPU kernel (a one-line error naming op and backend otherwise).
Status checkCpuKernels(const plan::Program &program);
// Floats of scratch the CPU kernels of `program` need at once: its largest attention's S x S
// probabilities (and backward two more blocks), then one region per stream for the fp32 copies
// of 16-bit operands (halfScratchFloats). The CPU backend keeps one such buffer, and the memory
// plan counts it (MemoryPlan.scratch_bytes), so the kernels allocate nothing in the step.
int64_t cpuScratchFloats(const plan::Program &program);
int64_t cpuAttentionScratchFloats(const plan::Program &program);
// fp32 floats an instruction with 16-bit operands needs on the CPU: a native 16-bit kernel's
// own (runtime/cpu/HalfKernels.cpp), or else the widened copies of its 16-bit operands, each
// once; and the most any instruction of one stream needs.
int64_t halfScratchFloats(const plan::Program &program, const plan::Instruction &in);
int64_t halfScratchFloats(const plan::Program &program, int stream);
// Argument `index` against its buffer: element type and count.
Status checkArgument(const plan::Program &program, int index, const HostTensor &tensor);
Status checkArgument(const plan::Program &program, int index, const ArgumentView &view);

// Where this rank's shard of `rows` starts along a parallel group (0 outside a group or
// without collectives): vocab-parallel embedding rows, sequence-parallel position rows.
int64_t shardStart(const Collectives *collectives, const std::string &group, int64_t rows);
// The dropout generator's stream for an op: where masks must differ across tensor-parallel
// ranks, the rank (plus one) goes in the upper 32 bits. Every backend must draw the same way.
uint64_t dropoutStream(const Collectives *collectives, int64_t stream, const std::string &distinctGroup);
// A grouped attention instruction's heads: the local query heads, the KV heads, and which KV
// head each query head reads (with kv_replicated_group: from this rank's first query head,
// `shardStartOf(group, heads)`). Dropout fields are left to the caller. A one-line error for
// attributes that do not fit the buffers (a corrupt plan).
Status groupedAttentionShape(const plan::Program &program, const plan::Instruction &in,
                             const std::function<int64_t(const std::string &, int64_t)> &shardStartOf,
                             cpu::GroupedAttentionShape *shape);
// A collective's "reduce" attribute ("sum" when absent).
ReduceOp reduceOpOf(const std::string &name);

// `args` follow program.arguments(); on success `results` follow program.results().
Status executeProgram(const plan::Program &program, const std::vector<const HostTensor *> &args,
                      std::vector<HostTensor> &results, const ExecutionContext &ctx);

// The same, handing each result to `consume` in place (valid only during the call): callers
// that accumulate or copy into their own tensors avoid allocating a result per run.
using ResultConsumer = std::function<void(int index, const float *data, int64_t count)>;
Status executeProgram(const plan::Program &program, const std::vector<const HostTensor *> &args,
                      const ResultConsumer &consume, const ExecutionContext &ctx);
Status executeProgram(const plan::Program &program, const std::vector<ArgumentView> &args,
                      const ResultConsumer &consume, const ExecutionContext &ctx);

}  // namespace loom
