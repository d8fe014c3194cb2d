#include "compiler/Calibrate.h"

#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include <cblas.h>

#include "compiler/CostModel.h"
#include "compiler/ConfigLoader.h"
#include "compiler/PlanViews.h"
#include "gloo/rendezvous/file_store.h"
#include "llvm/Support/FormatVariadic.h"
#include "runtime/Executor.h"
#include "runtime/GlooCollectives.h"
#include "runtime/PlanAttributes.h"
#include "runtime/ThreadCollectives.h"

extern char **environ;

namespace loom {
namespace {

llvm::Error error(const llvm::Twine &msg) { return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str()); }

struct Sample {
  double flops, bytes, seconds;
};

// The calibration models: one or two layers each, from a few hundred kFLOPs per GEMM to the
// sizes of GPT-2 small's, GPT and LLaMA (whose norm, activation, rotary and attention differ).
std::vector<config::ModelConfig> calibrationModels() {
  struct Shape {
    config::Architecture arch;
    int64_t layers, hidden, heads, seq, vocab, batch;
  };
  const Shape shapes[] = {
      {config::GPT, 1, 64, 4, 64, 512, 1},      {config::GPT, 2, 128, 4, 128, 1024, 2},
      {config::GPT, 1, 256, 8, 128, 2048, 4},   {config::GPT, 1, 384, 6, 256, 4096, 2},
      {config::GPT, 1, 768, 12, 512, 8192, 1},  {config::LLAMA, 1, 128, 4, 128, 1024, 2},
      {config::LLAMA, 1, 256, 8, 256, 2048, 2},
  };
  std::vector<config::ModelConfig> out;
  for (const Shape &s : shapes) {
    config::ModelConfig m;
    m.set_name(llvm::formatv("calibrate-{0}-{1}x{2}-s{3}-b{4}", s.arch == config::GPT ? "gpt" : "llama", s.layers,
                             s.hidden, s.seq, s.batch)
                   .str());
    m.set_architecture(s.arch);
    m.set_num_layers(s.layers), m.set_hidden_size(s.hidden), m.set_num_attention_heads(s.heads);
    m.set_seq_length(s.seq), m.set_vocab_size(s.vocab), m.set_micro_batch_size(s.batch);
    if (s.arch == config::GPT) m.set_hidden_dropout(0.1f), m.set_attention_dropout(0.1f);
    if (s.arch == config::LLAMA) m.set_num_key_value_heads(s.heads / 2);
    applyModelDefaults(m);
    out.push_back(m);
  }
  return out;
}

// Arguments a program runs on: token ids below the vocabulary, masks of ones, the recipe's
// scalars at ordinary values, everything else normal(0, 0.02) (the timing, not the values,
// matters; no denormals or infinities to slow a kernel down).
std::vector<HostTensor> argumentsFor(const plan::Program &program, int64_t vocab, std::mt19937 &rng) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const std::map<std::string, float> scalars = {{"learning_rate", 1e-4f}, {"adam_step", 1.0f}, {"clip_grad", 1.0f},
                                                {"weight_decay", 0.01f},  {"adam_beta1", 0.9f}, {"adam_beta2", 0.95f},
                                                {"adam_eps", 1e-8f},      {"loss_scale", 1.0f}};
  std::vector<HostTensor> args;
  for (const plan::Binding &binding : program.arguments()) {
    const plan::Buffer &b = program.buffers(binding.buffer());
    HostTensor t;
    t.shape.assign(b.shape().begin(), b.shape().end());
    if (b.dtype() == plan::I32) {
      t.isInt = true;
      t.ints.resize(size_t(t.numel()));
      for (int32_t &v : t.ints) v = int32_t(rng() % uint32_t(vocab));
    } else {
      t.data.resize(size_t(t.numel()));
      auto scalar = scalars.find(binding.name());
      bool mask = binding.name().find("mask") != std::string::npos;
      for (float &v : t.data)
        v = binding.role() == plan::Binding::HYPERPARAMETER ? (scalar != scalars.end() ? scalar->second : 1.0f)
            : mask                                          ? 1.0f
                                                            : normal(rng);
    }
    args.push_back(std::move(t));
  }
  return args;
}

// Efficiency points against `peak`: the median rate of the samples in each half-decade of FLOPs.
void efficiencyCurve(std::vector<Sample> samples, double peak,
                     google::protobuf::RepeatedPtrField<config::EfficiencyPoint> *out) {
  std::map<int, std::vector<Sample>> bins;
  for (const Sample &s : samples)
    if (s.flops > 0 && s.seconds > 0) bins[int(std::floor(2 * std::log10(s.flops)))].push_back(s);
  for (auto &[bin, v] : bins) {
    std::sort(v.begin(), v.end(), [](const Sample &a, const Sample &b) { return a.flops / a.seconds < b.flops / b.seconds; });
    const Sample &mid = v[v.size() / 2];
    double flops = 0;
    for (const Sample &s : v) flops += std::log(s.flops);
    config::EfficiencyPoint *pt = out->Add();
    pt->set_flops(std::exp(flops / double(v.size())));
    pt->set_efficiency(std::min(1.0, mid.flops / mid.seconds / peak));
  }
}

