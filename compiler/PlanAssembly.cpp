#include "compiler/PlanAssembly.h"

#include <optional>
#include <algorithm>
#include <map>

#include "analysis/Units.h"
#include "ir/ParamAttrs.h"
#include "llvm/Support/FormatVariadic.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "plan/Layout.h"
#include "plan/MemoryAccounting.h"
#include "plan/PlanAttributes.h"
#include "plan/PlanVersion.h"
#include "support/ProgressMeter.h"

namespace loom {
namespace {

llvm::Error error(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

// A rank whose planned peak exceeds the device's memory is refused before launch, naming the
// rank, both numbers and the three largest parts of the plan.
llvm::Error checkMemoryFits(const plan::RankPlan &rp, const config::ClusterSpec &cluster) {
  int64_t device = cluster.device().memory_bytes();
  const plan::MemoryPlan &m = rp.memory();
  if (device <= 0 || m.peak_bytes() <= device) return llvm::Error::success();
  std::vector<std::pair<int64_t, std::string>> parts = memory::namedParts(m);
  std::string biggest;
  for (int k = 0; k < 3; ++k) biggest += (k ? ", " : "") + parts[k].second + " " + humanBytes(parts[k].first);
  return error(llvm::formatv("rank {0} (pipeline stage {1}) plans {2} of memory but the device has {3} "
                             "(device.memory_bytes): {4}; use more tensor or pipeline parallelism, ZeRO-1, or "
                             "RECOMPUTE_FULL",
                             rp.rank(), rp.pp_rank(), humanBytes(m.peak_bytes()), humanBytes(device), biggest));
}

}  // namespace

std::string recomputeName(config::RecomputeMode r) {
  switch (r) {
    case config::RECOMPUTE_FULL: return "full";
    default: return "none";
  }
}

namespace {

// Every rank's plan from the stages' programs: its identity, groups and model facts, its
// parameters, and its stage's schedule, memory plan and collective totals (computed for the
// stage's first rank and copied to the others).
class RankPlanAssembler {
 public:
  RankPlanAssembler(mlir::ModuleOp module, const std::vector<plan::ProgramSet> &sets,
                    const std::vector<std::string> &programFiles, const std::vector<uint64_t> &checksums,
                    const PlanRequest &req)
      : module(module), sets(sets), programFiles(programFiles), checksums(checksums), req(req), cluster(req.cluster),
        par(cluster.parallel()), facts(req.facts), modelName(req.modelName), paddedVocab(req.paddedVocab),
        modelFlopsPerToken(req.modelFlopsPerToken), kind(req.kind), t(par.tensor_parallel_size()),
        p(par.pipeline_parallel_size()), d(par.data_parallel_size()), v(par.virtual_pipeline_size()),
        b(par.micro_batch_size()), m(req.microBatches), layout{t, p, d, std::max<int>(1, int(par.context_parallel_size())),
                                                       std::max<int>(1, int(par.expert_parallel_size()))},
        vocab(facts.vocabSize) {
    for (const plan::ProgramSet &set : sets)
      for (const plan::Program &prog : set.programs()) byName[prog.name()] = &prog;
  }

  std::vector<plan::RankPlan> run() {
    std::vector<plan::RankPlan> plans;
    std::map<int, size_t> stageDone;  // stage -> index in `plans` of its first rank
    std::optional<ProgressMeter> meter;
    if (req.progress) meter.emplace("loomc: assembling rank plans", layout.world(), "ranks");
    for (int rank = 0; rank < layout.world(); ++rank) {
      if (meter) meter->update(rank);
      plan::RankPlan rp;
      int stage = layout.ppOf(rank);
      identity(rank, stage, &rp);
      int64_t paramCount = parameters(rank, stage, &rp);
      // The schedule, collective totals and memory plan are the stage's: computed for its first
      // rank and copied to the others (3072 ranks would repeat the same walk 48 times).
      if (const plan::RankPlan *like = stageDone.count(stage) ? &plans[stageDone[stage]] : nullptr) {
        *rp.mutable_schedule() = like->schedule();
        *rp.mutable_memory() = like->memory();
        rp.set_flops_per_step(like->flops_per_step());
        *rp.mutable_collectives() = like->collectives();
      } else {
        stageDone[stage] = plans.size();
        stagePlan(stage, paramCount, rp);
      }
      plans.push_back(std::move(rp));
    }
    if (meter) meter->update(layout.world());
    return plans;
  }

