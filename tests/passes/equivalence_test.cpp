// The passes preserve the math: the tensor-parallel and data-parallel programs, run as t or
// d ranks (threads) in the reference interpreter, reproduce the single-device loss and every
// gradient of gpt-tiny, bert-tiny and llama-tiny (fp32, relative error < 1e-5); autodiff's gradients
// agree with finite differences of the loss.
#include <gtest/gtest.h>

#include <thread>

#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "mlir/IR/Verifier.h"
#include "runtime/Executor.h"
#include "runtime/ThreadCollectives.h"
#include "tests/passes/PassTestSupport.h"

namespace loom::test {
namespace {

constexpr int64_t kVocab = 1000;  // gpt-tiny's and bert-tiny's unpadded vocabulary

struct Reference {
  std::vector<HostTensor> args;     // full parameters + data of the whole batch
  std::vector<HostTensor> outputs;  // loss, then gradients in parameter order
};

Reference runReference(mlir::MLIRContext &ctx, const std::string &model, int64_t batch) {
  auto m = buildExample(ctx, model, batch);
  EXPECT_TRUE(succeeded(runPipeline(*m, "loom-autodiff")));
  Reference r;
  r.args = makeArguments(trainStep(*m), kVocab, 42);
  auto out = interpret(trainStep(*m), r.args, {});
  EXPECT_TRUE(bool(out)) << llvm::toString(out.takeError());
  r.outputs = std::move(*out);
  return r;
}

// Runs `f` on every rank of `layout` in threads; argsOf(rank) gives each rank's arguments.
std::vector<std::vector<HostTensor>> runRanks(mlir::func::FuncOp f, ParallelLayout layout,
                                              const std::function<std::vector<HostTensor>(int)> &argsOf) {
  ThreadWorld world(layout, 30);
  std::vector<std::vector<HostTensor>> results(layout.world());
  std::vector<std::string> errors(layout.world());
  std::vector<std::thread> threads;
  for (int r = 0; r < layout.world(); ++r)
    threads.emplace_back([&, r] {
      auto comm = world.forRank(r);
      auto out = interpret(f, argsOf(r), {.collectives = comm.get()});
      if (out) results[r] = std::move(*out);
      else errors[r] = llvm::toString(out.takeError());
    });
  for (auto &t : threads) t.join();
  for (int r = 0; r < layout.world(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return results;
}

class TensorParallel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TensorParallel, MatchesSingleDevice) {
  auto [model, t] = GetParam();
  mlir::MLIRContext ctx;
  Reference ref = runReference(ctx, model, 2);

  auto m = buildExample(ctx, model, 2);
  // loom-data-parallel with d = 1 sums partial gradients over tp (replicated KV heads).
  ASSERT_TRUE(succeeded(
      runPipeline(*m, "loom-tensor-parallel{tp=" + std::to_string(t) + "},loom-autodiff,loom-data-parallel{dp=1}")));
  ASSERT_TRUE(succeeded(mlir::verify(*m)));
  mlir::func::FuncOp f = trainStep(*m);
  auto argsOf = [&](int rank) {
    std::vector<HostTensor> args = ref.args;
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      if (auto dim = f.getArgAttrOfType<mlir::IntegerAttr>(i, attr::kShardDim))
        args[i] = shardOf(ref.args[i], dim.getInt(), t, rank);
    return args;
  };
  auto results = runRanks(f, {.t = t}, argsOf);

  ASSERT_EQ(ref.outputs.size(), f.getNumResults());
  for (int r = 0; r < t; ++r) ASSERT_EQ(results[r].size(), f.getNumResults()) << "rank " << r;
  for (int r = 0; r < t; ++r) EXPECT_LT(relativeError(results[r][0], ref.outputs[0]), 1e-5) << "loss, rank " << r;
  // Gradient k belongs to parameter argument k (parameters come first).
  for (unsigned k = 1; k < ref.outputs.size(); ++k) {
    unsigned arg = k - 1;
    auto name = f.getArgAttrOfType<mlir::StringAttr>(arg, attr::kParam).getValue();
    HostTensor got = results[0][k];
    if (auto dim = f.getArgAttrOfType<mlir::IntegerAttr>(arg, attr::kShardDim)) {
      std::vector<HostTensor> shards;
      for (int r = 0; r < t; ++r) shards.push_back(results[r][k]);
      got = unshard(shards, dim.getInt());
    } else {
      for (int r = 1; r < t; ++r)  // replicated parameters: every rank has the same gradient
        EXPECT_LT(relativeError(results[r][k], results[0][k]), 1e-6) << name.str();
    }
    EXPECT_LT(relativeError(got, ref.outputs[k]), 1e-5) << name.str();
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallel,
                         ::testing::Combine(::testing::Values("gpt-tiny", "bert-tiny", "llama-tiny"),
                                            ::testing::Values(2, 4)),
                         [](const auto &info) {
                           std::string n = std::get<0>(info.param) + "_t" + std::to_string(std::get<1>(info.param));
                           for (char &c : n) c = isalnum(c) ? c : '_';
                           return n;
                         });

TEST(DataParallel, TwoReplicasMatchTheWholeBatch) {
  mlir::MLIRContext ctx;
  Reference ref = runReference(ctx, "gpt-tiny", 4);
  auto m = buildExample(ctx, "gpt-tiny", 2);
  ASSERT_TRUE(succeeded(runPipeline(*m, "loom-autodiff,loom-data-parallel{dp=2 bucket-bytes=20000}")));
  mlir::func::FuncOp f = trainStep(*m);
  auto argsOf = [&](int rank) {
    std::vector<HostTensor> args = ref.args;
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      if (f.getArgAttr(i, attr::kInput)) args[i] = batchSlice(ref.args[i], 2 * rank, 2);
    return args;
  };
  auto results = runRanks(f, {.d = 2}, argsOf);
  double meanLoss = (results[0][0].data[0] + results[1][0].data[0]) / 2;
  EXPECT_NEAR(meanLoss / ref.outputs[0].data[0], 1.0, 1e-5);
  for (unsigned k = 1; k < ref.outputs.size(); ++k) {
    EXPECT_LT(relativeError(results[0][k], ref.outputs[k]), 1e-5) << k;
    EXPECT_EQ(results[0][k].data, results[1][k].data) << "replicas disagree on gradient " << k;
  }
}

// Each parameter's gradient against a central difference of the loss along a direction v
// of unit norm: (L(p + e v) - L(p - e v)) / 2e  ~  <dL/dp, v>. v mixes the gradient's own
// direction (large directional derivative, so fp32 rounding stays small) with a random one.
TEST(Autodiff, GradientsMatchFiniteDifferences) {
  // Dropout masks come from a counter-based generator, so the loss is a deterministic
  // function of the parameters with dropout on too, and its rule is checked as well.
  for (auto [model, dropout] :
       {std::pair{"gpt-tiny", 0.0f}, {"bert-tiny", 0.0f}, {"gpt-tiny", 0.1f}, {"llama-tiny", 0.0f}, {"llama-tiny", 0.1f}}) {
    mlir::MLIRContext ctx;
    auto fwd = buildExample(ctx, model, 1, dropout);
    auto bwd = buildExample(ctx, model, 1, dropout);
    ASSERT_TRUE(succeeded(runPipeline(*bwd, "loom-autodiff")));
    std::vector<HostTensor> args = makeArguments(trainStep(*fwd), kVocab, 7);
    auto grads = interpret(trainStep(*bwd), args, {});
    ASSERT_TRUE(bool(grads)) << llvm::toString(grads.takeError());
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    for (unsigned k = 1; k < grads->size(); ++k) {
      unsigned arg = k - 1;
      const std::vector<float> &g = (*grads)[k].data;
      std::vector<double> v(g.size());
      double gnorm = 0, rnorm = 0, vnorm = 0;
      std::vector<double> r(g.size());
      for (size_t i = 0; i < g.size(); ++i) gnorm += double(g[i]) * g[i], r[i] = normal(rng), rnorm += r[i] * r[i];
      for (size_t i = 0; i < g.size(); ++i) v[i] = 0.8 * g[i] / std::sqrt(gnorm) + 0.2 * r[i] / std::sqrt(rnorm);
      for (double x : v) vnorm += x * x;
      double eps = 3e-3, analytic = 0;  // small: LLaMA's rotary softmax logits curve more than GPT's
      for (size_t i = 0; i < g.size(); ++i) analytic += double(g[i]) * v[i] / std::sqrt(vnorm);
      auto lossAt = [&](double sign) {
        std::vector<HostTensor> a = args;
        for (size_t i = 0; i < v.size(); ++i) a[arg].data[i] += float(sign * eps * v[i] / std::sqrt(vnorm));
        return double((*interpret(trainStep(*fwd), a, {}))[0].data[0]);
      };
      double numeric = (lossAt(1) - lossAt(-1)) / (2 * eps);
      EXPECT_LT(std::abs(analytic - numeric) / std::max(std::abs(analytic), 1e-3), 1e-2)
          << model << " " << trainStep(*fwd).getArgAttrOfType<mlir::StringAttr>(arg, attr::kParam).getValue().str()
          << ": analytic " << analytic << " numeric " << numeric;
    }
  }
}

// With dropout on, tensor parallelism keeps dropout outside the parallel regions identical
// across the group, so a t = 2 run is bit-for-bit reproducible and its loss is finite.
TEST(TensorParallel, DropoutRunsAreReproducible) {
  mlir::MLIRContext ctx;
  auto m = buildExample(ctx, "gpt-tiny", 2, 0.1f);
  ASSERT_TRUE(succeeded(runPipeline(*m, "loom-tensor-parallel{tp=2},loom-autodiff")));
  mlir::func::FuncOp f = trainStep(*m);
  auto full = makeArguments(trainStep(*buildExample(ctx, "gpt-tiny", 2, 0.1f)), kVocab, 5);
  auto argsOf = [&](int rank) {
    std::vector<HostTensor> args = full;
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      if (auto dim = f.getArgAttrOfType<mlir::IntegerAttr>(i, attr::kShardDim))
        args[i] = shardOf(full[i], dim.getInt(), 2, rank);
    return args;
  };
  auto a = runRanks(f, {.t = 2}, argsOf), b = runRanks(f, {.t = 2}, argsOf);
  EXPECT_TRUE(std::isfinite(a[0][0].data[0]));
  EXPECT_EQ(a[0][0].data, a[1][0].data);
  for (size_t k = 0; k < a[0].size(); ++k) EXPECT_EQ(a[0][k].data, b[0][k].data);

  // Dropout is really on: the same arguments without it give another loss.
  auto m0 = buildExample(ctx, "gpt-tiny", 2, 0.0f);
  ASSERT_TRUE(succeeded(runPipeline(*m0, "loom-tensor-parallel{tp=2},loom-autodiff")));
  auto off = runRanks(trainStep(*m0), {.t = 2}, argsOf);
  EXPECT_NE(off[0][0].data, a[0][0].data) << "the dropout run's loss equals the dropout-free run's";

  // Inside the parallel regions the masks differ across the group, outside they are the same:
  // the pass marks exactly the attention dropout rank-distinct, and the runtime's stream for
  // a rank-distinct op differs by rank while the others do not.
  int attentions = 0;
  f.walk([&](loom::AttentionOp o) {
    ++attentions;
    EXPECT_EQ(o.getRankDistinctDropout().value_or(""), "tp") << "attention dropout inside a parallel region is rank-identical";
  });
  EXPECT_EQ(attentions, 4);
  f.walk([&](loom::DropoutOp o) { EXPECT_FALSE(o.getRankDistinct().has_value()) << "dropout outside the regions is rank-distinct"; });
  ThreadWorld world({.t = 2});
  auto r0 = world.forRank(0), r1 = world.forRank(1);
  EXPECT_NE(dropoutStream(r0.get(), 3, "tp"), dropoutStream(r1.get(), 3, "tp"));
  EXPECT_EQ(dropoutStream(r0.get(), 3, ""), dropoutStream(r1.get(), 3, ""));
}

}  // namespace
}  // namespace loom::test
