// Megatron's straggler report (CoordinatorService::ReportMetrics) off the training thread. At a
// log iteration each rank hands its kernel time per iteration to a reporter thread, which sends
// it; on the logging rank that thread also waits for the coordinator's verdict over every rank.
// The training loop itself never waits on the control plane (a unary call to the coordinator
// costs ~1 ms here, a tenth of a small model's step): a log line carries the newest verdict that
// has arrived since the previous line, which is that of an earlier log iteration (it says which).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/control/CoordinatorClient.h"

namespace loom {

class StragglerReporter {
 public:
  // `waitMs` > 0 (the logging rank): wait that long for every rank's report of an iteration.
  StragglerReporter(control::CoordinatorClient &client, int rank, int64_t waitMs);
  ~StragglerReporter();  // finishes the report in flight, drops queued ones, stops the thread

  // This rank's kernel seconds per iteration since the last report, and its pipeline stage.
  void report(int64_t iteration, double computeSeconds, int stage, bool wantVerdict);
  // " | straggler: rank R (compute ... at iteration I)" once per verdict, or "".
  std::string takeVerdict();

 private:
  struct Report {
    int64_t iteration;
    double computeSeconds;
    int stage;
    bool wantVerdict;
  };
  void loop();

  control::CoordinatorClient &client_;
  int rank_;
  int64_t waitMs_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Report> queue_;
  std::string verdict_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loom
