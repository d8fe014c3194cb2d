// loom-rank: one rank of a Loom job (like a torchrun worker).
//   loom-rank --coordinator HOST:PORT --rank R [--address IP] [--threads T] [--seed S]
//     data:        [--data-prefix PREFIX (loom-preprocess output; default: synthetic tokens)]
//                  [--valid-fraction 0.05] [--eval-interval N] [--eval-iters K]
//     recipe:      [--steps N] [--lr 3e-4] [--min-lr 3e-5] [--warmup N] [--decay-iters N]
//                  [--clip-grad 1.0] [--weight-decay 0.1] [--adam-beta1 0.9] [--adam-beta2 0.95]
//                  [--adam-eps 1e-8] [--log-interval 1]
//     checkpoints: [--save DIR] [--save-interval N] [--async-save] [--resume | --strict-resume]
//                  [--init-from HF.safetensors]
//                  [--export MODEL.safetensors]
//     tests:       [--dump-grads DIR] [--dump-batches DIR] [--dump-routing DIR] [--loss-log FILE] [--connect-timeout 20]
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
#include "formats/HfExport.h"
#include "plan/PlanAttributes.h"
#include "plan/PlanVersion.h"
#include "runtime/CpuBackend.h"
#include "apps/RankFlags.h"
#include "runtime/cuda/Precision.h"
#ifdef LOOM_WITH_CUDA  // a build with the CUDA toolkit (third_party/cuda_configure.bzl)
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/CudaBackend.h"
#include "runtime/cuda/NcclGroup.h"
#include "runtime/cuda/PipelineLinks.h"
#endif
#include "runtime/control/CoordinatorClient.h"
#include "support/CommandLine.h"
#include "data/BertDataset.h"
#include "data/GptDataset.h"
#include "train/Trainer.h"
#include "train/TrainingLoop.h"

