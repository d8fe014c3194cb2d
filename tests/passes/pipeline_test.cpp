// Pipeline partitioning preserves the math: the per-stage forward/backward/grad-sync programs,
// run as t * p * d ranks (threads) in the reference interpreter, reproduce the single-device
// loss and every gradient (fp32, relative error < 1e-5), the tied embedding included.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "llvm/Support/FormatVariadic.h"

#include "ir/ParamAttrs.h"
#include "mlir/IR/Verifier.h"
#include "runtime/ThreadCollectives.h"
#include "compiler/Compile.h"
#include "plan/Schedule.h"
#include "tests/passes/PassTestSupport.h"

namespace loom::test {
namespace {

constexpr int64_t kVocab = 1000;

struct Config {
  int t, p, d, v, m;
  config::PipelineSchedule schedule;
  config::RecomputeMode recompute;
};

config::ClusterSpec clusterFor(const Config &c) {
  config::ClusterSpec spec;
  spec.set_nodes(1);
  spec.set_devices_per_node(c.t * c.p * c.d);
  spec.mutable_device()->set_kind(config::CPU);
  config::ParallelConfig *p = spec.mutable_parallel();
  p->set_tensor_parallel_size(c.t);
  p->set_pipeline_parallel_size(c.p);
  p->set_data_parallel_size(c.d);
  p->set_virtual_pipeline_size(c.v);
  p->set_micro_batch_size(2);
  p->set_global_batch_size(2 * c.m * c.d);
  p->set_dp_bucket_size_bytes(30000);
  p->set_schedule(c.schedule);
  p->set_recompute(c.recompute);
  return spec;
}

ScheduleKind kindOf(const Config &c) {
  if (c.schedule == config::GPIPE || c.p == 1) return ScheduleKind::kGPipe;
  return c.v > 1 ? ScheduleKind::kInterleaved : ScheduleKind::kOneFOneB;
}

class Pipeline : public ::testing::TestWithParam<std::tuple<std::string, Config>> {};

// Compiles with the pass pipeline of `loomc compile`, then runs every rank's schedule (m
// micro-batches, gradients accumulated, then grad sync) against the single-device step.
TEST_P(Pipeline, MatchesSingleDevice) {
  auto [model, c] = GetParam();
  mlir::MLIRContext ctx;
  // Reference: one device, the whole global batch (d replicas x m micro-batches x 2).
  auto refModule = buildExample(ctx, model, 2 * c.m * c.d);
  ASSERT_TRUE(succeeded(runPipeline(*refModule, "loom-autodiff")));
  mlir::func::FuncOp ref = trainStep(*refModule);
  std::vector<HostTensor> refArgs = makeArguments(ref, kVocab, 11);
  auto refOut = interpret(ref, refArgs, {});
  ASSERT_TRUE(bool(refOut)) << llvm::toString(refOut.takeError());
  std::map<std::string, HostTensor> params, data, refGrads;
  for (unsigned i = 0; i < ref.getNumArguments(); ++i) {
    if (auto n = ref.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam)) params[n.str()] = refArgs[i];
    if (auto n = ref.getArgAttrOfType<mlir::StringAttr>(i, attr::kInput)) data[n.str()] = refArgs[i];
  }
  for (unsigned i = 1; i < ref.getNumResults(); ++i)
    refGrads[ref.getResultAttrOfType<mlir::StringAttr>(i, attr::kGradOf).str()] = (*refOut)[i];

  auto m = buildExample(ctx, model, 2, 0.0f, c.t);
  ASSERT_FALSE(bool(runCompilerPasses(*m, clusterFor(c), c.m, false)));
  ASSERT_TRUE(succeeded(mlir::verify(*m)));
  auto schedule = buildSchedule(kindOf(c), c.p, c.v, c.m);
  ASSERT_TRUE(bool(schedule)) << llvm::toString(schedule.takeError());

