#include "runtime/control/CoordinatorClient.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gloo/common/error.h"

namespace loom::control {

CoordinatorClient::CoordinatorClient(std::string address, std::string token, const TlsMaterial &tls)
    : address_(std::move(address)), token_(std::move(token)) {
  channel_ = grpc::CreateChannel(address_, channelCredentials(tls));
  tls_ = tls.enabled();
  clientCertificate_ = !tls.certPem.empty();
  rpc_ = Coordinator::NewStub(channel_);
}

std::unique_ptr<grpc::ClientContext> CoordinatorClient::context(double seconds) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("loom-token", token_);
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(int64_t(seconds * 1000)));
  return ctx;
}

Status CoordinatorClient::translate(const grpc::Status &st, const std::string &what) {
  if (st.ok()) return Status::ok();
  switch (st.error_code()) {
    case grpc::StatusCode::PERMISSION_DENIED:
      return Status::error("the coordinator at " + address_ + " refused the job token (check LOOM_TOKEN)");
    case grpc::StatusCode::UNAVAILABLE:
      return Status::error("the coordinator at " + address_ + " is unreachable (" + st.error_message() + ")");
    case grpc::StatusCode::ABORTED:
      return Status::error("the job was aborted: " + st.error_message());
    default:
      return Status::error(what + ": " + st.error_message());
  }
}

Status CoordinatorClient::connect(int rank, double retrySeconds, RegisterReply *reply) {
  auto start = std::chrono::steady_clock::now();
  double backoff = 0.1;
  int attempts = 0;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  for (;;) {
    ++attempts;
    RegisterRequest req;
    req.set_rank(rank);
    req.set_host(host);
    req.set_pid(getpid());
    auto ctx = context(5);
    grpc::Status st = rpc_->Register(ctx.get(), req, reply);
    if (st.ok()) return Status::ok();
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // A failed TLS handshake means the coordinator is up and refuses this peer (or this
    // peer refuses its certificate): trying again changes nothing.
    bool handshake = st.error_message().find("andshake failed") != std::string::npos;
    bool retryable = (st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                      st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) && !handshake;
    if (!retryable && !handshake) return translate(st, "registration of rank " + std::to_string(rank));
    if (!retryable || elapsed + backoff > retrySeconds) {
      // The server closing the connection at once is what a TLS coordinator does to a
      // plaintext client, and a mutual-TLS one to a client without a certificate.
      std::string hint;
      if (st.error_message().find("Socket closed") != std::string::npos)
        hint = !tls_                  ? "; if the coordinator uses TLS, give --tls-ca"
               : !clientCertificate_ ? "; if the coordinator requires client certificates, give --tls-cert and --tls-key"
                                     : "; the coordinator may not accept this certificate (signed by another CA?)";
      char buf[768];
      std::snprintf(buf, sizeof buf, "cannot reach the coordinator at %s after %d attempts over %.1f s (%s)%s",
                    address_.c_str(), attempts, elapsed, st.error_message().c_str(), hint.c_str());
      return Status::error(buf);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(int64_t(backoff * 1000)));
    backoff = std::min(backoff * 2, 2.0);
  }
}

Status CoordinatorClient::getFile(const std::string &name, std::string *content) {
  GetFileRequest req;
  req.set_name(name);
  GetFileReply rep;
  auto ctx = context(60);
  Status s = translate(rpc_->GetFile(ctx.get(), req, &rep), "fetching " + name);
  if (s.isOk()) *content = rep.content();
  return s;
}

Status CoordinatorClient::kvSet(const std::string &key, const std::string &value) {
  KvSetRequest req;
  req.set_key(key);
  req.set_value(value);
  Empty rep;
  auto ctx = context(30);
  return translate(rpc_->KvSet(ctx.get(), req, &rep), "store set " + key);
}

Status CoordinatorClient::kvGet(const std::string &key, int64_t timeoutMs, std::string *value) {
  KvGetRequest req;
  req.set_key(key);
  req.set_timeout_ms(timeoutMs);
  KvGetReply rep;
  auto ctx = context(timeoutMs / 1000.0 + 5);
  Status s = translate(rpc_->KvGet(ctx.get(), req, &rep), "store get " + key);
  if (s.isOk()) *value = rep.value();
  return s;
}

Status CoordinatorClient::barrier(const std::string &name, int rank, int64_t timeoutMs) {
  BarrierRequest req;
  req.set_name(name);
  req.set_rank(rank);
  req.set_timeout_ms(timeoutMs);
  Empty rep;
  auto ctx = context(timeoutMs / 1000.0 + 5);
  return translate(rpc_->Barrier(ctx.get(), req, &rep), "barrier " + name);
}

Status CoordinatorClient::heartbeat(int rank, int64_t step, bool *aborted, std::string *reason,
                                    const RankProgress *progress) {
  HeartbeatRequest req;
  req.set_rank(rank);
  req.set_step(step);
  if (progress) {
    req.set_completed(progress->completed);
    req.set_waiting(progress->waiting);
    req.set_idle(progress->idle);
    req.set_where(progress->where);
    req.set_longest_step_seconds(progress->longestStepSeconds);
  }
  HeartbeatReply rep;
  auto ctx = context(5);
  Status s = translate(rpc_->Heartbeat(ctx.get(), req, &rep), "heartbeat");
  if (s.isOk()) *aborted = rep.aborted(), *reason = rep.reason();
  return s;
}

Status CoordinatorClient::metrics(int rank, int64_t step, const std::map<std::string, double> &values, int64_t waitMs,
                                  MetricsReply *reply) {
  MetricsRequest req;
  req.set_rank(rank);
  req.set_step(step);
  req.set_wait_ms(waitMs);
  for (auto &[k, v] : values) (*req.mutable_values())[k] = v;
  MetricsReply rep;
  auto ctx = context(10 + double(waitMs) / 1000);
  Status s = translate(rpc_->ReportMetrics(ctx.get(), req, &rep), "metrics");
  if (reply) *reply = rep;
  return s;
}

Status CoordinatorClient::abort(int rank, const std::string &reason, double seconds) {
  AbortRequest req;
  req.set_rank(rank);
  req.set_reason(reason);
  Empty rep;
  auto ctx = context(seconds);
  return translate(rpc_->Abort(ctx.get(), req, &rep), "abort");
}

Status CoordinatorClient::finish(int rank, int exitCode) {
  FinishRequest req;
  req.set_rank(rank);
  req.set_exit_code(exitCode);
  Empty rep;
  auto ctx = context(10);
  return translate(rpc_->Finish(ctx.get(), req, &rep), "finish");
}

void CoordinatorStore::set(const std::string &key, const std::vector<char> &data) {
  Status s = client_.kvSet(key, std::string(data.begin(), data.end()));
  if (!s.isOk()) throw gloo::IoException(s.message());
}

std::vector<char> CoordinatorStore::get(const std::string &key) {
  std::string value;
  Status s = client_.kvGet(key, 60000, &value);
  if (!s.isOk()) throw gloo::IoException(s.message());
  return {value.begin(), value.end()};
}

void CoordinatorStore::wait(const std::vector<std::string> &keys) { wait(keys, std::chrono::seconds(60)); }

void CoordinatorStore::wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) {
  for (const std::string &k : keys) {
    std::string ignored;
    Status s = client_.kvGet(k, timeout.count(), &ignored);
    if (!s.isOk()) throw gloo::IoException(s.message());
  }
}

}  // namespace loom::control
