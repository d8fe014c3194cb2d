#include "analysis/Search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <thread>

#include "config/ConfigLoader.h"
#include "analysis/CostModel.h"
#include "plan/MemoryAccounting.h"
#include "plan/PlanAttributes.h"
#include "plan/Schedule.h"
#include "analysis/Units.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include "support/ProgressMeter.h"

namespace loom {
namespace {

llvm::Error error(const llvm::Twine &msg) { return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str()); }

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t k = 1; k <= n; ++k)
    if (n % k == 0) out.push_back(k);
  return out;
}

// What a layer, the embedding and the output layer hold, from a compiled probe: the model cut
// to 4 layers on 3 pipeline stages of 1, 2 and 1 layers (t, b, recomputation and sequence
// parallelism as the candidate's): each stage's stash per micro-batch, flat parameters and
// largest arena. The estimate then counts a candidate's stages with the memory plan's own
// accounting (plan/MemoryAccounting.h) over the candidate's real schedule: no second formula.
struct LayerProbe {
  int64_t layerStash = 0, embedStash = 0, headStash = 0;  // per micro-batch
  int64_t layerParams = 0, embedParams = 0, headParams = 0;  // flat elements
  int64_t layerExpertParams = 0;  // of layerParams, the experts split over ep (ZeRO-1 shards them over d / ep)
  int64_t workspace = 0, scratch = 0, inputs = 0;
  double backendHalfPerElement = 0;  // the backend's 16-bit weight copies per flat element
  plan::DType compute = plan::F32;
};

llvm::Expected<LayerProbe> probeLayers(const config::ModelConfig &model, const config::ClusterSpec &cluster,
                                       const config::ParallelConfig &candidate, const SearchOptions &options) {
  config::ModelConfig m = model;
  m.set_num_layers(4);
  config::ClusterSpec c = cluster;
  int64_t t = candidate.tensor_parallel_size(), cp = std::max<int64_t>(1, candidate.context_parallel_size());
  // Expert parallelism splits the experts over ep data-parallel ranks: the probe has d = ep.
  int64_t ep = std::max<int64_t>(1, candidate.expert_parallel_size());
  c.set_nodes(3 * ep), c.set_devices_per_node(t * cp);
  c.mutable_device()->set_memory_bytes(0);  // measured, not refused
  config::ParallelConfig &par = *c.mutable_parallel();
  par = candidate;
  par.set_pipeline_parallel_size(3), par.set_data_parallel_size(ep), par.set_virtual_pipeline_size(1);
  par.set_global_batch_size(3 * ep * candidate.micro_batch_size());
  par.set_schedule(config::ONE_F_ONE_B), par.set_zero1(false), par.set_balance_stages(false);
  par.clear_layers_per_stage();
  for (int layers : {1, 2, 1}) par.add_layers_per_stage(layers);
  CompiledPlans plans;
  if (llvm::Error e = options.compile(m, c, &plans)) return std::move(e);
  const plan::MemoryPlan *stage[3] = {};
  LayerProbe probe;
  for (const plan::RankPlan &rp : plans.plans)
    if (rp.tp_rank() == 0 && rp.dp_rank() == 0 && rp.pp_rank() < 3) {
      stage[rp.pp_rank()] = &rp.memory();
      if (rp.pp_rank() == 1)
        for (const plan::Parameter &param : rp.parameters())
          if (param.shard_group() == "ep") {
            int64_t n = 1;
            for (int64_t dim : param.shape()) n *= dim;
            probe.layerExpertParams += n / 2;
          }
    }
  for (const plan::MemoryPlan *s : stage)
    if (!s) return error("the layer probe has no plan of every stage");
  probe.layerStash = stage[1]->stash_bytes_per_micro_batch() / 2;
  probe.embedStash = stage[0]->stash_bytes_per_micro_batch() - probe.layerStash;
  probe.headStash = stage[2]->stash_bytes_per_micro_batch() - probe.layerStash;
  // Elements of the flat buffers from the fp32 main gradients (never sharded; the master
  // weights are with ZeRO-1 in 16-bit).
  probe.layerParams = stage[1]->gradient_bytes() / 4 / 2;
  probe.embedParams = stage[0]->gradient_bytes() / 4 - probe.layerParams;
  probe.headParams = stage[2]->gradient_bytes() / 4 - probe.layerParams;
  for (const plan::MemoryPlan *s : stage) {
    probe.workspace = std::max(probe.workspace, s->max_workspace_bytes());
    probe.scratch = std::max(probe.scratch, s->scratch_bytes());
  }
  probe.compute = planattr::computeDtype(plans.sets[0].programs());
  int64_t ownCopies = probe.compute == plan::F32 ? 0 : 2 * (stage[1]->gradient_bytes() / 4);
  probe.backendHalfPerElement =
      double(stage[1]->half_weight_bytes() - ownCopies) / double(std::max<int64_t>(stage[1]->gradient_bytes() / 4, 1));
  probe.inputs = stage[0]->peak_input_bytes() / 3;  // 1F1B's first of 3 stages: 3 micro-batches in flight
  return probe;
}

