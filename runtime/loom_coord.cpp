// loom-coord: the job's control plane (see protos/control.proto).
//   loom-coord --plans DIR [--bind 127.0.0.1] [--port 0] [--port-file F] [--token T]
//              [--heartbeat-timeout 10] [--tls-cert F --tls-key F [--tls-ca F]] [--insecure]
// The token comes from --token or $LOOM_TOKEN; without either, one is generated and printed.
// With --tls-cert/--tls-key the control plane is TLS; with --tls-ca as well, every client must
// present a certificate that CA signed. An address other machines can reach is served only
// over TLS, unless --insecure says plaintext is meant.
// Exits 0 once every rank finished successfully, 1 if the job was aborted.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "runtime/PlanVersion.h"
#include "protos/plan.pb.h"
#include "runtime/control/CoordinatorService.h"
#include "runtime/control/Flags.h"
#include "runtime/control/Tls.h"

constexpr char kUsage[] =
    "loom-coord: a Loom job's control plane (registration, plan files, rendezvous, heartbeats).\n"
    "  loom-coord --plans DIR [--bind 127.0.0.1] [--port 0] [--port-file F] [--token T]\n"
    "             [--heartbeat-timeout 10] [--registration-timeout 120]\n"
    "             [--tls-cert F --tls-key F [--tls-ca F]] [--insecure]\n"
    "A reachable (non-loopback) address is served only over TLS unless --insecure is given.\n"
    "Exits 0 once every rank finished successfully, 1 if the job was aborted.";

int main(int argc, char **argv) {
  loom::control::silenceGrpcLogging();
  loom::Flags flags(argc, argv, "loom-coord",
                    {"plans", "bind", "port", "port-file", "token", "heartbeat-timeout", "registration-timeout", "tls-cert",
                     "tls-key", "tls-ca"},
                    {"insecure"});
  if (flags.help(kUsage)) return 0;
  if (!flags.ok()) return 2;
  std::string planDir = flags.get("plans");
  if (planDir.empty()) return flags.fail("--plans DIR is required (a directory from `loomc compile`)");
  std::ifstream rank0(planDir + "/rank_0.plan.pb", std::ios::binary);
  loom::plan::RankPlan plan0;
  if (!rank0 || !plan0.ParseFromIstream(&rank0))
    return flags.fail(planDir + "/rank_0.plan.pb: missing or corrupt (not a plan directory from `loomc compile`)");
  if (std::string why = loom::planVersionError(plan0.plan_version(), planDir + "/rank_0.plan.pb"); !why.empty())
    return flags.fail(why);

  std::string token = flags.get("token", std::getenv("LOOM_TOKEN") ? std::getenv("LOOM_TOKEN") : "");
  if (token.empty()) {
    std::random_device rd;
    char buf[33];
    std::snprintf(buf, sizeof buf, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    token = buf;
    std::printf("loom-coord: job token %s (pass it to the ranks as LOOM_TOKEN)\n", token.c_str());
  }
  loom::control::CoordinatorOptions opt{planDir, token, plan0.world_size(), flags.number("heartbeat-timeout", 10),
                                        flags.number("registration-timeout", 120)};
  // Before a step has been measured, a stall is declared after ten times what the plan's work
  // would take at the device's peak (at least the minimum): rank 0's FLOPs per step over its
  // device's FLOP/s.
  if (plan0.device_peak_flops() > 0)
    opt.firstStepStallSeconds = std::max(opt.minStallSeconds, 10 * plan0.flops_per_step() / plan0.device_peak_flops());
  if (!flags.ok()) return 2;
  loom::control::TlsFiles tlsFiles{flags.get("tls-cert"), flags.get("tls-key"), flags.get("tls-ca")};
  if (flags.has("insecure") && tlsFiles.any()) return flags.fail("--insecure and --tls-* contradict each other");
  loom::control::TlsMaterial tls;
  if (loom::Status s = loom::control::loadTls(tlsFiles, &tls); !s.isOk()) return flags.fail(s.message());
  if (!tlsFiles.ca.empty() && tlsFiles.cert.empty())
    return flags.fail("--tls-ca needs --tls-cert and --tls-key (the coordinator's own certificate)");
  std::string bind = flags.get("bind", "127.0.0.1");
  if (!loom::control::isLoopback(bind) && !tls.enabled() && !flags.has("insecure"))
    return flags.fail("refusing to serve the job token in plaintext on " + bind +
                      ", which other machines can reach: give --tls-cert, --tls-key and --tls-ca, or --insecure");
  loom::control::CoordinatorService service(opt);
  std::string address = bind + ":" + flags.get("port", "0");
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, loom::control::serverCredentials(tls), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return flags.fail("cannot listen on " + address);
  if (!flags.get("port-file").empty()) {
    std::string tmp = flags.get("port-file") + ".tmp";
    std::ofstream(tmp) << port << "\n";
    std::filesystem::rename(tmp, flags.get("port-file"));
  }
  std::fprintf(stderr, "loom-coord: serving %s for %d ranks on %s:%d (%s)\n", planDir.c_str(), opt.worldSize,
               bind.c_str(), port,
               !tls.enabled()       ? "plaintext"
               : tls.caPem.empty() ? "TLS"
                                   : "mutual TLS");
  while (!service.poll()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (service.succeeded()) {
    std::fprintf(stderr, "loom-coord: all %d ranks finished\n", opt.worldSize);
    return 0;
  }
  std::fprintf(stderr, "loom-coord: error: job failed: %s\n", service.abortReason().c_str());
  return 1;
}