  ParallelLayout layout{c.t, c.p, c.d};
  ThreadWorld world(layout, 30);
  std::vector<std::map<std::string, HostTensor>> grads(layout.world());
  std::vector<double> losses(layout.world(), 0);
  std::vector<std::string> errors(layout.world());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < layout.world(); ++rank)
    threads.emplace_back([&, rank] {
      auto comm = world.forRank(rank);
      int tp = layout.tpOf(rank), dp = layout.dpOf(rank), stage = layout.ppOf(rank);
      std::map<std::pair<std::string, int>, HostTensor> stash;  // (name, micro-batch)
      std::map<std::string, HostTensor> accumulated;           // backward outputs summed over micro-batches
      auto argsOf = [&](mlir::func::FuncOp f, int mb) {
        std::vector<HostTensor> args;
        for (unsigned i = 0; i < f.getNumArguments(); ++i) {
          if (auto n = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam)) {
            auto tied = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kTiedTo);
            HostTensor full = params.at((tied ? tied : n).str());
            if (auto dim = f.getArgAttrOfType<mlir::IntegerAttr>(i, attr::kShardDim))
              full = shardOf(full, dim.getInt(), c.t, tp);
            args.push_back(full);
          } else if (auto n = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kInput)) {
            args.push_back(batchSlice(data.at(n.str()), 2 * (dp * c.m + mb), 2));
          } else {
            auto s = f.getArgAttrOfType<mlir::StringAttr>(i, "loom.stash").str();
            args.push_back(mb >= 0 ? stash.at({s, mb}) : accumulated.at(s));
          }
        }
        return args;
      };
      // Pipeline messages are matched per micro-batch: the interpreter's collectives see the
      // program's tag; a per-rank channel keeps micro-batches in schedule order.
      auto run = [&](const std::string &name, int mb) -> bool {
        auto f = m->lookupSymbol<mlir::func::FuncOp>(name);
        if (!f) return true;
        auto out = interpret(f, argsOf(f, mb), {.collectives = comm.get()});
        if (!out) {
          errors[rank] = name + ": " + llvm::toString(out.takeError());
          return false;
        }
        for (unsigned i = 0; i < f.getNumResults(); ++i) {
          HostTensor &r = (*out)[i];
          auto s = f.getResultAttrOfType<mlir::StringAttr>(i, "loom.stash");
          auto g = f.getResultAttrOfType<mlir::StringAttr>(i, attr::kGradOf);
          if (mb >= 0 && (g || (s && name.rfind("backward_", 0) == 0))) {  // accumulate over micro-batches
            std::string key = g ? "grad:" + g.str() : s.str();
            auto [it, fresh] = accumulated.try_emplace(key, r);
            if (!fresh)
              for (size_t k = 0; k < r.data.size(); ++k) it->second.data[k] += r.data[k];
          } else if (s) {
            stash[{s.str(), mb}] = r;
          } else if (g) {
            grads[rank][g.str()] = r;
          }
          if (f.getResultAttr(i, "loom.output")) losses[rank] += r.data[0] / c.m;
        }
        return true;
      };
      for (const Task &task : (*schedule)[stage]) {
        int vs = task.chunk * c.p + stage;
        if (!run((task.type == Task::kForward ? "forward_" : "backward_") + std::to_string(vs), task.microBatch))
          return;
      }
      for (int k = 0; k < c.v; ++k)
        if (!run("grad_sync_" + std::to_string(k * c.p + stage), -1)) return;
      // Gradients never synchronised (no data parallelism, untied) come straight from backward.
      for (auto &[key, g] : accumulated)
        if (llvm::StringRef(key).starts_with("grad:")) grads[rank].try_emplace(key.substr(5), g);
    });
  for (auto &th : threads) th.join();
  for (int r = 0; r < layout.world(); ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  // The loss lives on the last stage: the mean over data-parallel replicas is the reference.
  double loss = 0;
  for (int dp = 0; dp < c.d; ++dp) loss += losses[layout.rankOf(0, dp, c.p - 1)] / c.d;
  EXPECT_NEAR(loss / (*refOut)[0].data[0], 1.0, 1e-5);

  // Every parameter's gradient, from the ranks holding it (shards concatenated).
  std::map<std::string, int> seen;
  std::map<std::string, int64_t> shardDim;
  for (auto f : m->getOps<mlir::func::FuncOp>())
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      if (auto n = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam))
        if (auto dim = f.getArgAttrOfType<mlir::IntegerAttr>(i, attr::kShardDim)) shardDim[n.str()] = dim.getInt();
  for (int stage = 0; stage < c.p; ++stage)
    for (int dp = 0; dp < c.d; ++dp)
      for (auto &[name, g0] : grads[layout.rankOf(0, dp, stage)]) {
        std::string base = name.substr(0, name.find(".stage"));
        HostTensor got = g0;
        if (shardDim.count(name)) {
          std::vector<HostTensor> shards;
          for (int tp = 0; tp < c.t; ++tp) shards.push_back(grads[layout.rankOf(tp, dp, stage)].at(name));
          got = unshard(shards, shardDim[name]);
        }
        EXPECT_LT(relativeError(got, refGrads.at(base)), 1e-5) << name << " on stage " << stage << " replica " << dp;
        if (dp == 0) ++seen[base];
      }
  EXPECT_EQ(seen.size(), refGrads.size());
  if (c.p > 1)
    EXPECT_EQ(seen[model == "bert-tiny" ? "bert.wte.weight" : "transformer.wte.weight"], 2)
        << "the tied embedding lives on the first and the last stage";
}

constexpr auto kOneFOneB = config::ONE_F_ONE_B;
constexpr auto kGPipe = config::GPIPE;
constexpr auto kInterleaved = config::INTERLEAVED_ONE_F_ONE_B;
constexpr auto kNone = config::RECOMPUTE_NONE;
constexpr auto kFull = config::RECOMPUTE_FULL;

INSTANTIATE_TEST_SUITE_P(
    Configs, Pipeline,
    ::testing::Combine(::testing::Values("gpt-tiny", "bert-tiny"),
                       ::testing::Values(Config{1, 1, 1, 1, 1, kGPipe, kNone}, Config{2, 1, 1, 1, 2, kGPipe, kNone},
                                         Config{1, 2, 1, 1, 2, kOneFOneB, kNone}, Config{1, 1, 2, 1, 2, kGPipe, kNone},
                                         Config{2, 2, 1, 1, 4, kOneFOneB, kNone}, Config{2, 2, 2, 1, 2, kOneFOneB, kNone},
                                         Config{1, 2, 1, 2, 4, kInterleaved, kNone}, Config{1, 2, 1, 1, 3, kGPipe, kNone},
                                         Config{1, 2, 2, 1, 2, kOneFOneB, kFull}, Config{2, 2, 1, 1, 2, kGPipe, kFull},
                                         Config{1, 4, 1, 1, 4, kOneFOneB, kNone})),
    [](const auto &info) {
      const Config &c = std::get<1>(info.param);
      std::string n = llvm::formatv("{0}_t{1}p{2}d{3}v{4}m{5}_{6}_{7}", std::get<0>(info.param), c.t, c.p, c.d, c.v,
                                    c.m, config::PipelineSchedule_Name(c.schedule), config::RecomputeMode_Name(c.recompute))
                          .str();
      for (char &ch : n) ch = isalnum(ch) ? ch : '_';
      return n;
    });

}  // namespace
}  // namespace loom::test