// A candidate stage's memory plan from the probe: its layers, the embedding on the first
// stage's first chunk, the output layer on the last stage's last chunk, walked over the stage's
// schedule. ZeRO-1's optimizer holds two fp32 1/d shards, three in 16-bit plans (the master weights;
// compiler/StepPrograms.cpp).
plan::MemoryPlan estimateStageMemory(const LayerProbe &probe, const config::ParallelConfig &par, int64_t numLayers,
                                     int stage, const StageSchedule &tasks) {
  int p = int(par.pipeline_parallel_size()), v = std::max(1, int(par.virtual_pipeline_size()));
  int64_t d = par.data_parallel_size() * std::max<int64_t>(1, par.context_parallel_size());  // ZeRO-1's shards
  double layersPerChunk = double(numLayers) / double(p * v);
  memory::StageActivations acts;
  int64_t flat = 0, experts = 0;
  for (int chunk = 0; chunk < v; ++chunk) {
    int64_t stash = int64_t(std::ceil(layersPerChunk) * double(probe.layerStash));
    flat += int64_t(std::ceil(layersPerChunk) * double(probe.layerParams));
    experts += int64_t(std::ceil(layersPerChunk) * double(probe.layerExpertParams));
    if (stage == 0 && chunk == 0) stash += probe.embedStash, flat += probe.embedParams;
    if (stage == p - 1 && chunk == v - 1) stash += probe.headStash, flat += probe.headParams;
    acts.stashPerChunk.push_back(stash);
  }
  acts.inputsPerMicroBatch = probe.inputs;
  bool sharded = par.zero1() && d > 1;
  acts.workspace = probe.workspace;  // ZeRO-1 reduces and updates in place: no shard-sized temporaries
  plan::MemoryPlan mem;
  mem.set_scratch_bytes(probe.scratch);
  mem.set_half_weight_bytes(int64_t(probe.backendHalfPerElement * double(flat)));
  int64_t edp = std::max<int64_t>(1, d / std::max<int64_t>(1, par.expert_parallel_size()));
  memory::accountWeights(flat, probe.compute, sharded ? (flat - experts) / d + experts / edp : flat,
                         sharded && probe.compute != plan::F32, &mem);
  memory::accountActivations(tasks, acts, stage == p - 1 ? 2 : 1, &mem);
  return mem;
}

// The closed-form estimate of a candidate: step seconds and the largest stage's bytes.
struct Estimate {
  double seconds = 0, bytes = 0;
};

