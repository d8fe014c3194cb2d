// The progress line's text (runtime/ProgressMeter.h), and its silence off a terminal.
#include "support/ProgressMeter.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace loom {
namespace {

TEST(ProgressMeter, LineShowsCountRateAndEta) {
  EXPECT_EQ(ProgressMeter::format("compiling plans", 256, 1024, "ranks", false, 2.0),
            "compiling plans: 256/1024 ranks (25%), 128 ranks/s, ETA 6.0 s");
  EXPECT_EQ(ProgressMeter::format("compiling plans", 1024, 1024, "ranks", false, 8.0),
            "compiling plans: 1024/1024 ranks (100%), 128 ranks/s, 8.0 s");
  EXPECT_EQ(ProgressMeter::format("saving checkpoint", 1500000000, 3000000000, "", true, 10.0),
            "saving checkpoint: 1.50 GB/3.00 GB (50%), 150.0 MB/s, ETA 10 s");
  EXPECT_EQ(ProgressMeter::format("searching", 5, 0, "configurations", false, 0.0), "searching: 5 configurations");
  EXPECT_EQ(ProgressMeter::format("searching", 3, 32, "configurations", false, 4.0),
            "searching: 3/32 configurations (9%), 0.8 configurations/s, ETA 39 s");
  EXPECT_EQ(ProgressMeter::format("x", 1, 1000, "items", false, 1.0), "x: 1/1000 items (0%), 1.0 items/s, ETA 16m39s");
}

// Off a terminal nothing is drawn; LOOM_PROGRESS=always draws (what a terminal would show).
TEST(ProgressMeter, SilentOffATerminal) {
  for (const char *mode : {"never", "always"}) {
    setenv("LOOM_PROGRESS", mode, 1);
    FILE *f = std::tmpfile();
    {
      ProgressMeter m("tokenizing", 10, "documents", false, f);
      for (int i = 1; i <= 10; ++i) m.update(i);
    }
    std::fflush(f);
    long size = std::ftell(f);
    std::rewind(f);
    std::string text(size_t(size), '\0');
    size_t got = std::fread(text.data(), 1, text.size(), f);
    text.resize(got);
    std::fclose(f);
    if (std::string(mode) == "never")
      EXPECT_EQ(text, "");
    else
      EXPECT_NE(text.find("tokenizing: 10/10 documents (100%)"), std::string::npos) << text;
  }
  unsetenv("LOOM_PROGRESS");
}

}  // namespace
}  // namespace loom
