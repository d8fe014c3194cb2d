// The trainer's checkpoint shard on the CPU backend: it round-trips, and a ZeRO-1 shard (AdamW's
// moments as raw flat memory) is refused by a plan whose flat parameter layout differs, instead
// of loading moments into the wrong parameters.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "analysis/PlanViews.h"
#include "data/DataSource.h"
#include "runtime/CpuBackend.h"
#include "runtime/ThreadCollectives.h"
#include "train/Trainer.h"

namespace loom {
namespace {

std::string runfile(const std::string &path) {
  const char *dir = std::getenv("TEST_SRCDIR");
  const char *ws = std::getenv("TEST_WORKSPACE");
  return std::string(dir ? dir : ".") + "/" + (ws ? ws : "loom") + "/" + path;
}
std::string tmpdir() { return std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"; }

PlanDirectory compileZero1() {
  std::string cluster = tmpdir() + "/zero1.pbtxt", out = tmpdir() + "/plans_trainer_zero1";
  std::ofstream(cluster) << "name: \"z\"\nnodes: 1\ndevices_per_node: 1\ndevice { kind: CPU }\n"
                            "parallel { micro_batch_size: 2 global_batch_size: 4 zero1: true }\n";
  std::string command = runfile("apps/loomc") + " compile " + runfile("examples/models/gpt-tiny.pbtxt") +
                        " --cluster " + cluster + " --out " + out + " --quiet";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  llvm::Expected<PlanDirectory> dir = readPlanDirectory(out);
  if (!dir) ADD_FAILURE() << llvm::toString(dir.takeError());
  return dir ? std::move(*dir) : PlanDirectory{};
}

TEST(Trainer, AZeroOneShardLoadsOnlyIntoItsFlatLayout) {
  PlanDirectory plans = compileZero1();
  ASSERT_EQ(plans.ranks.size(), 1u);
  ThreadWorld world(ParallelLayout{});
  std::unique_ptr<Collectives> collectives = world.forRank(0);
  SyntheticData data(plans.ranks[0].seq_length(), 1000, 3);
  std::unique_ptr<Trainer> a;
  Status s = Trainer::create(plans.ranks[0], plans.programsOf(0), std::make_unique<CpuBackend>(), collectives.get(),
                             &data, {}, &a);
  ASSERT_TRUE(s.isOk()) << s.message();
  StepResult r;
  double norm = 0;
  bool skipped = false;
  ASSERT_TRUE(a->computeGradients(0, &r).isOk());
  ASSERT_TRUE(a->optimizerStep(1, 1e-3, 1.0, &norm, &skipped).isOk());
  std::string shard = tmpdir() + "/zero1_shard.safetensors";
  ASSERT_TRUE(a->saveShard(shard, {}).isOk());

  std::map<std::string, std::string> meta;
  std::unique_ptr<Trainer> same;
  ASSERT_TRUE(Trainer::create(plans.ranks[0], plans.programsOf(0), std::make_unique<CpuBackend>(), collectives.get(),
                              &data, {}, &same)
                  .isOk());
  s = same->loadShard(shard, &meta);
  EXPECT_TRUE(s.isOk()) << s.message();

  // The same parameters in another flat order (two of them swapped): the shard is refused.
  plan::RankPlan other = plans.ranks[0];
  ASSERT_GE(other.parameters_size(), 2);
  int64_t o0 = other.parameters(0).flat_offset(), o1 = other.parameters(1).flat_offset();
  ASSERT_EQ(other.parameters(0).shape(0) * (other.parameters(0).shape_size() > 1 ? other.parameters(0).shape(1) : 1),
            other.parameters(1).shape(0) * (other.parameters(1).shape_size() > 1 ? other.parameters(1).shape(1) : 1))
      << "the test swaps two parameters of one size";
  other.mutable_parameters(0)->set_flat_offset(o1);
  other.mutable_parameters(1)->set_flat_offset(o0);
  std::unique_ptr<Trainer> b;
  ASSERT_TRUE(Trainer::create(other, plans.programsOf(0), std::make_unique<CpuBackend>(), collectives.get(), &data, {}, &b)
                  .isOk());
  s = b->loadShard(shard, &meta);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("another flat parameter layout"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace loom
