// The rank runtime as real processes (loomrun, loom-coord, loom-rank over Gloo/TCP):
// - every parallel configuration reproduces the single-rank loss and gradients of gpt-tiny;
// - a killed rank, a wrong token, an unreachable coordinator and bad plans end the job with
//   a clear error and a non-zero exit within 30 s.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "protos/plan.pb.h"
#include "formats/Safetensors.h"
#include "support/Checksum.h"
#ifdef LOOM_WITH_CUDA
#include "runtime/cuda/CudaKernels.h"
#endif
#include "tests/runtime/MultiProcess.h"

namespace loom::test {
namespace {

std::string tmpdir() { return std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"; }
std::string loomc() { return runfile("apps/loomc"); }
std::string loomrun() { return runfile("apps/loomrun"); }
std::string input(const std::string &name) { return runfile("tests/runtime/Inputs/" + name); }
// Bytes in `path`, 0 when it does not exist (yet).
int64_t fileSize(const std::string &path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  return in ? int64_t(in.tellg()) : 0;
}

// Compiles gpt-tiny (no dropout) for `cluster` into `dir`.
void compile(const std::string &cluster, const std::string &dir) {
  Result r = run(loomc() + " compile " + input("gpt-tiny-nodropout.pbtxt") + " --cluster " + input(cluster) +
                 " --out " + dir + " --quiet");
  ASSERT_EQ(r.exitCode, 0) << r.output;
}

double relativeError(const HostTensor &a, const HostTensor &b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.data.size(); ++i) d += std::pow(a.data[i] - b.data[i], 2), n += std::pow(b.data[i], 2);
  return std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
}

JobGradients train(const std::string &name, int world) {
  std::string plans = tmpdir() + "/plans_" + name, dump = tmpdir() + "/grads_" + name;
  compile(name + ".pbtxt", plans);
  Result r = run(loomrun() + " --nproc " + std::to_string(world) + " --plans " + plans + " --steps 1 --threads 1" +
                 " --dump-grads " + dump);
  EXPECT_EQ(r.exitCode, 0) << r.output;
  return readJobGradients(dump, world);
}

// Each of the `world` ranks' "memory: planned peak X MiB, allocated by the backend Y MiB (D
// bytes, ...)" lines in a job's output: the CPU backend holds exactly the plan's peak (D = 0).
void expectMemoryAsPlanned(const std::string &output, int world, const std::string &what) {
  int ranks = 0;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    int rank;
    double planned, held;
    long long difference;
    if (std::sscanf(line.c_str(), " rank %d memory: planned peak %lf MiB, allocated by the backend %lf MiB (%lld bytes",
                    &rank, &planned, &held, &difference) != 4)
      continue;
    ++ranks;
    EXPECT_GT(planned, 0) << line;
    EXPECT_EQ(difference, 0) << what << ": " << line;
  }
  EXPECT_EQ(ranks, world) << what << ":\n" << output;
}

// The memory plan is what the CPU backend holds: every rank's storage (parameters, gradients,
// AdamW state, stash and input slots of the micro-batches in flight, the step's scalars) and
// its one workspace arena come to its plan's peak to the byte (each rank prints both after its
// first iteration); with 1F1B over 8 micro-batches, the slots of the 2 in flight, not of all 8.
TEST(Runtime, EveryRankHoldsWhatItsMemoryPlanSays) {
  for (const char *layout : {"t2p2d1", "t1p1d1_zero1", "t1p2d1_m8"}) {
    std::string plans = tmpdir() + "/plans_memory_" + layout;
    compile(std::string(layout) + ".pbtxt", plans);
    int world = std::string(layout) == "t2p2d1" ? 4 : std::string(layout) == "t1p2d1_m8" ? 2 : 1;
    Result r = run(loomrun() + " --nproc " + std::to_string(world) + " --plans " + plans + " --steps 2 --threads 1");
    ASSERT_EQ(r.exitCode, 0) << r.output;
    expectMemoryAsPlanned(r.output, world, layout);
  }
}

TEST(Runtime, ParallelRunsMatchTheSingleRankRun) {
  JobGradients ref = train("t1p1d1", 1);
  ASSERT_EQ(ref.error, "");
  ASSERT_GT(ref.grads.size(), 50u);
  for (auto [name, world] : {std::pair{"t2p1d1", 2}, {"t1p2d1", 2}, {"t1p1d2", 2}, {"t2p2d1", 4}}) {
    JobGradients got = train(name, world);
    ASSERT_EQ(got.error, "") << name;
    EXPECT_LT(std::abs(got.loss - ref.loss) / ref.loss, 1e-5) << name << ": loss " << got.loss << " vs " << ref.loss;
    EXPECT_EQ(got.grads.size(), ref.grads.size()) << name;
    for (auto &[param, g] : ref.grads) {
      ASSERT_TRUE(got.grads.count(param)) << name << ": no gradient for " << param;
      EXPECT_LT(relativeError(got.grads[param], g), 1e-5) << name << ": " << param;
    }
  }
}

std::string readAll(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// bf16 plans (Megatron's mixed precision: bf16 weights for compute, activations, stashes,
// messages and tp collectives; fp32 master weights, main gradients and AdamW) train on the CPU
// backend in every layout: each step's loss within 2e-3 of the fp32 run's, and within 1e-3 of
// the single-rank bf16 run's (the layouts round at the same points but sum in other orders:
// measured differences are ~2e-4 and ~1.5e-4 on gpt-tiny over 10 steps), the same bits at 1
// and 2 threads, and the backend holds what the bf16 memory plan says.
std::vector<double> lossesOf(const std::string &output) {
  std::vector<double> losses;
  for (size_t at = output.find("lm loss: "); at != std::string::npos; at = output.find("lm loss: ", at + 1))
    losses.push_back(std::strtod(output.c_str() + at + 9, nullptr));
  return losses;
}

TEST(Runtime, Bf16PlansTrainCloseToFp32InEveryLayout) {
  // `extra`: more fields of the bf16 run's parallel config (grad_reduce_in_bf16).
  auto trainIn = [](const std::string &layout, int world, bool bf16, std::string *output, int threads = 1,
                    const std::string &extra = "") {
    std::string tag = layout + (bf16 ? "_bf16" : "") + (extra.empty() ? "" : "_wire");
    std::string cluster = input(layout + ".pbtxt"), plans = tmpdir() + "/plans_precision_" + tag;
    if (bf16) {
      std::ifstream in(cluster);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      size_t at = text.find("parallel {");
      if (at == std::string::npos) return std::vector<double>{};
      text.insert(at + 10, " precision: PRECISION_BF16 " + extra);
      cluster = tmpdir() + "/bf16_" + tag + ".pbtxt";
      std::ofstream(cluster) << text;
    }
    Result c = run(loomc() + " compile " + input("gpt-tiny-nodropout.pbtxt") + " --cluster " + cluster + " --out " + plans +
                   " --quiet");
    EXPECT_EQ(c.exitCode, 0) << c.output;
    Result r = run(loomrun() + " --nproc " + std::to_string(world) + " --plans " + plans +
                   " --steps 10 --threads " + std::to_string(threads) + " --seed 4");
    EXPECT_EQ(r.exitCode, 0) << r.output;
    *output = r.output;
    return lossesOf(r.output);
  };
  std::string out;
  std::vector<double> fp32 = trainIn("t1p1d1", 1, false, &out), bf16 = trainIn("t1p1d1", 1, true, &out);
  ASSERT_EQ(fp32.size(), 10u) << out;
  ASSERT_EQ(bf16.size(), 10u) << out;
  bool differs = false;
  for (size_t k = 0; k < 10; ++k) {
    EXPECT_LT(std::abs(bf16[k] - fp32[k]), 2e-3) << "step " << k + 1;
    differs |= bf16[k] != fp32[k];
  }
  EXPECT_TRUE(differs) << "the bf16 plan computed exactly the fp32 losses: it did not round";
  // The native bf16 kernels (oneDNN's bf16 GEMM in fixed tiles among them) give the same bits
  // at 2 threads as at 1.
  EXPECT_EQ(trainIn("t1p1d1", 1, true, &out, 2), bf16) << "bf16 at 2 threads differs from 1 thread:\n" << out;
  // --precision chooses an fp32 plan's GEMM operands; a 16-bit plan computes in its own type,
  // so asking it for another is refused, not ignored.
  Result asked = run(loomrun() + " --nproc 1 --plans " + tmpdir() + "/plans_precision_t1p1d1_bf16 --steps 1 --precision fp32");
  EXPECT_NE(asked.exitCode, 0) << asked.output;
  EXPECT_NE(asked.output.find("loom-rank 0: error: --precision fp32: this plan computes in bf16 (compiled with "
                              "parallel.precision or params_dtype); --precision applies to fp32 plans"),
            std::string::npos)
      << asked.output;
  // The tp all-reduces, sequence parallelism's all-gather / reduce-scatter and the pipeline
  // messages move bf16; with grad_reduce_in_bf16 the dp reduction too (t1p1d2 and ZeRO-1's
  // reduce-scatter at d = 2).
  struct Layout {
    const char *name;
    int world;
    const char *extra;
  };
  for (auto [layout, world, extra] : {Layout{"t2p2d1", 4, ""}, {"t2p1d1_sp", 2, ""}, {"t1p1d2", 2, ""},
                                      {"t1p1d1_zero1", 1, ""}, {"t1p1d2", 2, "grad_reduce_in_bf16: true"},
                                      {"t1p1d2", 2, "grad_reduce_in_bf16: true zero1: true"}}) {
    std::vector<double> got = trainIn(layout, world, true, &out, 1, extra);
    ASSERT_EQ(got.size(), 10u) << layout << " " << extra << ":\n" << out;
    for (size_t k = 0; k < 10; ++k) {
      EXPECT_LT(std::abs(got[k] - bf16[k]), 1e-3) << layout << " " << extra << " step " << k + 1;
      EXPECT_LT(std::abs(got[k] - fp32[k]), 2e-3) << layout << " " << extra << " step " << k + 1;
    }
    expectMemoryAsPlanned(out, world, layout);
  }
}

// An fp16 plan trains with dynamic loss scaling (Megatron's --fp16): from a loss scale so large
// that the fp16 gradients overflow, each such iteration skips its update and halves the scale
// until the gradients are finite, and training goes on with finite losses; at the default
// scale the fp16 losses are those of the fp32 run to within 1e-3.
TEST(Runtime, Fp16PlansScaleTheLossAndRecoverFromOverflows) {
  std::ifstream in(input("t1p1d1.pbtxt"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.insert(text.find("parallel {") + 10, " precision: PRECISION_FP16");
  std::string cluster = tmpdir() + "/fp16_t1p1d1.pbtxt", plans = tmpdir() + "/plans_fp16";
  std::ofstream(cluster) << text;
  Result c = run(loomc() + " compile " + input("gpt-tiny-nodropout.pbtxt") + " --cluster " + cluster + " --out " + plans +
                 " --quiet");
  ASSERT_EQ(c.exitCode, 0) << c.output;
  Result r = run(loomrun() + " --nproc 1 --plans " + plans + " --steps 12 --threads 1 --seed 4 --initial-loss-scale 16777216");
  ASSERT_EQ(r.exitCode, 0) << r.output;
  std::vector<double> scales;
  for (size_t at = r.output.find("skipped: inf/NaN gradients at loss scale "); at != std::string::npos;
       at = r.output.find("skipped: inf/NaN gradients at loss scale ", at + 1))
    scales.push_back(std::strtod(r.output.c_str() + at + 41, nullptr));
  ASSERT_GE(scales.size(), 1u) << r.output;
  EXPECT_EQ(scales[0], 16777216.0);
  for (size_t k = 1; k < scales.size(); ++k) EXPECT_EQ(scales[k], scales[k - 1] / 2) << r.output;
  std::vector<double> after = lossesOf(r.output);
  ASSERT_GE(after.size(), 3u) << "training did not go on after the overflows:\n" << r.output;
  for (double l : after) EXPECT_TRUE(std::isfinite(l) && l > 6 && l < 8) << r.output;

  Result fp16 = run(loomrun() + " --nproc 1 --plans " + plans + " --steps 10 --threads 1 --seed 4");
  ASSERT_EQ(fp16.exitCode, 0) << fp16.output;
  std::string fp32Plans = tmpdir() + "/plans_fp16_reference";
  compile("t1p1d1.pbtxt", fp32Plans);
  Result fp32 = run(loomrun() + " --nproc 1 --plans " + fp32Plans + " --steps 10 --threads 1 --seed 4");
  std::vector<double> a = lossesOf(fp16.output), b = lossesOf(fp32.output);
  ASSERT_EQ(a.size(), 10u) << fp16.output;
  ASSERT_EQ(b.size(), 10u) << fp32.output;
  for (size_t k = 0; k < 10; ++k) EXPECT_LT(std::abs(a[k] - b[k]), 1e-3) << "step " << k + 1;
}

// IR written by hand (examples/ir/tiny-decoder.mlir: no position embedding, a
// gated MLP, an untied output layer stored [hidden, vocab], vocabulary 20, dynamic batch) is
// compiled as it is and trains alike in every layout: the vocabulary padding that t sets
// (128 or 256 rows) changes neither the initial weights, nor the losses, nor the export.
TEST(Runtime, HandWrittenIrTrainsAlikeInEveryLayout) {
  std::string ir = runfile("examples/ir/tiny-decoder.mlir");
  std::vector<std::string> initial, logs;
  std::vector<SafetensorsFile> finals;
  for (auto [name, world] : {std::pair{"t1p1d1", 1}, {"t2p1d1", 2}, {"t2p1d1_sp", 2}, {"t1p1d2", 2}}) {
    std::string plans = tmpdir() + "/plans_hand_" + std::string(name), tag = tmpdir() + "/hand_" + name;
    Result c = run(loomc() + " compile " + ir + " --cluster " + input(std::string(name) + ".pbtxt") + " --out " +
                   plans + " --quiet");
    ASSERT_EQ(c.exitCode, 0) << c.output;
    std::string job = loomrun() + " --nproc " + std::to_string(world) + " --plans " + plans + " --seed 4 --threads 1";
    Result r0 = run(job + " --steps 0 --export " + tag + "_init.safetensors");
    ASSERT_EQ(r0.exitCode, 0) << r0.output;
    // Adam's epsilon as in the oracle (run_oracle.py): rounding noise of near-zero gradients
    // must not become full-size steps.
    Result r = run(job + " --steps 3 --adam-eps 1e-6 --loss-log " + tag + ".log --export " + tag + "_final.safetensors");
    ASSERT_EQ(r.exitCode, 0) << r.output;
    initial.push_back(readAll(tag + "_init.safetensors"));
    logs.push_back(readAll(tag + ".log"));
    SafetensorsFile f;
    ASSERT_TRUE(readSafetensors(tag + "_final.safetensors", &f).isOk());
    finals.push_back(std::move(f));
  }
  ASSERT_EQ(finals[0].tensors.size(), 13u);
  EXPECT_EQ(finals[0].tensors.at("head.weight").shape, (std::vector<int64_t>{8, 20}));  // no padding exported
  std::vector<double> first;
  for (size_t k = 0; k < logs.size(); ++k) {
    EXPECT_EQ(initial[k], initial[0]) << "initial weights of layout " << k;
    std::istringstream in(logs[k]);
    int step;
    double loss, norm;
    for (int i = 0; in >> step >> loss >> norm; ++i) {
      if (k == 0) first.push_back(loss);
      ASSERT_LT(size_t(i), first.size());
      EXPECT_LT(std::abs(loss - first[size_t(i)]) / first[size_t(i)], 1e-5) << "layout " << k << " step " << step;
    }
    for (auto &[param, t] : finals[0].tensors)
      EXPECT_LT(relativeError(finals[k].tensors.at(param), t), 1e-4) << "layout " << k << ": " << param;
  }
  EXPECT_EQ(first.size(), 3u);
}

// An export is a Hugging Face checkpoint: the safetensors file plus the config.json its class
// reads, side by side. A LLaMA export loads back with --init-from, in another layout, to the
// same losses; a GPT export names GPT2LMHeadModel.
TEST(Runtime, ExportsCarryConfigJsonAndLoadBack) {
  std::string llama = runfile("examples/models/llama-tiny.pbtxt"), dir = tmpdir() + "/llama_export";
  std::vector<std::string> logs;
  for (auto [cluster, world, from] : {std::tuple{"t2p1d1", 2, false}, {"t1p2d1", 2, true}}) {
    std::string plans = tmpdir() + "/plans_llama_" + cluster;
    Result c = run(loomc() + " compile " + llama + " --cluster " + input(std::string(cluster) + ".pbtxt") +
                   " --out " + plans + " --quiet");
    ASSERT_EQ(c.exitCode, 0) << c.output;
    std::string job = loomrun() + " --nproc " + std::to_string(world) + " --plans " + plans + " --seed 5 --threads 1";
    if (!from) {
      Result e = run(job + " --steps 0 --export " + dir + "/model.safetensors");
      ASSERT_EQ(e.exitCode, 0) << e.output;
      std::string text = readAll(dir + "/config.json");
      nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      ASSERT_TRUE(config.is_object()) << text;
      EXPECT_EQ(config["architectures"], nlohmann::json::array({"LlamaForCausalLM"})) << text;
      EXPECT_EQ(config["num_key_value_heads"], 2) << text;
      EXPECT_EQ(config["tie_word_embeddings"], false) << text;
      // f32 attributes printed to their own precision (10000.0, not 10000.0000000001 or 1e+04).
      EXPECT_NE(text.find("\"rope_theta\": 10000.0,"), std::string::npos) << text;
      SafetensorsFile f;
      ASSERT_TRUE(readSafetensors(dir + "/model.safetensors", &f).isOk());
      EXPECT_EQ(f.tensors.at("lm_head.weight").shape, (std::vector<int64_t>{1000, 64}));  // unpadded
      EXPECT_EQ(f.tensors.at("model.layers.0.self_attn.k_proj.weight").shape, (std::vector<int64_t>{32, 64}));
    }
    std::string log = tmpdir() + "/llama_" + cluster + ".log";
    Result r = run(job + " --steps 2 --loss-log " + log + (from ? " --init-from " + dir + "/model.safetensors" : ""));
    ASSERT_EQ(r.exitCode, 0) << r.output;
    logs.push_back(readAll(log));
  }
  std::istringstream a(logs[0]), b(logs[1]);
  int sa, sb, steps = 0;
  double la, lb, na, nb;
  for (; a >> sa >> la >> na && b >> sb >> lb >> nb; ++steps)
    EXPECT_LT(std::abs(la - lb) / la, 1e-5) << "step " << sa << ": " << la << " vs " << lb;
  EXPECT_EQ(steps, 2);

  std::string plans = tmpdir() + "/plans_gpt_export", gptDir = tmpdir() + "/gpt_export";
  compile("t1p1d1.pbtxt", plans);
  Result e = run(loomrun() + " --nproc 1 --plans " + plans + " --steps 0 --export " + gptDir + "/model.safetensors");
  ASSERT_EQ(e.exitCode, 0) << e.output;
  std::string text = readAll(gptDir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(config.is_object()) << text;
  EXPECT_EQ(config["architectures"], nlohmann::json::array({"GPT2LMHeadModel"})) << text;
  EXPECT_EQ(config["n_head"], 4) << text;
  EXPECT_EQ(config["vocab_size"], 1000) << text;
  EXPECT_NE(text.find("\"layer_norm_epsilon\": 1e-05,"), std::string::npos) << text;

  // With --save the export's directory is made too (as save_pretrained makes it).
  std::string nested = tmpdir() + "/gpt_export_saved/a/b";
  Result saved = run(loomrun() + " --nproc 1 --plans " + plans + " --steps 0 --save " + tmpdir() +
                     "/gpt_export_ckpt --export " + nested + "/model.safetensors");
  ASSERT_EQ(saved.exitCode, 0) << saved.output;
  EXPECT_TRUE(std::filesystem::exists(nested + "/model.safetensors")) << saved.output;
  EXPECT_TRUE(std::filesystem::exists(nested + "/config.json")) << saved.output;
}

// With dropout on (gpt-tiny's 0.1), a configuration and seed reproduce themselves bit for bit:
// across runs and across BLAS thread counts (dropout masks come from a counter-based generator).
TEST(Runtime, DropoutRunsReproduceBitForBit) {
  std::string plans = tmpdir() + "/plans_dropout";
  Result c = run(loomc() + " compile " + runfile("examples/models/gpt-tiny.pbtxt") + " --cluster " +
                 input("t2p2d1.pbtxt") + " --out " + plans + " --quiet");
  ASSERT_EQ(c.exitCode, 0) << c.output;
  std::vector<std::string> weights;
  std::vector<std::string> logs;
  for (int threads : {1, 2, 2}) {
    std::string tag = std::to_string(weights.size());
    std::string log = tmpdir() + "/dropout" + tag + ".log", out = tmpdir() + "/dropout" + tag + ".safetensors";
    Result r = run(loomrun() + " --nproc 4 --plans " + plans + " --steps 4 --seed 3 --threads " +
                   std::to_string(threads) + " --loss-log " + log + " --export " + out);
    ASSERT_EQ(r.exitCode, 0) << r.output;
    std::ifstream l(log), w(out, std::ios::binary);
    logs.emplace_back((std::istreambuf_iterator<char>(l)), std::istreambuf_iterator<char>());
    weights.emplace_back((std::istreambuf_iterator<char>(w)), std::istreambuf_iterator<char>());
  }
  EXPECT_EQ(std::count(logs[0].begin(), logs[0].end(), '\n'), 4);
  // Dropout is really on: without it the same plans' layout and seed give other losses.
  std::string off = tmpdir() + "/plans_dropout_off", offLog = tmpdir() + "/dropout_off.log";
  compile("t2p2d1.pbtxt", off);
  Result r = run(loomrun() + " --nproc 4 --plans " + off + " --steps 4 --seed 3 --threads 1 --loss-log " + offLog);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(readAll(offLog), logs[0]) << "the dropout run's losses equal the dropout-free run's";
  EXPECT_EQ(logs[0], logs[1]) << "1 vs 2 BLAS threads";
  EXPECT_EQ(logs[1], logs[2]) << "two runs";
  EXPECT_TRUE(weights[0] == weights[1] && weights[1] == weights[2]) << "final weights differ";
}

// Pids of this job's loom-rank processes (found by the unique seed on their command line).
std::vector<pid_t> rankPids(const std::string &marker) {
  std::vector<pid_t> pids;
  DIR *d = opendir("/proc");
  while (dirent *e = readdir(d)) {
    pid_t pid = atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream in("/proc/" + std::string(e->d_name) + "/cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), {});
    if (cmd.find("loom-rank") != std::string::npos && cmd.find(marker) != std::string::npos) pids.push_back(pid);
  }
  closedir(d);
  return pids;
}

TEST(Runtime, AKilledRankEndsTheJobNamingIt) {
  std::string plans = tmpdir() + "/plans_kill";
  compile("t2p2d1.pbtxt", plans);
  Result r;
  std::thread job([&] {
    r = run(loomrun() + " --nproc 4 --plans " + plans + " --steps 1000000 --threads 1 --seed 97531");
  });
  std::vector<pid_t> pids;
  for (int i = 0; i < 200 && pids.size() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pids = rankPids("97531");
  }
  ASSERT_EQ(pids.size(), 4u);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // mid-training
  auto killed = std::chrono::steady_clock::now();
  kill(pids[2], SIGKILL);
  job.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_NE(r.exitCode, 0);
  EXPECT_LT(seconds, 30.0) << r.output;
  EXPECT_NE(r.output.find("was killed by signal 9"), std::string::npos) << r.output;
  // The peers name it too: "job aborted: rank R ..." in training, "the job was aborted: rank R
  // ..." when the kill lands while they still connect (a loaded machine is slow to start).
  EXPECT_NE(r.output.find("aborted: rank"), std::string::npos) << r.output;
}

TEST(Runtime, ARankThatStopsHeartBeatingIsDeclaredDead) {
  std::string plans = tmpdir() + "/plans_stop", losses = tmpdir() + "/stop_losses.txt";
  compile("t1p2d1.pbtxt", plans);
  std::remove(losses.c_str());
  Result r;
  std::thread job([&] {
    r = run(loomrun() + " --nproc 2 --plans " + plans + " --steps 1000000 --threads 1 --seed 86420 --loss-log " +
            losses);
  });
  std::vector<pid_t> pids;
  for (int i = 0; i < 200 && pids.size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pids = rankPids("86420");
  }
  ASSERT_EQ(pids.size(), 2u);
  // Training, not still connecting (a loaded machine takes a while): its first steps are logged.
  for (int i = 0; i < 600 && fileSize(losses) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto stopped = std::chrono::steady_clock::now();
  kill(pids[0], SIGSTOP);  // alive but silent: no heartbeats, no traffic
  job.join();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  kill(pids[0], SIGKILL);
  EXPECT_NE(r.exitCode, 0);
  EXPECT_LT(seconds, 30.0) << r.output;
  EXPECT_NE(r.output.find("stopped heart-beating"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("error: job aborted: rank"), std::string::npos) << r.output;
  // The verdict names where the silent rank was and what its peer waits in.
  EXPECT_NE(r.output.find("rank 1 waits in "), std::string::npos) << r.output;
}

// A live rank stuck inside a kernel (heartbeats go on, no instruction finishes) while its
// tensor-parallel peer waits in their next all-reduce: the job ends well within 30 s naming
// the stalled rank, its program, micro-batch, instruction and op, and what the peer waits in.
TEST(Runtime, ARankStuckInAKernelIsNamedWithWhatItsPeersWaitIn) {
  std::string plans = tmpdir() + "/plans_stall";
  compile("t2p1d1.pbtxt", plans);
  auto started = std::chrono::steady_clock::now();
  // Step 100 (a few seconds in): the coordinator has measured the steps, so the limit is 10 s.
  Result r = run("LOOM_TEST_STALL=1:100 " + loomrun() + " --nproc 2 --plans " + plans + " --steps 1000 --threads 1");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_NE(r.exitCode, 0);
  EXPECT_LT(seconds, 40.0) << r.output;  // a few steps, then the stall limit (10 s) and the verdict
  EXPECT_NE(r.output.find("rank 1 stopped in forward_0 mb 0 at instruction "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(linear, layer 0)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 waits in all_reduce@tp #"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no instruction finished on any rank for"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Timed out"), std::string::npos) << "Gloo's timeout came first:\n" << r.output;
}

// Megatron's straggler report: rank 1's kernels take 3x as long (LOOM_TEST_SLOW=1:2). In a
// synchronous job both ranks' iterations take the same wall time (rank 0 waits in the
// gradient all-reduce), so the coordinator compares the ranks' time in their own kernels. The
// verdict comes back off the training thread and is printed on the next log line: every line
// but the first names rank 1, with the iteration it was reported at, and none names rank 0.
TEST(Runtime, TheLogLineNamesAStragglerByItsComputeTime) {
  std::string plans = tmpdir() + "/plans_straggler";
  compile("t1p1d2.pbtxt", plans);
  Result r = run("LOOM_TEST_SLOW=1:2 " + loomrun() + " --nproc 2 --plans " + plans +
                 " --steps 20 --log-interval 5 --threads 1");
  ASSERT_EQ(r.exitCode, 0) << r.output;
  int lines = 0, named = 0;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) {
    if (line.find(" iteration ") == std::string::npos || line.find("lm loss") == std::string::npos) continue;
    ++lines;
    if (line.find("| straggler: rank 1 (compute ") == std::string::npos) continue;
    ++named;
    // The verdict on iteration N's line is that of an earlier log iteration.
    int64_t at = std::stoll(line.substr(line.find(" iteration ") + 11));
    size_t pos = line.find("reported at iteration ");
    ASSERT_NE(pos, std::string::npos) << line;
    int64_t reported = std::stoll(line.substr(pos + 22));
    EXPECT_LT(reported, at) << line;
    EXPECT_EQ(reported % 5, 0) << line;
  }
  EXPECT_EQ(lines, 4) << r.output;
  EXPECT_GE(named, lines - 1) << r.output;
  EXPECT_EQ(r.output.find("straggler: rank 0"), std::string::npos) << r.output;
}

// Alone, a rank stuck in a kernel has nobody waiting for it: the stall is still declared,
// naming where it stopped. Step 1500: seconds into the run (~3.5 ms a step), after several
// heartbeats (one a second), so the coordinator has measured steps (the limit is then 10 s,
// not the first step's FLOPs-based one). Step 200 was ~0.7 s in, before the second heartbeat.
TEST(Runtime, ALoneRankStuckInAKernelIsNamed) {
  std::string plans = tmpdir() + "/plans_stall_alone";
  compile("t1p1d1.pbtxt", plans);
  auto started = std::chrono::steady_clock::now();
  Result r = run("LOOM_TEST_STALL=0:1500 " + loomrun() + " --nproc 1 --plans " + plans + " --steps 3000 --threads 1");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_NE(r.exitCode, 0);
  EXPECT_LT(seconds, 40.0) << r.output;
  EXPECT_NE(r.output.find("rank 0 stopped in forward_0 mb 0 at instruction "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(linear, layer 0) (no instruction finished on any rank for"), std::string::npos)
      << r.output;
}

// A plan edited after loomc check (which would refuse it): stage 0's first send goes out with
// a tag its peer never receives. Both ranks end up waiting on each other; the job ends well
// within Gloo's 30 s timeout (the stall limit before a measured step comes from the plan's
// FLOPs and the device's: the 10 s minimum here) with what every rank waits in.
TEST(Runtime, APeerThatNeverSendsEndsTheJobNamingWhatEachRankWaitsIn) {
  std::string plans = tmpdir() + "/plans_nosend", cluster = tmpdir() + "/nosend.pbtxt";
  std::ofstream(cluster) << "name: \"nosend\"\nnodes: 1\ndevices_per_node: 2\n"
                            "device { kind: CPU peak_flops: 1e11 }\n"
                            "parallel { pipeline_parallel_size: 2 micro_batch_size: 2 global_batch_size: 4 }\n";
  Result c = run(loomc() + " compile " + input("gpt-tiny-nodropout.pbtxt") + " --cluster " + cluster + " --out " +
                 plans + " --quiet");
  ASSERT_EQ(c.exitCode, 0) << c.output;
  std::string file = plans + "/programs/stage_0.pb";
  plan::ProgramSet programs;
  {
    std::ifstream in(file, std::ios::binary);
    ASSERT_TRUE(programs.ParseFromIstream(&in));
  }
  bool edited = false;
  for (plan::Program &p : *programs.mutable_programs())
    for (plan::Instruction &in : *p.mutable_instructions())
      if (!edited && p.name() == "forward_0" && in.op() == "send")
        for (plan::Attribute &a : *in.mutable_attributes())
          if (a.name() == "tag") a.set_i(a.i() + 1000), edited = true;
  ASSERT_TRUE(edited);
  std::string bytes;
  programs.SerializeToString(&bytes);
  std::ofstream(file, std::ios::binary) << bytes;
  std::string planFile = plans + "/rank_0.plan.pb";
  plan::RankPlan rank0;
  {
    std::ifstream in(planFile, std::ios::binary);
    ASSERT_TRUE(rank0.ParseFromIstream(&in));
  }
  rank0.set_programs_checksum(checksum64(bytes));
  std::string planBytes;
  rank0.SerializeToString(&planBytes);
  std::ofstream(planFile, std::ios::binary) << planBytes;

  auto started = std::chrono::steady_clock::now();
  Result r = run(loomrun() + " --nproc 2 --plans " + plans + " --steps 3 --threads 1");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_NE(r.exitCode, 0);
  EXPECT_LT(seconds, 28.0) << r.output;
  EXPECT_NE(r.output.find("no rank makes progress: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("waits in recv@pp (peer 0) of forward_1 mb 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 0 waits in recv@pp (peer 1) of backward_0"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("Timed out"), std::string::npos) << "Gloo's timeout came first:\n" << r.output;
}

TEST(Runtime, AWrongTokenIsRefused) {
  std::string plans = tmpdir() + "/plans_token";
  compile("t1p1d1.pbtxt", plans);
  std::string portFile = tmpdir() + "/token.port";
  std::remove(portFile.c_str());
  Result coord;
  std::thread c([&] {
    coord = run(runfile("apps/loom-coord") + " --plans " + plans + " --token right --port-file " + portFile +
                " --registration-timeout 8");
  });
  std::string port;
  for (int i = 0; i < 100 && port.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream(portFile) >> port;
  }
  Result r = run("LOOM_TOKEN=wrong " + runfile("apps/loom-rank") + " --coordinator 127.0.0.1:" + port + " --rank 0");
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_NE(r.output.find("loom-rank 0: error: the coordinator at 127.0.0.1:" + port + " refused the job token"),
            std::string::npos)
      << r.output;
  c.join();
  EXPECT_NE(coord.exitCode, 0);
  EXPECT_NE(coord.output.find("ranks 0 never registered"), std::string::npos) << coord.output;
}

TEST(Runtime, MalformedFlagsAreOneLineErrors) {
  Result r = run("LOOM_TOKEN=x " + runfile("apps/loom-rank") + " --coordinator 127.0.0.1:9 --rank x");
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_EQ(r.output, "loom-rank: for the --rank option: 'x' value invalid for integer argument!\n");
  r = run("LOOM_TOKEN=x " + runfile("apps/loom-rank") + " --coordinator 127.0.0.1:9 --rank 0 --lr fast");
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_EQ(r.output, "loom-rank: for the --lr option: 'fast' value invalid for floating point argument!\n");
  r = run("LOOM_TOKEN=x " + runfile("apps/loom-rank") + " --coordinator 127.0.0.1:9 --rank 0 --device tpu");
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_EQ(r.output, "loom-rank: error: --device tpu: expected cpu or cuda\n");
  r = run("LOOM_TOKEN=x " + runfile("apps/loom-rank") + " --coordinator 127.0.0.1:9 --rank 0 --precision bf16");
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_EQ(r.output,
            "loom-rank: error: --precision bf16: the CUDA backend's GEMM precision for fp32 plans; on the CPU, compile "
            "a bf16 plan (params_dtype: BF16 or parallel.precision: PRECISION_BF16)\n");
  r = run("LOOM_TOKEN=x " + runfile("apps/loom-rank") +
          " --coordinator 127.0.0.1:9 --rank 0 --device cuda --precision fp8");
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_EQ(r.output, "loom-rank: error: --precision fp8: expected fp32, bf16 or fp16\n");
  r = run("LOOM_TOKEN=x " + runfile("apps/loom-rank") + " --coordinator 127.0.0.1:9 --rank 0 --attention flash");
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_EQ(r.output, "loom-rank: error: --attention needs --device cuda\n");
  r = run("LOOM_TOKEN=x " + runfile("apps/loom-rank") + " --coordinator 127.0.0.1:9 --rank 0 --gpu 1");
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_EQ(r.output, "loom-rank: error: --gpu needs --device cuda\n");
  // loomrun parses the rank flags too: a malformed one stops it before it starts anything.
  r = run(loomrun() + " --nproc 2 --plans " + tmpdir() + "/no_such_plans --lr fast");
  EXPECT_EQ(r.exitCode, 2);
  EXPECT_EQ(r.output, "loomrun: for the --lr option: 'fast' value invalid for floating point argument!\n");
}

// Without a GPU (CI), --device cuda ends the job with one line naming why; with one, the
// GPU check (tools/gpu/check.sh) covers training there. A build without the CUDA toolkit
// says that it has no CUDA backend.
TEST(Runtime, DeviceCudaWithoutAGpuIsOneLineError) {
#ifdef LOOM_WITH_CUDA
  const char *why = "";
  if (cuda::deviceAvailable(&why)) GTEST_SKIP() << "a CUDA device is present: this case is for machines without one";
  std::string expected = "loom-rank 0: error: --device cuda: ";
#else
  std::string expected = "loom-rank: error: --device cuda: this loom-rank was built without the CUDA backend";
#endif
  std::string plans = tmpdir() + "/plans_cuda_refused";
  compile("t1p1d1.pbtxt", plans);
  Result r = run(loomrun() + " --nproc 1 --plans " + plans + " --steps 1 --device cuda");
  EXPECT_NE(r.exitCode, 0);
  EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
}

TEST(Runtime, AnUnreachableCoordinatorIsRetriedThenReported) {
  Result r = run("LOOM_TOKEN=x " + runfile("apps/loom-rank") +
                 " --coordinator 127.0.0.1:9 --rank 0 --connect-timeout 2");
  EXPECT_EQ(r.exitCode, 1);
  EXPECT_NE(r.output.find("loom-rank 0: error: cannot reach the coordinator at 127.0.0.1:9 after"), std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 10);
}

TEST(Runtime, BadPlansAreRefused) {
  std::string good = tmpdir() + "/plans_good", four = tmpdir() + "/plans_four";
  compile("t2p1d1.pbtxt", good);
  compile("t2p2d1.pbtxt", four);
  auto variant = [&](const std::string &name, const std::function<void(const std::string &)> &damage) {
    std::string dir = tmpdir() + "/plans_" + name;
    run("rm -rf " + dir + " && cp -r " + good + " " + dir);
    damage(dir);
    return run(loomrun() + " --nproc 2 --plans " + dir + " --steps 1");
  };
  Result missing = variant("missing", [](const std::string &d) { std::remove((d + "/rank_1.plan.pb").c_str()); });
  EXPECT_NE(missing.exitCode, 0);
  EXPECT_NE(missing.output.find("rank_1.plan.pb: no such plan file"), std::string::npos) << missing.output;
  Result corrupt = variant("corrupt", [](const std::string &d) { std::ofstream(d + "/rank_1.plan.pb") << "garbage"; });
  EXPECT_NE(corrupt.exitCode, 0);
  EXPECT_NE(corrupt.output.find("rank_1.plan.pb: corrupt plan"), std::string::npos) << corrupt.output;
  Result other = variant("other", [](const std::string &d) { run("cp " + d + "/rank_0.plan.pb " + d + "/rank_1.plan.pb"); });
  EXPECT_NE(other.exitCode, 0);
  EXPECT_NE(other.output.find("the plan is for rank 0, not rank 1"), std::string::npos) << other.output;
  Result world = variant("world", [&](const std::string &d) { run("cp " + four + "/rank_1.plan.pb " + d + "/"); });
  EXPECT_NE(world.exitCode, 0);
  EXPECT_NE(world.output.find("the plan is for a world of 4 ranks but the job has 2"), std::string::npos)
      << world.output;
  Result programs = variant("programs", [](const std::string &d) { std::ofstream(d + "/programs/stage_0.pb", std::ios::app) << "x"; });
  EXPECT_NE(programs.exitCode, 0);
  EXPECT_NE(programs.output.find("stage_0.pb: checksum mismatch"), std::string::npos) << programs.output;
  // A plan of another format version: rank 1's (read by its loom-rank), or rank 0's (read by
  // loomrun first), and loom-dump.
  auto rewriteVersion = [](const std::string &path, uint32_t version) {
    plan::RankPlan p;
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(p.ParseFromIstream(&in)) << path;
    p.set_plan_version(version);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    ASSERT_TRUE(p.SerializeToOstream(&out)) << path;
  };
  Result rank1 = variant("version1", [&](const std::string &d) { rewriteVersion(d + "/rank_1.plan.pb", 1); });
  EXPECT_NE(rank1.exitCode, 0);
  EXPECT_NE(rank1.output.find("rank_1.plan.pb: plan format version 1, but this build reads version"), std::string::npos)
      << rank1.output;
  Result rank0 = variant("version0", [&](const std::string &d) { rewriteVersion(d + "/rank_0.plan.pb", 0); });
  EXPECT_NE(rank0.exitCode, 0);
  EXPECT_NE(rank0.output.find("plan format version 0 (written before plans had versions)"), std::string::npos)
      << rank0.output;
  Result dump = run(runfile("apps/loom-dump") + " " + tmpdir() + "/plans_version0");
  EXPECT_NE(dump.exitCode, 0);
  EXPECT_NE(dump.output.find("plan format version 0"), std::string::npos) << dump.output;
  Result nproc = run(loomrun() + " --nproc 3 --plans " + good + " --steps 1");
  EXPECT_NE(nproc.exitCode, 0);
  EXPECT_NE(nproc.output.find("are for 2 ranks but --nproc is 3"), std::string::npos) << nproc.output;
  for (const Result *r : {&missing, &corrupt, &other, &world, &programs, &rank1, &rank0})
    EXPECT_LT(r->seconds, 30) << r->output;
}

}  // namespace
}  // namespace loom::test
