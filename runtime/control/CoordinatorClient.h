// A rank's side of the control plane: every call carries the job token and a deadline, and
// failures come back as one-line Status messages naming the coordinator's address.
#pragma once

#include <memory>
#include <string>

#include "gloo/rendezvous/store.h"
#include "protos/control.grpc.pb.h"
#include "support/Status.h"
#include "runtime/control/Tls.h"

namespace loom::control {

class CoordinatorClient {
 public:
  // Without TLS material the channel is plaintext (a loopback coordinator started with --insecure).
  CoordinatorClient(std::string address, std::string token, const TlsMaterial &tls = {});

  // Registers `rank`, retrying with exponential backoff for up to `retrySeconds` while the
  // coordinator is unreachable.
  Status connect(int rank, double retrySeconds, RegisterReply *reply);
  Status getFile(const std::string &name, std::string *content);
  Status kvSet(const std::string &key, const std::string &value);
  Status kvGet(const std::string &key, int64_t timeoutMs, std::string *value);
  Status barrier(const std::string &name, int rank, int64_t timeoutMs);
  // `progress`: where the rank is (null: not training yet).
  struct RankProgress {
    int64_t completed = 0;
    bool waiting = false, idle = false;
    std::string where;
    double longestStepSeconds = 0;  // the longest iteration finished so far
  };
  Status heartbeat(int rank, int64_t step, bool *aborted, std::string *reason, const RankProgress *progress = nullptr);
  // `waitMs` > 0: wait that long for every rank's compute-seconds of `step`; `reply` (optional)
  // gets the straggler report (MetricsReply.complete when every rank's report was in).
  Status metrics(int rank, int64_t step, const std::map<std::string, double> &values, int64_t waitMs = 0,
                 MetricsReply *reply = nullptr);
  // `seconds`: how long to wait for the coordinator (a launcher reporting a dead child must not
  // hang on a coordinator that is itself stopped).
  Status abort(int rank, const std::string &reason, double seconds = 5);
  Status finish(int rank, int exitCode);
  const std::string &address() const { return address_; }

 private:
  std::unique_ptr<grpc::ClientContext> context(double seconds);
  Status translate(const grpc::Status &st, const std::string &what);

  std::string address_, token_;
  bool tls_ = false, clientCertificate_ = false;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Coordinator::Stub> rpc_;
};

// The Gloo rendezvous store on the coordinator's key-value store.
class CoordinatorStore : public gloo::rendezvous::Store {
 public:
  explicit CoordinatorStore(CoordinatorClient &client) : client_(client) {}
  void set(const std::string &key, const std::vector<char> &data) override;
  std::vector<char> get(const std::string &key) override;
  void wait(const std::vector<std::string> &keys) override;
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override;

 private:
  CoordinatorClient &client_;
};

}  // namespace loom::control
