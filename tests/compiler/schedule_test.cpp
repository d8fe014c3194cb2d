// Schedules: every stage runs each micro-batch's forward and backward once per chunk; the
// simulator finds no deadlock in GPipe, 1F1B and interleaved 1F1B, finds one in a schedule
// built to deadlock, and measures the bubble fractions of the PTD-P paper (section 2.2):
// (p - 1) / m for GPipe and 1F1B, (p - 1) / (v m) for interleaved 1F1B.
#include <gtest/gtest.h>

#include <algorithm>

#include "plan/Schedule.h"

namespace loom {
namespace {

struct Shape {
  int p, v, m;
};

void expectComplete(const std::vector<StageSchedule> &schedule, const Shape &s) {
  ASSERT_EQ(int(schedule.size()), s.p);
  for (const StageSchedule &stage : schedule) {
    EXPECT_EQ(int(stage.size()), 2 * s.v * s.m);
    for (int c = 0; c < s.v; ++c)
      for (int mb = 0; mb < s.m; ++mb)
        for (auto type : {Task::kForward, Task::kBackward})
          EXPECT_EQ(std::count(stage.begin(), stage.end(), Task{type, c, mb}), 1);
  }
}

TEST(Schedule, OneFOneBBubbleIsPMinusOneOverM) {
  for (Shape s : {Shape{2, 1, 4}, Shape{4, 1, 4}, Shape{4, 1, 8}, Shape{8, 1, 16}, Shape{3, 1, 7}}) {
    auto sched = buildSchedule(ScheduleKind::kOneFOneB, s.p, 1, s.m);
    ASSERT_TRUE(bool(sched)) << llvm::toString(sched.takeError());
    expectComplete(*sched, s);
    for (auto [tf, tb] : {std::pair{1.0, 1.0}, std::pair{1.0, 2.0}}) {
      Simulation sim = simulate(*sched, s.p, 1, s.m, tf, tb);
      ASSERT_FALSE(sim.deadlock) << sim.diagnosis;
      EXPECT_NEAR(sim.bubbleFraction, double(s.p - 1) / s.m, 1e-12) << "p=" << s.p << " m=" << s.m;
    }
  }
}

TEST(Schedule, GPipeBubbleIsPMinusOneOverM) {
  for (Shape s : {Shape{2, 1, 4}, Shape{4, 1, 8}, Shape{4, 1, 3}}) {
    auto sched = buildSchedule(ScheduleKind::kGPipe, s.p, 1, s.m);
    ASSERT_TRUE(bool(sched));
    expectComplete(*sched, s);
    Simulation sim = simulate(*sched, s.p, 1, s.m);
    ASSERT_FALSE(sim.deadlock) << sim.diagnosis;
    EXPECT_NEAR(sim.bubbleFraction, double(s.p - 1) / s.m, 1e-12);
  }
}

TEST(Schedule, InterleavedBubbleIsPMinusOneOverVM) {
  for (Shape s : {Shape{2, 2, 4}, Shape{4, 2, 8}, Shape{4, 4, 8}, Shape{2, 3, 6}, Shape{8, 2, 16}}) {
    auto sched = buildSchedule(ScheduleKind::kInterleaved, s.p, s.v, s.m);
    ASSERT_TRUE(bool(sched)) << llvm::toString(sched.takeError());
    expectComplete(*sched, s);
    for (auto [tf, tb] : {std::pair{1.0, 1.0}, std::pair{1.0, 2.0}}) {
      Simulation sim = simulate(*sched, s.p, s.v, s.m, tf, tb);
      ASSERT_FALSE(sim.deadlock) << sim.diagnosis;
      EXPECT_NEAR(sim.bubbleFraction, double(s.p - 1) / (s.v * s.m), 1e-12)
          << "p=" << s.p << " v=" << s.v << " m=" << s.m << " tb=" << tb;
    }
  }
}

TEST(Schedule, ABackwardBeforeItsForwardDeadlocks) {
  // Stage 1 (the last) starts with a backward whose forward it has not run, and stage 0
  // waits for that backward: nothing can move.
  std::vector<StageSchedule> bad = {
      {{Task::kForward, 0, 0}, {Task::kBackward, 0, 0}},
      {{Task::kBackward, 0, 0}, {Task::kForward, 0, 0}},
  };
  Simulation sim = simulate(bad, 2, 1, 1);
  EXPECT_TRUE(sim.deadlock);
  EXPECT_NE(sim.diagnosis.find("stage 1 is stuck at backward(virtual stage 1, micro-batch 0)"), std::string::npos)
      << sim.diagnosis;
  EXPECT_NE(sim.diagnosis.find("stage 0 is stuck at backward(virtual stage 0, micro-batch 0), waiting for backward of "
                               "virtual stage 1 (stage 1)"),
            std::string::npos)
      << sim.diagnosis;
}

TEST(Schedule, CrossedMicroBatchesDeadlock) {
  // Stage 1 insists on micro-batch 1 first, stage 0 waits for micro-batch 0's backward
  // before sending micro-batch 1: a cycle.
  std::vector<StageSchedule> bad = {
      {{Task::kForward, 0, 0}, {Task::kBackward, 0, 0}, {Task::kForward, 0, 1}, {Task::kBackward, 0, 1}},
      {{Task::kForward, 0, 1}, {Task::kBackward, 0, 1}, {Task::kForward, 0, 0}, {Task::kBackward, 0, 0}},
  };
  Simulation sim = simulate(bad, 2, 1, 2);
  EXPECT_TRUE(sim.deadlock);
  EXPECT_NE(sim.diagnosis.find("waiting for forward of virtual stage 0"), std::string::npos) << sim.diagnosis;
}

TEST(Schedule, BadShapesNameTheNumbers) {
  auto e1 = buildSchedule(ScheduleKind::kOneFOneB, 4, 1, 2);
  ASSERT_FALSE(bool(e1));
  EXPECT_EQ(llvm::toString(e1.takeError()), "1F1B needs at least as many micro-batches as stages: m = 2 < p = 4");
  auto e2 = buildSchedule(ScheduleKind::kInterleaved, 4, 2, 6);
  ASSERT_FALSE(bool(e2));
  EXPECT_EQ(llvm::toString(e2.takeError()), "interleaved 1F1B needs m to be a multiple of p: m = 6, p = 4");
}

}  // namespace
}  // namespace loom