 private:
  // Who the rank is, its groups, the job's and the model's facts.
  void identity(int rank, int stage, plan::RankPlan *out) {
    plan::RankPlan &rp = *out;
    rp.set_plan_version(kPlanVersion);
    rp.set_rank(rank);
    rp.set_world_size(layout.world());
    rp.set_tp_rank(layout.tpOf(rank));
    rp.set_dp_rank(layout.dpOf(rank));
    rp.set_pp_rank(stage);
    rp.set_cp_rank(layout.cpOf(rank));
    rp.set_c(layout.c);
    rp.set_t(t), rp.set_p(p), rp.set_d(d), rp.set_v(v);
    rp.set_model(modelName);
    rp.set_programs_file(programFiles[stage]);
    rp.set_programs_checksum(checksums[stage]);
    std::vector<const char *> groups = {"tp", "pp", "dp", "embedding"};
    if (layout.c > 1) groups.insert(groups.end(), {"cp", "dpcp"});
    if (layout.e > 1) groups.insert(groups.end(), {"ep", "edp"});
    for (const char *g : groups) {
      plan::Group *grp = rp.add_groups();
      grp->set_name(g);
      std::vector<int> members = groupMembers(layout, g, rank);
      for (int r : members) grp->add_ranks(r);
      grp->set_position(int(std::find(members.begin(), members.end(), rank) - members.begin()));
    }
    rp.set_schedule_kind(toString(kind));
    rp.set_micro_batches(m);
    rp.set_micro_batch_size(b);
    rp.set_global_batch_size(par.global_batch_size());
    rp.set_seq_length(facts.seqLength);
    rp.set_vocab_size(vocab);
    rp.set_recompute(recomputeName(par.recompute()));
    rp.set_device_peak_flops(cluster.device().peak_flops());
    *rp.mutable_cluster() = cluster;
    rp.set_zero1(par.zero1());
    rp.set_padded_vocab_size(paddedVocab);
    rp.set_num_layers(facts.numLayers);
    rp.set_hidden_size(facts.hiddenSize);
    rp.set_num_attention_heads(facts.numHeads);
    rp.set_architecture(facts.architecture);
    rp.set_num_key_value_heads(facts.numKvHeads);
    rp.set_ffn_hidden_size(facts.ffnHiddenSize);
    rp.set_max_position_embeddings(facts.maxPositions);
    rp.set_norm_epsilon(facts.normEpsilon);
    rp.set_rope_theta(facts.ropeTheta);
    rp.set_tie_word_embeddings(facts.tiedEmbeddings);
    rp.set_num_experts(int32_t(facts.numExperts));
    rp.set_num_experts_per_tok(int32_t(facts.expertsPerToken));
    rp.set_moe_layer_freq(int32_t(facts.moeLayerFreq));
    rp.set_router_aux_loss_coef(facts.routerAuxLossCoef);
    rp.set_capacity_factor(facts.capacityFactor);
    rp.set_model_flops_per_token(modelFlopsPerToken);
  }

