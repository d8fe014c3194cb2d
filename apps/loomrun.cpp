// loomrun: start a local Loom job, like torchrun: the coordinator and N rank processes.
//   loomrun --nproc N --plans DIR [--bind 127.0.0.1] [--port 0] [--max-restarts N]
//           [--tls-cert F --tls-key F --tls-ca F | --insecure] [RANK FLAGS...]
// Rank flags (--steps, --lr, --seed, --threads, --dump-grads, ...: apps/RankFlags.h) are
// checked here, then go to every loom-rank as they were given.
// The control plane is TLS: with a throwaway self-signed certificate the launcher creates
// (and removes) unless one is given; --insecure runs it in plaintext (loopback only).
// Exits 0 when every rank succeeded; otherwise non-zero after naming the rank that failed.
// When a rank dies, the others learn it from the coordinator and exit; any still running
// 5 s later are killed. With --max-restarts N the job is then launched again, up to N times,
// resuming from the newest complete checkpoint in --save.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "google/protobuf/text_format.h"
#include "plan/PlanVersion.h"
#include "apps/RankFlags.h"
#include "protos/plan.pb.h"
#include "support/CommandLine.h"
#include "runtime/control/CoordinatorClient.h"
#include "runtime/control/Tls.h"

namespace {

pid_t spawn(const std::vector<std::string> &args) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char *> argv;
    for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "loomrun: error: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "stopped";
}

std::vector<pid_t> children;
volatile sig_atomic_t interrupted = 0;  // SIGINT / SIGTERM: the user's stop, never restarted
void forwardSignal(int sig) {
  interrupted = 1;
  for (pid_t p : children) kill(p, sig);
}

}  // namespace

namespace cl = llvm::cl;

constexpr char kUsage[] =
    "loomrun: start a local Loom job, like torchrun: the coordinator and N rank processes.\n"
    "  loomrun --nproc N --plans DIR [--bind 127.0.0.1] [--port 0] [--max-restarts N]\n"
    "          [--tls-cert F --tls-key F --tls-ca F | --insecure] [RANK FLAGS...]\n"
    "The control plane is mutual TLS with a throwaway certificate unless one is given; the loom-rank\n"
    "options below go to every rank (see loom-rank --help).\n";

cl::OptionCategory category("loomrun options");
cl::opt<int> nprocFlag("nproc", cl::desc("rank processes to start (the plans' world size), required"),
                       cl::value_desc("N"), cl::init(0), cl::cat(category));
cl::opt<std::string> plansFlag("plans", cl::desc("the plan directory from `loomc compile`, required"),
                               cl::value_desc("DIR"), cl::cat(category));
cl::opt<std::string> bindFlag("bind", cl::desc("the coordinator's address"), cl::value_desc("ADDRESS"),
                              cl::init("127.0.0.1"), cl::cat(category));
cl::opt<std::string> portFlag("port", cl::desc("the coordinator's port (0: any free one)"), cl::value_desc("PORT"),
                              cl::init("0"), cl::cat(category));
cl::opt<std::string> tlsCert("tls-cert",
                             cl::desc("the job's certificate (coordinator and ranks; default: a throwaway one)"),
                             cl::value_desc("FILE"), cl::cat(category));
cl::opt<std::string> tlsKey("tls-key", cl::desc("the key of --tls-cert"), cl::value_desc("FILE"), cl::cat(category));
cl::opt<std::string> tlsCa("tls-ca", cl::desc("the CA that signed --tls-cert"), cl::value_desc("FILE"),
                           cl::cat(category));
cl::opt<bool> insecureFlag("insecure", cl::desc("a plaintext control plane (loopback only)"), cl::cat(category));
cl::opt<int> maxRestarts("max-restarts",
                         cl::desc("relaunch a failed job up to N times, each from the newest complete checkpoint in "
                                  "--save (torchrun's --max-restarts; the ranks resume it in any layout)"),
                         cl::value_desc("N"), cl::init(0), cl::cat(category));
cl::opt<bool> elasticFlag("elastic",
                          cl::desc("with --max-restarts: restart on the ranks that remain when ranks died by a signal "
                                   "(a node gone), in a layout for that count (loomc search, or --elastic-cluster) "
                                   "with the same global batch, compiled from --model"),
                          cl::cat(category));
cl::opt<std::string> modelFlag("model", cl::desc("--elastic: the model config the plans were compiled from"),
                               cl::value_desc("CONFIG.pbtxt"), cl::cat(category));
