#include "runtime/control/CoordinatorService.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>
#include <filesystem>

#include "support/FileIO.h"
#include "runtime/control/Tls.h"

namespace loom::control {

namespace {
using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A client's wait (0: the default), at most a day: a huge value must not overflow the
// deadline arithmetic of wait_for.
std::chrono::milliseconds requestTimeout(int64_t requested, int64_t dflt) {
  constexpr int64_t kDay = 24 * 3600 * 1000;
  return std::chrono::milliseconds(requested > 0 ? std::min(requested, kDay) : dflt);
}
}  // namespace

CoordinatorService::CoordinatorService(CoordinatorOptions options)
    : opt_(std::move(options)), ranks_(opt_.worldSize), started_(Clock::now()) {}

grpc::Status CoordinatorService::checkToken(grpc::ServerContext *ctx) {
  auto it = ctx->client_metadata().find("loom-token");
  if (it == ctx->client_metadata().end() ||
      !constantTimeEquals(std::string(it->second.data(), it->second.size()), opt_.token))
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "wrong or missing job token");
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::checkRank(int rank) {
  if (rank < 0 || rank >= opt_.worldSize)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "rank " + std::to_string(rank) + " is outside the job's world of " +
                            std::to_string(opt_.worldSize));
  return grpc::Status::OK;
}

void CoordinatorService::abortLocked(const std::string &reason) {
  if (aborted_) return;
  aborted_ = true;
  abortReason_ = reason;
  abortedAt_ = Clock::now();
  std::fprintf(stderr, "loom-coord: aborting the job: %s\n", reason.c_str());
  cv_.notify_all();
}

#define LOOM_CHECK_TOKEN()                          \
  if (auto st = checkToken(ctx); !st.ok()) return st