Estimate estimate(const config::ModelConfig &model, const config::ClusterSpec &cluster, CostModel &cost,
                  const LayerProbe &probe, const std::vector<StageSchedule> &schedule) {
  const config::ParallelConfig &par = cluster.parallel();
  double t = double(par.tensor_parallel_size()), p = double(par.pipeline_parallel_size()),
         d = double(par.data_parallel_size()), v = double(par.virtual_pipeline_size()),
         b = double(par.micro_batch_size());
  double m = double(par.global_batch_size()) / (b * d);
  double cp = double(std::max<int64_t>(1, par.context_parallel_size()));
  double h = double(model.hidden_size()), s = double(model.seq_length()), L = double(model.num_layers()),
         f = double(model.ffn_hidden_size());
  double V = double(paddedVocabSize(model, par.tensor_parallel_size()));
  bool llama = model.architecture() == config::LLAMA;
  double kv = llama && model.num_key_value_heads() > 0
                  ? h * double(model.num_key_value_heads()) / double(model.num_attention_heads())
                  : h;
  double tokens = b * s / cp;  // a rank's: context parallelism holds s / cp of each sample
  // Forward GEMM FLOPs of one layer on one tp rank: qkv, the output projection, the MLP
  // (LLaMA's gated MLP has three matrices); attention's two batched GEMMs (the rank's queries
  // against the whole sequence's keys).
  double layerParams = h * (h + 2 * kv) + h * h + (llama ? 3 : 2) * h * f;
  double gemmFlops = 2 * tokens * layerParams / t, attentionFlops = 4 * tokens * s * h / t;
  // Mixture of experts (every moe_layer_freq-th layer): the MLP becomes the router and top-k
  // SwiGLU experts, whole on every tp rank (Loom keeps MoE replicated over t) over all the
  // tokens, or with sequence parallelism over the rank's s / t of them; their E / ep experts'
  // weights on each rank; per layer and micro-batch the dispatch and combine move (ep - 1) / ep
  // of the tokens' k rows out and back, twice as much in the backward.
  double E = double(model.num_experts()), k = double(std::max<int64_t>(1, model.num_experts_per_tok()));
  double ep = double(std::max<int64_t>(1, par.expert_parallel_size()));
  double moeShare = E > 0 ? 1.0 / double(std::max<int64_t>(1, model.moe_layer_freq())) : 0;
  double moeTokens = par.sequence_parallel() ? tokens / t : tokens;
  double expertParams = 3 * h * f * E, moeRows = moeTokens * k;
  if (E > 0) {
    double denseMlp = 2 * tokens * 3 * h * f / t, moeMlp = 2 * moeTokens * h * E + 2 * moeRows * 3 * h * f;
    gemmFlops += moeShare * (moeMlp - denseMlp);
    layerParams += moeShare * (h * E + expertParams / ep * t - 3 * h * f);  // per tp rank below: / t
  }
  auto gemm = [&](double flops, int pieces) { return pieces * cost.computeSeconds("linear", flops / pieces, 0); };
  double layerForward = gemm(gemmFlops, llama ? 7 : 4) + cost.computeSeconds("attention", attentionFlops, 0);
  // Memory-bound work of a layer (norms, activation, residual adds, dropout): ~12 passes over
  // the b s h activations, 4 bytes each.
  layerForward += cost.computeSeconds("add", 0, 12 * tokens * h * 4 / (par.sequence_parallel() ? t : 1));
  bool recompute = par.recompute() == config::RECOMPUTE_FULL;
  double layerTraining = 3 * layerForward + (recompute ? layerForward : 0);
  double head = 3 * gemm(2 * tokens * h * V / t, 1);
  double stage = L / p * layerTraining + head;  // the last stage: the bottleneck of the pipeline
  double pipeline = (m + (p - 1) / v) * stage;
  // Communication: per layer and micro-batch 2 forward and 2 backward tp all-reduces (2 more
  // recomputed) of b s h fp32 values; pipeline sends of the same size per chunk boundary; the
  // dp all-reduce of the rank's gradients once per step.
  // A group spans one node when the ranks it strides over fit in one (ranks are tp-fastest).
  auto ring = [&](double bytes, double n, double span, int steps) {
    return n <= 1 ? 0.0 : cost.transferSeconds(span <= double(cluster.devices_per_node()), steps, bytes);
  };
  double activation = tokens * h * 4;
  double tp = m * L / p * (recompute ? 6 : 4) * ring(2 * (t - 1) / t * activation, t, t, int(2 * (t - 1)));
  // PTD-P's scatter/gather (on unless the spec turns it off): across nodes each tp rank sends
  // 1/t of a replicated message, then the receiving stage all-gathers it within its node.
  // Stage s holds ranks [s t d, (s + 1) t d): some neighbouring stages sit on different nodes
  // once the world is larger than a node.
  bool acrossNodes = p > 1 && t * p * d > double(cluster.devices_per_node());
  bool scatterGather = t > 1 && !par.sequence_parallel() && acrossNodes &&
                       (!par.has_scatter_gather() || par.scatter_gather());
  double pp = m * 2 * v * ring(activation / (par.sequence_parallel() || scatterGather ? t : 1), p, t * p, 1);
  if (scatterGather) pp += m * 2 * v * ring((t - 1) / t * activation, t, t, int(t - 1));
  double stageParams = L / p * layerParams / t + V * h / t;
  // The experts' gradients average over the d / ep ranks holding them instead of d x cp.
  double stageExperts = E > 0 ? L / p * moeShare * expertParams / ep : 0;
  stageParams -= stageExperts;
  // Weight gradients average over the d x cp ranks of a (tp, pp) position.
  double dp = ring(2 * (d * cp - 1) / (d * cp) * stageParams * 4, d * cp, t * p * d * cp, int(2 * (d * cp - 1)));
  // Context parallelism: per layer and micro-batch the keys and values (GPT: the fused qkv)
  // all-gathered over cp in the forward (again when recomputed), reduce-scattered in the backward.
  double keys = tokens * (llama ? 2 * kv : 3 * h) / t * 4;
  double context = m * L / p * (recompute ? 3 : 2) * ring((cp - 1) * keys, cp, t * cp, int(cp - 1));
  double edp = d / ep;
  double experts = ring(2 * (edp - 1) / edp * stageExperts * 4, edp, t * p * d * cp, int(2 * (edp - 1)));
  double dispatch = m * L / p * moeShare * (recompute ? 8 : 6) *
                    ring((ep - 1) / ep * moeRows * h * 4, ep, t * ep, int(ep - 1));
  Estimate e;
  e.seconds = pipeline + tp + pp + dp + context + experts + dispatch;
  // Memory: the first and the last stage's plans as the compiler would count them.
  for (int k : {0, int(p) - 1})
    e.bytes = std::max(e.bytes, double(estimateStageMemory(probe, par, model.num_layers(), k,
                                                           schedule[size_t(k)]).peak_bytes()));
  return e;
}

