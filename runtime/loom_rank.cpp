// loom-rank: one rank of a Loom job (like a torchrun worker).
//   loom-rank --coordinator HOST:PORT --rank R [--address IP] [--threads T] [--seed S]
//     data:        [--data-prefix PREFIX (loom-preprocess output; default: synthetic tokens)]
//                  [--valid-fraction 0.05] [--eval-interval N] [--eval-iters K]
//     recipe:      [--steps N] [--lr 3e-4] [--min-lr 3e-5] [--warmup N] [--decay-iters N]
//                  [--clip-grad 1.0] [--weight-decay 0.1] [--adam-beta1 0.9] [--adam-beta2 0.95]
//                  [--adam-eps 1e-8] [--log-interval 1]
//     checkpoints: [--save DIR] [--save-interval N] [--resume | --strict-resume] [--init-from HF.safetensors]
//                  [--export MODEL.safetensors]
//     tests:       [--dump-grads DIR] [--dump-batches DIR] [--loss-log FILE] [--connect-timeout 20]
//                  [--comm-timeout 30]
//     security:    [--tls-ca CA.pem] [--tls-cert RANK.pem --tls-key RANK.key] (a TLS coordinator)
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
#include "runtime/PlanFiles.h"
#include "runtime/GlooCollectives.h"
#include "formats/Safetensors.h"
#include "formats/HfGpt2.h"
#include "formats/HfLlama.h"
#include "runtime/PlanVersion.h"
#include "runtime/CpuBackend.h"
#include "runtime/cuda/Precision.h"
#ifdef LOOM_WITH_CUDA  // a build with the CUDA toolkit (third_party/cuda_configure.bzl)
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/CudaBackend.h"
#include "runtime/cuda/NcclGroup.h"
#include "runtime/cuda/PipelineLinks.h"
#endif
#include "runtime/control/CoordinatorClient.h"
#include "runtime/control/Flags.h"
#include "data/GptDataset.h"
#include "train/Trainer.h"
#include "train/TrainingLoop.h"

