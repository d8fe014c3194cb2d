// A progress line for long work (tokenizing a corpus, compiling thousands of ranks, a search,
// a large checkpoint): "what: done/total unit (pct%), rate unit/s, ETA 12 s", redrawn in place
// at most ten times a second while the output is a terminal, ended with a summary line. When the
// output is not a terminal (logs, pipes, tests) it prints nothing: the tools' own result lines
// stay the only output. LOOM_PROGRESS=always|never overrides the terminal test.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace loom {

class ProgressMeter {
 public:
  // `total` <= 0: unknown (no percentage or ETA). `bytes`: done and total are bytes, shown in
  // KB/MB/GB. Draws on `out` (stderr by default; null: never).
  ProgressMeter(std::string what, int64_t total, std::string unit, bool bytes = false, FILE *out = stderr);
  ~ProgressMeter();  // finish() if not yet done
  ProgressMeter(const ProgressMeter &) = delete;
  ProgressMeter &operator=(const ProgressMeter &) = delete;

  void update(int64_t done);  // cheap: redraws only when 100 ms have passed
  void add(int64_t n) { update(done_ + n); }
  void finish();              // the final line and a newline (terminal only)
  bool shown() const { return enabled_; }

  // Whether progress lines are drawn on `out` (a terminal, or LOOM_PROGRESS=always).
  static bool enabledFor(FILE *out);
  // The line for a state, without drawing (tests): e.g. "compiling plans: 512/1024 ranks (50%),
  // 120 ranks/s, ETA 4.3 s".
  static std::string format(const std::string &what, int64_t done, int64_t total, const std::string &unit,
                            bool bytes, double seconds);

 private:
  void draw(bool final);

  std::string what_, unit_;
  int64_t total_, done_ = 0;
  bool bytes_, enabled_, finished_ = false;
  FILE *out_;
  size_t lastWidth_ = 0;
  std::chrono::steady_clock::time_point start_, lastDraw_;
};

}  // namespace loom
