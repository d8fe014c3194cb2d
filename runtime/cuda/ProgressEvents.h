// The CUDA executor's completion probes for the rank's progress reports (runtime/Progress.h):
// an event recorded after each issued instruction on its stream, asked with cudaEventQuery
// from the heartbeat thread. Events are pooled: a completed one is reused, so the pool is as
// large as the device is behind the host, never one per instruction ever issued.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "runtime/Progress.h"
#include "support/Status.h"

namespace loom::cuda {

class ProgressEvents : public CompletionProbe {
 public:
  ProgressEvents();
  ~ProgressEvents() override;  // detaches from the Progress it reported to
  ProgressEvents(const ProgressEvents &) = delete;
  ProgressEvents &operator=(const ProgressEvents &) = delete;

  // Records an event after what `stream` holds and reports instruction `index` of `program`
  // (run `run`, micro-batch mb) issued to `progress`.
  Status issue(Progress *progress, const plan::Program &program, int mb, int index, int64_t run, cudaStream_t stream);

  bool done(uint64_t token) override;
  void release(uint64_t token) override;

 private:
  int device_ = 0;                  // the events' device: the heartbeat thread asks from there
  std::mutex mu_;                   // the free list (issue and release come from different threads)
  std::vector<cudaEvent_t> events_;
  std::vector<uint64_t> free_;
  Progress *reportedTo_ = nullptr;
};

}  // namespace loom::cuda