namespace {

struct RankJob {
  loom::control::CoordinatorClient *client = nullptr;
  int rank = 0;
  loom::Progress progress;           // where the step is, reported with each heartbeat
  std::atomic<bool> training{false};  // the trainer runs (reports mean something)
  std::atomic<int64_t> step{0};  // the iteration in progress, reported with heartbeats
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
    loom::control::CoordinatorClient::RankProgress where;
    if (job->training) {
      loom::Progress::Report r = job->progress.report();
      where.completed = r.completed, where.waiting = r.waiting, where.idle = r.idle, where.where = r.where;
    }
    loom::Status s = job->client->heartbeat(job->rank, job->step, &aborted, &reason, job->training ? &where : nullptr);
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

#ifdef LOOM_WITH_CUDA
// --gpu N, or the rank's turn among this machine's GPUs (rank % count, as one process per GPU).
loom::Status selectGpu(loom::Flags &flags, int rank, int pipelineStages) {
  // Without pipeline stages: one hardware queue, so kernels start in the order they are issued
  // across streams, and the tensor-parallel collectives and the overlapped data-parallel
  // buckets reach the GPU in the same order on every rank, which concurrent NCCL communicators
  // need (Megatron-LM sets the same). Not with stages: a pipeline link's send waits for its
  // peer, and with one queue everything issued after it would wait too (PipelineLinks.h relies
  // on sends never holding up the rest). Before any CUDA call; a value the user set wins.
  if (pipelineStages == 1) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1", 0);
  const char *why = "";
  if (!loom::cuda::deviceAvailable(&why)) return loom::Status::error(std::string("--device cuda: ") + why);
  int count = 0;
  cudaGetDeviceCount(&count);
  int64_t gpu = flags.integer("gpu", rank % count);
  if (!flags.ok() || gpu < 0 || gpu >= count)
    return loom::Status::error("--gpu " + std::to_string(gpu) + ": this machine has " + std::to_string(count) + " GPUs");
  cudaError_t err = cudaSetDevice(int(gpu));
  if (err != cudaSuccess) return loom::Status::error("cudaSetDevice(" + std::to_string(gpu) + "): " + cudaGetErrorString(err));
  return loom::Status::ok();
}
#endif

loom::Status fetchPlan(loom::control::CoordinatorClient &client, int rank, int worldSize, loom::plan::RankPlan *plan,
                       loom::plan::ProgramSet *programs) {
  std::string name = "rank_" + std::to_string(rank) + ".plan.pb", bytes, pbytes;
  LOOM_RETURN_IF_ERROR(client.getFile(name, &bytes));
  LOOM_RETURN_IF_ERROR(loom::parsePlan(name, bytes, rank, worldSize, plan));
  LOOM_RETURN_IF_ERROR(client.getFile(plan->programs_file(), &pbytes));
  return loom::parsePrograms(*plan, pbytes, programs);
}

}  // namespace

constexpr char kUsage[] =
    "loom-rank: one rank of a Loom job (as a torchrun worker): fetches its plan from the coordinator,\n"
    "connects its communicators and trains. The job token comes from $LOOM_TOKEN (or --token).\n"
    "  loom-rank --coordinator HOST:PORT --rank R [--address IP] [--threads T] [--seed S]\n"
    "    data:        [--data-prefix PREFIX] [--valid-fraction 0.05] [--eval-interval N] [--eval-iters K]\n"
    "    recipe:      [--steps N] [--lr 3e-4] [--min-lr 3e-5] [--warmup N] [--decay-iters N] [--clip-grad 1.0]\n"
    "                 [--weight-decay 0.1] [--adam-beta1 0.9] [--adam-beta2 0.95] [--adam-eps 1e-8] [--log-interval 1]\n"
    "    checkpoints: [--save DIR] [--save-interval N] [--resume | --strict-resume] [--init-from HF.safetensors]\n"
    "                 [--export MODEL.safetensors]\n"
    "    device:      [--device cpu|cuda] [--precision fp32|bf16|fp16] [--gpu N] [--attention auto|unfused|flash]\n"
    "    security:    [--tls-ca CA.pem] [--tls-cert RANK.pem --tls-key RANK.key]\n"
    "    metrics:     [--tensorboard-dir DIR] [--metrics-file FILE.jsonl] (Megatron's scalar names)\n"
    "    tests:       [--dump-grads DIR] [--dump-batches DIR] [--loss-log FILE] [--trace DIR]\n"
    "                 [--connect-timeout 20] [--comm-timeout 30]";

int main(int argc, char **argv) {
  loom::control::silenceGrpcLogging();
  loom::Flags flags(argc, argv, "loom-rank",
                    {"coordinator", "rank", "steps", "lr", "min-lr", "warmup", "decay-iters", "clip-grad",
                     "weight-decay", "adam-beta1", "adam-beta2", "adam-eps", "log-interval", "seed", "address",
                     "threads", "dump-grads", "token", "connect-timeout", "comm-timeout", "data-prefix",
                     "valid-fraction", "eval-interval", "eval-iters", "save", "save-interval", "init-from",
                     "export", "loss-log", "dump-batches", "device", "precision", "gpu", "attention", "trace", "tls-cert",
                     "tls-key", "tls-ca", "tensorboard-dir", "metrics-file"},
                    {"resume", "strict-resume"});
  if (flags.help(kUsage)) return 0;
  if (!flags.ok()) return 2;
  if (!flags.has("coordinator") || !flags.has("rank")) return flags.fail("--coordinator HOST:PORT and --rank R are required");
  int rank = int(flags.integer("rank", -1));
  if (!flags.ok()) return 2;
  std::string token = flags.get("token", std::getenv("LOOM_TOKEN") ? std::getenv("LOOM_TOKEN") : "");
  if (token.empty()) return flags.fail("no job token: set LOOM_TOKEN (loom-coord prints it) or pass --token");
  std::string tool = "loom-rank " + std::to_string(rank);
  if (flags.has("threads")) openblas_set_num_threads(int(flags.integer("threads", 1)));

  loom::control::TlsMaterial tls;
  if (loom::Status s = loom::control::loadTls({flags.get("tls-cert"), flags.get("tls-key"), flags.get("tls-ca")}, &tls);
      !s.isOk())
    return flags.fail(s.message());
  loom::control::CoordinatorClient client(flags.get("coordinator"), token, tls);
  loom::control::RegisterReply reg;
  double connectTimeout = flags.number("connect-timeout", 20), commTimeout = flags.number("comm-timeout", 30);
  uint64_t seed = uint64_t(flags.integer("seed", 1234));
  double validFraction = flags.number("valid-fraction", 0.05);
  loom::TrainerOptions topt{seed, {}, flags.get("dump-batches")};
  loom::TraceRecorder trace;
  if (flags.has("trace")) topt.trace = &trace;
  topt.adam.beta1 = flags.number("adam-beta1", 0.9);
  topt.adam.beta2 = flags.number("adam-beta2", 0.95);
  topt.adam.eps = flags.number("adam-eps", 1e-8);
  topt.adam.weightDecay = flags.number("weight-decay", 0.1);
  loom::TrainingOptions lopt;
  lopt.trainIters = flags.integer("steps", 1);
  lopt.lr.maxLr = flags.number("lr", 3e-4);
  lopt.lr.minLr = flags.number("min-lr", lopt.lr.maxLr / 10);
  lopt.lr.warmupIters = flags.integer("warmup", 0);
  lopt.lr.decayIters = flags.integer("decay-iters", 0);
  lopt.clipGrad = flags.number("clip-grad", 1.0);
  lopt.logInterval = std::max<int64_t>(1, flags.integer("log-interval", 1));
  lopt.evalInterval = flags.integer("eval-interval", 0);
  lopt.evalIters = std::max<int64_t>(1, flags.integer("eval-iters", 1));
  lopt.save = flags.get("save");
  lopt.saveInterval = flags.integer("save-interval", 0);
  lopt.resume = flags.has("resume") || flags.has("strict-resume");
  lopt.strictResume = flags.has("strict-resume");
  lopt.dumpGrads = flags.get("dump-grads");
  lopt.exportPath = flags.get("export");
  lopt.lossLog = flags.get("loss-log");
  lopt.tensorboardDir = flags.get("tensorboard-dir");
  lopt.metricsFile = flags.get("metrics-file");
  if (!flags.ok()) return 2;
  if (lopt.trainIters < 0) return flags.fail("--steps must be >= 0");
  if (lopt.resume && lopt.save.empty()) return flags.fail("--resume and --strict-resume need --save DIR (where the checkpoints are)");
  // --device cuda: the step on this rank's GPU (runtime/cuda/CudaBackend.h).
  std::string device = flags.get("device", "cpu");
  if (device != "cpu" && device != "cuda") return flags.fail("--device " + device + ": expected cpu or cuda");
  std::string precision = flags.get("precision", device == "cuda" ? "bf16" : "fp32");
  loom::cuda::Precision computePrecision;
  if (!loom::cuda::parsePrecision(precision, &computePrecision))
    return flags.fail("--precision " + precision + ": expected fp32, bf16 or fp16");
  if (device == "cpu" && computePrecision != loom::cuda::Precision::kFp32)
    return flags.fail("--precision " + precision + ": the CPU backend computes in fp32 (use --device cuda)");
  if (device == "cpu" && flags.has("gpu")) return flags.fail("--gpu needs --device cuda");
  if (device == "cpu" && flags.has("attention")) return flags.fail("--attention needs --device cuda");
  topt.lossScaling = computePrecision == loom::cuda::Precision::kFp16;  // fp16: dynamic loss scaling
#ifdef LOOM_WITH_CUDA
  loom::cuda::CudaExecutorOptions copt;
  copt.precision = computePrecision;
  if (!loom::cuda::parseAttentionKernel(flags.get("attention", "auto"), &copt.attention))
    return flags.fail("--attention " + flags.get("attention") + ": expected auto, unfused or flash");
#else
  if (device == "cuda")
    return flags.fail("--device cuda: this loom-rank was built without the CUDA backend (no CUDA toolkit when it "
                      "was built; install CUDA 13 at /usr/local/cuda and rebuild)");
#endif
  loom::Status s = client.connect(rank, connectTimeout, &reg);
  if (!s.isOk()) {
    std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), s.message().c_str());
    return 1;
  }
  RankJob job;
  job.client = &client;
  job.rank = rank;
  std::thread heartbeat;
  // Every exit after the heartbeat thread started: stop and join it, then end the process
  // without running static destructors under the feet of gRPC's own threads.
  auto exitWith = [&](int code) {
    job.done = true;
    if (heartbeat.joinable()) heartbeat.join();
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
    return code;
  };
  auto fail = [&](const std::string &msg) {
    std::fprintf(stderr, "%s: error: %s\n", tool.c_str(), msg.c_str());
    (void)client.abort(rank, msg);
    (void)client.finish(rank, 1);
    return exitWith(1);
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
        return exitWith(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return fail(msg);
  };
  heartbeat = std::thread(heartbeatLoop, &job, 10.0);

  loom::plan::RankPlan plan;
  loom::plan::ProgramSet programs;
  if (s = fetchPlan(client, rank, reg.world_size(), &plan, &programs); !s.isOk()) return fail(s.message());

  loom::control::CoordinatorStore store(client);
  std::unique_ptr<loom::GlooCollectives> collectives;
  if (s = loom::GlooCollectives::create(plan, store, flags.get("address", "127.0.0.1"), commTimeout, &collectives);
      !s.isOk())
    return fail(s.message());
  if (s = client.barrier("ready", rank, 60000); !s.isOk()) return fail(s.message());

  // Training and validation samples: the indexed dataset's two splits, or synthetic tokens.
  std::unique_ptr<loom::DataSource> train, valid;
  loom::IndexedDataset corpus;
  if (flags.has("data-prefix")) {
    if (s = loom::IndexedDataset::open(flags.get("data-prefix"), &corpus); !s.isOk()) return fail(s.message());
    double fraction = validFraction;
    auto t = std::make_unique<loom::GptDataset>(corpus, loom::GptDataset::Split::kTrain, fraction, plan.seq_length(), seed);
    if (t->samplesPerEpoch() == 0) return fail(flags.get("data-prefix") + ": too few tokens for one sample");
    train = std::move(t);
    valid = std::make_unique<loom::GptDataset>(corpus, loom::GptDataset::Split::kValidation, fraction,
                                               plan.seq_length(), seed);
  } else {
    train = std::make_unique<loom::SyntheticData>(plan.seq_length(), plan.vocab_size(), seed + 1);
    valid = std::make_unique<loom::SyntheticData>(plan.seq_length(), plan.vocab_size(), seed + 2);
  }
  if (!topt.dumpBatches.empty()) std::filesystem::create_directories(topt.dumpBatches);
  lopt.baselineResidentBytes = loom::residentBytes();  // the trainer's memory is measured from here
  std::unique_ptr<loom::StepBackend> backend;
#ifdef LOOM_WITH_CUDA
  std::unique_ptr<loom::cuda::NcclGroups> nccl;
  std::unique_ptr<loom::cuda::PipelineLinks> links;
  if (device == "cuda") {
    if (s = selectGpu(flags, rank, plan.p()); !s.isOk()) return fail(s.message());
    loom::ParallelLayout layout{plan.t(), plan.p(), plan.d()};
    if (s = loom::cuda::NcclGroups::create(&client, layout, rank, int64_t(commTimeout * 1000), &nccl); !s.isOk())
      return fail(s.message());
    copt.groups = nccl.get();
    if (plan.p() > 1) {  // messages between pipeline stages: one NCCL link per direction and peer
      std::vector<loom::cuda::PipelineLinks::Need> needs;
      if (s = loom::cuda::pipelineNeeds(plan, programs, &needs); !s.isOk()) return fail(s.message());
      s = loom::cuda::PipelineLinks::create(&client, loom::groupMembers(layout, "pp", rank), plan.pp_rank(), needs,
                                            int64_t(commTimeout * 1000), &links);
      if (!s.isOk()) return fail(s.message());
      copt.links = links.get();
    }
    std::unique_ptr<loom::cuda::CudaBackend> gpu;
    if (s = loom::cuda::CudaBackend::create(copt, programs, &gpu); !s.isOk()) return fail(s.message());
    backend = std::move(gpu);
  }
#endif
  if (!backend) backend = std::make_unique<loom::CpuBackend>();
  topt.progress = &job.progress;
  // Fault injection for the hang tests: LOOM_TEST_STALL=RANK:STEP stalls that rank in the first
  // linear of that (0-based) data step.
  if (const char *stall = std::getenv("LOOM_TEST_STALL")) {
    int stallRank = -1;
    long long stallStep = -1;
    if (std::sscanf(stall, "%d:%lld", &stallRank, &stallStep) == 2 && stallRank == rank) topt.stallStep = stallStep;
  }
  std::unique_ptr<loom::Trainer> trainer;
  if (s = loom::Trainer::create(plan, programs, std::move(backend), collectives.get(), train.get(), topt, &trainer);
      !s.isOk())
    return fail(s.message());
  if (flags.has("init-from")) {
    loom::SafetensorsFile hf;
    std::map<std::string, loom::HostTensor> global;
    if (s = loom::readSafetensors(flags.get("init-from"), &hf); !s.isOk()) return fail(s.message());
    s = plan.architecture() == "llama"
            ? loom::fromHuggingFaceLlama(hf.tensors, plan.padded_vocab_size(), plan.tie_word_embeddings(), &global)
            : loom::fromHuggingFaceGpt2(hf.tensors, plan.padded_vocab_size(), plan.num_attention_heads(), &global);
    if (!s.isOk() || !(s = trainer->loadGlobalParameters(global)).isOk())
      return fail(flags.get("init-from") + ": " + s.message());
  }
  loom::TrainingLoop loop(*trainer, client, valid.get(), lopt, &job.step);
  job.training = true;
  if (s = loop.run(); !s.isOk()) {
    bool communication = s.message().find("group") != std::string::npos || s.message().find("recv") != std::string::npos;
    return communication ? failAfterVerdict(s.message()) : fail(s.message());
  }
  if (flags.has("trace")) {
    std::string path = flags.get("trace") + "/rank_" + std::to_string(rank) + ".json";
    if (s = trace.write(path, plan); !s.isOk()) return fail(s.message());
  }
  // Heart-beating goes on while rank 0 finishes an export and everyone waits here.
  if (s = client.barrier("done", rank, 3600 * 1000); !s.isOk()) return fail(s.message());
  (void)client.finish(rank, 0);
  return exitWith(0);
}
