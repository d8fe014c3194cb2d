// What a pipeline rank's NCCL links must carry, counted from its compiled plan (needs no GPU):
// gpt-tiny on (t, p, d) = (1, 2, 1) with 2 micro-batches: stage 0 sends each micro-batch's
// activation to stage 1 and receives its gradient back, stage 1 the reverse, every message
// micro-batch x seq x hidden floats. A peer outside the group is refused before any device
// work. The messages themselves need two GPUs (NCCL will not put two ranks on one device),
// which no check machine has had: that part has not run.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <map>
#include <string>
#include <vector>

#include "protos/plan.pb.h"
#include "runtime/cuda/PipelineLinks.h"
#include "tests/runtime/MultiProcess.h"

namespace loom {
namespace {

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class PipelineNeeds : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/pp_plans";
    test::Result r = test::run(test::runfile("apps/loomc") + " compile " +
                               test::runfile("tests/runtime/Inputs/gpt-tiny-nodropout.pbtxt") + " --cluster " +
                               test::runfile("tests/runtime/Inputs/t1p2d1.pbtxt") + " --out " + dir_ + " --quiet");
    ASSERT_EQ(r.exitCode, 0) << r.output;
  }
  void load(int rank, plan::RankPlan *plan, plan::ProgramSet *programs) {
    ASSERT_TRUE(plan->ParseFromString(readFile(dir_ + "/rank_" + std::to_string(rank) + ".plan.pb")));
    ASSERT_TRUE(programs->ParseFromString(readFile(dir_ + "/" + plan->programs_file())));
  }
  std::string dir_;
};

TEST_F(PipelineNeeds, EachStageSendsAndReceivesOneMessagePerMicroBatch) {
  for (int rank : {0, 1}) {
    plan::RankPlan plan;
    plan::ProgramSet programs;
    load(rank, &plan, &programs);
    if (HasFatalFailure()) return;
    std::vector<cuda::PipelineLinks::Need> needs;
    Status s = cuda::pipelineNeeds(plan, programs, &needs);
    ASSERT_TRUE(s.isOk()) << s.message();
    ASSERT_EQ(needs.size(), 2u) << "rank " << rank;
    for (const cuda::PipelineLinks::Need &n : needs) {
      EXPECT_EQ(n.peer, 1 - rank);
      EXPECT_EQ(n.messages, plan.micro_batches()) << "rank " << rank << (n.send ? " send" : " recv");
      EXPECT_EQ(n.bytes, 4 * int64_t(plan.micro_batch_size()) * plan.seq_length() * plan.hidden_size());  // fp32 plans
    }
    EXPECT_NE(needs[0].send, needs[1].send);
  }
}

// For every link, the sender's messages go out in the order the receiver posts its receives
// (NCCL matches by order): checked by tag on compiled plans of every schedule, with 4 stages
// (2 with 2 chunks each for the interleaved one: gpt-tiny has 4 layers) and 8 micro-batches.
class LinkOrder : public ::testing::TestWithParam<const char *> {};

TEST_P(LinkOrder, SendersAndReceiversAgreeOnEveryLink) {
  std::string schedule = GetParam();
  bool interleaved = schedule == "INTERLEAVED_ONE_F_ONE_B";
  int stages = interleaved ? 2 : 4;
  std::string tmp = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  std::string cluster = tmp + "/" + schedule + ".pbtxt", dir = tmp + "/order_" + schedule;
  {
    std::ofstream f(cluster);
    f << "name: \"pipeline\"\nnodes: 1\ndevices_per_node: " << stages << "\ndevice { kind: CPU }\n"
      << "parallel { pipeline_parallel_size: " << stages << " micro_batch_size: 1 global_batch_size: 8 schedule: "
      << schedule << (interleaved ? " virtual_pipeline_size: 2" : "") << " }\n";
  }
  test::Result r = test::run(test::runfile("apps/loomc") + " compile " +
                             test::runfile("tests/runtime/Inputs/gpt-tiny-nodropout.pbtxt") + " --cluster " + cluster +
                             " --out " + dir + " --quiet");
  ASSERT_EQ(r.exitCode, 0) << r.output;
  std::vector<std::map<std::pair<int, bool>, std::vector<int64_t>>> order(stages);
  for (int rank = 0; rank < stages; ++rank) {
    plan::RankPlan plan;
    plan::ProgramSet programs;
    ASSERT_TRUE(plan.ParseFromString(readFile(dir + "/rank_" + std::to_string(rank) + ".plan.pb")));
    ASSERT_TRUE(programs.ParseFromString(readFile(dir + "/" + plan.programs_file())));
    std::vector<cuda::PipelineLinks::Need> needs;
    Status s = cuda::pipelineNeeds(plan, programs, &needs);
    ASSERT_TRUE(s.isOk()) << s.message();
    order[rank] = cuda::linkMessageOrder(plan, programs);
  }
  int links = 0;
  for (int rank = 0; rank < stages; ++rank)
    for (auto &[key, tags] : order[rank]) {
      auto [peer, send] = key;
      if (!send) continue;
      ++links;
      auto other = order[peer].find({rank, false});
      ASSERT_NE(other, order[peer].end()) << "rank " << rank << " sends to " << peer << ", which never receives";
      EXPECT_EQ(tags, other->second) << schedule << ": link " << rank << " -> " << peer;
    }
  EXPECT_GE(links, 2 * (stages - 1)) << schedule;  // forward and backward between each neighbouring pair
}

INSTANTIATE_TEST_SUITE_P(Schedules, LinkOrder, ::testing::Values("GPIPE", "ONE_F_ONE_B", "INTERLEAVED_ONE_F_ONE_B"));

// Two messages to one peer in one program could not be told apart by NCCL: refused, naming it.
TEST(PipelineLinksLimits, TwoMessagesOverOneLinkInAProgramAreRefused) {
  plan::RankPlan plan;
  plan::ScheduleEntry *entry = plan.add_schedule();
  entry->set_program("forward_0");
  entry->set_micro_batch(0);
  plan::ProgramSet programs;
  plan::Program *p = programs.add_programs();
  p->set_name("forward_0");
  plan::Buffer *b = p->add_buffers();
  b->set_id(0);
  b->add_shape(4);
  for (int k = 0; k < 2; ++k) {
    plan::Instruction *in = p->add_instructions();
    in->set_op("send");
    in->add_inputs(0);
    plan::Attribute *peer = in->add_attributes();
    peer->set_name("peer");
    peer->set_i(1);
  }
  std::vector<cuda::PipelineLinks::Need> needs;
  Status s = cuda::pipelineNeeds(plan, programs, &needs);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("forward_0: two messages to pp position 1"), std::string::npos) << s.message();
}

TEST(PipelineLinksLimits, APeerOutsideTheGroupIsRefused) {
  std::unique_ptr<cuda::PipelineLinks> links;
  Status s = cuda::PipelineLinks::create(nullptr, {0, 1}, 0, {{5, true, 16, 2}}, 1000, &links);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("pipeline peer 5"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace loom