// seconds = overhead + bytes / rate, least squares; a fit that gives a negative overhead or
// rate falls back to a line through the origin.
config::OpRate fitRate(const std::string &op, const std::vector<Sample> &samples) {
  double n = double(samples.size()), sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Sample &s : samples) sx += s.bytes, sy += s.seconds, sxx += s.bytes * s.bytes, sxy += s.bytes * s.seconds;
  double den = n * sxx - sx * sx;
  double slope = den > 0 ? (n * sxy - sx * sy) / den : 0, intercept = (sy - slope * sx) / n;
  if (slope <= 0 || intercept < 0) {
    slope = sxx > 0 ? sxy / sxx : 0;
    intercept = 0;
  }
  config::OpRate r;
  r.set_op(op);
  r.set_bytes_per_s(slope > 0 ? 1.0 / slope : 1e12);
  r.set_overhead_s(intercept);
  return r;
}

llvm::Error measureKernels(const CalibrateOptions &options, config::DeviceFile *out, llvm::raw_ostream &log) {
  std::vector<Sample> gemm, attention;
  std::map<std::string, std::vector<Sample>> others;
  config::ClusterSpec cluster;
  cluster.set_name("calibrate"), cluster.set_nodes(1), cluster.set_devices_per_node(1);
  cluster.mutable_device()->set_kind(config::CPU), cluster.mutable_device()->set_peak_flops(1e11);
  std::mt19937 rng(7);
  for (config::ModelConfig &model : calibrationModels()) {
    config::ClusterSpec c = cluster;
    c.mutable_parallel()->set_micro_batch_size(model.micro_batch_size());
    c.mutable_parallel()->set_global_batch_size(model.micro_batch_size());
    c.mutable_parallel()->set_tensor_parallel_size(1), c.mutable_parallel()->set_pipeline_parallel_size(1);
    c.mutable_parallel()->set_data_parallel_size(1), c.mutable_parallel()->set_virtual_pipeline_size(1);
    c.mutable_parallel()->set_dp_bucket_size_bytes(25000000);
    std::string dir = options.workDir + "/" + model.name();
    if (llvm::Error e = options.compile(model, c, dir)) return e;
    llvm::Expected<PlanDirectory> plans = readPlanDirectory(dir);
    if (!plans) return plans.takeError();
    ThreadWorld world(ParallelLayout{});
    std::unique_ptr<Collectives> collectives = world.forRank(0);
    TraceRecorder trace;
    auto start = std::chrono::steady_clock::now();
    for (const plan::ScheduleEntry &e : plans->ranks[0].schedule()) {
      const plan::Program *program = plans->program(0, e.program());
      if (!program) return error("calibration plan lacks program " + e.program());
      std::vector<HostTensor> args = argumentsFor(*program, model.vocab_size(), rng);
      std::vector<const HostTensor *> pointers;
      for (const HostTensor &t : args) pointers.push_back(&t);
      std::vector<float> workspace;
      for (int run = 0; run <= options.repeats; ++run) {
        ExecutionContext ctx;
        ctx.collectives = collectives.get();
        ctx.workspace = &workspace;
        ctx.trace = run > 0 ? &trace : nullptr;  // the first run warms caches and the arena
        std::vector<HostTensor> results;
        if (Status s = executeProgram(*program, pointers, results, ctx); !s.isOk())
          return error(model.name() + " " + program->name() + ": " + s.message());
      }
    }
    for (const TraceRecorder::Timing &t : trace.timings()) {
      const plan::Instruction &in = *t.instruction;
      if (in.stream() != plan::COMPUTE || in.op() == "identity" || t.runs == 0) continue;
      Sample s{in.flops(), instructionBytes(*t.program, in), t.seconds / t.runs};
      (isGemmOp(in.op()) ? gemm : isAttentionOp(in.op()) ? attention : others[in.op()]).push_back(s);
    }
    log << llvm::formatv("  {0}: {1:F1} s\n", model.name(),
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  double peak = 0;
  for (const Sample &s : gemm) peak = std::max(peak, s.flops / s.seconds);
  if (peak <= 0) return error("no GEMM was timed");
  config::Device &d = *out->mutable_device();
  d.set_kind(config::CPU);
  d.set_model(llvm::formatv("this machine, {0} BLAS thread(s) per rank (loomc calibrate)", options.threads).str());
  d.set_peak_flops(peak), d.set_fp32_peak_flops(peak);
  d.set_memory_bytes(int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE)));
  d.set_cores_per_node(int(std::thread::hardware_concurrency()));
  d.set_threads_per_rank(options.threads);
  efficiencyCurve(gemm, peak, d.mutable_gemm_efficiency());
  efficiencyCurve(attention, peak, d.mutable_attention_efficiency());
  double bytes = 0, seconds = 0;
  for (auto &[op, samples] : others) {
    *d.add_op_rates() = fitRate(op, samples);
    for (const Sample &s : samples) bytes += s.bytes, seconds += s.seconds;
  }
  if (seconds > 0) d.set_memory_bandwidth_bytes_per_s(bytes / seconds);  // ops not seen here
  log << llvm::formatv("  best GEMM rate {0:F1} GFLOP/s ({1} GEMMs, {2} attention ops, {3} other ops timed)\n",
                       peak / 1e9, gemm.size(), attention.size(), others.size());
  return llvm::Error::success();
}

