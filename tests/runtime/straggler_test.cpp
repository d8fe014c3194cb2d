// The coordinator's straggler report (CoordinatorService::ReportMetrics): each rank's compute
// time against the median of the ranks of its pipeline stage, named above 10%.
#include <grpcpp/test/server_context_test_spouse.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "runtime/control/CoordinatorService.h"

namespace loom::control {
namespace {

struct Report {
  int rank, stage;
  double seconds;
};

// Every rank reports step 1; the last report's reply is the verdict.
MetricsReply verdict(int world, const std::vector<Report> &reports) {
  CoordinatorService service(CoordinatorOptions{"", "token", world, 10, 120});
  MetricsReply reply;
  for (const Report &r : reports) {
    grpc::ServerContext ctx;
    grpc::testing::ServerContextTestSpouse spouse(&ctx);
    spouse.AddClientMetadata("loom-token", "token");
    MetricsRequest req;
    req.set_rank(r.rank);
    req.set_step(1);
    (*req.mutable_values())["compute-seconds"] = r.seconds;
    (*req.mutable_values())["pipeline-stage"] = r.stage;
    reply.Clear();
    EXPECT_TRUE(service.ReportMetrics(&ctx, &req, &reply).ok());
  }
  return reply;
}

TEST(Straggler, ARankSlowerThanItsStagePeersIsNamed) {
  // Stage 0: ranks 0, 1; stage 1: ranks 2, 3 (the output layer: twice the work by design).
  MetricsReply r = verdict(4, {{0, 0, 1.0}, {1, 0, 1.0}, {2, 1, 2.0}, {3, 1, 2.6}});
  EXPECT_TRUE(r.complete());
  EXPECT_TRUE(r.straggler());
  EXPECT_EQ(r.slowest_rank(), 3);
  EXPECT_EQ(r.stage(), 1);
  EXPECT_DOUBLE_EQ(r.median_seconds(), 2.3);
}

TEST(Straggler, StagesOfDifferentWorkAreNotStragglers) {
  MetricsReply r = verdict(4, {{0, 0, 1.0}, {1, 0, 1.05}, {2, 1, 2.0}, {3, 1, 2.1}});
  EXPECT_TRUE(r.complete());
  EXPECT_FALSE(r.straggler());
}

TEST(Straggler, AStageOfOneRankHasNobodyToCompareWith) {
  MetricsReply r = verdict(2, {{0, 0, 1.0}, {1, 1, 5.0}});
  EXPECT_TRUE(r.complete());
  EXPECT_FALSE(r.straggler());
}

TEST(Straggler, NoVerdictUntilEveryRankReported) {
  MetricsReply r = verdict(3, {{0, 0, 1.0}, {1, 0, 3.0}});
  EXPECT_FALSE(r.complete());
  EXPECT_FALSE(r.straggler());
}

// The median of an odd stage is its middle rank.
TEST(Straggler, MedianOfThree) {
  MetricsReply r = verdict(3, {{0, 0, 1.0}, {1, 0, 1.4}, {2, 0, 1.15}});
  EXPECT_TRUE(r.straggler());
  EXPECT_EQ(r.slowest_rank(), 1);
  EXPECT_DOUBLE_EQ(r.median_seconds(), 1.15);
  r = verdict(3, {{0, 0, 1.0}, {1, 0, 1.1}, {2, 0, 1.05}});
  EXPECT_FALSE(r.straggler());  // 1.1 / 1.05 = 1.048
}

}  // namespace
}  // namespace loom::control
