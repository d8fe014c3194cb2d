#include "compiler/Compile.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "config/ConfigLoader.h"
#include "compiler/Lowering.h"
#include "compiler/ModelBuilder.h"
#include "compiler/ModelStats.h"
#include "compiler/PlanAssembly.h"
#include "analysis/PlanCheck.h"
#include "compiler/StageBalance.h"
#include "plan/Layout.h"
#include "plan/Schedule.h"
#include "compiler/StepPrograms.h"
#include "compiler/ToolSupport.h"
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "llvm/Support/FormatVariadic.h"
#include "mlir/Pass/PassManager.h"
#include "passes/ModelFacts.h"
#include "passes/Passes.h"
#include "protos/plan.pb.h"
#include "support/Checksum.h"
#include "support/ProgressMeter.h"

namespace loom {
namespace {

llvm::Error error(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

ScheduleKind scheduleKindOf(const config::ParallelConfig &p) {
  switch (p.schedule()) {
    case config::GPIPE: return ScheduleKind::kGPipe;
    case config::ONE_F_ONE_B: return ScheduleKind::kOneFOneB;
    case config::INTERLEAVED_ONE_F_ONE_B: return ScheduleKind::kInterleaved;
    default:
      // One stage: each micro-batch's forward, then its backward (Megatron's no-pipelining
      // order), holding one micro-batch's stash instead of all of them.
      if (p.pipeline_parallel_size() == 1) return ScheduleKind::kOneFOneB;
      return p.virtual_pipeline_size() > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
  }
}

// loom-mixed-precision's dtype for the cluster's precision ("": the model's policy).
std::string precisionOverride(config::Precision p) {
  switch (p) {
    case config::PRECISION_FP32: return "f32";
    case config::PRECISION_BF16: return "bf16";
    case config::PRECISION_FP16: return "f16";
    default: return "";
  }
}

// loom-scatter-gather's `crossing`: the neighbouring pipeline positions (a, a + 1 mod p) some of
// whose ranks sit on different nodes (node = rank / devices_per_node; Megatron-Core's rank
// order, plan/Layout.h), as "a,b" pairs; empty when scatter/gather is off.
std::string crossNodeLinks(const config::ClusterSpec &cluster) {
  const config::ParallelConfig &p = cluster.parallel();
  if (p.has_scatter_gather() && !p.scatter_gather()) return "";
  ParallelLayout layout{int(p.tensor_parallel_size()), int(p.pipeline_parallel_size()), int(p.data_parallel_size()),
                        std::max<int>(1, int(p.context_parallel_size()))};
  int64_t perNode = std::max<int64_t>(cluster.devices_per_node(), 1);
  std::set<std::pair<int, int>> links;
  for (int a = 0; a < layout.p && layout.p > 1; ++a) {
    int b = (a + 1) % layout.p;
    for (int dp = 0; dp < layout.d; ++dp)
      for (int cp = 0; cp < layout.c; ++cp)
        for (int tp = 0; tp < layout.t; ++tp)
          if (layout.rankOf(tp, dp, a, cp) / perNode != layout.rankOf(tp, dp, b, cp) / perNode)
            links.insert(std::minmax(a, b));
  }
  std::string list;
  for (auto [a, b] : links) list += (list.empty() ? "" : ",") + std::to_string(a) + "," + std::to_string(b);
  return list;
}

// Writes `bytes` to `path` through a temporary file and a rename.
llvm::Error writeFile(const std::string &path, const std::string &bytes) {
  return writeOutput(path, [&](llvm::raw_ostream &os) { os << bytes; });
}

}  // namespace

llvm::Error runCompilerPasses(mlir::ModuleOp module, const config::ClusterSpec &cluster, int64_t microBatches,
                              bool printIrAfterAll, const std::function<void(mlir::ModuleOp)> &afterShapes,
                              std::vector<int64_t> *stageLayout) {
  const config::ParallelConfig &p = cluster.parallel();
  static bool registered = (registerLoomPasses(), true);
  (void)registered;
  auto run = [&](const std::string &pipeline) -> llvm::Error {
    auto pm = mlir::PassManager::on<mlir::ModuleOp>(module.getContext());
    if (printIrAfterAll) {
      module.getContext()->disableMultithreading();
      pm.enableIRPrinting([](mlir::Pass *, mlir::Operation *) { return false; },
                          [](mlir::Pass *, mlir::Operation *) { return true; }, /*printModuleScope=*/true,
                          /*printAfterOnlyOnChange=*/false);
    }
    if (failed(mlir::parsePassPipeline(pipeline, pm, llvm::errs()))) return error("invalid pass pipeline " + pipeline);
    if (failed(pm.run(module))) return diagnosticsReported();
    return llvm::Error::success();
  };
  // Layout-specific shapes are passes too: the micro-batch, then the vocabulary padded to a
  // multiple of make_vocab_size_divisible_by * t (Megatron's rule). The module is then still
  // the global model, only shaped for this layout.
  int64_t padMultiple = vocabDivisibleBy(module) * p.tensor_parallel_size();
  if (llvm::Error e = run(llvm::formatv("loom-specialize-batch{{batch={0}},loom-pad-vocab{{multiple={1}}",
                                        p.micro_batch_size(), padMultiple)))
    return e;
  if (afterShapes) afterShapes(module);
  // The stage layout: the spec's, one balanced by predicted cost, or (empty) even.
  std::vector<int64_t> layout(p.layers_per_stage().begin(), p.layers_per_stage().end());
  if (p.balance_stages()) {
    llvm::Expected<StageCosts> costs = stageCosts(module, cluster);
    if (!costs) return costs.takeError();
    layout = balancedLayout(*costs, p.pipeline_parallel_size() * p.virtual_pipeline_size());
  }
  if (stageLayout) *stageLayout = layout;
  std::string crossing = crossNodeLinks(cluster);
  int64_t cp = std::max<int64_t>(1, p.context_parallel_size());
  std::string layoutOption;
  for (int64_t n : layout) layoutOption += (layoutOption.empty() ? " layout=" : ",") + std::to_string(n);
  return run(llvm::formatv(
      "loom-tensor-parallel{{tp={0} sequence-parallel={8}},loom-context-parallel{{cp={12} comm={14}},"
      "loom-expert-parallel{{ep={15}},"
      "loom-mixed-precision{{dtype={10}},loom-pipeline-stages{{pp={1} vp={2}{9}},loom-autodiff,"
      "loom-data-parallel{{dp={3} bucket-bytes={4} zero1={7}{13} expert-parallel={15}},loom-pipeline-partition,"
      "loom-recompute{{mode={5}},"
      "loom-micro-batches{{count={6}},loom-scatter-gather{{tp={0}{11}}",
      p.tensor_parallel_size(), p.pipeline_parallel_size(), p.virtual_pipeline_size(), p.data_parallel_size() * cp,
      p.dp_bucket_size_bytes(), recomputeName(p.recompute()), microBatches, p.zero1() ? "true" : "false",
      p.sequence_parallel() ? "true" : "false", layoutOption, precisionOverride(p.precision()),
      crossing.empty() ? std::string() : " crossing=" + crossing, cp, cp > 1 ? " group=dpcp" : "",
      p.cp_comm_type().empty() ? std::string("p2p") : p.cp_comm_type(), std::max<int64_t>(1, p.expert_parallel_size())));
}

llvm::Error compile(const config::ModelConfig &model, const config::ClusterSpec &cluster, const CompileOptions &opt,
                    llvm::raw_ostream &summary) {
  mlir::MLIRContext ctx;
  OneLineDiagnostics diags(ctx);
  mlir::OwningOpRef<mlir::ModuleOp> module = buildModel(ctx, model, {});
  return compile(*module, cluster, opt, summary);
}

llvm::Error compile(mlir::ModuleOp module, const config::ClusterSpec &cluster, const CompileOptions &opt,
                    llvm::raw_ostream &summary) {
  auto started = std::chrono::steady_clock::now();
  CompiledPlans compiled;
  if (llvm::Error e = compileInMemory(module, cluster, opt, &compiled)) return e;
  std::error_code ec;
  std::filesystem::create_directories(opt.outDir + "/programs", ec);
  if (ec) return error(opt.outDir + ": cannot create the output directory: " + ec.message());
  for (size_t s = 0; s < compiled.sets.size(); ++s) {
    std::string bytes;
    compiled.sets[s].SerializeToString(&bytes);
    if (llvm::Error e = writeFile(opt.outDir + "/programs/stage_" + std::to_string(s) + ".pb", bytes)) return e;
  }
  ProgressMeter meter("loomc: writing rank plans", int64_t(compiled.plans.size()), "ranks", false,
                      opt.progress ? stderr : nullptr);
  for (size_t rank = 0; rank < compiled.plans.size(); ++rank) {
    meter.update(int64_t(rank));
    std::string bytes;
    compiled.plans[rank].SerializeToString(&bytes);
    if (llvm::Error e = writeFile(opt.outDir + "/rank_" + std::to_string(rank) + ".plan.pb", bytes)) return e;
  }
  meter.update(int64_t(compiled.plans.size()));
  meter.finish();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::string text = compiled.summaryHead +
                     llvm::formatv("wrote {0} rank plans and {1} program files to {2} in {3:F2} s\n",
                                   compiled.plans.size(), compiled.sets.size(), opt.outDir, seconds).str() +
                     compiled.summaryTail;
  if (llvm::Error e = writeFile(opt.outDir + "/summary.txt", text)) return e;
  if (!opt.quiet) summary << text;
  return llvm::Error::success();
}

llvm::Error compileInMemory(mlir::ModuleOp module, const config::ClusterSpec &cluster, const CompileOptions &opt,
                            CompiledPlans *out) {
  if (!opt.backendMemory) return error("internal: compileInMemory was given no backend memory model");
  const config::ParallelConfig &par = cluster.parallel();
  // The input is the model over global shapes: the passes do everything layout-specific.
  const llvm::StringRef partitionedMarks[] = {attr::kTensorParallel, "loom.zero1", "loom.sequence_parallel"};
  for (llvm::StringRef partitioned : partitionedMarks)
    if (module->hasAttr(partitioned))
      return error("the module carries '" + partitioned +
                   "': it is already compiled for a layout; loomc compile takes the IR over global shapes");
  if (auto f = module.lookupSymbol<mlir::func::FuncOp>("train_step"))
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      for (llvm::StringRef partitioned : {attr::kShardDim, attr::kTiedTo, attr::kTpPartialGrad})
        if (f.getArgAttr(i, partitioned))
          return error(llvm::formatv("argument {0} of @train_step carries '{1}': the module is already compiled for a "
                                     "layout; loomc compile takes the IR over global shapes",
                                     i, partitioned));
  mlir::FailureOr<ModelFacts> facts = readModelFacts(module);
  if (failed(facts)) return diagnosticsReported();
  std::string modelName = !facts->name.empty() ? facts->name : opt.modelName.empty() ? "model" : opt.modelName;
  std::string precision = precisionOverride(par.precision());
  if (precision.empty()) precision = facts->paramsDtype;
  plan::DType dpWire = plan::F32;
  if (par.grad_reduce_in_bf16()) {
    if (precision != "bf16")
      return error("parallel.grad_reduce_in_bf16: the gradients are reduced in bf16 only in a bf16 plan (this run's "
                   "precision is " + (precision.empty() ? std::string("f32") : precision) + ")");
    if (cluster.device().kind() != config::CPU)
      return error("parallel.grad_reduce_in_bf16: the CUDA backend does not reduce in bf16 yet (its NCCL buckets "
                   "move fp32); leave it off for GPU clusters");
    dpWire = plan::BF16;
  }
  if (par.tp_comm_overlap()) {
    if (par.tensor_parallel_size() < 2)
      return error("parallel.tp_comm_overlap: there is no tensor-parallel communication to overlap at "
                   "tensor_parallel_size 1");
    // With sequence parallelism the all-gathers and reduce-scatters split by samples
    // (compiler/Lowering.cpp): a one-sample micro-batch has nothing to split.
    if (par.sequence_parallel() && par.micro_batch_size() < 2)
      return error("parallel.tp_comm_overlap: with sequence_parallel the all-gathers and reduce-scatters overlap the "
                   "GEMMs sample by sample, and micro_batch_size 1 has one sample; use micro_batch_size >= 2 or "
                   "leave tp_comm_overlap off");
  }
  // Megatron asserts --overlap-param-gather only with --use-distributed-optimizer: the option
  // has nothing to act on otherwise.
  int c = std::max<int>(1, int(par.context_parallel_size()));
  if (par.has_overlap_param_gather() && !(par.zero1() && par.data_parallel_size() * c > 1))
    return error("parallel.overlap_param_gather: only ZeRO-1 gathers parameters over dp (set zero1 with "
                 "data_parallel_size > 1, or leave overlap_param_gather unset)");
  // The weight gradients' reduction: over dp, or with context parallelism over the d x c ranks
  // that hold the same weights (Megatron-Core's data-parallel group "with context parallel").
  std::string dpGroup = c > 1 ? "dpcp" : "dp";
  int dReduce = par.data_parallel_size() * c;
  int t = par.tensor_parallel_size(), p = par.pipeline_parallel_size(), d = par.data_parallel_size(),
      v = par.virtual_pipeline_size(), b = par.micro_batch_size();
  int m = par.global_batch_size() / (b * d);
  ScheduleKind kind = scheduleKindOf(par);
  auto schedule = buildSchedule(kind, p, v, m);
  if (!schedule)
    return error(llvm::formatv("parallel.schedule: {0} (global batch {1} = micro-batch {2} x d {3} x m {4})",
                               llvm::toString(schedule.takeError()), par.global_batch_size(), b, d, m));
  Simulation sim = simulate(*schedule, p, v, m);
  if (sim.deadlock) return error("the pipeline schedule can deadlock: " + sim.diagnosis);

  // Model FLOPs per token (3 x forward: GPT's equals the PTD-P formula; any architecture is
  // counted alike) and the padded vocabulary, from the global IR once it is shaped for the
  // layout, before it is partitioned.
  double modelFlopsPerToken = 0;
  int64_t paddedVocab = 0;
  auto measure = [&](mlir::ModuleOp shaped) {
    modelFlopsPerToken = computeModelStats(shaped).trainingFlopsPerToken();
    if (mlir::FailureOr<ModelFacts> f = readModelFacts(shaped); succeeded(f)) paddedVocab = f->wordRows;
  };
  std::vector<int64_t> layersPerStage;
  if (llvm::Error e = runCompilerPasses(module, cluster, m, opt.printIrAfterAll, measure, &layersPerStage)) return e;
  constexpr int64_t kTpOverlapBlocks = 4;
  if (par.tp_comm_overlap())
    module->setAttr(kTpCommOverlapAttr, mlir::IntegerAttr::get(mlir::IntegerType::get(module.getContext(), 64),
                                                               kTpOverlapBlocks));

  // Lower every program once; pipeline stage s holds virtual stages s, s + p, ...
  std::vector<plan::ProgramSet> sets(p);
  for (int s = 0; s < p; ++s) sets[s].set_pipeline_stage(s);
  std::map<int, plan::Program> gradSyncOf;  // virtual stage -> its gradient-sync program
  for (auto f : module.getOps<mlir::func::FuncOp>()) {
    auto lowered = lowerProgram(f);
    if (!lowered) return lowered.takeError();
    auto kindAttr = f->getAttrOfType<mlir::StringAttr>(attr::kProgramKind);
    if (kindAttr && kindAttr.getValue() == "grad_sync")
      gradSyncOf[lowered->virtual_stage()] = std::move(*lowered);
    else
      sets[lowered->virtual_stage() % p].add_programs()->Swap(&*lowered);
  }
  // The rest of the step in the plan (compiler/StepPrograms.h): accumulation and gradient
  // sync inside each backward, the loss sum in each forward, the loss and optimizer programs.
  std::vector<StageLayout> layouts(p);
  for (int s = 0; s < p; ++s) {
    std::vector<DeferredSync> deferred;  // cross-stage gradient sync: the optimizer's first step
    for (plan::Program &prog : *sets[s].mutable_programs()) {
      if (prog.kind() == plan::Program::FORWARD) accumulateLoss(prog);
      if (prog.kind() != plan::Program::BACKWARD) continue;
      auto sync = gradSyncOf.find(prog.virtual_stage());
      if (llvm::Error e = foldGradientSync(prog, sync == gradSyncOf.end() ? nullptr : &sync->second,
                                           par.serial_grad_reduce(), dpWire, &deferred))
        return e;
    }
    std::set<std::string> syncedLater;  // the gradients the optimizer reduces across stages first
    for (const DeferredSync &sync : deferred) syncedLater.insert(sync.params.begin(), sync.params.end());
    llvm::Expected<StageLayout> layout =
        stageLayout(module, sets[s], dReduce, par.zero1(), par.dp_bucket_size_bytes(), syncedLater, dpGroup,
                    std::max<int>(1, int(par.expert_parallel_size())));
    if (!layout) return llvm::createStringError(llvm::inconvertibleErrorCode(), "pipeline stage %d: %s", s,
                                                llvm::toString(layout.takeError()).c_str());
    layouts[s] = std::move(*layout);
    // ZeRO-1 by buckets: each bucket's reduce-scatter in its backward, its parameters' all-gather
    // at the head of its forward (Megatron's --overlap-grad-reduce and --overlap-param-gather;
    // overlap_param_gather: false leaves the all-gathers at the end of the optimizer program).
    bool gatherInForward = !par.has_overlap_param_gather() || par.overlap_param_gather();
    // A bucket of one part (experts with d = ep) has nothing to gather: the optimizer program remakes
    // its 16-bit copy, if any.
    for (StageBucket &bucket : layouts[s].buckets)
      bucket.gatherInForward = gatherInForward && bucket.virtualStage >= 0 && bucket.parts > 1;
    if (!layouts[s].buckets.empty()) {
      for (plan::Program &prog : *sets[s].mutable_programs()) {
        if (prog.kind() == plan::Program::BACKWARD)
          appendBucketReduceScatters(prog, layouts[s], dpWire, par.serial_grad_reduce(), syncedLater);
        if (prog.kind() == plan::Program::FORWARD) prependParameterGathers(prog, layouts[s]);
      }
    }
    if (s == p - 1) {
      std::vector<std::string> terms;  // the losses the loss sums (BERT's), from its forward
      for (const plan::Program &prog : sets[s].programs())
        if (prog.kind() == plan::Program::FORWARD && terms.empty()) terms = lossTermsOf(prog);
      *sets[s].add_programs() = lossProgram(m, dpGroup, dReduce, terms);
    }
    *sets[s].add_programs() = optimizerProgram(layouts[s], t, p, dReduce, par.zero1(), dpWire, deferred,
                                                 std::max<int>(1, int(par.expert_parallel_size())));
    if (!layouts[s].buckets.empty()) {
      plan::Program parameterGather = parameterGatherProgram(layouts[s]);
      if (parameterGather.instructions_size()) *sets[s].add_programs() = std::move(parameterGather);
      plan::Program gradientGather = gradientGatherProgram(layouts[s], deferred);
      if (gradientGather.instructions_size()) *sets[s].add_programs() = std::move(gradientGather);
    }
  }
  // Everything is assembled and checked before anything is written.
  std::vector<std::string> programFiles(p), programBytes(p);
  std::vector<uint64_t> checksums(p);
  for (int s = 0; s < p; ++s) {
    sets[s].SerializeToString(&programBytes[s]);
    programFiles[s] = "programs/stage_" + std::to_string(s) + ".pb";
    checksums[s] = checksum64(programBytes[s]);
  }

  PlanRequest request{cluster,           *facts, modelName, paddedVocab, modelFlopsPerToken, kind, *schedule, m, layouts,
                      opt.progress,      opt.backendMemory};
  llvm::Expected<std::vector<plan::RankPlan>> plans = assembleRankPlans(module, sets, programFiles, checksums, request);
  if (!plans) return plans.takeError();
  // The plans are proved to run together (compiler/PlanCheck.h) before anything is written.
  std::vector<RankPrograms> check;
  for (const plan::RankPlan &rp : *plans) check.push_back({&rp, &sets[rp.pp_rank()]});
  CheckResult checked;
  if (llvm::Error e = checkPlans(check, &checked)) return error("the compiled plans fail their check: " + llvm::toString(std::move(e)));
  std::map<std::pair<int, int>, int> stageLinkSlots;  // the simulated ranks' links, by stage
  for (auto &[link, most] : checked.linkInFlight) {
    int &slots = stageLinkSlots[{(*plans)[size_t(link.first)].pp_rank(), (*plans)[size_t(link.second)].pp_rank()}];
    slots = std::max(slots, most);
  }
  if (llvm::Error e = finishPlans(*plans, sets, stageLinkSlots, cluster)) return e;
  std::string layoutLine;
  if (!layersPerStage.empty()) {
    std::string list;
    for (int64_t n : layersPerStage) list += (list.empty() ? "" : ", ") + std::to_string(n);
    layoutLine = "layers per virtual stage: " + list +
                 (par.balance_stages() ? " (balanced by predicted cost)\n" : " (parallel.layers_per_stage)\n");
  }
  out->summaryHead = compileSummary(request, *plans, sim.bubbleFraction);
  out->summaryTail = "check: " + checked.summary + "\n" + layoutLine;
  out->sets = std::move(sets);
  out->plans = std::move(*plans);
  return llvm::Error::success();
}

}  // namespace loom