llvm::Error measureLoopback(const CalibrateOptions &options, config::DeviceFile *out, llvm::raw_ostream &log) {
  std::string dir = options.workDir + "/gloo";
  std::filesystem::create_directories(dir);
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    std::string rank = std::to_string(r);
    std::vector<std::string> argv = {options.self, "calibrate", "--gloo-worker", rank, "--gloo-dir", dir};
    std::vector<char *> cargv;
    for (std::string &a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    if (posix_spawn(&pids[r], options.self.c_str(), nullptr, nullptr, cargv.data(), environ) != 0)
      return error("cannot start the Gloo calibration worker " + options.self);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok) return error("a Gloo calibration worker failed (see its message above)");
  std::ifstream in(dir + "/allreduce.txt");
  std::vector<Sample> samples;
  for (double bytes, seconds; in >> bytes >> seconds;) samples.push_back({0, bytes, seconds});
  if (samples.size() < 2) return error(dir + "/allreduce.txt: too few measurements");
  // An all-reduce over two ranks: 2 ring steps, each rank sending and receiving `bytes`. The
  // bandwidth from the two largest sizes, the latency from the smallest (single timings of
  // mid sizes on a loaded 2-core machine are too noisy for a least-squares fit).
  std::sort(samples.begin(), samples.end(), [](const Sample &a, const Sample &b) { return a.bytes < b.bytes; });
  const Sample &big = samples.back(), &less = samples[samples.size() - 2], &small = samples.front();
  double bandwidth = big.seconds > less.seconds ? (big.bytes - less.bytes) / (big.seconds - less.seconds)
                                                : big.bytes / big.seconds;
  double latency = std::max(0.0, (small.seconds - small.bytes / bandwidth) / 2);
  config::Link &link = *out->mutable_intra_node();
  link.set_bandwidth_bytes_per_s(bandwidth);
  link.set_latency_s(latency);
  for (const Sample &s : samples)
    log << llvm::formatv("  Gloo all-reduce of {0,9} bytes between 2 processes: {1:F1} us\n", s.bytes, s.seconds * 1e6);
  log << llvm::formatv("  loopback link: {0:F2} GB/s, latency {1:F1} us\n", bandwidth / 1e9, latency * 1e6);
  return llvm::Error::success();
}

}  // namespace

int runGlooWorker(int rank, const std::string &dir) {
  plan::RankPlan plan;
  plan.set_rank(rank), plan.set_world_size(2);
  plan::Group *g = plan.add_groups();
  g->set_name("dp"), g->add_ranks(0), g->add_ranks(1), g->set_position(rank);
  gloo::rendezvous::FileStore store(dir);
  std::unique_ptr<GlooCollectives> gloo;
  if (Status s = GlooCollectives::create(plan, store, "127.0.0.1", 30, &gloo); !s.isOk()) {
    std::fprintf(stderr, "loomc calibrate: Gloo worker %d: %s\n", rank, s.message().c_str());
    return 1;
  }
  std::ofstream out;
  if (rank == 0) out.open(dir + "/allreduce.txt");
  for (int64_t n : {256, 4096, 65536, 262144, 1048576, 4194304}) {
    std::vector<float> data(size_t(n), 1.0f);
    int reps = n >= 1048576 ? 15 : 50;
    std::vector<double> times;
    for (int k = 0; k <= reps; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      if (Status s = gloo->allReduce("dp", data.data(), n, ReduceOp::kSum); !s.isOk()) {
        std::fprintf(stderr, "loomc calibrate: Gloo worker %d: %s\n", rank, s.message().c_str());
        return 1;
      }
      if (k > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    if (rank == 0) out << n * 4 << " " << times[times.size() / 2] << "\n";
  }
  return 0;
}

llvm::Error calibrate(const CalibrateOptions &options, config::DeviceFile *out, llvm::raw_ostream &log) {
  openblas_set_num_threads(options.threads);
  log << "kernels (CPU executor, traced):\n";
  if (llvm::Error e = measureKernels(options, out, log)) return e;
  log << "communication (Gloo over loopback, 2 processes):\n";
  return measureLoopback(options, out, log);
}

}  // namespace loom
