// Executes one plan::Program on the CPU: one thread per stream (compute, tp, pp, dp) running
// its instructions in order, waiting on the events (wait_for) of other streams, so that
// communication overlaps independent compute as it does on CUDA streams. Activations live in
// one workspace arena at the offsets of the compiler's memory plan.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "protos/plan.pb.h"
#include "runtime/Collectives.h"
#include "runtime/Status.h"
#include "runtime/Tensor.h"

namespace loom {

struct ExecutionContext {
  Collectives *collectives = nullptr;  // required by programs with communication
  uint64_t seed = 1234;                // dropout seed of this step and micro-batch
  int64_t messageTag = 0;              // added to send/recv tags (the micro-batch's channel)
  bool training = true;                // false: dropout off (validation, inference)
  // A workspace reused across runs of the same program (no fresh, zeroed pages each time);
  // null: a temporary one.
  std::vector<float> *workspace = nullptr;
};

// What every executor checks of a plan read from a file before running it: streams, event
// order and buffer ids (a one-line error naming the program otherwise).
Status checkProgram(const plan::Program &program);
// Argument `index` against its buffer: element type and count.
Status checkArgument(const plan::Program &program, int index, const HostTensor &tensor);

// `args` follow program.arguments(); on success `results` follow program.results().
Status executeProgram(const plan::Program &program, const std::vector<const HostTensor *> &args,
                      std::vector<HostTensor> &results, const ExecutionContext &ctx);

// The same, handing each result to `consume` in place (valid only during the call): callers
// that accumulate or copy into their own tensors avoid allocating a result per run.
using ResultConsumer = std::function<void(int index, const float *data, int64_t count)>;
Status executeProgram(const plan::Program &program, const std::vector<const HostTensor *> &args,
                      const ResultConsumer &consume, const ExecutionContext &ctx);

}  // namespace loom
