// The trainer's checkpoint file on the CPU backend: a ZeRO-1 rank's pieces (AdamW's moments cut
// from its flat shard) load into a plan whose flat parameter layout differs, each moment into
// its own parameter. The step driver's context-parallel cut of a micro-batch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "analysis/PlanViews.h"
#include "data/DataSource.h"
#include "formats/Checkpoint.h"
#include "runtime/CpuBackend.h"
#include "runtime/ThreadCollectives.h"
#include "train/StepDriver.h"
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

// A ZeRO-1 checkpoint is layout-independent: written by a plan, it loads into a plan whose flat
// buffer orders the parameters differently (two swapped), and both then take the same step.
TEST(Trainer, AZeroOneCheckpointLoadsIntoAnotherFlatLayout) {
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
  std::string root = tmpdir() + "/zero1_checkpoint";
  std::filesystem::remove_all(root);
  std::string partial = checkpointDir(root, 1, true);
  std::filesystem::create_directories(partial);
  ASSERT_TRUE(a->saveShard(checkpointFile(partial, 0), {}).isOk());
  ASSERT_TRUE(publishCheckpoint(root, 1, 1, {{"iteration", "1"}}).isOk());
  CheckpointIndex index;
  s = readVerifiedCheckpointIndex(root, 1, &index);
  ASSERT_TRUE(s.isOk()) << s.message();

  // The same parameters in another flat order (two of them swapped).
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
  s = b->loadResharded(checkpointDir(root, 1), index);
  ASSERT_TRUE(s.isOk()) << s.message();
  // The same next step: parameters equal by name after it (the moments came across too: a
  // zeroed AdamW state would step differently).
  for (Trainer *t : {a.get(), b.get()}) {
    ASSERT_TRUE(t->computeGradients(1, &r).isOk());
    ASSERT_TRUE(t->optimizerStep(2, 1e-3, 1.0, &norm, &skipped).isOk());
  }
  std::map<std::string, HostTensor> pa, pb;
  ASSERT_TRUE(a->hostParameters(&pa).isOk());
  ASSERT_TRUE(b->hostParameters(&pb).isOk());
  for (auto &[name, t] : pa) EXPECT_EQ(t.data, pb.at(name).data) << name;
  // A fresh trainer (moments zero) steps differently: the comparison above can fail.
  std::unique_ptr<Trainer> fresh;
  ASSERT_TRUE(Trainer::create(other, plans.programsOf(0), std::make_unique<CpuBackend>(), collectives.get(), &data, {},
                              &fresh)
                  .isOk());
  std::map<std::string, HostTensor> before;
  ASSERT_TRUE(b->hostParameters(&before).isOk());
  ASSERT_TRUE(fresh->loadGlobalParameters(before).isOk());  // parameters, not moments
  ASSERT_TRUE(fresh->computeGradients(2, &r).isOk());
  ASSERT_TRUE(b->computeGradients(2, &r).isOk());
  ASSERT_TRUE(fresh->optimizerStep(3, 1e-3, 1.0, &norm, &skipped).isOk());
  ASSERT_TRUE(b->optimizerStep(3, 1e-3, 1.0, &norm, &skipped).isOk());
  std::map<std::string, HostTensor> pf;
  ASSERT_TRUE(fresh->hostParameters(&pf).isOk());
  ASSERT_TRUE(b->hostParameters(&pb).isOk());
  bool differs = false;
  for (auto &[name, t] : pf) differs |= t.data != pb.at(name).data;
  EXPECT_TRUE(differs);
}

// Context parallelism cuts each sample into 2c chunks, cp rank r keeping chunks r and 2c-1-r;
// a loss_mask whose tokens are not spread evenly over the cp ranks is refused (each rank's
// mean averaged would not be the sequence's), one whose are is cut like the rest.
TEST(StepDriver, ContextChunksCutTheSequenceAndRefuseAnUnevenLossMask) {
  HostTensor tokens{{2, 8}}, mask{{2, 8}};
  tokens.isInt = true;
  for (int i = 0; i < 16; ++i) tokens.ints.push_back(i);
  mask.data.assign(16, 1.0f);
  std::map<std::string, HostTensor> cut;
  ASSERT_TRUE(contextChunksOf({{"tokens", tokens}, {"loss_mask", mask}}, ContextChunks{8, 2, 1}, 3, &cut).isOk());
  EXPECT_EQ(cut["tokens"].shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(cut["tokens"].ints, (std::vector<int32_t>{2, 3, 4, 5, 10, 11, 12, 13}));
  EXPECT_EQ(cut["loss_mask"].data.size(), 8u);

  mask.data[0] = 0;  // sample 0, position 0: cp rank 0's chunk 0
  Status s = contextChunksOf({{"tokens", tokens}, {"loss_mask", mask}}, ContextChunks{8, 2, 1}, 3, &cut);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("micro-batch 3's loss_mask holds 7 tokens in cp rank 0's chunks and 8 in cp rank 1's"),
            std::string::npos)
      << s.message();

  mask.data[8 + 4] = 0;  // sample 1, position 4: cp rank 1's chunk 2; 7 and 7
  ASSERT_TRUE(contextChunksOf({{"tokens", tokens}, {"loss_mask", mask}}, ContextChunks{8, 2, 0}, 3, &cut).isOk());
  EXPECT_EQ(cut["tokens"].ints, (std::vector<int32_t>{0, 1, 6, 7, 8, 9, 14, 15}));
  EXPECT_EQ(cut["loss_mask"].data, (std::vector<float>{0, 1, 1, 1, 1, 1, 1, 1}));
}

}  // namespace
}  // namespace loom