  // The parameters the rank holds, in its stage's flat-buffer order; their count.
  int64_t parameters(int rank, int stage, plan::RankPlan *out) {
    plan::RankPlan &rp = *out;
    // Parameters this rank holds, in its stage's flat-buffer order.
    const StageLayout &flat = req.layouts[stage];
    int64_t paramCount = 0;
    for (const StageParameter &sp : flat.parameters) {
      plan::Parameter *pp = rp.add_parameters();
      pp->set_name(sp.name);
      for (int64_t x : sp.shape) pp->add_shape(x), pp->add_global_shape(x);
      pp->set_shard_dim(-1);
      pp->set_flat_offset(sp.flatOffset);
      pp->set_weight_decay(sp.decay);
      paramCount += sp.elements;
    }
    rp.set_flat_elements(flat.flatElements);
    rp.set_master_weights_sharded(flat.mastersSharded());
    for (const StageBucket &b : flat.buckets) {
      rp.add_zero1_buckets(b.elements);
      rp.add_zero1_bucket_groups(b.group);
    }
    // Shard and initializer facts come from the IR's argument attributes.
    for (auto f : module.getOps<mlir::func::FuncOp>())
      for (unsigned i = 0; i < f.getNumArguments(); ++i) {
        auto n = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam);
        if (!n) continue;
        for (plan::Parameter &pp : *rp.mutable_parameters()) {
          if (pp.name() != n.getValue()) continue;
          if (auto init = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kInit)) pp.set_init(init.str());
          if (auto sd = f.getArgAttrOfType<mlir::FloatAttr>(i, attr::kInitStd)) pp.set_init_std(sd.getValueAsDouble());
          if (auto tied = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kTiedTo)) pp.set_tied_to(tied.str());
          if (auto padded = f.getArgAttrOfType<mlir::IntegerAttr>(i, attr::kPaddedDim)) {
            pp.set_padded_dim(int32_t(padded.getInt()));
            pp.set_unpadded_size(f.getArgAttrOfType<mlir::IntegerAttr>(i, attr::kUnpaddedSize).getInt());
          }
          if (auto dim = f.getArgAttrOfType<mlir::IntegerAttr>(i, attr::kShardDim)) {
            // Split over "tp" (Megatron's tensor parallelism) or "ep" (an MoE's experts).
            auto group = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kShardGroup);
            bool experts = group && group.getValue() == "ep";
            int parts = experts ? layout.e : t;
            pp.set_shard_dim(dim.getInt());
            pp.set_shard_group(experts ? "ep" : "tp");
            pp.set_shard_parts(parts);
            pp.set_shard_index(experts ? layout.epOf(rank) : layout.tpOf(rank));
            pp.set_global_shape(dim.getInt(), pp.shape(dim.getInt()) * parts);
          }
        }
      }
    rp.set_parameter_count(paramCount);
    return paramCount;
  }

  // What the backend holds beyond the plan's buffers, all step long (in `mem`); its bytes.
  void backendScratch(int stage, int64_t paramCount, plan::MemoryPlan *mem) {
    plan::BackendReserve reserve = req.backendMemory(cluster.device().kind(), sets[stage].programs(), paramCount);
    mem->set_scratch_bytes(reserve.scratchBytes);
    mem->set_half_weight_bytes(reserve.halfWeightBytes);  // + pipeline slots: finishPlans
    mem->set_step_scalar_bytes(memory::stepScalarBytes(sets[stage].programs()));
  }

  // The stage's schedule, memory plan and collective totals.
  void stagePlan(int stage, int64_t paramCount, plan::RankPlan &rp) {
    const StageLayout &flat = req.layouts[stage];
    // Schedule: the stage's forward/backward list, then the loss (last stage) and the optimizer.
    std::map<std::string, std::pair<int64_t, int64_t>> collectives;  // kind -> count, bytes
    double flops = 0;
    // lastRun / firstRun: the step's last / first run of the program (its last_micro_batch /
    // first_micro_batch instructions run).
    auto account = [&](const plan::Program &prog, bool lastRun, bool firstRun) {
      for (const plan::Instruction &in : prog.instructions()) {
        if ((in.last_micro_batch() && !lastRun) || (in.first_micro_batch() && !firstRun)) continue;
        flops += in.flops();
        if (in.bytes_moved() == 0 && in.stream() == plan::COMPUTE) continue;
        std::string group;
        for (const plan::Attribute &a : in.attributes())
          if (a.name() == "group" || a.name() == "vocab_parallel_group") group = a.s();
        if (group.empty()) continue;
        auto &c = collectives[in.op() + "@" + group];
        c.first += 1, c.second += in.bytes_moved();
      }
    };
    // The memory plan (plan/MemoryAccounting.h): weights and optimizer, what the backend
    // adds, then the schedule's walk over the stashes, inputs and the largest arena.
    plan::MemoryPlan *mem = rp.mutable_memory();
    backendScratch(stage, paramCount, mem);
    memory::accountWeights(flat.flatElements, flat.computeDtype, optimizerElements(flat), flat.mastersSharded(), mem);
    memory::StageActivations acts;
    for (const plan::Program &prog : sets[stage].programs())
      if (prog.workspace_bytes() > acts.workspace) acts.workspace = prog.workspace_bytes(), acts.workspaceProgram = prog.name();
    acts.stashPerChunk.assign(size_t(std::max(v, 1)), 0);
    for (int chunk = 0; chunk < std::max(v, 1); ++chunk)
      if (auto it = byName.find("forward_" + std::to_string(chunk * p + stage)); it != byName.end())
        acts.stashPerChunk[size_t(chunk)] = it->second->stash_bytes();
    // A micro-batch's inputs are held from its first program to its last (the step driver's slots).
    std::map<std::string, int64_t> inputBytes;  // input name -> bytes per micro-batch
    for (const plan::Program &prog : sets[stage].programs())
      for (const plan::Binding &a : prog.arguments())
        if (a.role() == plan::Binding::INPUT) inputBytes[a.name()] = prog.buffers(a.buffer()).bytes();
    for (auto &[name, bytes] : inputBytes) acts.inputsPerMicroBatch += bytes;
    std::map<std::string, size_t> lastEntry;  // program -> its last schedule entry
    const StageSchedule &tasks = req.schedule[stage];
    auto programOf = [&](const Task &task) {
      return (task.type == Task::kForward ? "forward_" : "backward_") + std::to_string(task.chunk * p + stage);
    };
    std::map<std::string, size_t> firstEntry;
    for (size_t k = 0; k < tasks.size(); ++k) lastEntry[programOf(tasks[k])] = k, firstEntry.try_emplace(programOf(tasks[k]), k);
    for (size_t k = 0; k < tasks.size(); ++k) {
      plan::ScheduleEntry *e = rp.add_schedule();
      e->set_program(programOf(tasks[k]));
      e->set_micro_batch(tasks[k].microBatch);
      account(*byName.at(e->program()), lastEntry[e->program()] == k, firstEntry[e->program()] == k);
    }
    int once = 0;
    for (plan::Program::Kind kind : {plan::Program::LOSS, plan::Program::OPTIMIZER}) {
      const plan::Program *prog = nullptr;  // the stage's own (every stage has an optimizer)
      for (const plan::Program &candidate : sets[stage].programs())
        if (candidate.kind() == kind) prog = &candidate;
      if (!prog) continue;
      plan::ScheduleEntry *e = rp.add_schedule();
      e->set_program(prog->name());
      e->set_micro_batch(-1);
      account(*prog, true, true);
      ++once;
    }
    memory::accountActivations(tasks, acts, once, mem);
    rp.set_flops_per_step(flops);
    for (auto &[k, c] : collectives) {
      plan::CollectiveTotal *ct = rp.add_collectives();
      ct->set_kind(k);
      ct->set_count(c.first);
      ct->set_bytes(c.second);
    }
  }

  mlir::ModuleOp module;
  const std::vector<plan::ProgramSet> &sets;
  const std::vector<std::string> &programFiles;
  const std::vector<uint64_t> &checksums;
  const PlanRequest &req;
  const config::ClusterSpec &cluster;
  const config::ParallelConfig &par;
  const ModelFacts &facts;
  const std::string &modelName;
  int64_t paddedVocab;
  double modelFlopsPerToken;
  ScheduleKind kind;
  int t, p, d, v, b, m;
  ParallelLayout layout;
  int64_t vocab;
  std::map<std::string, const plan::Program *> byName;
};

}  // namespace

