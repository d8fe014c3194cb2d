// loom-rank: one rank of a Loom job (like a torchrun worker).
//   loom-rank --coordinator HOST:PORT --rank R [--steps N] [--lr 3e-4] [--seed S]
//             [--address IP] [--threads T] [--dump-grads DIR] [--connect-timeout 20]
//             [--comm-timeout 30]
// The job token comes from $LOOM_TOKEN (or --token). The rank fetches its plan from the
// coordinator, connects its communicators, trains, and exits non-zero with a one-line error
// naming the cause (an unreachable coordinator, a bad plan, a dead peer, an aborted job).
#include <unistd.h>

#include <atomic>
#include <cblas.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "protos/plan.pb.h"
#include "runtime/GlooCollectives.h"
#include "runtime/Safetensors.h"
#include "runtime/Trainer.h"
#include "runtime/control/CoordinatorClient.h"
#include "runtime/control/Flags.h"

namespace {

uint64_t fnv1a(const std::string &bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

struct RankJob {
  loom::control::CoordinatorClient *client = nullptr;
  int rank = 0;
  std::atomic<int64_t> step{0};
  std::atomic<bool> done{false};
};

// Heart-beats every second; ends the process when the coordinator reports an abort or can no
// longer be reached for `deadSeconds` (a rank blocked in a collective with a dead peer must
// not hang).
void heartbeatLoop(RankJob *job, double deadSeconds) {
  auto lastOk = std::chrono::steady_clock::now();
  while (!job->done) {
    bool aborted = false;
    std::string reason;
    loom::Status s = job->client->heartbeat(job->rank, job->step, &aborted, &reason);
    if (s.isOk()) lastOk = std::chrono::steady_clock::now();
    if (aborted) {
      std::fprintf(stderr, "loom-rank %d: error: job aborted: %s\n", job->rank, reason.c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }
    double silent = std::chrono::duration<double>(std::chrono::steady_clock::now() - lastOk).count();
    if (!s.isOk() && silent > deadSeconds) {
      std::fprintf(stderr, "loom-rank %d: error: lost the coordinator for %.0f s: %s\n", job->rank, silent,
                   s.message().c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

loom::Status fetchPlan(loom::control::CoordinatorClient &client, int rank, int worldSize, loom::plan::RankPlan *plan,
                       loom::plan::ProgramSet *programs) {
  std::string name = "rank_" + std::to_string(rank) + ".plan.pb", bytes;
  LOOM_RETURN_IF_ERROR(client.getFile(name, &bytes));
  if (!plan->ParseFromString(bytes) || plan->world_size() <= 0)
    return loom::Status::error(name + ": corrupt plan (not a RankPlan)");
  if (plan->rank() != rank)
    return loom::Status::error(name + ": the plan is for rank " + std::to_string(plan->rank()) + ", not rank " +
                               std::to_string(rank));
  if (plan->world_size() != worldSize)
    return loom::Status::error(name + ": the plan is for a world of " + std::to_string(plan->world_size()) +
                               " ranks but the job has " + std::to_string(worldSize));
  std::string pbytes;
  LOOM_RETURN_IF_ERROR(client.getFile(plan->programs_file(), &pbytes));
  if (fnv1a(pbytes) != plan->programs_checksum())
    return loom::Status::error(plan->programs_file() + ": checksum mismatch (corrupt, or from another compile)");
  if (!programs->ParseFromString(pbytes)) return loom::Status::error(plan->programs_file() + ": corrupt program file");
  return loom::Status::ok();
}

loom::Status dumpGradients(const loom::Trainer &trainer, const std::string &dir, double loss, bool hasLoss) {
  std::filesystem::create_directories(dir);
  loom::SafetensorsFile file;
  for (const loom::plan::Parameter &p : trainer.plan().parameters()) {
    file.tensors[p.name()] = trainer.gradients().at(p.name());
    file.metadata[p.name()] = std::to_string(p.shard_dim()) + "," + std::to_string(p.shard_parts()) + "," +
                              std::to_string(p.shard_index());
  }
  if (hasLoss) file.metadata["__loss__"] = std::to_string(loss);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", loss);
  if (hasLoss) file.metadata["__loss__"] = buf;
  return loom::writeSafetensors(dir + "/grads_rank" + std::to_string(trainer.plan().rank()) + ".safetensors", file);
}

}  // namespace

int main(int argc, char **argv) {
  loom::Flags flags(argc, argv, "loom-rank",
                    {"coordinator", "rank", "steps", "lr", "seed", "address", "threads", "dump-grads", "token",
                     "connect-timeout", "comm-timeout"});
  if (!flags.ok()) return 2;
  if (!flags.has("coordinator") || !flags.has("rank")) return flags.fail("--coordinator HOST:PORT and --rank R are required");
  int rank = std::atoi(flags.get("rank").c_str());
  std::string token = flags.get("token", std::getenv("LOOM_TOKEN") ? std::getenv("LOOM_TOKEN") : "");
  if (token.empty()) return flags.fail("no job token: set LOOM_TOKEN (loom-coord prints it) or pass --token");
  std::string tool = "loom-rank " + std::to_string(rank);
  if (flags.has("threads")) openblas_set_num_threads(std::atoi(flags.get("threads").c_str()));

  loom::control::CoordinatorClient client(flags.get("coordinator"), token);
  loom::control::RegisterReply reg;
  loom::Status s = client.connect(rank, std::stod(flags.get("connect-timeout", "20")), &reg);
  if (!s.isOk()) {
    std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), s.message().c_str());
    return 1;
  }
  RankJob job;
  job.client = &client;
  job.rank = rank;
  auto fail = [&](const std::string &msg) {
    std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), msg.c_str());
    (void)client.abort(rank, msg);
    (void)client.finish(rank, 1);
    job.done = true;
    return 1;
  };
  // A failed collective usually means a peer died: give the coordinator time to name it
  // (loomrun reports a dead child at once; a silent rank is declared dead after the heartbeat
  // timeout), and only then report this rank's own error.
  auto failAfterVerdict = [&](const std::string &msg) {
    for (int i = 0; i < 60; ++i) {
      bool aborted = false;
      std::string reason;
      if (client.heartbeat(rank, job.step, &aborted, &reason).isOk() && aborted) {
        std::fprintf(stderr, "%s: error: job aborted: %s (here: %s)\n", tool.c_str(), reason.c_str(), msg.c_str());
        job.done = true;
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return fail(msg);
  };
  std::thread heartbeat(heartbeatLoop, &job, 10.0);
  heartbeat.detach();

  loom::plan::RankPlan plan;
  loom::plan::ProgramSet programs;
  if (s = fetchPlan(client, rank, reg.world_size(), &plan, &programs); !s.isOk()) return fail(s.message());

  loom::control::CoordinatorStore store(client);
  std::unique_ptr<loom::GlooCollectives> collectives;
  double commTimeout = std::stod(flags.get("comm-timeout", "30"));
  if (s = loom::GlooCollectives::create(plan, store, flags.get("address", "127.0.0.1"), commTimeout, &collectives);
      !s.isOk())
    return fail(s.message());
  if (s = client.barrier("ready", rank, 60000); !s.isOk()) return fail(s.message());

  uint64_t seed = std::stoull(flags.get("seed", "1234"));
  loom::SyntheticData data(plan.seq_length(), plan.vocab_size(), seed + 1);
  loom::Trainer trainer(plan, programs, collectives.get(), &data, {seed, {}});
  int64_t steps = std::atoll(flags.get("steps", "1").c_str());
  double lr = std::stod(flags.get("lr", "3e-4"));
  bool logs = trainer.isLossRank() && plan.tp_rank() == 0 && plan.dp_rank() == 0;
  for (int64_t step = 0; step < steps; ++step) {
    job.step = step;
    loom::StepResult r;
    if (s = trainer.computeGradients(step, &r); !s.isOk()) return failAfterVerdict(s.message());
    if (step == 0 && flags.has("dump-grads"))
      if (s = dumpGradients(trainer, flags.get("dump-grads"), r.loss, r.hasLoss); !s.isOk()) return fail(s.message());
    trainer.applyOptimizer(step + 1, lr);
    if (logs)
      std::printf(" iteration %6lld/%6lld | lm loss: %.6E | elapsed time per iteration (ms): %.1f\n",
                  (long long)step + 1, (long long)steps, r.loss, r.seconds * 1000);
    std::fflush(stdout);
    if (r.hasLoss) (void)client.metrics(rank, step, {{"loss", r.loss}});
  }
  job.done = true;
  if (s = client.barrier("done", rank, 120000); !s.isOk()) return fail(s.message());
  (void)client.finish(rank, 0);
  return 0;
}
