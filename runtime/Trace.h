// A rank's execution trace: every instruction the executor runs, per stream, with its start
// and duration, written as Chrome trace-event JSON (Perfetto, chrome://tracing). It is the
// record of what the runtime actually ran, checked against the plan by tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "protos/plan.pb.h"
#include "support/Status.h"

namespace loom {

class TraceRecorder {
 public:
  TraceRecorder();

  // One executed instruction (number `index`) of `program` (micro-batch mb, -1 outside micro-batches),
  // between `start` and `end`. Thread-safe: each stream thread records its own. The recorder
  // keeps pointers to the program and instruction: they must outlive its write() and timings().
  void record(const plan::Program &program, int index, int mb, std::chrono::steady_clock::time_point start,
              std::chrono::steady_clock::time_point end);

  // DIR/rank_N.json: the events, and under "otherData" the rank and the plan's per-step
  // collective totals (what the compiler says the rank does, to compare with the events).
  Status write(const std::string &path, const plan::RankPlan &plan) const;

  // Each recorded instruction's time in each of its runs (`loomc calibrate` fits its cost
  // model to these). The pointers are the recorded programs'.
  struct Timing {
    const plan::Program *program;
    const plan::Instruction *instruction;
    std::vector<double> seconds;  // one per run, in order
  };
  std::vector<Timing> timings() const;

 private:
  struct Event {
    const plan::Program *program;
    const plan::Instruction *instruction;  // its op, stream, layer, group and bytes
    int index, mb;
    double startUs, durationUs;
  };
  std::chrono::steady_clock::time_point epoch_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

}  // namespace loom