llvm::Expected<std::vector<plan::RankPlan>> assembleRankPlans(mlir::ModuleOp module,
                                                             const std::vector<plan::ProgramSet> &sets,
                                                             const std::vector<std::string> &programFiles,
                                                             const std::vector<uint64_t> &checksums,
                                                             const PlanRequest &req) {
  return RankPlanAssembler(module, sets, programFiles, checksums, req).run();
}

llvm::Error finishPlans(std::vector<plan::RankPlan> &plans, const std::vector<plan::ProgramSet> &sets,
                        const std::map<std::pair<int, int>, int> &stageLinkSlots, const config::ClusterSpec &cluster) {
  for (plan::RankPlan &rp : plans) {
    // The rank's links and their largest message, from its programs' sends and receives.
    std::map<std::pair<int, bool>, int64_t> largest;  // (peer position, send) -> bytes
    for (const plan::Program &prog : sets[rp.pp_rank()].programs())
      for (const plan::Instruction &in : prog.instructions())
        if (in.op() == "send" || in.op() == "recv") {
          bool send = in.op() == "send";
          int64_t &l = largest[{int(planattr::i64(in, "peer")), send}];
          l = std::max<int64_t>(l, prog.buffers(send ? in.inputs(0) : in.outputs(0)).bytes());
        }
    int64_t slotBytes = 0;
    for (auto &[link, bytes] : largest) {
      auto [peer, send] = link;
      int from = send ? rp.pp_rank() : peer, to = send ? peer : rp.pp_rank();
      auto it = stageLinkSlots.find({from, to});
      int slots = it == stageLinkSlots.end() ? 1 : std::max(1, it->second);
      plan::PipelineLink *pl = rp.add_pipeline_links();
      pl->set_peer(peer), pl->set_send(send), pl->set_slots(slots);
      slotBytes += slots * bytes;
    }
    if (cluster.device().kind() == config::CUDA) {  // the CUDA backend's PipelineLinks hold these all step
      rp.mutable_memory()->set_pipeline_slot_bytes(slotBytes);
      memory::addHeldAllStep(slotBytes, rp.mutable_memory());
    }
    if (llvm::Error e = checkMemoryFits(rp, cluster)) return e;
  }
  return llvm::Error::success();
}

