// loom-rank's training flags as loomrun sees them (apps/RankFlags.h): parsed and checked by
// llvm::cl, and passed on to the ranks exactly as they were given.
#include "apps/RankFlags.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/CommandLine.h"

namespace loom::rankflags {
namespace {

// Parses `args` (after a program name) and returns the rank arguments it recorded.
bool parse(std::vector<std::string> args, std::vector<std::string> *forwarded) {
  llvm::cl::ResetAllOptionOccurrences();
  args.insert(args.begin(), "loomrun");
  std::vector<const char *> argv;
  for (const std::string &a : args) argv.push_back(a.c_str());
  size_t before = forwardedArguments().size();
  bool ok = parseCommandLine(int(argv.size()), argv.data(), "test\n", {&category});
  forwarded->assign(forwardedArguments().begin() + before, forwardedArguments().end());
  return ok;
}

TEST(RankFlags, EveryFormIsParsedAndForwardedAsGiven) {
  std::vector<std::string> forwarded;
  ASSERT_TRUE(parse({"--steps", "3", "--lr=1e-3", "--resume", "--save", "", "--seed", "-5", "--data-prefix=a=b",
                     "--steps=4", "--strict-resume=false"},
                    &forwarded));
  EXPECT_EQ(forwarded, (std::vector<std::string>{"--steps=3", "--lr=1e-3", "--resume", "--save=", "--seed=-5",
                                                 "--data-prefix=a=b", "--steps=4", "--strict-resume=false"}));
  EXPECT_EQ(steps, 4);  // the last occurrence wins
  EXPECT_EQ(lr, 1e-3);
  EXPECT_TRUE(resume);
  EXPECT_FALSE(strictResume);
  EXPECT_EQ(seed, -5);
  EXPECT_EQ(std::string(dataPrefix), "a=b");
  EXPECT_TRUE(save.getNumOccurrences());
  EXPECT_EQ(std::string(save), "");
  EXPECT_FALSE(minLr.getNumOccurrences());  // --min-lr defaults to --lr / 10 in loom-rank
}

TEST(RankFlags, DefaultsAreLoomRanksOwn) {
  std::vector<std::string> forwarded;
  ASSERT_TRUE(parse({}, &forwarded));
  EXPECT_TRUE(forwarded.empty());
  EXPECT_EQ(steps, 1);
  EXPECT_EQ(lr, 3e-4);
  EXPECT_EQ(seed, 1234);
  EXPECT_EQ(clipGrad, 1.0);
  EXPECT_EQ(weightDecay, 0.1);
  EXPECT_EQ(adamBeta1, 0.9);
  EXPECT_EQ(adamBeta2, 0.95);
  EXPECT_EQ(adamEps, 1e-8);
  EXPECT_EQ(validFraction, 0.05);
  EXPECT_EQ(evalIters, 1);
  EXPECT_EQ(connectTimeout, 20);
  EXPECT_EQ(commTimeout, 30);
  EXPECT_EQ(std::string(address), "127.0.0.1");
  EXPECT_EQ(std::string(device), "cpu");
  EXPECT_EQ(std::string(attention), "auto");
}

TEST(RankFlags, MalformedOnesAreRefused) {
  std::vector<std::string> forwarded;
  EXPECT_FALSE(parse({"--lr", "fast"}, &forwarded));
  EXPECT_FALSE(parse({"--steps", "3.5"}, &forwarded));
  EXPECT_FALSE(parse({"--stpes", "3"}, &forwarded));
  EXPECT_FALSE(parse({"--rank", "0"}, &forwarded));  // loomrun sets each rank's --rank itself
  EXPECT_FALSE(parse({"--steps"}, &forwarded));
}

// Every option of the category is a RankOpt (loomrun passes it on) and says what it does.
TEST(RankFlags, EveryOptionIsForwardedAndDescribed) {
  std::vector<std::string> args, expected;
  for (auto &entry : llvm::cl::getRegisteredOptions()) {
    llvm::StringRef name = entry.getKey();
    llvm::cl::Option *option = entry.getValue();
    bool ours = false;
    for (llvm::cl::OptionCategory *c : option->Categories) ours |= c == &category;
    if (!ours) continue;
    EXPECT_FALSE(option->HelpStr.empty()) << "--" << name.str() << " has no description";
    bool isSwitch = option->getValueExpectedFlag() != llvm::cl::ValueRequired;
    args.push_back(isSwitch ? "--" + name.str() : "--" + name.str() + "=1");
    expected.push_back(args.back());
  }
  EXPECT_GE(args.size(), 30u);
  std::vector<std::string> forwarded;
  ASSERT_TRUE(parse(args, &forwarded));
  EXPECT_EQ(forwarded, expected);
}

}  // namespace
}  // namespace loom::rankflags
