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
#include "tests/passes/PassTestSupport.h"

namespace loom::test {
namespace {

constexpr int64_t kVocab = 1000;

struct Config {
  int t, p, d, v;
};

std::string pipelineFor(const Config &c) {
  return llvm::formatv("loom-tensor-parallel{{tp={0}},loom-pipeline-stages{{pp={1} vp={2}},loom-autodiff,"
                       "loom-data-parallel{{dp={3} bucket-bytes=30000},loom-pipeline-partition",
                       c.t, c.p, c.v, c.d)
      .str();
}

class Pipeline : public ::testing::TestWithParam<std::tuple<std::string, Config>> {};

TEST_P(Pipeline, MatchesSingleDevice) {
  auto [model, c] = GetParam();
  mlir::MLIRContext ctx;
  // Reference: one device, the whole batch (each of the d replicas takes 2 sequences).
  auto refModule = buildExample(ctx, model, 2 * c.d);
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

  auto m = buildExample(ctx, model, 2);
  ASSERT_TRUE(succeeded(runPipeline(*m, pipelineFor(c))));
  ASSERT_TRUE(succeeded(mlir::verify(*m)));

  ParallelLayout layout{c.t, c.p, c.d};
  ThreadWorld world(layout, 30);
  std::vector<std::map<std::string, HostTensor>> grads(layout.world());
  std::vector<float> losses(layout.world(), NAN);
  std::vector<std::string> errors(layout.world());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < layout.world(); ++rank)
    threads.emplace_back([&, rank] {
      auto comm = world.forRank(rank);
      int tp = layout.tpOf(rank), dp = layout.dpOf(rank), stage = layout.ppOf(rank);
      std::map<std::string, HostTensor> stash;
      auto argsOf = [&](mlir::func::FuncOp f) {
        std::vector<HostTensor> args;
        for (unsigned i = 0; i < f.getNumArguments(); ++i) {
          if (auto n = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam)) {
            auto tied = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kTiedTo);
            HostTensor full = params.at((tied ? tied : n).str());
            if (auto dim = f.getArgAttrOfType<mlir::IntegerAttr>(i, attr::kShardDim))
              full = shardOf(full, dim.getInt(), c.t, tp);
            args.push_back(full);
          } else if (auto n = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kInput)) {
            args.push_back(batchSlice(data.at(n.str()), 2 * dp, 2));
          } else {
            args.push_back(stash.at(f.getArgAttrOfType<mlir::StringAttr>(i, "loom.stash").str()));
          }
        }
        return args;
      };
      auto run = [&](const std::string &name) -> bool {
        auto f = m->lookupSymbol<mlir::func::FuncOp>(name);
        if (!f) return true;
        auto out = interpret(f, argsOf(f), {.collectives = comm.get()});
        if (!out) {
          errors[rank] = name + ": " + llvm::toString(out.takeError());
          return false;
        }
        for (unsigned i = 0; i < f.getNumResults(); ++i) {
          if (auto s = f.getResultAttrOfType<mlir::StringAttr>(i, "loom.stash")) stash[s.str()] = (*out)[i];
          if (auto g = f.getResultAttrOfType<mlir::StringAttr>(i, attr::kGradOf)) grads[rank][g.str()] = (*out)[i];
          if (f.getResultAttr(i, "loom.output")) losses[rank] = (*out)[i].data[0];
        }
        return true;
      };
      // GPipe order for one micro-batch: chunks forward, then backward in reverse, then sync.
      for (int k = 0; k < c.v; ++k)
        if (!run("forward_" + std::to_string(k * c.p + stage))) return;
      for (int k = c.v - 1; k >= 0; --k)
        if (!run("backward_" + std::to_string(k * c.p + stage))) return;
      for (int k = 0; k < c.v; ++k)
        if (!run("grad_sync_" + std::to_string(k * c.p + stage))) return;
    });
  for (auto &th : threads) th.join();
  for (int r = 0; r < layout.world(); ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  // The loss lives on the last stage: the mean over data-parallel replicas is the reference.
  double loss = 0;
  for (int dp = 0; dp < c.d; ++dp) loss += losses[layout.rankOf(0, dp, c.p - 1)] / c.d;
  EXPECT_NEAR(loss / (*refOut)[0].data[0], 1.0, 1e-5);

  // Every parameter's gradient, from the ranks holding it (shards concatenated).
  std::map<std::string, int> seen;
  for (int stage = 0; stage < c.p; ++stage) {
    for (auto &[name, g0] : grads[layout.rankOf(0, 0, stage)]) {
      std::string base = name.substr(0, name.find(".stage"));
      HostTensor got = g0;
      mlir::func::FuncOp holder;
      for (auto f : m->getOps<mlir::func::FuncOp>())
        for (unsigned i = 0; i < f.getNumArguments(); ++i)
          if (auto n = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam); n && n.getValue() == name)
            if (auto dim = f.getArgAttrOfType<mlir::IntegerAttr>(i, attr::kShardDim)) {
              std::vector<HostTensor> shards;
              for (int tp = 0; tp < c.t; ++tp) shards.push_back(grads[layout.rankOf(tp, 0, stage)].at(name));
              got = unshard(shards, dim.getInt());
            }
      EXPECT_LT(relativeError(got, refGrads.at(base)), 1e-5) << name << " on stage " << stage;
      ++seen[base];
    }
  }
  EXPECT_EQ(seen.size(), refGrads.size());
  if (c.p > 1) EXPECT_EQ(seen[model == "bert-tiny" ? "bert.wte.weight" : "transformer.wte.weight"], 2)
      << "the tied embedding lives on the first and the last stage";
}

INSTANTIATE_TEST_SUITE_P(
    Configs, Pipeline,
    ::testing::Combine(::testing::Values("gpt-tiny", "bert-tiny"),
                       ::testing::Values(Config{1, 2, 1, 1}, Config{2, 2, 1, 1}, Config{1, 2, 1, 2},
                                         Config{2, 2, 2, 1}, Config{1, 2, 2, 1})),
    [](const auto &info) {
      const Config &c = std::get<1>(info.param);
      std::string n = llvm::formatv("{0}_t{1}p{2}d{3}v{4}", std::get<0>(info.param), c.t, c.p, c.d, c.v).str();
      for (char &ch : n) ch = isalnum(ch) ? ch : '_';
      return n;
    });

}  // namespace
}  // namespace loom::test
