#include "analysis/Calibrate.h"

#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include <cblas.h>

#include "analysis/CostModel.h"
#include "config/ConfigLoader.h"
#include "analysis/PlanViews.h"
#include "gloo/rendezvous/file_store.h"
#include "llvm/Support/FormatVariadic.h"
#include "runtime/Executor.h"
#include "runtime/GlooCollectives.h"
#include "plan/PlanAttributes.h"
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
    bool dropout;  // GPT: hidden and attention dropout 0.1 (attention with dropout has its own curve)
  };
  const Shape shapes[] = {
      {config::GPT, 1, 64, 4, 64, 512, 1, true},       {config::GPT, 2, 128, 4, 128, 1024, 2, true},
      {config::GPT, 1, 256, 8, 128, 2048, 4, true},    {config::GPT, 1, 384, 6, 256, 4096, 2, true},
      {config::GPT, 1, 768, 12, 512, 8192, 1, true},   {config::GPT, 1, 128, 4, 128, 1024, 2, false},
      {config::GPT, 1, 256, 8, 256, 2048, 2, false},   {config::GPT, 1, 768, 12, 512, 8192, 1, false},
      {config::LLAMA, 1, 128, 4, 128, 1024, 2, false}, {config::LLAMA, 1, 256, 8, 256, 2048, 2, false},
  };
  std::vector<config::ModelConfig> out;
  for (const Shape &s : shapes) {
    config::ModelConfig m;
    m.set_name(llvm::formatv("calibrate-{0}-{1}x{2}-s{3}-b{4}{5}", s.arch == config::GPT ? "gpt" : "llama", s.layers,
                             s.hidden, s.seq, s.batch, s.arch == config::GPT && !s.dropout ? "-nodropout" : "")
                   .str());
    m.set_architecture(s.arch);
    m.set_num_layers(s.layers), m.set_hidden_size(s.hidden), m.set_num_attention_heads(s.heads);
    m.set_seq_length(s.seq), m.set_vocab_size(s.vocab), m.set_micro_batch_size(s.batch);
    if (s.arch == config::GPT && s.dropout) m.set_hidden_dropout(0.1f), m.set_attention_dropout(0.1f);
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
      // AdamW's second moment is never negative in training (a negative one makes every
      // update NaN, which is not what a kernel's speed should be measured on).
      bool nonNegative = binding.name() == "adam_v";
      for (float &v : t.data)
        v = binding.role() == plan::Binding::HYPERPARAMETER ? (scalar != scalars.end() ? scalar->second : 1.0f)
            : mask                                          ? 1.0f
            : nonNegative                                   ? std::fabs(normal(rng))
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

// A compiled calibration model's rank `rank`: its schedule's programs and their arguments.
struct ScheduledRank {
  std::vector<const plan::Program *> programs;
  std::vector<std::vector<HostTensor>> args;
  std::vector<float> workspace, scratch;  // kept across steps, as the CPU backend keeps them
};

llvm::Error scheduleOf(const PlanDirectory &plans, int rank, int64_t vocab, std::mt19937 &rng, ScheduledRank *out) {
  for (const plan::ScheduleEntry &e : plans.ranks[size_t(rank)].schedule()) {
    const plan::Program *program = plans.program(rank, e.program());
    if (!program) return error("calibration plan lacks program " + e.program());
    out->programs.push_back(program);
    out->args.push_back(argumentsFor(*program, vocab, rng));
  }
  return llvm::Error::success();
}

// Runs the schedule `steps` times as training runs it, step after step (each program between
// the others, on one workspace and scratch as the CPU backend keeps them), not a program
// repeated on caches it has just warmed. Steps from `traceFrom` on are traced.
Status runSteps(ScheduledRank &rank, Collectives *collectives, int steps, int traceFrom, TraceRecorder *trace) {
  for (int step = 0; step < steps; ++step)
    for (size_t k = 0; k < rank.programs.size(); ++k) {
      std::vector<const HostTensor *> pointers;
      for (const HostTensor &a : rank.args[k]) pointers.push_back(&a);
      ExecutionContext ctx;
      ctx.collectives = collectives;
      ctx.workspace = &rank.workspace;
      ctx.scratch = &rank.scratch;
      ctx.trace = step >= traceFrom ? trace : nullptr;
      std::vector<HostTensor> results;
      if (Status s = executeProgram(*rank.programs[k], pointers, results, ctx); !s.isOk())
        return Status::error(rank.programs[k]->name() + ": " + s.message());
    }
  return Status::ok();
}

config::ClusterSpec calibrationCluster(const config::ModelConfig &model, int t) {
  config::ClusterSpec c;
  c.set_name("calibrate"), c.set_nodes(1), c.set_devices_per_node(t);
  c.mutable_device()->set_kind(config::CPU), c.mutable_device()->set_peak_flops(1e11);
  config::ParallelConfig &par = *c.mutable_parallel();
  par.set_micro_batch_size(model.micro_batch_size()), par.set_global_batch_size(model.micro_batch_size());
  par.set_tensor_parallel_size(t), par.set_pipeline_parallel_size(1), par.set_data_parallel_size(1);
  par.set_virtual_pipeline_size(1), par.set_dp_bucket_size_bytes(25000000);
  return c;
}

// `slowdown`: what every core busy costs a kernel (measureContention). The t = 2 models run
// their two ranks at once, so their samples are scaled back to a kernel's time alone by the
// share of the cores they kept busy.
llvm::Error measureKernels(const CalibrateOptions &options, double slowdown, config::DeviceFile *out,
                           llvm::raw_ostream &log) {
  int cores = int(std::thread::hardware_concurrency());
  std::vector<Sample> gemm, attention, attentionDropout;  // attention with and without attention dropout
  std::map<std::string, std::vector<Sample>> others;
  for (config::ModelConfig &model : calibrationModels())
    for (int t : {1, 2}) {  // t = 2: the vocab-parallel cross-entropy's steps and the sharded shapes
      if (t == 2 && (model.num_attention_heads() % 2 != 0 || model.hidden_size() > 512)) continue;
      config::ClusterSpec c = calibrationCluster(model, t);
      std::string dir = options.workDir + "/" + model.name() + "-t" + std::to_string(t);
      if (llvm::Error e = options.compile(model, c, dir)) return e;
      llvm::Expected<PlanDirectory> plans = readPlanDirectory(dir);
      if (!plans) return plans.takeError();
      // The ranks run concurrently, each on its own thread (as their processes would), their
      // collectives in-process.
      ThreadWorld world(ParallelLayout{t, 1, 1});
      std::vector<TraceRecorder> traces(static_cast<size_t>(t));
      std::vector<std::string> failures(static_cast<size_t>(t));
      auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> threads;
      for (int r = 0; r < t; ++r)
        threads.emplace_back([&, r] {
          std::unique_ptr<Collectives> collectives = world.forRank(r);
          std::mt19937 rng(7 + r);
          ScheduledRank rank;
          if (llvm::Error e = scheduleOf(*plans, r, model.vocab_size(), rng, &rank)) {
            failures[size_t(r)] = llvm::toString(std::move(e));
            return;
          }
          // The first step warms pages, caches and the arena.
          if (Status s = runSteps(rank, collectives.get(), options.repeats + 1, 1, &traces[size_t(r)]); !s.isOk())
            failures[size_t(r)] = model.name() + " " + s.message();
        });
      for (std::thread &th : threads) th.join();
      for (const std::string &f : failures)
        if (!f.empty()) return error(f);
      for (const TraceRecorder &trace : traces)
        for (const TraceRecorder::Timing &tm : trace.timings()) {
          const plan::Instruction &in = *tm.instruction;
          if (in.stream() != plan::COMPUTE || in.op() == "identity" || tm.seconds.empty()) continue;
          std::vector<double> runs = tm.seconds;  // the median run: an interrupted one does not count
          std::nth_element(runs.begin(), runs.begin() + long(runs.size() / 2), runs.end());
          int busy = std::min(cores, t * options.threads);
          double contention = cores > 1 ? 1 + (slowdown - 1) * double(busy - 1) / double(cores - 1) : 1.0;
          Sample smp{in.flops(), instructionBytes(*tm.program, in), runs[runs.size() / 2] / contention};
          bool dropout = planattr::f64(in, "dropout") > 0;
          (isGemmOp(in.op())          ? gemm
           : !isAttentionOp(in.op()) ? others[in.op()]
           : dropout                 ? attentionDropout
                                     : attention)
              .push_back(smp);
        }
      log << llvm::formatv("  {0} t={1}: {2:F1} s\n", model.name(), t,
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
  efficiencyCurve(attentionDropout, peak, d.mutable_attention_dropout_efficiency());
  std::vector<double> rates;
  for (auto &[op, samples] : others) {
    *d.add_op_rates() = fitRate(op, samples);
    rates.push_back(d.op_rates(d.op_rates_size() - 1).bytes_per_s());
  }
  if (!rates.empty()) {  // ops not seen here: the median op's rate
    std::nth_element(rates.begin(), rates.begin() + long(rates.size() / 2), rates.end());
    d.set_memory_bandwidth_bytes_per_s(rates[rates.size() / 2]);
  }
  log << llvm::formatv("  best GEMM rate {0:F1} GFLOP/s ({1} GEMMs, {2} attention ops, {3} other ops timed)\n",
                       peak / 1e9, gemm.size(), attention.size() + attentionDropout.size(), others.size());
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
  // An all-reduce over two ranks is 2 ring steps of half its payload each: the link's step
  // times are half the measured times at half the bytes. Beyond the largest size: the
  // bandwidth between the two largest.
  std::sort(samples.begin(), samples.end(), [](const Sample &a, const Sample &b) { return a.bytes < b.bytes; });
  // Moving more bytes never takes less time: the measured means are made non-decreasing by
  // pooling adjacent violators (isotonic regression), which averages out single sizes' noise.
  std::vector<std::pair<double, int>> pools;  // (mean seconds, samples pooled)
  for (const Sample &s : samples) {
    pools.push_back({s.seconds, 1});
    while (pools.size() > 1 && pools[pools.size() - 2].first > pools.back().first) {
      auto [t, n] = pools.back();
      pools.pop_back();
      pools.back().first = (pools.back().first * pools.back().second + t * n) / (pools.back().second + n);
      pools.back().second += n;
    }
  }
  std::vector<double> fitted;
  for (auto [t, n] : pools) fitted.insert(fitted.end(), size_t(n), t);
  config::Link &link = *out->mutable_intra_node();
  for (size_t i = 0; i < samples.size(); ++i) {
    config::TransferPoint *pt = link.add_step_times();
    pt->set_bytes(samples[i].bytes / 2), pt->set_seconds(fitted[i] / 2);
    log << llvm::formatv("  Gloo all-reduce of {0,9} bytes between 2 processes: {1:F1} us per call in the executor (median of sweeps; fitted {2:F1} us)\n",
                         samples[i].bytes, samples[i].seconds * 1e6, fitted[i] * 1e6);
  }
  const Sample &big = samples.back(), &less = samples[samples.size() - 2];
  double bandwidth = big.seconds > less.seconds ? (big.bytes - less.bytes) / (big.seconds - less.seconds)
                                                : big.bytes / big.seconds;
  link.set_bandwidth_bytes_per_s(bandwidth);
  link.set_latency_s(samples.front().seconds / 2);
  log << llvm::formatv("  loopback link: {0:F2} GB/s for large messages, {1:F1} us per step for small ones\n",
                       bandwidth / 1e9, link.latency_s() * 1e6);
  return llvm::Error::success();
}

// `calls` rounds of a GEMM of a training layer's size (512 x 256 by 256 x 768) on the compute
// stream, an all-reduce of `floats` over "dp" on the TP stream once the GEMM is done (when
// `allReduce`), and a scale of the all-reduced data on the compute stream after it.
plan::Program handOffProgram(int64_t floats, int calls, bool allReduce) {
  plan::Program p;
  p.set_name(allReduce ? "calibrate_all_reduce" : "calibrate_compute");
  int64_t offset = 0;
  auto buffer = [&](std::vector<int64_t> shape) {
    plan::Buffer *b = p.add_buffers();
    b->set_id(p.buffers_size() - 1);
    int64_t n = 1;
    for (int64_t d : shape) b->add_shape(d), n *= d;
    b->set_dtype(plan::F32), b->set_bytes(n * 4), b->set_kind(plan::Buffer::ACTIVATION);
    b->set_offset(offset), offset += (n * 4 + 255) / 256 * 256;
    return b->id();
  };
  int x = buffer({512, 256}), w = buffer({256, 768}), h = buffer({512, 768}), data = buffer({floats}),
      scaled = buffer({floats});
  int previous = -1;
  for (int c = 0; c < calls; ++c) {
    plan::Instruction *gemm = p.add_instructions();
    gemm->set_op("linear"), gemm->set_stream(plan::COMPUTE);
    gemm->add_inputs(x), gemm->add_inputs(w), gemm->add_outputs(h);
    if (previous >= 0) gemm->add_wait_for(previous);
    int gemmIndex = p.instructions_size() - 1;
    plan::Instruction *scale = nullptr;
    if (allReduce) {
      plan::Instruction *ar = p.add_instructions();
      ar->set_op("all_reduce"), ar->set_stream(plan::TP);
      ar->add_inputs(data), ar->add_outputs(data), ar->add_wait_for(gemmIndex);
      plan::Attribute *g = ar->add_attributes();
      g->set_name("group"), g->set_s("dp");
      scale = p.add_instructions();
      scale->add_wait_for(p.instructions_size() - 2);
    } else {
      scale = p.add_instructions();
      scale->add_wait_for(gemmIndex);
    }
    scale->set_op("scale"), scale->set_stream(plan::COMPUTE);
    scale->add_inputs(data), scale->add_outputs(scaled);
    previous = p.instructions_size() - 1;
  }
  p.set_workspace_bytes(offset);
  return p;
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
  // Measured as the runtime issues it: the executor's compute stream runs a GEMM, the TP
  // stream's thread takes the all-reduce when the GEMM is done, and the next compute op waits
  // for it. What a collective costs the step is then its transfer, the hand-offs between the
  // threads and the ranks' arrival skew after a GEMM each: the program with the all-reduces
  // minus the same program without them, per call. The sweep over sizes runs five times; each
  // size's time is the median of its sweeps (a disturbed sweep does not count).
  const std::vector<int64_t> sizes = {256, 1024, 4096, 16384, 65536, 131072, 262144, 524288, 1048576, 4194304};
  const int calls = 8;
  std::vector<std::vector<double>> means(sizes.size());
  std::vector<float> workspace, scratch;
  auto seconds = [&](const plan::Program &program, double *out) {
    ExecutionContext ctx;
    ctx.collectives = gloo.get();
    ctx.workspace = &workspace;
    ctx.scratch = &scratch;
    auto t0 = std::chrono::steady_clock::now();
    std::vector<HostTensor> results;
    Status st = executeProgram(program, std::vector<const HostTensor *>{}, results, ctx);
    *out = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st.isOk()) std::fprintf(stderr, "loomc calibrate: Gloo worker %d: %s\n", rank, st.message().c_str());
    return st.isOk();
  };
  for (int sweep = 0; sweep <= 5; ++sweep)  // sweep 0 warms the threads, buffers and connections
    for (size_t k = 0; k < sizes.size(); ++k) {
      plan::Program with = handOffProgram(sizes[k], calls, true), without = handOffProgram(sizes[k], calls, false);
      double a = 0, b = 0;
      if (!seconds(with, &a) || !seconds(without, &b)) return 1;
      if (sweep > 0) means[k].push_back(std::max(0.0, a - b) / calls);
    }
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<double> &m = means[k];
    std::nth_element(m.begin(), m.begin() + long(m.size() / 2), m.end());
    if (rank == 0) out << sizes[k] * 4 << " " << m[m.size() / 2] << "\n";
  }
  return 0;
}

// Seconds per training step of `copies` copies of one rank's schedule running at once, each
// on its own thread with its own arguments (the mean over the copies of their timed steps,
// which all begin together after every copy's warm-up step).
llvm::Expected<double> concurrentStepSeconds(const PlanDirectory &plans, int64_t vocab, int copies, int steps) {
  std::vector<ScheduledRank> ranks(static_cast<size_t>(copies));
  for (int c = 0; c < copies; ++c) {
    std::mt19937 rng(11 + c);
    if (llvm::Error e = scheduleOf(plans, 0, vocab, rng, &ranks[size_t(c)])) return std::move(e);
  }
  std::vector<double> seconds(static_cast<size_t>(copies));
  std::vector<std::string> failures(static_cast<size_t>(copies));
  std::mutex mu;
  std::condition_variable cv;
  int warm = 0;
  std::vector<std::thread> pool;
  for (int c = 0; c < copies; ++c)
    pool.emplace_back([&, c] {
      ThreadWorld world(ParallelLayout{1, 1, 1});
      std::unique_ptr<Collectives> collectives = world.forRank(0);
      Status s = runSteps(ranks[size_t(c)], collectives.get(), 1, 1, nullptr);
      {
        std::unique_lock<std::mutex> lock(mu);
        ++warm;
        cv.notify_all();
        cv.wait(lock, [&] { return warm == copies; });
      }
      auto t0 = std::chrono::steady_clock::now();
      if (s.isOk()) s = runSteps(ranks[size_t(c)], collectives.get(), steps, steps, nullptr);
      seconds[size_t(c)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
      if (!s.isOk()) failures[size_t(c)] = s.message();
    });
  for (std::thread &th : pool) th.join();
  for (const std::string &f : failures)
    if (!f.empty()) return error("contention model: " + f);
  double sum = 0;
  for (double x : seconds) sum += x;
  return sum / copies;
}

// How much slower a rank's kernels run when every core of the node is busy than alone,
// measured on a training step's own mix (GEMMs, attention, elementwise ops, AdamW) of a
// mid-sized calibration model: the median of five alternations of one copy alone and one copy
// per core at once. (A synthetic unit mixes compute and memory traffic in proportions training
// does not have: a GEMM and a streaming pass measured 1.0x to 1.6x from one run to the next.)
llvm::Expected<double> measureContention(const CalibrateOptions &options, int cores, llvm::raw_ostream &log) {
  if (cores < 2) return 1.0;
  config::ModelConfig model;
  for (const config::ModelConfig &m : calibrationModels())
    if (m.name() == "calibrate-gpt-1x256-s256-b2-nodropout") model = m;
  std::string dir = options.workDir + "/contention";
  if (llvm::Error e = options.compile(model, calibrationCluster(model, 1), dir)) return std::move(e);
  llvm::Expected<PlanDirectory> plans = readPlanDirectory(dir);
  if (!plans) return plans.takeError();
  // The process's first steps run about 2x slower than later ones (first use of the BLAS
  // buffers and of the allocator's arenas by new threads): one round warms them, not counted.
  if (llvm::Expected<double> warm = concurrentStepSeconds(*plans, model.vocab_size(), cores, 1); !warm)
    return warm.takeError();
  std::vector<double> ratios;
  for (int round = 0; round < 5; ++round) {
    llvm::Expected<double> alone = concurrentStepSeconds(*plans, model.vocab_size(), 1, 3);
    if (!alone) return alone.takeError();
    llvm::Expected<double> all = concurrentStepSeconds(*plans, model.vocab_size(), cores, 3);
    if (!all) return all.takeError();
    ratios.push_back(*all / *alone);
  }
  std::string rounds;
  for (double r : ratios) rounds += llvm::formatv("{0}{1:F2}", rounds.empty() ? "" : " ", r).str();
  std::sort(ratios.begin(), ratios.end());
  double slowdown = std::max(1.0, ratios[ratios.size() / 2]);
  log << llvm::formatv("  a training step's kernels with all {0} cores busy: {1:F2}x their time alone (the median of "
                       "rounds {2})\n",
                       cores, slowdown, rounds);
  return slowdown;
}

llvm::Error calibrate(const CalibrateOptions &options, config::DeviceFile *out, llvm::raw_ostream &log) {
  openblas_set_num_threads(options.threads);
  log << "contention (a calibration model's training step alone and on every core):\n";
  int cores = int(std::thread::hardware_concurrency());
  llvm::Expected<double> contention = measureContention(options, cores, log);
  if (!contention) return contention.takeError();
  double slowdown = *contention;
  log << "kernels (CPU executor, traced):\n";
  if (llvm::Error e = measureKernels(options, slowdown, out, log)) return e;
  out->mutable_device()->set_all_cores_busy_slowdown(slowdown);
  log << "communication (Gloo over loopback, 2 processes):\n";
  return measureLoopback(options, out, log);
}

}  // namespace loom
