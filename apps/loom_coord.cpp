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

#include "plan/PlanVersion.h"
#include "protos/plan.pb.h"
#include "runtime/control/CoordinatorService.h"
#include "support/CommandLine.h"
#include "runtime/control/Tls.h"

constexpr char kUsage[] =
    "loom-coord: a Loom job's control plane (registration, plan files, rendezvous, heartbeats).\n"
    "  loom-coord --plans DIR [--bind 127.0.0.1] [--port 0] [--port-file F] [--token T]\n"
    "             [--heartbeat-timeout 10] [--registration-timeout 120]\n"
    "             [--tls-cert F --tls-key F [--tls-ca F]] [--insecure]\n"
    "A reachable (non-loopback) address is served only over TLS unless --insecure is given.\n"
    "Exits 0 once every rank finished successfully, 1 if the job was aborted.\n";

namespace cl = llvm::cl;

cl::OptionCategory category("loom-coord options");
cl::opt<std::string> plans("plans", cl::desc("the job's plan directory (from `loomc compile`), required"),
                           cl::value_desc("DIR"), cl::cat(category));
cl::opt<std::string> bindAddress("bind", cl::desc("the address to serve on"), cl::value_desc("ADDRESS"),
                                 cl::init("127.0.0.1"), cl::cat(category));
cl::opt<std::string> portFlag("port", cl::desc("the port to serve on (0: any free one)"), cl::value_desc("PORT"),
                              cl::init("0"), cl::cat(category));
cl::opt<std::string> portFile("port-file", cl::desc("write the port served on to FILE once listening"),
                              cl::value_desc("FILE"), cl::cat(category));
cl::opt<std::string> tokenFlag("token", cl::desc("the job token (default: $LOOM_TOKEN, else a new one, printed)"),
                               cl::value_desc("T"), cl::cat(category));
cl::opt<double> heartbeatTimeout("heartbeat-timeout", cl::desc("seconds without a heartbeat before a rank is dead"),
                                 cl::value_desc("S"), cl::init(10), cl::cat(category));
cl::opt<double> registrationTimeout("registration-timeout",
                                    cl::desc("seconds for every rank to register before the job is aborted"),
                                    cl::value_desc("S"), cl::init(120), cl::cat(category));
cl::opt<std::string> tlsCert("tls-cert", cl::desc("the coordinator's certificate: serve over TLS"),
                             cl::value_desc("FILE"), cl::cat(category));
cl::opt<std::string> tlsKey("tls-key", cl::desc("the key of --tls-cert"), cl::value_desc("FILE"), cl::cat(category));
cl::opt<std::string> tlsCa("tls-ca", cl::desc("require client certificates signed by this CA (mutual TLS)"),
                           cl::value_desc("FILE"), cl::cat(category));
cl::opt<bool> insecure("insecure", cl::desc("serve in plaintext even on an address other machines can reach"),
                       cl::cat(category));

int main(int argc, char **argv) {
  loom::control::silenceGrpcLogging();
  if (!loom::parseCommandLine(argc, argv, kUsage, {&category})) return 2;
  auto fail = [](const std::string &msg) {
    std::fprintf(stderr, "loom-coord: error: %s\n", msg.c_str());
    return 1;
  };
  std::string planDir = plans;
  if (planDir.empty()) return fail("--plans DIR is required (a directory from `loomc compile`)");
  std::ifstream rank0(planDir + "/rank_0.plan.pb", std::ios::binary);
  loom::plan::RankPlan plan0;
  if (!rank0 || !plan0.ParseFromIstream(&rank0))
    return fail(planDir + "/rank_0.plan.pb: missing or corrupt (not a plan directory from `loomc compile`)");
  if (std::string why = loom::planVersionError(plan0.plan_version(), planDir + "/rank_0.plan.pb"); !why.empty())
    return fail(why);

  const char *envToken = std::getenv("LOOM_TOKEN");
  std::string token = tokenFlag.getNumOccurrences() ? tokenFlag : std::string(envToken ? envToken : "");
  if (token.empty()) {
    std::random_device rd;
    char buf[33];
    std::snprintf(buf, sizeof buf, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    token = buf;
    std::printf("loom-coord: job token %s (pass it to the ranks as LOOM_TOKEN)\n", token.c_str());
  }
  loom::control::CoordinatorOptions opt{planDir, token, plan0.world_size(), heartbeatTimeout, registrationTimeout};
  // Before a step has been measured, a stall is declared after ten times what the plan's work
  // would take at the device's peak (at least the minimum): rank 0's FLOPs per step over its
  // device's FLOP/s.
  if (plan0.device_peak_flops() > 0)
    opt.firstStepStallSeconds = std::max(opt.minStallSeconds, 10 * plan0.flops_per_step() / plan0.device_peak_flops());
  loom::control::TlsFiles tlsFiles{tlsCert, tlsKey, tlsCa};
  if (insecure && tlsFiles.any()) return fail("--insecure and --tls-* contradict each other");
  loom::control::TlsMaterial tls;
  if (loom::Status s = loom::control::loadTls(tlsFiles, &tls); !s.isOk()) return fail(s.message());
  if (!tlsFiles.ca.empty() && tlsFiles.cert.empty())
    return fail("--tls-ca needs --tls-cert and --tls-key (the coordinator's own certificate)");
  if (!loom::control::isLoopback(bindAddress) && !tls.enabled() && !insecure)
    return fail("refusing to serve the job token in plaintext on " + bindAddress +
                ", which other machines can reach: give --tls-cert, --tls-key and --tls-ca, or --insecure");
  loom::control::CoordinatorService service(opt);
  std::string address = bindAddress + ":" + portFlag;
  int listening = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, loom::control::serverCredentials(tls), &listening);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || listening == 0) return fail("cannot listen on " + address);
  if (!portFile.empty()) {
    std::string tmp = portFile + ".tmp";
    std::ofstream(tmp) << listening << "\n";
    std::filesystem::rename(tmp, std::string(portFile));
  }
  std::fprintf(stderr, "loom-coord: serving %s for %d ranks on %s:%d (%s)\n", planDir.c_str(), opt.worldSize,
               bindAddress.c_str(), listening,
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