std::string describe(const config::ParallelConfig &p) {
  const char *schedule = p.pipeline_parallel_size() == 1                  ? "-"
                         : p.schedule() == config::GPIPE                     ? "GPipe"
                         : p.schedule() == config::INTERLEAVED_ONE_F_ONE_B ? "interleaved"
                                                                           : "1F1B";
  std::string context = p.context_parallel_size() > 1 ? " c=" + std::to_string(p.context_parallel_size()) : "";
  if (p.expert_parallel_size() > 1) context += " ep=" + std::to_string(p.expert_parallel_size());
  return llvm::formatv("t={0} p={1} d={2} v={3} b={4}{10} {5}{6}{7}{8} {9}", p.tensor_parallel_size(),
                       p.pipeline_parallel_size(), p.data_parallel_size(), p.virtual_pipeline_size(),
                       p.micro_batch_size(), p.recompute() == config::RECOMPUTE_FULL ? "recompute" : "no-recompute",
                       p.sequence_parallel() ? " sp" : "",
                       !p.zero1()                                                      ? ""
                       : p.has_overlap_param_gather() && !p.overlap_param_gather()    ? " zero1 no-param-overlap"
                                                                                        : " zero1",
                       p.tp_comm_overlap() ? " tp-overlap" : "", schedule, context)
      .str();
}

}  // namespace

