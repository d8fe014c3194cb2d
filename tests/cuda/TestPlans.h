// The plans the GPU tests run: gpt-tiny without dropout for one rank (cluster t1p1d1, or
// t1p1d1_bf16 in bf16), and bert-tiny (t1p1d1, t1p1d1_bf16). (ZeRO-1 on one rank is the plain
// plan: its sharded programs need d > 1, more GPUs than a check machine has.)
// LOOM_TEST_PLANS (LOOM_TEST_PLANS_BF16, LOOM_TEST_PLANS_BERT,
// LOOM_TEST_PLANS_BERT_BF16) names a directory compiled beforehand (the GPU pack carries plans,
// not loomc and LLVM); otherwise they are compiled here with the loomc of this build.
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

// Fills rank 0's plan and its programs (gtest assertions on failure) for `model` (a runfile
// path) on cluster tests/runtime/Inputs/<cluster>.pbtxt; `env` names the variable of a prebuilt
// directory.
inline void loadPlanFor(const std::string &model, const std::string &cluster, const char *env, plan::RankPlan *rank,
                        plan::ProgramSet *programs) {
  const char *prebuilt = std::getenv(env);
  std::string stem = model.substr(model.rfind('/') + 1);
  stem = stem.substr(0, stem.find('.'));
  std::string dir = prebuilt ? prebuilt
                             : std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
                                   "/cuda_plans_" + stem + "_" + cluster;
  if (!prebuilt) {
    Result r = run(runfile("apps/loomc") + " compile " + runfile(model) +
                   " --cluster " + runfile("tests/runtime/Inputs/" + cluster + ".pbtxt") + " --out " + dir + " --quiet");
    ASSERT_EQ(r.exitCode, 0) << r.output;
  }
  ASSERT_TRUE(rank->ParseFromString(readWholeFile(dir + "/rank_0.plan.pb"))) << dir;
  ASSERT_TRUE(programs->ParseFromString(readWholeFile(dir + "/" + rank->programs_file()))) << dir;
  ASSERT_GT(programs->programs_size(), 0);
}

inline constexpr const char *kGptTiny = "tests/runtime/Inputs/gpt-tiny-nodropout.pbtxt";

inline void loadGptTinyPlan(plan::RankPlan *rank, plan::ProgramSet *programs) {
  loadPlanFor(kGptTiny, "t1p1d1", "LOOM_TEST_PLANS", rank, programs);
}

// The bf16 plan of gpt-tiny (t1p1d1_bf16: 16-bit activations, stashes and weight copies).
inline void loadGptTinyBf16Plan(plan::RankPlan *rank, plan::ProgramSet *programs) {
  loadPlanFor(kGptTiny, "t1p1d1_bf16", "LOOM_TEST_PLANS_BF16", rank, programs);
}

// bert-tiny (padded keys, token types, the sentence-order head), fp32 or its bf16 plan.
inline void loadBertTinyPlan(plan::RankPlan *rank, plan::ProgramSet *programs, bool bf16 = false) {
  loadPlanFor("examples/models/bert-tiny.pbtxt", bf16 ? "t1p1d1_bf16" : "t1p1d1",
              bf16 ? "LOOM_TEST_PLANS_BERT_BF16" : "LOOM_TEST_PLANS_BERT", rank, programs);
}

}  // namespace loom::test
