#include "train/StragglerReporter.h"

#include <cstdio>
#include <map>

namespace loom {

StragglerReporter::StragglerReporter(control::CoordinatorClient &client, int rank, int64_t waitMs)
    : client_(client), rank_(rank), waitMs_(waitMs), thread_([this] { loop(); }) {}

StragglerReporter::~StragglerReporter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void StragglerReporter::report(int64_t iteration, double computeSeconds, int stage, bool wantVerdict) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({iteration, computeSeconds, stage, wantVerdict});
  }
  cv_.notify_all();
}

std::string StragglerReporter::takeVerdict() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string v;
  v.swap(verdict_);
  return v;
}

void StragglerReporter::loop() {
  for (;;) {
    Report r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      r = queue_.front();
      queue_.pop_front();
    }
    std::map<std::string, double> values = {{"compute-seconds", r.computeSeconds}, {"pipeline-stage", r.stage}};
    control::MetricsReply reply;
    bool waits = r.wantVerdict && waitMs_ > 0;
    // A failed call loses one report; the coordinator's own watchdogs deal with a dead peer.
    if (!client_.metrics(rank_, r.iteration, values, waits ? waitMs_ : 0, &reply).isOk() || !waits ||
        !reply.straggler())
      continue;
    char text[200];
    std::snprintf(text, sizeof text,
                  " | straggler: rank %d (compute %.1f ms per iteration, its stage's median %.1f ms; "
                  "reported at iteration %lld)",
                  reply.slowest_rank(), reply.slowest_seconds() * 1000, reply.median_seconds() * 1000,
                  (long long)r.iteration);
    std::lock_guard<std::mutex> lock(mu_);
    verdict_ = text;
  }
}

}  // namespace loom