cl::opt<std::string> elasticCluster("elastic-cluster",
                                    cl::desc("--elastic: the cluster spec for the smaller job (default: the best "
                                             "layout loomc search finds for the ranks that remain)"),
                                    cl::value_desc("SPEC.pbtxt"), cl::cat(category));

// Why the plans in `plans` cannot run on `nproc` ranks ("" when they can).
std::string planError(const std::string &plans, int nproc) {
  std::ifstream in(plans + "/rank_0.plan.pb", std::ios::binary);
  loom::plan::RankPlan plan0;
  if (!in || !plan0.ParseFromIstream(&in))
    return plans + "/rank_0.plan.pb: missing or corrupt (compile with `loomc compile`)";
  if (std::string why = loom::planVersionError(plan0.plan_version(), plans + "/rank_0.plan.pb"); !why.empty())
    return why;
  if (plan0.world_size() != nproc)
    return "the plans in " + plans + " are for " + std::to_string(plan0.world_size()) + " ranks but --nproc is " +
           std::to_string(nproc);
  return "";
}

// Waits (up to 10 s) for the coordinator to write the port it listens on; why not ("": it did).
std::string awaitCoordinator(pid_t coord, const std::string &portFile, std::string *port) {
  for (int waited = 0; waited < 200 && port->empty(); ++waited) {
    int status;
    if (waitpid(coord, &status, WNOHANG) == coord)
      return "the coordinator " + describe(status) + " before it started listening";
    std::ifstream(portFile) >> *port;
    if (port->empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!port->empty()) return "";
  kill(coord, SIGKILL);
  return "the coordinator did not start within 10 s";
}

// The job's private directory (its path in *tmpOut) and its control plane's TLS: the files
// given, or a throwaway certificate made there; the TLS flags for the coordinator and the
// ranks. 0, or the exit code after a one-line error.
int prepareJob(bool insecure, loom::control::TlsFiles tlsFiles, std::string *tmpOut, loom::control::TlsMaterial *tls,
               std::vector<std::string> *tlsArgs) {
  // The job's private directory (mode 0700: the throwaway TLS key lives here), under $TMPDIR.
  const char *tmpRoot = std::getenv("TMPDIR") && *std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  std::string tmplString = std::string(tmpRoot) + "/loomrun.XXXXXX";
  std::vector<char> tmpl(tmplString.begin(), tmplString.end());
  tmpl.push_back('\0');
  if (!mkdtemp(tmpl.data())) {
    std::fprintf(stderr, "loomrun: error: cannot create a temporary directory: %s\n", std::strerror(errno));
    return 1;
  }
  *tmpOut = tmpl.data();
  const std::string &tmp = *tmpOut;
  if (insecure && tlsFiles.any()) {
    std::fprintf(stderr, "loomrun: error: --insecure and --tls-* contradict each other\n");
    return 2;
  }
  if (!insecure && !tlsFiles.any()) {
    if (loom::Status s = loom::control::createThrowawayCertificate(tmp, &tlsFiles); !s.isOk()) {
      std::fprintf(stderr, "loomrun: error: %s\n", s.message().c_str());
      std::filesystem::remove_all(tmp);
      return 1;
    }
  }
  if (loom::Status s = loom::control::loadTls(tlsFiles, tls); !s.isOk()) {
    std::fprintf(stderr, "loomrun: error: %s\n", s.message().c_str());
    std::filesystem::remove_all(tmp);
    return 2;
  }
  // The same files go to the coordinator (its certificate, and the CA its clients need) and
  // to every rank (the CA to trust, and the certificate that identifies the rank).
  if (insecure) *tlsArgs = {"--insecure"};
  for (auto [flag, path] : {std::pair{"--tls-cert", tlsFiles.cert}, {"--tls-key", tlsFiles.key}, {"--tls-ca", tlsFiles.ca}})
    if (!path.empty()) tlsArgs->insert(tlsArgs->end(), {flag, path});
  return 0;
}

namespace {
// What every attempt of the job starts with.
struct JobSpec {
  std::string self, plans, bind, port, tmp, token;
  loom::control::TlsMaterial tls;
  std::vector<std::string> tlsArgs;
  bool insecure = false;
  int nproc = 0;
  std::vector<std::string> rankArgs;
};
// *lost: the ranks that died by a signal loomrun did not send (a node gone, for --elastic).
int runJob(const JobSpec &job, int *lost);
std::string elasticPlans(const JobSpec &job, int survivors, int *nproc);
}  // namespace

int main(int argc, char **argv) {
  loom::control::silenceGrpcLogging();
  // The rank flags are parsed (and so checked) here too; what set them goes to every rank.
  if (!loom::parseCommandLine(argc, argv, kUsage, {&category, &loom::rankflags::category})) return 2;
  int nproc = nprocFlag;
  std::string plans = plansFlag, bind = bindFlag, port = portFlag;
  loom::control::TlsFiles tlsFiles{tlsCert, tlsKey, tlsCa};
  bool insecure = insecureFlag;
  const std::vector<std::string> &rankArgs = loom::rankflags::forwardedArguments();
  if (nproc < 1 || plans.empty()) {
    std::fprintf(stderr, "loomrun: error: usage: loomrun --nproc N --plans DIR [rank flags]\n");
    return 2;
  }
  if (std::string why = planError(plans, nproc); !why.empty()) {
    std::fprintf(stderr, "loomrun: error: %s\n", why.c_str());
    return 1;
  }
  std::string self = std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
  std::random_device rd;
  char token[33];
  std::snprintf(token, sizeof token, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  setenv("LOOM_TOKEN", token, 1);
  // One BLAS thread per rank unless told otherwise (--threads): ranks share the machine's cores.
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  std::string tmp;
  loom::control::TlsMaterial tls;
  std::vector<std::string> tlsArgs;
  if (int code = prepareJob(insecure, tlsFiles, &tmp, &tls, &tlsArgs)) return code;
  signal(SIGINT, forwardSignal);
  signal(SIGTERM, forwardSignal);
  JobSpec job{self, plans, bind, port, tmp, token, tls, tlsArgs, insecure, nproc, rankArgs};
  // --max-restarts: a failed job is launched again (fresh coordinator and ranks) and resumes from
  // the newest complete checkpoint; a checkpoint half-written by the failed attempt was never
  // published, so it is never read.
  if (maxRestarts < 0) {
    std::fprintf(stderr, "loomrun: error: --max-restarts must be >= 0, got %d\n", int(maxRestarts));
    std::filesystem::remove_all(tmp);
    return 2;
  }
  if (maxRestarts > 0 && std::string(loom::rankflags::save).empty()) {
    std::fprintf(stderr, "loomrun: error: --max-restarts needs --save DIR (a restart resumes from its checkpoints)\n");
    std::filesystem::remove_all(tmp);
    return 2;
  }
  if (elasticFlag && (maxRestarts < 1 || modelFlag.empty())) {
    std::fprintf(stderr, "loomrun: error: --elastic needs --max-restarts N and --model CONFIG.pbtxt\n");
    std::filesystem::remove_all(tmp);
    return 2;
  }
  int lost = 0;
  int code = runJob(job, &lost);
  for (int restart = 1; code != 0 && restart <= maxRestarts && !interrupted; ++restart) {
    if (elasticFlag && lost > 0 && job.nproc - lost >= 1) {
      // The ranks that remain: a layout for them (or for fewer, down to one) with the same
      // global batch, compiled; the checkpoint reshards into it on resume.
      int nproc = 0;
      std::string plansDir = elasticPlans(job, job.nproc - lost, &nproc);
      if (plansDir.empty()) break;
      std::fprintf(stderr, "loomrun: %d of %d ranks lost: continuing on %d ranks with the plans in %s\n", lost,
                   job.nproc, nproc, plansDir.c_str());
      job.plans = plansDir, job.nproc = nproc;
    }
    std::fprintf(stderr, "loomrun: restarting the job (restart %d of %d) on %d ranks from the newest complete "
                 "checkpoint in %s\n", restart, int(maxRestarts), job.nproc, std::string(loom::rankflags::save).c_str());
    if (!loom::rankflags::resume && !loom::rankflags::strictResume &&
        std::find(job.rankArgs.begin(), job.rankArgs.end(), "--resume") == job.rankArgs.end())
      job.rankArgs.push_back("--resume");
    code = runJob(job, &lost);
  }
  std::filesystem::remove_all(tmp);
  return code;
}

namespace {

// Runs a tool, its stdout into *out (its stderr to `log`); true when it exited 0.
bool runTool(const std::vector<std::string> &args, const std::string &log, std::string *out) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    int err = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (err >= 0) dup2(err, 2);
    close(fds[0]), close(fds[1]);
    std::vector<char *> argv;
    for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out->append(buf, size_t(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// --elastic: plans for `survivors` ranks (or the most below it that a layout fits, keeping the
// global batch): --elastic-cluster compiled, or the first layout `loomc search` ranks for the
// plans' cluster spec on one node of that many devices. "" after a one-line error.
std::string elasticPlans(const JobSpec &job, int survivors, int *nproc) {
  std::ifstream in(job.plans + "/rank_0.plan.pb", std::ios::binary);
  loom::plan::RankPlan plan0;
  if (!in || !plan0.ParseFromIstream(&in)) {
    std::fprintf(stderr, "loomrun: error: --elastic: %s/rank_0.plan.pb unreadable\n", job.plans.c_str());
    return "";
  }
  std::string loomc = job.self + "/loomc", log = job.tmp + "/elastic.log";
  for (int n = survivors; n >= 1; --n) {
    std::string spec = elasticCluster;
    if (spec.empty()) {
      loom::config::ClusterSpec c = plan0.cluster();
      c.set_nodes(1), c.set_devices_per_node(n);
      // The search takes the batch from the spec and chooses every parallel size itself.
      loom::config::ParallelConfig batch;
      batch.set_micro_batch_size(c.parallel().micro_batch_size());
      batch.set_global_batch_size(c.parallel().global_batch_size());
      *c.mutable_parallel() = batch;
      std::string text, found;
      google::protobuf::TextFormat::PrintToString(c, &text);
      std::string searchSpec = job.tmp + "/elastic-search-" + std::to_string(n) + ".pbtxt";
      std::ofstream(searchSpec) << text;
      if (!runTool({loomc, "search", modelFlag, "--cluster", searchSpec, "--top", "1", "--json"}, log, &found)) continue;
      nlohmann::json best = nlohmann::json::parse(found, nullptr, false);
      if (best.is_discarded() || !best.is_array() || best.empty()) continue;
      // The chosen layout as the cluster spec's parallel block (the search's field names).
      std::string parallel;
      for (const char *key : {"tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                              "virtual_pipeline_size", "micro_batch_size", "global_batch_size", "context_parallel_size",
                              "expert_parallel_size"})
        parallel += std::string(key) + ": " + std::to_string(best[0].value(key, int64_t(1))) + " ";
      for (const char *key : {"sequence_parallel", "zero1", "tp_comm_overlap"})
        parallel += std::string(key) + ": " + (best[0].value(key, false) ? "true " : "false ");
      parallel += "recompute: " + best[0].value("recompute", std::string("RECOMPUTE_NONE")) +
                  " schedule: " + best[0].value("schedule", std::string("ONE_F_ONE_B"));
      c.clear_parallel();
      if (!google::protobuf::TextFormat::MergeFromString(parallel, c.mutable_parallel())) continue;
      c.mutable_parallel()->set_dp_bucket_size_bytes(plan0.cluster().parallel().dp_bucket_size_bytes());
      google::protobuf::TextFormat::PrintToString(c, &text);
      spec = job.tmp + "/elastic-" + std::to_string(n) + ".pbtxt";
      std::ofstream(spec) << text;
    }
    std::string out = job.plans + ".elastic-" + std::to_string(n), ignored;
    std::filesystem::remove_all(out);
    if (!runTool({loomc, "compile", modelFlag, "--cluster", spec, "--out", out, "--quiet"}, log, &ignored)) {
      if (!elasticCluster.empty()) {
        std::fprintf(stderr, "loomrun: error: --elastic-cluster %s does not compile (see %s)\n", spec.c_str(), log.c_str());
        return "";
      }
      continue;
    }
    std::ifstream newPlan(out + "/rank_0.plan.pb", std::ios::binary);
    loom::plan::RankPlan first;
    if (!newPlan || !first.ParseFromIstream(&newPlan)) continue;
    *nproc = first.world_size();
    if (*nproc > survivors) {
      std::fprintf(stderr, "loomrun: error: --elastic-cluster %s needs %d ranks, %d remain\n", spec.c_str(), *nproc,
                   survivors);
      return "";
    }
    return out;
  }
  // The job's directory goes with it: the tools' last word goes into the message.
  std::string last, line;
  for (std::ifstream tools(log); std::getline(tools, line);)
    if (!line.empty()) last = line;
  std::fprintf(stderr, "loomrun: error: --elastic: no layout of the model fits %d or fewer ranks with the global batch "
               "%lld%s\n", survivors, (long long)plan0.global_batch_size(), last.empty() ? "" : (" (" + last + ")").c_str());
  return "";
}

// One attempt: the coordinator and the ranks, until every rank has ended. The exit code.
int runJob(const JobSpec &job, int *lost) {
  *lost = 0;
  const std::string &self = job.self, &plans = job.plans, &bind = job.bind, &port = job.port, &tmp = job.tmp;
  const std::vector<std::string> &tlsArgs = job.tlsArgs, &rankArgs = job.rankArgs;
  const loom::control::TlsMaterial &tls = job.tls;
  const std::string &token = job.token;
  bool insecure = job.insecure;
  int nproc = job.nproc;
  std::string portFile = tmp + "/port";
  std::filesystem::remove(portFile);  // a previous attempt's
  children.clear();
  children.reserve(size_t(nproc) + 1);  // the handler reads it; no reallocation while it may run
  std::vector<std::string> coordArgs = {self + "/loom-coord", "--plans", plans, "--bind", bind, "--port", port,
                                        "--port-file", portFile};
  coordArgs.insert(coordArgs.end(), tlsArgs.begin(), tlsArgs.end());
  pid_t coord = spawn(coordArgs);
  children.push_back(coord);
  std::string coordPort;
  if (std::string why = awaitCoordinator(coord, portFile, &coordPort); !why.empty()) {
    std::fprintf(stderr, "loomrun: error: %s\n", why.c_str());
    return 1;
  }
  std::string address = (bind == "0.0.0.0" ? "127.0.0.1" : bind) + ":" + coordPort;
  std::map<pid_t, int> rankOf;
  for (int r = 0; r < nproc; ++r) {
    std::vector<std::string> args = {self + "/loom-rank", "--coordinator", address, "--rank", std::to_string(r)};
    if (!insecure) args.insert(args.end(), tlsArgs.begin(), tlsArgs.end());
    args.insert(args.end(), rankArgs.begin(), rankArgs.end());
    pid_t pid = spawn(args);
    rankOf[pid] = r;
    children.push_back(pid);
  }

  loom::control::CoordinatorClient client(address, token, tls);
  int failures = 0, running = nproc, coordStatus = 0;
  bool coordDone = false, killed = false;
  auto firstFailure = std::chrono::steady_clock::time_point::max();
  while (running > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid == coord) {
      coordDone = true;
      coordStatus = status;
      continue;
    }
    if (pid > 0 && rankOf.count(pid)) {
      --running;
      int r = rankOf[pid];
      rankOf.erase(pid);  // reaped: never signalled again
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        ++failures;
        if (WIFSIGNALED(status) && !killed) ++*lost;  // not one loomrun killed itself
        std::fprintf(stderr, "loomrun: rank %d %s\n", r, describe(status).c_str());
        // A rank that reported its own error already told the coordinator; telling it again
        // is harmless, and covers ranks that died before registering. Once, briefly: the
        // coordinator may itself be stopped.
        if (failures == 1) (void)client.abort(-1, "rank " + std::to_string(r) + " " + describe(status), 2);
        firstFailure = std::min(firstFailure, std::chrono::steady_clock::now());
      }
      continue;
    }
    if (!killed && std::chrono::steady_clock::now() - firstFailure > std::chrono::seconds(5)) {
      for (auto &[p, r] : rankOf) kill(p, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Every rank is gone: the coordinator ends at once after a success and after an abort; one
  // that is still there (stopped, or stuck) is killed after 10 s, or 3 s if the job failed.
  int coordPolls = failures > 0 ? 60 : 200;
  for (int waited = 0; waited < coordPolls && !coordDone; ++waited) {
    if (waitpid(coord, &coordStatus, WNOHANG) == coord) break;
    if (waited == coordPolls - 1) {
      kill(coord, SIGKILL);
      waitpid(coord, &coordStatus, 0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (failures > 0) {
    std::fprintf(stderr, "loomrun: error: %d of %d ranks failed\n", failures, nproc);
    return 1;
  }
  return WIFEXITED(coordStatus) && WEXITSTATUS(coordStatus) == 0 ? 0 : 1;
}

}  // namespace
