// The plans the GPU tests run: LOOM_TEST_PLANS names a directory compiled beforehand (the GPU
// pack carries plans, not loomc and LLVM); otherwise gpt-tiny without dropout is compiled here
// for one rank with the loomc of this build.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "protos/plan.pb.h"
#include "tests/runtime/MultiProcess.h"

namespace loom::test {

inline std::string readWholeFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Fills rank 0's plan and its programs (gtest assertions on failure).
inline void loadGptTinyPlan(plan::RankPlan *rank, plan::ProgramSet *programs) {
  const char *prebuilt = std::getenv("LOOM_TEST_PLANS");
  std::string dir = prebuilt ? prebuilt
                             : std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/cuda_plans";
  if (!prebuilt) {
    Result r = run(runfile("compiler/loomc") + " compile " + runfile("tests/runtime/Inputs/gpt-tiny-nodropout.pbtxt") +
                   " --cluster " + runfile("tests/runtime/Inputs/t1p1d1.pbtxt") + " --out " + dir + " --quiet");
    ASSERT_EQ(r.exitCode, 0) << r.output;
  }
  ASSERT_TRUE(rank->ParseFromString(readWholeFile(dir + "/rank_0.plan.pb"))) << dir;
  ASSERT_TRUE(programs->ParseFromString(readWholeFile(dir + "/" + rank->programs_file()))) << dir;
  ASSERT_GT(programs->programs_size(), 0);
}

}  // namespace loom::test
