#include "runtime/cuda/ProgressEvents.h"

#include "runtime/cuda/CudaStatus.h"

namespace loom::cuda {

ProgressEvents::ProgressEvents() { cudaGetDevice(&device_); }

ProgressEvents::~ProgressEvents() {
  if (reportedTo_) reportedTo_->detach(this);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

Status ProgressEvents::issue(Progress *progress, const plan::Program &program, int mb, int index, int64_t run,
                             cudaStream_t stream) {
  if (reportedTo_ && reportedTo_ != progress) return Status::error("progress events report to one Progress only");
  reportedTo_ = progress;
  uint64_t token;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) {
      cudaEvent_t e;
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "progress event"));
      events_.push_back(e);
      free_.push_back(events_.size() - 1);
    }
    token = free_.back();
    free_.pop_back();
  }
  // events_ only grows under mu_ on this (the issuing) thread, so reading it here is safe.
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(events_[token], stream), "progress event"));
  progress->issued(program, mb, index, run, this, token);
  return Status::ok();
}

bool ProgressEvents::done(uint64_t token) {
  cudaEvent_t e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = events_[token];
  }
  cudaSetDevice(device_);  // the heartbeat thread's current device may be another
  // Not ready, or an error (a failed kernel): not complete; the failure is the executor's to report.
  return cudaEventQuery(e) == cudaSuccess;
}

void ProgressEvents::release(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(token);
}

}  // namespace loom::cuda
