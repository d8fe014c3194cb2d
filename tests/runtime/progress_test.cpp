// Progress reports of a backend that issues instructions ahead of their completion (the CUDA
// executor's way, runtime/Progress.h): what is in flight per stream, waits across streams and
// program runs, call numbers of collectives, and the completed count.
#include "runtime/Progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <thread>

namespace loom {
namespace {

// Completion decided by the test: token t is complete once marked.
class MarkedProbe : public CompletionProbe {
 public:
  bool done(uint64_t token) override { return complete.count(token) > 0; }
  void release(uint64_t token) override { released.insert(token); }
  std::set<uint64_t> complete, released;
};

plan::Instruction *add(plan::Program &p, const std::string &op, plan::Stream stream, int layer,
                       std::vector<int> waitFor = {}, const std::string &group = "") {
  plan::Instruction *in = p.add_instructions();
  in->set_op(op), in->set_stream(stream), in->set_layer(layer);
  for (int w : waitFor) in->add_wait_for(w);
  if (!group.empty()) {
    plan::Attribute *a = in->add_attributes();
    a->set_name("group"), a->set_s(group);
  }
  return in;
}

// forward_0: 0 linear (compute), 1 all_reduce@tp (tp stream, waits for 0), 2 gelu (compute,
// waits for 1), 3 linear (compute).
plan::Program forward() {
  plan::Program p;
  p.set_name("forward_0");
  add(p, "linear", plan::COMPUTE, 0);
  add(p, "all_reduce", plan::TP, 0, {0}, "tp");
  add(p, "gelu", plan::COMPUTE, 0, {1});
  add(p, "linear", plan::COMPUTE, 1);
  return p;
}

TEST(Progress, TheDevicesFirstIncompleteInstructionIsInFlight) {
  plan::Program p = forward();
  Progress progress;
  MarkedProbe probe;
  for (int i = 0; i < 4; ++i) progress.issued(p, 0, i, /*run=*/0, &probe, uint64_t(i));
  Progress::Report r = progress.report();
  EXPECT_EQ(r.completed, 0);
  EXPECT_FALSE(r.idle);
  EXPECT_FALSE(r.waiting);
  // The all-reduce waits for the linear (not started): only the linear is in flight.
  EXPECT_EQ(r.where, "forward_0 mb 0 at instruction 0 (linear, layer 0)");

  probe.complete.insert(0);
  r = progress.report();
  EXPECT_EQ(r.completed, 1);
  // The gelu waits for the all-reduce: the rank waits on communication.
  EXPECT_TRUE(r.waiting);
  EXPECT_EQ(r.where, "all_reduce@tp #0 of forward_0 mb 0");
  EXPECT_EQ(probe.released, std::set<uint64_t>{0});

  probe.complete.insert({1, 2, 3});
  r = progress.report();
  EXPECT_EQ(r.completed, 4);
  EXPECT_TRUE(r.idle);
  EXPECT_EQ(probe.released.size(), 4u);
}

TEST(Progress, ALaterRunWaitsForTheEarlierOne) {
  plan::Program p = forward();
  Progress progress;
  MarkedProbe probe;
  for (int i = 0; i < 4; ++i) progress.issued(p, 0, i, 0, &probe, uint64_t(i));
  for (int i = 0; i < 4; ++i) progress.issued(p, 1, i, 1, &probe, uint64_t(10 + i));
  probe.complete.insert({0, 1, 2});
  Progress::Report r = progress.report();
  // Run 0's last linear runs; run 1's all-reduce (tp stream front) has not started.
  EXPECT_FALSE(r.waiting);
  EXPECT_EQ(r.where, "forward_0 mb 0 at instruction 3 (linear, layer 1)");
  probe.complete.insert({3, 10});
  r = progress.report();
  EXPECT_TRUE(r.waiting);
  // Collectives are numbered per group in issue order: run 1's is the second.
  EXPECT_EQ(r.where, "all_reduce@tp #1 of forward_0 mb 1");
}

TEST(Progress, StartedInstructionsAndIssuedOnesReportTogether) {
  plan::Program p = forward();
  Progress progress;
  MarkedProbe probe;
  progress.started(p, 0, 0);
  EXPECT_EQ(progress.report().where, "forward_0 mb 0 at instruction 0 (linear, layer 0)");
  progress.finished(p, 0);
  Progress::Report r = progress.report();
  EXPECT_EQ(r.completed, 1);
  EXPECT_TRUE(r.idle);
  EXPECT_EQ(r.where, "between programs");
}

TEST(Progress, ADetachedProbeReleasesItsTokensAndIsNoLongerAsked) {
  plan::Program p = forward();
  Progress progress;
  {
    MarkedProbe probe;
    progress.issued(p, 0, 0, 0, &probe, 7);
    progress.detach(&probe);
    EXPECT_EQ(probe.released, std::set<uint64_t>{7});
  }
  Progress::Report r = progress.report();  // would ask the destroyed probe if it were still held
  EXPECT_TRUE(r.idle);
  EXPECT_EQ(r.completed, 0);
}

// The straggler report's measure: time inside instructions that are not communication.
TEST(Progress, ComputeSecondsCountKernelsNotCommunication) {
  plan::Program p = forward();
  Progress progress;
  EXPECT_EQ(progress.computeSeconds(), -1);  // nothing timed yet
  progress.started(p, 0, 0);                 // linear: 30 ms
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  progress.finished(p, 0);
  progress.started(p, 0, 1);                 // all_reduce: 200 ms, not counted
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  progress.finished(p, 1);
  double s = progress.computeSeconds();
  EXPECT_GE(s, 0.030);
  EXPECT_LT(s, 0.200);
}

}  // namespace
}  // namespace loom
