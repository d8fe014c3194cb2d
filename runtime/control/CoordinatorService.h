// loom-coord's service: registration, plan distribution, a key-value store and barriers for
// communicator rendezvous, heartbeats with dead-rank detection, metrics, abort.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "protos/control.grpc.pb.h"

namespace loom::control {

struct CoordinatorOptions {
  std::string planDir;
  std::string token;
  int worldSize = 0;
  double heartbeatTimeoutSeconds = 10;
  double registrationTimeoutSeconds = 120;
  // A stall (no instruction finished anywhere while a rank waits on communication) ends the
  // job after max(minStallSeconds, 3 x the longest step so far), or firstStepStallSeconds
  // before a step has been measured (loom-coord derives it from the plan's FLOPs and device).
  double minStallSeconds = 10, firstStepStallSeconds = 60;
};

class CoordinatorService final : public Coordinator::Service {
 public:
  explicit CoordinatorService(CoordinatorOptions options);

  grpc::Status Register(grpc::ServerContext *, const RegisterRequest *, RegisterReply *) override;
  grpc::Status GetFile(grpc::ServerContext *, const GetFileRequest *, GetFileReply *) override;
  grpc::Status KvSet(grpc::ServerContext *, const KvSetRequest *, Empty *) override;
  grpc::Status KvGet(grpc::ServerContext *, const KvGetRequest *, KvGetReply *) override;
  grpc::Status Barrier(grpc::ServerContext *, const BarrierRequest *, Empty *) override;
  grpc::Status Heartbeat(grpc::ServerContext *, const HeartbeatRequest *, HeartbeatReply *) override;
  grpc::Status ReportMetrics(grpc::ServerContext *, const MetricsRequest *, MetricsReply *) override;
  grpc::Status Abort(grpc::ServerContext *, const AbortRequest *, Empty *) override;
  grpc::Status Finish(grpc::ServerContext *, const FinishRequest *, Empty *) override;

  // Checks heartbeats and registrations; returns true once every rank finished or the job
  // was aborted (and all live ranks had a chance to hear it).
  bool poll();
  bool succeeded();
  std::string abortReason();

 private:
  struct RankState {
    bool registered = false, finished = false;
    int exitCode = 0;
    std::string host;
    int64_t pid = 0;
    std::chrono::steady_clock::time_point lastSeen;
    // The latest progress report (HeartbeatRequest): instructions finished, whether waiting
    // on communication, where; when the count last changed; the step and when it began.
    bool reported = false, waiting = false, idle = false;
    int64_t completed = -1, step = -1;
    std::string where;
    std::chrono::steady_clock::time_point lastProgress, stepStarted;
  };
  // The job stalls when no rank has finished an instruction for the stall limit while some
  // rank waits on communication and none is outside the plan's instructions (loading or saving
  // a checkpoint): the ranks stuck in an instruction are named, with what the others wait in.
  double stallLimitSeconds() const;
  std::string whoWaits(int except, bool onlyWaiting) const;
  grpc::Status checkToken(grpc::ServerContext *ctx);
  grpc::Status checkRank(int rank);
  void abortLocked(const std::string &reason);

  CoordinatorOptions opt_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RankState> ranks_;
  std::map<std::string, std::string> kv_;
  std::map<std::string, std::set<int>> barriers_;
  bool aborted_ = false;
  std::string abortReason_;
  std::chrono::steady_clock::time_point started_, abortedAt_;
  double longestStepSeconds_ = 0;  // the ranks' longest iteration (reported, or seen from their step numbers)
  // The straggler report: each rank's compute-seconds and pipeline stage per recent step
  // (step -> rank -> (seconds, stage)).
  std::map<int64_t, std::map<int, std::pair<double, int>>> computeSeconds_;
};

}  // namespace loom::control