llvm::Error searchConfigurations(const config::ModelConfig &model, const config::ClusterSpec &cluster,
                                 const SearchOptions &options, SearchResult *out) {
  auto started = std::chrono::steady_clock::now();
  const config::ParallelConfig &request = cluster.parallel();
  int64_t world = cluster.nodes() * cluster.devices_per_node(), batch = request.global_batch_size();
  if (batch <= 0) return error(options.clusterPath + ": error: field 'parallel.global_batch_size' must be set to search");
  CostModel cost(cluster, cluster.device().kind() == config::CUDA ? GemmPrecision::kBf16 : GemmPrecision::kFp32, false);
  std::vector<SearchCandidate> candidates;
  std::map<std::tuple<int64_t, int64_t, bool, bool, int64_t, int64_t>, LayerProbe> probes;
  // Context parallelism is tried where the sequence splits into 2 cp chunks and the layout keeps
  // a cp group inside a node (cp ranks are next to tp's; the CUDA backend has no cp kernels yet).
  std::vector<int64_t> contexts = {1};
  if (cluster.device().kind() == config::CPU)
    for (int64_t cp : {2, 4, 8})
      if (model.seq_length() % (2 * cp) == 0) contexts.push_back(cp);
  // Expert parallelism: every divisor of the experts (the MoE runs on the CPU backend only).
  std::vector<int64_t> expertSplits = {1};
  if (model.num_experts() > 0 && cluster.device().kind() == config::CPU)
    for (int64_t ep : divisors(model.num_experts()))
      if (ep > 1) expertSplits.push_back(ep);
  for (int64_t ep : expertSplits)
  for (int64_t cp : contexts)
  for (int64_t t : divisors(cluster.devices_per_node()))
    for (int64_t p : divisors(world / t))
      for (int64_t v : {1, 2, 4})
        for (int64_t b : {1, 2, 4, 8})
          for (bool recompute : {false, true})
            for (bool sp : {false, true})
              for (bool zero1 : {false, true})
                for (config::PipelineSchedule schedule : {config::GPIPE, config::ONE_F_ONE_B, config::INTERLEAVED_ONE_F_ONE_B}) {
                  int64_t d = world / (t * p * cp);
                  if (world % (t * p * cp) != 0 || cluster.devices_per_node() % (t * cp) != 0) continue;
                  if ((v > 1) != (schedule == config::INTERLEAVED_ONE_F_ONE_B) || (p == 1 && schedule != config::ONE_F_ONE_B) ||
                      (sp && t == 1) || (zero1 && d * cp == 1) || p * v > model.num_layers() ||
                      (ep > 1 && d % ep != 0))
                    continue;
                  ++out->enumerated;
                  config::ClusterSpec c = cluster;
                  config::ParallelConfig &par = *c.mutable_parallel();
                  par.set_tensor_parallel_size(t), par.set_pipeline_parallel_size(p), par.set_data_parallel_size(d);
                  par.set_context_parallel_size(cp), par.set_expert_parallel_size(ep);
                  par.set_virtual_pipeline_size(v), par.set_micro_batch_size(b), par.set_global_batch_size(batch);
                  par.set_recompute(recompute ? config::RECOMPUTE_FULL : config::RECOMPUTE_NONE);
                  par.set_sequence_parallel(sp), par.set_zero1(zero1), par.set_schedule(schedule);
                  par.clear_layers_per_stage(), par.set_balance_stages(false);
                  if (batch % (b * d) != 0 || llvm::errorToBool(finishClusterSpec(c, options.clusterPath)) ||
                      llvm::errorToBool(checkModelFitsCluster(model, c, options.clusterPath))) {
                    ++out->invalid;
                    continue;
                  }
                  int m = int(batch / (b * d));
                  ScheduleKind kind = schedule == config::GPIPE ? ScheduleKind::kGPipe
                                      : v > 1                   ? ScheduleKind::kInterleaved
                                                                : ScheduleKind::kOneFOneB;
                  auto tasks = buildSchedule(kind, int(p), int(v), m);
                  if (!tasks) {  // e.g. interleaving needs m divisible by p
                    llvm::consumeError(tasks.takeError());
                    ++out->invalid;
                    continue;
                  }
                  // One probe per (t, b, recomputation, sequence parallelism, cp, ep).
                  std::tuple<int64_t, int64_t, bool, bool, int64_t, int64_t> key{t, b, recompute, sp, cp, ep};
                  auto found = probes.find(key);
                  if (found == probes.end()) {
                    auto probe = probeLayers(model, cluster, par, options);
                    if (!probe)
                      return error(llvm::formatv("{0}: the layer probe of t={1} b={2}{3}{4} did not compile: {5}",
                                                 options.clusterPath, t, b, recompute ? " recompute" : "",
                                                 sp ? " sp" : "", llvm::toString(probe.takeError())));
                    found = probes.emplace(key, *probe).first;
                  }
                  SearchCandidate cand;
                  cand.parallel = par;
                  Estimate e = estimate(model, c, cost, found->second, *tasks);
                  cand.estimatedSeconds = e.seconds, cand.estimatedBytes = e.bytes;
                  if (cluster.device().memory_bytes() > 0 && e.bytes > 1.25 * double(cluster.device().memory_bytes())) {
                    ++out->overEstimate;
                    continue;
                  }
                  candidates.push_back(cand);
                }
  // Those the estimate says fit first, then those within its margin; each by estimated time.
  double memory = double(cluster.device().memory_bytes());
  std::stable_sort(candidates.begin(), candidates.end(), [&](const SearchCandidate &a, const SearchCandidate &b) {
    bool fitsA = memory <= 0 || a.estimatedBytes <= memory, fitsB = memory <= 0 || b.estimatedBytes <= memory;
    if (fitsA != fitsB) return fitsA;
    return a.estimatedSeconds < b.estimatedSeconds;
  });
  size_t evaluate = std::min(candidates.size(), size_t(std::max(options.evaluate, 1)));
  out->notEvaluated = int(candidates.size() - evaluate);
  // Compile and simulate candidates [0, count), `threads` at a time.
  std::mutex mu;
  std::string failure;
  auto evaluateAll = [&](std::vector<SearchCandidate> &batch, size_t count, const char *what) {
    std::atomic<size_t> next{0};
    ProgressMeter meter(what, int64_t(count), "configurations", false, options.progress ? stderr : nullptr);
    int64_t finished = 0;
    auto work = [&] {
      for (size_t i; (i = next++) < count;) {
        auto done = llvm::make_scope_exit([&] {
          std::lock_guard<std::mutex> lock(mu);
          meter.update(++finished);
        });
        SearchCandidate &cand = batch[i];
        config::ClusterSpec c = cluster;
        *c.mutable_parallel() = cand.parallel;
        CompiledPlans plans;
        cand.evaluated = true;
        if (llvm::Error e = options.compile(model, c, &plans)) {
          std::string why = llvm::toString(std::move(e));
          std::lock_guard<std::mutex> lock(mu);
          if (why.find("of memory but the device has") != std::string::npos)
            cand.refused = why;
          else if (failure.empty())
            failure = describe(cand.parallel) + ": " + why;
          continue;
        }
        std::vector<RankPrograms> ranks;
        for (const plan::RankPlan &rp : plans.plans) ranks.push_back({&rp, &plans.sets[size_t(rp.pp_rank())]});
        SimulateOptions so;
        so.precision = defaultPrecision(plans.plans[0]);
        if (llvm::Error e = simulateStep(ranks, so, &cand.prediction)) {
          std::lock_guard<std::mutex> lock(mu);
          if (failure.empty()) failure = describe(cand.parallel) + ": " + llvm::toString(std::move(e));
        }
      }
    };
    std::vector<std::thread> threads;
    for (int k = 0; k < std::max(options.threads, 1); ++k) threads.emplace_back(work);
    for (std::thread &th : threads) th.join();
    meter.finish();
  };
  auto rank = [&](std::vector<SearchCandidate> &batch, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      if (!batch[i].refused.empty()) {
        ++out->refusedByPlan;
        if (out->exampleRefusal.empty()) out->exampleRefusal = describe(batch[i].parallel) + ": " + batch[i].refused;
        continue;
      }
      out->ranked.push_back(batch[i]);
      double planned = double(batch[i].prediction.peakMemoryBytes);
      if (planned > 0)
        out->worstMemoryEstimateError =
            std::max(out->worstMemoryEstimateError, std::abs(batch[i].estimatedBytes / planned - 1));
    }
    std::stable_sort(out->ranked.begin(), out->ranked.end(), [](const SearchCandidate &a, const SearchCandidate &b) {
      return a.prediction.modelTflopsPerDevice > b.prediction.modelTflopsPerDevice;
    });
  };
  evaluateAll(candidates, evaluate, "loomc search: compiling and simulating candidates");
  if (!failure.empty()) return error("a candidate failed to compile or simulate: " + failure);
  rank(candidates, evaluate);
  // Variants the closed-form estimate does not tell apart, only the plan's simulation: the best
  // `top` that `applies` to are compiled and simulated again changed by `apply`, and ranked
  // beside the rest; returns how many.
  auto tryVariants = [&](const char *what, auto applies, auto apply) -> llvm::Expected<int> {
    std::vector<SearchCandidate> variants;
    for (size_t i = 0; i < out->ranked.size() && int(variants.size()) < std::max(options.top, 1); ++i) {
      if (!applies(out->ranked[i].parallel)) continue;
      SearchCandidate variant = out->ranked[i];
      apply(variant.parallel), variant.evaluated = false, variant.prediction = StepPrediction{};
      variants.push_back(variant);
    }
    evaluateAll(variants, variants.size(), what);
    if (!failure.empty()) return error("a candidate failed to compile or simulate: " + failure);
    rank(variants, variants.size());
    return int(variants.size());
  };
  // Tensor-parallel overlap (parallel.tp_comm_overlap) trades exposed all-reduces for smaller
  // GEMMs and more collective calls: tried on the best with an all-reduce to overlap (t > 1, no
  // sequence parallelism).
  llvm::Expected<int> overlapped = tryVariants(
      "loomc search: the best with tensor-parallel overlap",
      [](const config::ParallelConfig &par) {
        return par.tensor_parallel_size() > 1 && !par.sequence_parallel() && !par.tp_comm_overlap();
      },
      [](config::ParallelConfig &par) { par.set_tp_comm_overlap(true); });
  if (!overlapped) return overlapped.takeError();
  out->overlapVariants = *overlapped;
  // ZeRO-1's parameter all-gathers in the next step's first forward (the default) delay a
  // pipeline's first stage as much as they overlap it: tried at the optimizer's end instead
  // (parallel.overlap_param_gather: false) on the best with ZeRO-1.
  llvm::Expected<int> gathered = tryVariants(
      "loomc search: the best with ZeRO-1's gathers in the optimizer",
      [](const config::ParallelConfig &par) {
        return par.zero1() && par.data_parallel_size() > 1 && !par.has_overlap_param_gather();
      },
      [](config::ParallelConfig &par) { par.set_overlap_param_gather(false); });
  if (!gathered) return gathered.takeError();
  out->paramGatherVariants = *gathered;
  out->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return llvm::Error::success();
}