grpc::Status CoordinatorService::Register(grpc::ServerContext *ctx, const RegisterRequest *req, RegisterReply *rep) {
  LOOM_CHECK_TOKEN();
  if (auto st = checkRank(req->rank()); !st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return grpc::Status(grpc::StatusCode::ABORTED, abortReason_);
  RankState &r = ranks_[req->rank()];
  if (r.registered && !r.finished)
    return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                        "rank " + std::to_string(req->rank()) + " is already registered (host " + r.host + ", pid " +
                            std::to_string(r.pid) + ")");
  r.registered = true;
  r.host = req->host();
  r.pid = req->pid();
  r.lastSeen = Clock::now();
  rep->set_world_size(opt_.worldSize);
  rep->set_job(opt_.planDir);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetFile(grpc::ServerContext *ctx, const GetFileRequest *req, GetFileReply *rep) {
  LOOM_CHECK_TOKEN();
  const std::string &name = req->name();
  if (name.empty() || name[0] == '/' || name.find("..") != std::string::npos)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad file name '" + name + "'");
  std::string path = opt_.planDir + "/" + name;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return grpc::Status(grpc::StatusCode::NOT_FOUND, path + ": no such plan file");
  if (Status s = readWholeFile(path, "the plan file", rep->mutable_content()); !s.isOk())
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, s.message());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::KvSet(grpc::ServerContext *ctx, const KvSetRequest *req, Empty *) {
  LOOM_CHECK_TOKEN();
  std::lock_guard<std::mutex> lock(mu_);
  kv_[req->key()] = req->value();
  cv_.notify_all();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::KvGet(grpc::ServerContext *ctx, const KvGetRequest *req, KvGetReply *rep) {
  LOOM_CHECK_TOKEN();
  std::unique_lock<std::mutex> lock(mu_);
  auto timeout = requestTimeout(req->timeout_ms(), 30000);
  bool found = cv_.wait_for(lock, timeout, [&] { return aborted_ || kv_.count(req->key()) > 0; });
  if (aborted_) return grpc::Status(grpc::StatusCode::ABORTED, abortReason_);
  if (!found) return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "key '" + req->key() + "' was never set");
  rep->set_value(kv_[req->key()]);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Barrier(grpc::ServerContext *ctx, const BarrierRequest *req, Empty *) {
  LOOM_CHECK_TOKEN();
  if (auto st = checkRank(req->rank()); !st.ok()) return st;
  std::unique_lock<std::mutex> lock(mu_);
  auto &arrived = barriers_[req->name()];
  arrived.insert(req->rank());
  cv_.notify_all();
  auto timeout = requestTimeout(req->timeout_ms(), 60000);
  bool all = cv_.wait_for(lock, timeout, [&] { return aborted_ || int(arrived.size()) == opt_.worldSize; });
  if (aborted_) return grpc::Status(grpc::StatusCode::ABORTED, abortReason_);
  if (!all) {
    std::string missing;
    for (int r = 0; r < opt_.worldSize; ++r)
      if (!arrived.count(r)) missing += (missing.empty() ? "" : ",") + std::to_string(r);
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "barrier '" + req->name() + "' timed out waiting for ranks " + missing);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext *ctx, const HeartbeatRequest *req,
                                           HeartbeatReply *rep) {
  LOOM_CHECK_TOKEN();
  if (auto st = checkRank(req->rank()); !st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  RankState &r = ranks_[req->rank()];
  auto now = Clock::now();
  r.lastSeen = now;
  if (req->step() != r.step) {  // a step began: the previous one's length counts
    if (r.step > 0) longestStepSeconds_ = std::max(longestStepSeconds_, secondsSince(r.stepStarted));
    r.step = req->step(), r.stepStarted = now;
  }
  longestStepSeconds_ = std::max(longestStepSeconds_, req->longest_step_seconds());
  if (!req->where().empty()) {
    if (!r.reported || req->completed() != r.completed) r.lastProgress = now;
    r.reported = true, r.completed = req->completed(), r.waiting = req->waiting(), r.idle = req->idle();
    r.where = req->where();
  }
  rep->set_aborted(aborted_);
  rep->set_reason(abortReason_);
  return grpc::Status::OK;
}

// Megatron-LM's straggler report: in a synchronous job every rank's step takes the same wall
// time (the fast ones wait in collectives), so ranks are compared by the time they spend in
// their own kernels, each against the ranks that run the same programs (its pipeline stage:
// stages differ in work by design). The rank furthest above its stage's median is named when
// that is more than 10%; a stage of one rank has nobody to be compared with.
grpc::Status CoordinatorService::ReportMetrics(grpc::ServerContext *ctx, const MetricsRequest *req, MetricsReply *rep) {
  LOOM_CHECK_TOKEN();
  if (auto st = checkRank(req->rank()); !st.ok()) return st;
  constexpr int64_t kStepsKept = 64;
  std::unique_lock<std::mutex> lock(mu_);
  auto it = req->values().find("compute-seconds");
  auto stage = req->values().find("pipeline-stage");
  if (it != req->values().end() && std::isfinite(it->second) && it->second >= 0) {
    int s = stage != req->values().end() && std::isfinite(stage->second) ? int(stage->second) : 0;
    computeSeconds_[req->step()][req->rank()] = {it->second, s};
    while (computeSeconds_.size() > size_t(kStepsKept)) computeSeconds_.erase(computeSeconds_.begin());
    cv_.notify_all();
  }
  auto complete = [&] {
    auto s = computeSeconds_.find(req->step());
    return s != computeSeconds_.end() && int(s->second.size()) == opt_.worldSize;
  };
  if (req->wait_ms() > 0)
    cv_.wait_for(lock, std::min(requestTimeout(req->wait_ms(), 0), std::chrono::milliseconds(60000)),
                 [&] { return aborted_ || complete(); });
  if (!complete()) return grpc::Status::OK;
  rep->set_complete(true);
  std::map<int, std::vector<double>> byStage;
  for (auto &[rank, entry] : computeSeconds_[req->step()]) byStage[entry.second].push_back(entry.first);
  std::map<int, double> medians;
  for (auto &[s, values] : byStage) {
    if (values.size() < 2) continue;
    std::sort(values.begin(), values.end());
    size_t n = values.size();
    medians[s] = n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
  }
  double worst = 0;
  for (auto &[rank, entry] : computeSeconds_[req->step()]) {
    auto m = medians.find(entry.second);
    if (m == medians.end() || m->second <= 0) continue;
    double ratio = entry.first / m->second;
    if (ratio <= worst) continue;
    worst = ratio;
    rep->set_slowest_rank(rank);
    rep->set_slowest_seconds(entry.first);
    rep->set_median_seconds(m->second);
    rep->set_stage(entry.second);
  }
  rep->set_straggler(worst > 1.1);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Abort(grpc::ServerContext *ctx, const AbortRequest *req, Empty *) {
  LOOM_CHECK_TOKEN();
  std::lock_guard<std::mutex> lock(mu_);
  abortLocked(req->rank() >= 0 ? "rank " + std::to_string(req->rank()) + " failed: " + req->reason() : req->reason());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Finish(grpc::ServerContext *ctx, const FinishRequest *req, Empty *) {
  LOOM_CHECK_TOKEN();
  if (auto st = checkRank(req->rank()); !st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  RankState &r = ranks_[req->rank()];
  r.finished = true;
  r.exitCode = req->exit_code();
  if (req->exit_code() != 0)
    abortLocked("rank " + std::to_string(req->rank()) + " exited with code " + std::to_string(req->exit_code()));
  cv_.notify_all();
  return grpc::Status::OK;
}

double CoordinatorService::stallLimitSeconds() const {
  if (longestStepSeconds_ <= 0) return opt_.firstStepStallSeconds;
  return std::max(opt_.minStallSeconds, 3 * longestStepSeconds_);
}

// "ranks 4, 6, 7 wait in all_reduce@tp #212 of backward_1 mb 3; rank 0 waits in ...", leaving
// out rank `except` (and with onlyWaiting the ranks not waiting on communication).
std::string CoordinatorService::whoWaits(int except, bool onlyWaiting) const {
  std::map<std::string, std::vector<int>> byWhere;
  for (int i = 0; i < opt_.worldSize; ++i)
    if (i != except && ranks_[i].reported && !ranks_[i].finished && (!onlyWaiting || ranks_[i].waiting))
      byWhere[ranks_[i].where].push_back(i);
  std::string text;
  for (auto &[where, ranks] : byWhere) {
    std::string list;
    for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
    text += (text.empty() ? "" : "; ") + std::string(ranks.size() > 1 ? "ranks " : "rank ") + list +
            (ranks_[ranks[0]].waiting ? (ranks.size() > 1 ? " wait in " : " waits in ") : " at ") + where;
  }
  return text;
}

bool CoordinatorService::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  bool allFinished = true;
  std::string unregistered;
  for (int i = 0; i < opt_.worldSize; ++i) {
    RankState &r = ranks_[i];
    if (!r.finished) allFinished = false;
    if (!r.registered) unregistered += (unregistered.empty() ? "" : ",") + std::to_string(i);
    if (r.registered && !r.finished && !aborted_ && secondsSince(r.lastSeen) > opt_.heartbeatTimeoutSeconds) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "rank %d (host %s, pid %lld) stopped heart-beating %.1f s ago", i, r.host.c_str(),
                    (long long)r.pid, secondsSince(r.lastSeen));
      std::string reason = buf;
      if (r.reported) reason += " in " + r.where;
      if (std::string others = whoWaits(i, false); !others.empty()) reason += "; " + others;
      abortLocked(reason);
    }
  }
  if (!aborted_ && !unregistered.empty() && secondsSince(started_) > opt_.registrationTimeoutSeconds)
    abortLocked("ranks " + unregistered + " never registered");
  // A stall: every rank alive and reporting, none has finished an instruction for the limit,
  // and none is outside the plan's instructions (checkpoint I/O, logging). The ranks not
  // waiting on communication are the stalled ones (a lone rank stuck in a kernel too).
  bool allReporting = true, someIdle = false;
  double quiet = 1e30;
  for (const RankState &r : ranks_) {
    allReporting &= r.reported && !r.finished;
    someIdle |= r.idle;
    if (r.reported) quiet = std::min(quiet, secondsSince(r.lastProgress));
  }
  if (!aborted_ && allReporting && !someIdle && quiet > stallLimitSeconds()) {
    std::string stalled;
    for (int i = 0; i < opt_.worldSize; ++i)
      if (!ranks_[i].waiting) stalled += (stalled.empty() ? "" : "; ") + ("rank " + std::to_string(i) + " stopped in " + ranks_[i].where);
    std::string waiters = whoWaits(-1, true);
    char limit[96];
    std::snprintf(limit, sizeof limit, " (no instruction finished on any rank for %.0f s; limit %.0f s)", quiet,
                  stallLimitSeconds());
    abortLocked(stalled.empty() ? "no rank makes progress: " + waiters + limit
                                : stalled + (waiters.empty() ? "" : "; " + waiters) + limit);
  }
  if (allFinished) return true;
  // After an abort, wait until the live ranks heard it (they heartbeat every second).
  return aborted_ && secondsSince(abortedAt_) > 3;
}

bool CoordinatorService::succeeded() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return false;
  for (const RankState &r : ranks_)
    if (!r.finished || r.exitCode != 0) return false;
  return true;
}

std::string CoordinatorService::abortReason() {
  std::lock_guard<std::mutex> lock(mu_);
  return abortReason_;
}

}  // namespace loom::control