std::string compileSummary(const PlanRequest &req, const std::vector<plan::RankPlan> &plans, double bubble) {
  const config::ParallelConfig &par = req.cluster.parallel();
  const ModelFacts &facts = req.facts;
  const std::string &modelName = req.modelName;
  int64_t vocab = facts.vocabSize, paddedVocab = req.paddedVocab;
  double modelFlopsPerToken = req.modelFlopsPerToken;
  ScheduleKind kind = req.kind;
  int t = par.tensor_parallel_size(), p = par.pipeline_parallel_size(), d = par.data_parallel_size(),
      v = par.virtual_pipeline_size(), b = par.micro_batch_size(), m = req.microBatches;
  int c = std::max<int>(1, int(par.context_parallel_size()));
  ParallelLayout layout{t, p, d, c, std::max<int>(1, int(par.expert_parallel_size()))};
  double totalFlops = 0;
  std::map<int, const plan::RankPlan *> firstOfStage;  // ranks of a stage are alike
  for (const plan::RankPlan &rp : plans) {
    totalFlops += rp.flops_per_step();
    firstOfStage.emplace(rp.pp_rank(), &rp);
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("model {0}: {1} layers, hidden {2}, {3} heads, seq {4}, vocab {5} (padded to {6})\n",
                      modelName, facts.numLayers, facts.hiddenSize, facts.numHeads, facts.seqLength, vocab,
                      paddedVocab);
  os << llvm::formatv("parallelism: t={0} p={1} d={2} v={3}{10} ({4} ranks), micro-batch {5}, global batch {6}, "
                      "{7} micro-batches, schedule {8}, recompute {9}\n",
                      t, p, d, v, layout.world(), b, par.global_batch_size(), m, toString(kind),
                      recomputeName(par.recompute()),
                      (c > 1 ? " c=" + std::to_string(c) : std::string()) +
                          (layout.e > 1 ? " ep=" + std::to_string(layout.e) : std::string()));
  if (layout.e > 1)
    os << llvm::formatv("expert parallelism: {0} of the {1} experts per rank, the ep groups {2} consecutive dp ranks; "
                        "the experts' gradients averaged over the {3} ranks holding the same experts (edp){4}\n",
                        facts.numExperts / layout.e, facts.numExperts, layout.e, d / layout.e,
                        !par.zero1()         ? ""
                        : d / layout.e > 1 ? ", ZeRO-1 sharding their optimizer state over those ranks"
                                             : ", ZeRO-1 leaving their optimizer state whole (one rank holds them)");
  if (c > 1) {
    ContextChunks chunks{facts.seqLength, c, 0};
    os << llvm::formatv("context parallelism: {0} chunks of {1} tokens; cp rank r holds chunks r and {2}-r "
                        "(tokens [r*{1}, (r+1)*{1}) and [({2}-r)*{1}, ({3}-r)*{1}))\n",
                        2 * c, chunks.chunk(), 2 * c - 1, 2 * c);
  }
  os << llvm::formatv("pipeline bubble (unit-time simulation, tb = 2 tf): {0:F4}\n", bubble);
  os << llvm::formatv("model FLOPs per step: {0:e} ({1:e} per token, from the IR: forward GEMMs and attention x 3, "
                      "no recomputation; the MFU numerator of the training log and the benchmarks)\n",
                      modelFlopsPerToken * par.global_batch_size() * facts.seqLength, modelFlopsPerToken);
  os << llvm::formatv("executed FLOPs per step (all ranks, recomputation included): {0:e}\n", totalFlops);
  for (auto &[stage, r] : firstOfStage) {
    const plan::RankPlan &rp = *r;
    os << llvm::formatv("stage {0} (ranks like {1}): parameters {2}, peak memory {3} (weights+grads+AdamW {4}, "
                        "stashed activations {5}, workspace {6}), FLOPs/step {7:e}\n",
                        stage, rp.rank(), rp.parameter_count(), humanBytes(rp.memory().peak_bytes()),
                        humanBytes(4 * rp.memory().parameter_bytes()), humanBytes(rp.memory().peak_stash_bytes()),
                        humanBytes(rp.memory().max_workspace_bytes()), rp.flops_per_step());
    for (const plan::CollectiveTotal &c : rp.collectives())
      os << llvm::formatv("    {0,-28} {1,6} per step  {2,12} per rank\n", c.kind(), c.count(), humanBytes(c.bytes()));
  }
  return text;
}

}  // namespace loom