std::string searchText(const SearchResult &r, const config::ClusterSpec &cluster, int top) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("{0} configurations of {1} x {2} devices: {3} invalid for the model or batch, {4} over 1.25x the "
                      "device's memory by the estimate, {5} not evaluated (outside the estimate's best), {6} compiled "
                      "and simulated, of which {7} refused by the compiled plans' memory check; {8} of the best "
                      "also with tensor-parallel overlap, {9} with ZeRO-1's gathers after the optimizer; {10:F1} s\n",
                      r.enumerated, cluster.nodes(), cluster.devices_per_node(), r.invalid, r.overEstimate,
                      r.notEvaluated, r.ranked.size() + r.refusedByPlan - r.overlapVariants - r.paramGatherVariants,
                      r.refusedByPlan, r.overlapVariants, r.paramGatherVariants, r.seconds);
  if (!r.exampleRefusal.empty()) os << "  e.g. " << r.exampleRefusal << "\n";
  if (!r.ranked.empty())
    os << llvm::formatv("  the estimate's peak memory (the memory plan's accounting over a compiled 4-layer probe) is "
                        "within {0:F1}% of the compiled plans' for every compiled candidate\n",
                        100 * r.worstMemoryEstimateError);
  os << llvm::formatv("{0,-4} {1,-52} {2,11} {3,9} {4,6} {5,11} {6,7} {7,12}\n", "#", "configuration", "step", "TFLOP/s",
                      "MFU", "memory", "bubble", "exposed comm");
  for (size_t i = 0; i < r.ranked.size() && int(i) < top; ++i) {
    const SearchCandidate &c = r.ranked[i];
    const StepPrediction &p = c.prediction;
    double comm = 0;
    for (auto &[kind, seconds] : p.exposedByKind) comm += seconds;
    os << llvm::formatv("{0,-4} {1,-52} {2,11} {3,9} {4,5:F1}% {5,11} {6,6:F1}% {7,12}\n", i + 1, describe(c.parallel),
                        humanSeconds(p.stepSeconds),
                        llvm::formatv(p.modelTflopsPerDevice >= 1 ? "{0:F1}" : "{0:F4}", p.modelTflopsPerDevice).str(),
                        100 * p.mfu, humanBytes(double(p.peakMemoryBytes)), 100 * p.bubble, humanSeconds(comm));
  }
  return s;
}

