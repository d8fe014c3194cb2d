// The dynamic loss scaler's schedule: halve and skip on overflow (not below the minimum),
// double after growthInterval clean steps in a row, and refuse configs that cannot scale.
#include "train/LossScaler.h"

#include <gtest/gtest.h>

#include <string>

namespace loom {
namespace {

LossScalerConfig smallConfig() {
  LossScalerConfig c;
  c.initialScale = 1024;
  c.growthInterval = 3;
  c.minScale = 256;
  return c;
}

TEST(LossScaler, OverflowSkipsTheStepAndHalvesTheScale) {
  LossScaler s(smallConfig());
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_DOUBLE_EQ(s.unscaleFactor(), 1.0 / 512);
  EXPECT_TRUE(s.update(true));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 256) << "the scale stops at min_scale";
}

TEST(LossScaler, GrowsAfterAnUnbrokenRunOfCleanSteps) {
  LossScaler s(smallConfig());
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_EQ(s.cleanSteps(), 0);
}

TEST(LossScaler, AnOverflowRestartsTheCleanRun) {
  LossScaler s(smallConfig());
  s.update(false);
  s.update(false);
  s.update(true);  // 1024 -> 512, run restarts
  EXPECT_EQ(s.scale(), 512);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 512);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024);
}

TEST(LossScaler, RefusesConfigsThatCannotScaleNamingTheField) {
  EXPECT_TRUE(LossScaler::validate(LossScalerConfig{}).isOk());
  struct Case {
    void (*mutate)(LossScalerConfig &);
    const char *field;
  } cases[] = {
      {[](LossScalerConfig &c) { c.minScale = 0; }, "min_scale"},
      {[](LossScalerConfig &c) { c.initialScale = 0.5; }, "initial_scale"},
      {[](LossScalerConfig &c) { c.growthFactor = 1; }, "growth_factor"},
      {[](LossScalerConfig &c) { c.backoffFactor = 1; }, "backoff_factor"},
      {[](LossScalerConfig &c) { c.backoffFactor = 0; }, "backoff_factor"},
      {[](LossScalerConfig &c) { c.growthInterval = 0; }, "growth_interval"},
  };
  for (const Case &k : cases) {
    LossScalerConfig c;
    k.mutate(c);
    Status s = LossScaler::validate(c);
    ASSERT_FALSE(s.isOk()) << k.field;
    EXPECT_NE(s.message().find(k.field), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace loom
