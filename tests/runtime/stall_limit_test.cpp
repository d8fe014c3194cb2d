// The coordinator's stall limit (CoordinatorService::poll): max(minStallSeconds, 3 x the
// longest iteration), or the first-step limit before any iteration was timed. Iterations far
// shorter than the heartbeat period (gpt-tiny on a GPU: ~10 ms, 20 of them between two
// heartbeats) are timed by the rank itself (HeartbeatRequest.longest_step_seconds): from the
// step numbers alone the coordinator saw none, and a stalled GPU rank waited for the 60 s
// first-step limit (seen on an H200, 2026-12-04).
#include <grpcpp/test/server_context_test_spouse.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "runtime/control/CoordinatorService.h"

namespace loom::control {
namespace {

void heartbeat(CoordinatorService &service, int64_t step, double longestStepSeconds) {
  grpc::ServerContext ctx;
  grpc::testing::ServerContextTestSpouse spouse(&ctx);
  spouse.AddClientMetadata("loom-token", "token");
  HeartbeatRequest req;
  req.set_rank(0);
  req.set_step(step);
  req.set_completed(1234);  // the same count each time: no instruction finished in between
  req.set_where("forward_0 mb 0 at instruction 2 (linear, layer 0)");
  req.set_longest_step_seconds(longestStepSeconds);
  HeartbeatReply reply;
  ASSERT_TRUE(service.Heartbeat(&ctx, &req, &reply).ok());
}

CoordinatorOptions options() {
  CoordinatorOptions o{"", "token", 1, 10, 120};
  o.minStallSeconds = 0.05, o.firstStepStallSeconds = 60;
  return o;
}

TEST(StallLimit, ARankThatTimesItsShortStepsIsNamedAfterTheShortLimit) {
  CoordinatorService service(options());
  heartbeat(service, 20, 0.01);  // first heartbeat already at step 20
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  heartbeat(service, 20, 0.01);
  service.poll();  // aborts the job (poll returns true once the ranks had time to hear it)
  EXPECT_NE(service.abortReason().find("rank 0 stopped in forward_0 mb 0 at instruction 2 (linear, layer 0)"),
            std::string::npos)
      << service.abortReason();
  EXPECT_NE(service.abortReason().find("limit 0 s"), std::string::npos) << service.abortReason();
}

TEST(StallLimit, WithoutATimedStepTheFirstStepLimitHolds) {
  CoordinatorService service(options());
  heartbeat(service, 20, 0);  // steps seen only as numbers: none timed
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  heartbeat(service, 20, 0);
  service.poll();
  EXPECT_EQ(service.abortReason(), "");
}

}  // namespace
}  // namespace loom::control