// A JSON list, one configuration per line: the parallel fields named as in cluster.proto, then
// the simulate keys (predictionJson's).
std::string searchJson(const SearchResult &r, int top) {
  std::string s = "[";
  for (size_t i = 0; i < r.ranked.size() && int(i) < top; ++i) {
    const config::ParallelConfig &c = r.ranked[i].parallel;
    nlohmann::ordered_json j = {{"tensor_parallel_size", c.tensor_parallel_size()},
                                {"pipeline_parallel_size", c.pipeline_parallel_size()},
                                {"data_parallel_size", c.data_parallel_size()},
                                {"virtual_pipeline_size", c.virtual_pipeline_size()},
                                {"micro_batch_size", c.micro_batch_size()},
                                {"global_batch_size", c.global_batch_size()},
                                {"recompute", config::RecomputeMode_Name(c.recompute())},
                                {"sequence_parallel", c.sequence_parallel()},
                                {"context_parallel_size", std::max<int64_t>(1, c.context_parallel_size())},
                                {"expert_parallel_size", std::max<int64_t>(1, c.expert_parallel_size())},
                                {"zero1", c.zero1()},
                                {"tp_comm_overlap", c.tp_comm_overlap()},
                                {"overlap_param_gather", c.zero1() && c.data_parallel_size() > 1 &&
                                                             (!c.has_overlap_param_gather() || c.overlap_param_gather())},
                                {"schedule", config::PipelineSchedule_Name(c.schedule())}};
    nlohmann::ordered_json prediction = predictionObject(r.ranked[i].prediction);
    for (auto &[key, value] : prediction.items()) j[key] = value;
    s += (i ? ",\n " : "") + j.dump();
  }
  return s + "]\n";
}

}  // namespace loom