namespace {

struct RankJob {
  loom::control::CoordinatorClient *client = nullptr;
  int rank = 0;
  loom::Progress progress;           // where the step is, reported with each heartbeat
  std::atomic<bool> training{false};  // the trainer runs (reports mean something)
  loom::StepClock clock;  // the iteration in progress and the longest so far, reported with heartbeats
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
      where.longestStepSeconds = job->clock.longestSeconds;
    }
    loom::Status s = job->client->heartbeat(job->rank, job->clock.step, &aborted, &reason, job->training ? &where : nullptr);
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
loom::Status selectGpu(int rank, int pipelineStages) {
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
  int64_t gpu = loom::rankflags::gpu.getNumOccurrences() ? int64_t(loom::rankflags::gpu) : rank % count;
  if (gpu < 0 || gpu >= count)
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
    "    checkpoints: [--save DIR] [--save-interval N] [--async-save] [--resume | --strict-resume]\n"
    "                 [--init-from HF.safetensors]\n"
    "                 [--export MODEL.safetensors]\n"
    "    device:      [--device cpu|cuda] [--precision fp32|bf16|fp16] [--gpu N] [--attention auto|unfused|flash]\n"
    "    security:    [--tls-ca CA.pem] [--tls-cert RANK.pem --tls-key RANK.key]\n"
    "    metrics:     [--tensorboard-dir DIR] [--metrics-file FILE.jsonl] (Megatron's scalar names)\n"
    "    tests:       [--dump-grads DIR] [--dump-batches DIR] [--dump-routing DIR] [--loss-log FILE] [--trace DIR]\n"
    "                 [--connect-timeout 20] [--comm-timeout 30]\n";

namespace rf = loom::rankflags;
namespace cl = llvm::cl;

// Which job and rank this process is: loomrun sets these for each rank it starts (the training
// flags, which loomrun also accepts and passes on, are in apps/RankFlags.cpp).
cl::opt<std::string> coordinator("coordinator", cl::desc("the job's coordinator (loom-coord), required"),
                                 cl::value_desc("HOST:PORT"), cl::cat(rf::category));
cl::opt<int> rankFlag("rank", cl::desc("this process's rank in the job, required"), cl::value_desc("R"),
                      cl::init(-1), cl::cat(rf::category));
cl::opt<std::string> tokenFlag("token", cl::desc("the job token (default: $LOOM_TOKEN)"), cl::value_desc("T"),
                               cl::cat(rf::category));
cl::opt<std::string> tlsCert("tls-cert", cl::desc("this rank's certificate, for a mutual-TLS coordinator"),
                             cl::value_desc("RANK.pem"), cl::cat(rf::category));
cl::opt<std::string> tlsKey("tls-key", cl::desc("the key of --tls-cert"), cl::value_desc("RANK.key"),
                            cl::cat(rf::category));
cl::opt<std::string> tlsCa("tls-ca", cl::desc("the CA that signed the coordinator's certificate (a TLS coordinator)"),
                           cl::value_desc("CA.pem"), cl::cat(rf::category));

// The training recipe and the trainer's options, from the flags.
loom::Status recipeFromFlags(loom::TrainerOptions *topt, loom::TrainingOptions *lopt) {
  topt->adam.beta1 = rf::adamBeta1;
  topt->adam.beta2 = rf::adamBeta2;
  topt->adam.eps = rf::adamEps;
  topt->adam.weightDecay = rf::weightDecay;
  topt->lossScaler.initialScale = rf::initialLossScale;
  lopt->trainIters = rf::steps;
  lopt->lr.maxLr = rf::lr;
  lopt->lr.minLr = rf::minLr.getNumOccurrences() ? double(rf::minLr) : lopt->lr.maxLr / 10;
  lopt->lr.warmupIters = rf::warmup;
  lopt->lr.decayIters = rf::decayIters;
  lopt->clipGrad = rf::clipGrad;
  lopt->logInterval = std::max<int64_t>(1, rf::logInterval);
  lopt->evalInterval = rf::evalInterval;
  lopt->evalIters = std::max<int64_t>(1, rf::evalIters);
  lopt->save = rf::save;
  lopt->saveInterval = rf::saveInterval;
  lopt->asyncSave = rf::asyncSave;
  lopt->resume = rf::resume || rf::strictResume;
  lopt->strictResume = rf::strictResume;
  lopt->dumpGrads = rf::dumpGrads;
  lopt->dumpRouting = rf::dumpRouting;
  lopt->exportPath = rf::exportPath;
  lopt->lossLog = rf::lossLog;
  lopt->tensorboardDir = rf::tensorboardDir;
  lopt->metricsFile = rf::metricsFile;
  if (lopt->trainIters < 0) return loom::Status::error("--steps must be >= 0");
  if (lopt->resume && lopt->save.empty())
    return loom::Status::error("--resume and --strict-resume need --save DIR (where the checkpoints are)");
  return loom::Status::ok();
}

// --device cuda: the step on this rank's GPU (runtime/cuda/CudaBackend.h).
struct DeviceChoice {
  std::string device;
#ifdef LOOM_WITH_CUDA
  loom::cuda::CudaExecutorOptions cuda;
#endif
};

loom::Status deviceFromFlags(DeviceChoice *choice, loom::TrainerOptions *topt) {
  std::string device = rf::device;
  choice->device = device;
  if (device != "cpu" && device != "cuda") return loom::Status::error("--device " + device + ": expected cpu or cuda");
  std::string precision = rf::precision.getNumOccurrences() ? std::string(rf::precision)
                          : device == "cuda"                 ? "bf16"
                                                             : "fp32";
  loom::cuda::Precision computePrecision;
  if (!loom::cuda::parsePrecision(precision, &computePrecision))
    return loom::Status::error("--precision " + precision + ": expected fp32, bf16 or fp16");
  if (device == "cpu" && computePrecision != loom::cuda::Precision::kFp32)
    return loom::Status::error("--precision " + precision +
                               ": the CUDA backend's GEMM precision for fp32 plans; on the CPU, compile a bf16 plan "
                               "(params_dtype: BF16 or parallel.precision: PRECISION_BF16)");
  if (device == "cpu" && rf::gpu.getNumOccurrences()) return loom::Status::error("--gpu needs --device cuda");
  if (device == "cpu" && rf::attention.getNumOccurrences())
    return loom::Status::error("--attention needs --device cuda");
  topt->lossScaling = computePrecision == loom::cuda::Precision::kFp16;  // fp16: dynamic loss scaling
#ifdef LOOM_WITH_CUDA
  choice->cuda.precision = computePrecision;
  if (!loom::cuda::parseAttentionKernel(rf::attention, &choice->cuda.attention))
    return loom::Status::error("--attention " + rf::attention + ": expected auto, unfused or flash");
#else
  if (device == "cuda")
    return loom::Status::error("--device cuda: this loom-rank was built without the CUDA backend (no CUDA toolkit "
                               "when it was built; install CUDA 13 at /usr/local/cuda and rebuild)");
#endif
  return loom::Status::ok();
}

// A 16-bit plan computes in its own type: an explicit --precision naming another is refused.
loom::Status precisionFitsPlan(const loom::plan::ProgramSet &programs) {
  loom::plan::DType computes = loom::planattr::computeDtype(programs.programs());
  if (computes == loom::plan::F32 || !rf::precision.getNumOccurrences()) return loom::Status::ok();
  std::string own = computes == loom::plan::F16 ? "fp16" : "bf16";
  if (std::string(rf::precision) == own) return loom::Status::ok();
  return loom::Status::error("--precision " + std::string(rf::precision) + ": this plan computes in " + own +
                             " (compiled with parallel.precision or params_dtype); --precision applies to fp32 plans");
}

// Training and validation samples: the indexed dataset's two splits, or synthetic tokens.
// The rank's training and validation data. A BERT plan (the compiler read a bidirectional
// model: the plan's architecture "bert") takes a BERT dataset (PREFIX.bert.json beside PREFIX.bin/.idx, from
// loom-preprocess --tokenizer wordpiece) or, without --data-prefix, the synthetic BERT source;
// any other plan a GPT dataset or synthetic tokens. A dataset of the other kind is refused.
loom::Status openData(const loom::plan::RankPlan &plan, uint64_t seed,
                      double fraction, loom::IndexedDataset *corpus, std::unique_ptr<loom::DataSource> *train,
                      std::unique_ptr<loom::DataSource> *valid) {
  const bool bert = plan.architecture() == "bert";  // the compiler's reading of the model (bidirectional)
  const std::string &prefix = rf::dataPrefix;
  if (!rf::dataPrefix.getNumOccurrences()) {
    if (bert) {
      if (plan.vocab_size() <= 105)
        return loom::Status::error("the synthetic BERT data needs vocab_size > 105 (ids from 104 up), the plan has " +
                                   std::to_string(plan.vocab_size()));
      if (plan.seq_length() < 5)  // [CLS] A [SEP] B [SEP]
        return loom::Status::error("BERT samples need seq_length >= 5 ([CLS] A [SEP] B [SEP]), the plan has " +
                                   std::to_string(plan.seq_length()));
      *train = loom::syntheticBertData(plan.seq_length(), plan.vocab_size(), seed + 1);
      *valid = loom::syntheticBertData(plan.seq_length(), plan.vocab_size(), seed + 2);
      return loom::Status::ok();
    }
    *train = std::make_unique<loom::SyntheticData>(plan.seq_length(), plan.vocab_size(), seed + 1);
    *valid = std::make_unique<loom::SyntheticData>(plan.seq_length(), plan.vocab_size(), seed + 2);
    return loom::Status::ok();
  }
  std::error_code ec;
  bool bertData = std::filesystem::exists(loom::bertMetadataPath(prefix), ec);
  if (bert && !bertData)
    return loom::Status::error(prefix + ".idx: not a BERT dataset (no " + loom::bertMetadataPath(prefix) +
                               "; a GPT one?): this plan trains BERT, whose data comes from loom-preprocess "
                               "--tokenizer wordpiece");
  if (!bert && bertData)
    return loom::Status::error(prefix + ".idx: a BERT dataset (sentences, " + loom::bertMetadataPath(prefix) +
                               "): this plan (" + (plan.architecture().empty() ? "gpt" : plan.architecture()) +
                               ") trains next-token prediction, whose data comes from loom-preprocess "
                               "--tokenizer gpt2");
  LOOM_RETURN_IF_ERROR(loom::IndexedDataset::open(rf::dataPrefix, corpus));
  if (bert) {
    loom::BertMetadata meta;
    LOOM_RETURN_IF_ERROR(loom::readBertMetadata(prefix, &meta));
    if (meta.vocab.size > plan.vocab_size())
      return loom::Status::error(loom::bertMetadataPath(prefix) + ": the dataset's vocabulary (" +
                                 std::to_string(meta.vocab.size) + " tokens) is larger than the model's vocab_size (" +
                                 std::to_string(plan.vocab_size()) + ")");
    std::shared_ptr<const loom::SentenceCorpus> sentences = loom::indexedSentences(*corpus);
    auto t = std::make_unique<loom::BertDataset>(sentences, meta.vocab, meta.masking, loom::BertDataset::Split::kTrain,
                                                 fraction, plan.seq_length(), seed);
    if (t->samplesPerEpoch() == 0)
      return loom::Status::error(prefix + ": no BERT sample of " + std::to_string(plan.seq_length()) +
                                 " tokens (documents of at least two sentences are needed)");
    auto v = std::make_unique<loom::BertDataset>(sentences, meta.vocab, meta.masking,
                                                 loom::BertDataset::Split::kValidation, fraction, plan.seq_length(), seed);
    if (v->samplesPerEpoch() == 0 && rf::evalInterval > 0)
      return loom::Status::error(prefix + ": no BERT validation sample (--valid-fraction " + std::to_string(fraction) +
                                 " holds out too few documents of two or more sentences)");
    *train = std::move(t);
    *valid = std::move(v);
    return loom::Status::ok();
  }
  auto t = std::make_unique<loom::GptDataset>(*corpus, loom::GptDataset::Split::kTrain, fraction, plan.seq_length(), seed);
  if (t->samplesPerEpoch() == 0) return loom::Status::error(rf::dataPrefix + ": too few tokens for one sample");
  *train = std::move(t);
  *valid = std::make_unique<loom::GptDataset>(*corpus, loom::GptDataset::Split::kValidation, fraction,
                                              plan.seq_length(), seed);
  return loom::Status::ok();
}

// The CUDA backend's communicators, kept as long as the backend.
struct DeviceLinks {
#ifdef LOOM_WITH_CUDA
  std::unique_ptr<loom::cuda::NcclGroups> nccl;
  std::unique_ptr<loom::cuda::PipelineLinks> links;
#endif
};

// The step backend: the CUDA one with its NCCL groups and pipeline links (from the plan's
// groups), or the CPU one.
loom::Status makeBackend(DeviceChoice &device, loom::control::CoordinatorClient &client,
                         const loom::plan::RankPlan &plan, const loom::plan::ProgramSet &programs, int rank,
                         double commTimeout, DeviceLinks *kept, std::unique_ptr<loom::StepBackend> *backend) {
#ifdef LOOM_WITH_CUDA
  if (device.device == "cuda") {
    loom::cuda::CudaExecutorOptions &copt = device.cuda;
    LOOM_RETURN_IF_ERROR(selectGpu(rank, plan.p()));
    LOOM_RETURN_IF_ERROR(loom::cuda::NcclGroups::create(&client, plan, int64_t(commTimeout * 1000), &kept->nccl));
    copt.groups = kept->nccl.get();
    if (plan.p() > 1) {  // messages between pipeline stages: one NCCL link per direction and peer
      std::vector<loom::cuda::PipelineLinks::Need> needs;
      LOOM_RETURN_IF_ERROR(loom::cuda::pipelineNeeds(plan, programs, &needs));
      const loom::plan::Group *pp = nullptr;  // the pipeline group, as the plan has it
      for (const loom::plan::Group &g : plan.groups())
        if (g.name() == "pp") pp = &g;
      if (!pp) return loom::Status::error("rank_" + std::to_string(rank) + ".plan.pb: no pp group (corrupt plan)");
      LOOM_RETURN_IF_ERROR(loom::cuda::PipelineLinks::create(&client, {pp->ranks().begin(), pp->ranks().end()},
                                                             pp->position(), needs, int64_t(commTimeout * 1000),
                                                             &kept->links));
      copt.links = kept->links.get();
    }
    std::unique_ptr<loom::cuda::CudaBackend> gpu;
    LOOM_RETURN_IF_ERROR(loom::cuda::CudaBackend::create(copt, programs, &gpu));
    *backend = std::move(gpu);
    return loom::Status::ok();
  }
#else
  (void)device, (void)client, (void)programs, (void)rank, (void)commTimeout, (void)kept;
#endif
  *backend = std::make_unique<loom::CpuBackend>();
  return loom::Status::ok();
}

// Fault injection for the tests: LOOM_TEST_STALL=RANK:STEP stalls that rank in the first linear
// of that (0-based) data step (the hang tests); LOOM_TEST_SLOW=RANK:X makes that rank's kernels
// take 1 + X times as long (CPU backend; the straggler report's test).
void testFaultsFromEnvironment(int rank, loom::TrainerOptions *topt) {
  if (const char *stall = std::getenv("LOOM_TEST_STALL")) {
    int stallRank = -1;
    long long stallStep = -1;
    if (std::sscanf(stall, "%d:%lld", &stallRank, &stallStep) == 2 && stallRank == rank) topt->stallStep = stallStep;
  }
  if (const char *slow = std::getenv("LOOM_TEST_SLOW")) {
    int slowRank = -1;
    double factor = 0;
    if (std::sscanf(slow, "%d:%lf", &slowRank, &factor) == 2 && slowRank == rank && factor > 0) topt->slowdown = factor;
  }
}

// --init-from: a Hugging Face checkpoint of the plan's family as the initial parameters.
loom::Status initFromHuggingFace(const loom::plan::RankPlan &plan, loom::Trainer *trainer) {
  loom::SafetensorsFile hf;
  std::map<std::string, loom::HostTensor> global;
  LOOM_RETURN_IF_ERROR(loom::readSafetensors(rf::initFrom, &hf));
  loom::Status s = loom::readHuggingFace(plan, hf.tensors, &global);  // the plan's family's layout
  if (!s.isOk() || !(s = trainer->loadGlobalParameters(global)).isOk())
    return loom::Status::error(rf::initFrom + ": " + s.message());
  return loom::Status::ok();
}

int main(int argc, char **argv) {
  loom::control::silenceGrpcLogging();
  if (!loom::parseCommandLine(argc, argv, kUsage, {&rf::category})) return 2;
  auto usageError = [](const std::string &msg) {
    std::fprintf(stderr, "loom-rank: error: %s\n", msg.c_str());
    return 1;
  };
  if (!coordinator.getNumOccurrences() || !rankFlag.getNumOccurrences())
    return usageError("--coordinator HOST:PORT and --rank R are required");
  int rank = rankFlag;
  const char *envToken = std::getenv("LOOM_TOKEN");
  std::string token = tokenFlag.getNumOccurrences() ? tokenFlag : std::string(envToken ? envToken : "");
  if (token.empty()) return usageError("no job token: set LOOM_TOKEN (loom-coord prints it) or pass --token");
  std::string tool = "loom-rank " + std::to_string(rank);
  if (rf::threads.getNumOccurrences()) openblas_set_num_threads(int(rf::threads));

  loom::control::TlsMaterial tls;
  if (loom::Status s = loom::control::loadTls({tlsCert, tlsKey, tlsCa}, &tls); !s.isOk())
    return usageError(s.message());
  loom::control::CoordinatorClient client(coordinator, token, tls);
  loom::control::RegisterReply reg;
  double connectTimeout = rf::connectTimeout, commTimeout = rf::commTimeout;
  uint64_t seed = uint64_t(int64_t(rf::seed));
  double validFraction = rf::validFraction;
  loom::TrainerOptions topt{seed, {}, rf::dumpBatches};
  loom::TraceRecorder trace;
  if (rf::trace.getNumOccurrences()) topt.trace = &trace;
  loom::TrainingOptions lopt;
  if (loom::Status st = recipeFromFlags(&topt, &lopt); !st.isOk()) return usageError(st.message());
  DeviceChoice device;
  if (loom::Status st = deviceFromFlags(&device, &topt); !st.isOk()) return usageError(st.message());
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
      if (client.heartbeat(rank, job.clock.step, &aborted, &reason).isOk() && aborted) {
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
  if (s = precisionFitsPlan(programs); !s.isOk()) return fail(s.message());

  loom::control::CoordinatorStore store(client);
  std::unique_ptr<loom::GlooCollectives> collectives;
  if (s = loom::GlooCollectives::create(plan, store, rf::address, commTimeout, &collectives);
      !s.isOk())
    return fail(s.message());
  if (s = client.barrier("ready", rank, 60000); !s.isOk()) return fail(s.message());

  std::unique_ptr<loom::DataSource> train, valid;
  loom::IndexedDataset corpus;
  if (s = openData(plan, seed, validFraction, &corpus, &train, &valid); !s.isOk()) return fail(s.message());
  if (!topt.dumpBatches.empty()) std::filesystem::create_directories(topt.dumpBatches);
  lopt.baselineResidentBytes = loom::residentBytes();  // the trainer's memory is measured from here
  std::unique_ptr<loom::StepBackend> backend;
  DeviceLinks links;
  if (s = makeBackend(device, client, plan, programs, rank, commTimeout, &links, &backend); !s.isOk())
    return fail(s.message());
  if (!backend) backend = std::make_unique<loom::CpuBackend>();
  topt.progress = &job.progress;
  testFaultsFromEnvironment(rank, &topt);
  std::unique_ptr<loom::Trainer> trainer;
  if (s = loom::Trainer::create(plan, programs, std::move(backend), collectives.get(), train.get(), topt, &trainer);
      !s.isOk())
    return fail(s.message());
  if (rf::initFrom.getNumOccurrences())
    if (s = initFromHuggingFace(plan, trainer.get()); !s.isOk()) return fail(s.message());
  loom::TrainingLoop loop(*trainer, client, valid.get(), lopt, &job.clock);
  job.training = true;
  if (s = loop.run(); !s.isOk()) {
    bool communication = s.message().find("group") != std::string::npos || s.message().find("recv") != std::string::npos;
    return communication ? failAfterVerdict(s.message()) : fail(s.message());
  }
  if (rf::trace.getNumOccurrences()) {
    std::string path = rf::trace + "/rank_" + std::to_string(rank) + ".json";
    if (s = trace.write(path, plan); !s.isOk()) return fail(s.message());
  }
  // Heart-beating goes on while rank 0 finishes an export and everyone waits here.
  if (s = client.barrier("done", rank, 3600 * 1000); !s.isOk()) return fail(s.message());
  (void)client.finish(rank, 0);
  return exitWith(0);
}
