#include "support/ProgressMeter.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace loom {

namespace {
using Clock = std::chrono::steady_clock;

std::string amount(double v, bool bytes) {
  char text[32];
  if (!bytes) {
    std::snprintf(text, sizeof text, "%.0f", v);
  } else if (v >= 1e9) {
    std::snprintf(text, sizeof text, "%.2f GB", v / 1e9);
  } else if (v >= 1e6) {
    std::snprintf(text, sizeof text, "%.1f MB", v / 1e6);
  } else {
    std::snprintf(text, sizeof text, "%.0f KB", v / 1e3);
  }
  return text;
}

std::string duration(double s) {
  char text[32];
  if (s < 10)
    std::snprintf(text, sizeof text, "%.1f s", s);
  else if (s < 60)
    std::snprintf(text, sizeof text, "%.0f s", std::ceil(s));
  else if (s < 3600)
    std::snprintf(text, sizeof text, "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(text, sizeof text, "%dh%02dm", int(s) / 3600, int(s) % 3600 / 60);
  return text;
}
}  // namespace

bool ProgressMeter::enabledFor(FILE *out) {
  if (!out) return false;
  if (const char *mode = std::getenv("LOOM_PROGRESS")) {
    if (!std::strcmp(mode, "always")) return true;
    if (!std::strcmp(mode, "never")) return false;
  }
  return isatty(fileno(out));
}

std::string ProgressMeter::format(const std::string &what, int64_t done, int64_t total, const std::string &unit,
                                  bool bytes, double seconds) {
  std::string line = what + ": " + amount(double(done), bytes);
  if (total > 0) line += "/" + amount(double(total), bytes);
  if (!bytes) line += " " + unit;
  char text[64];
  if (total > 0) {
    std::snprintf(text, sizeof text, " (%.0f%%)", 100.0 * double(done) / double(total));
    line += text;
  }
  if (seconds > 0 && done > 0) {
    double rate = double(done) / seconds;
    char slow[32];  // a count's rate under 10 per second keeps a decimal ("0.9 configurations/s")
    std::snprintf(slow, sizeof slow, "%.1f", rate);
    line += ", " + (bytes || rate >= 10 ? amount(rate, bytes) : std::string(slow)) + (bytes ? "/s" : " " + unit + "/s");
    if (total > 0 && done < total) line += ", ETA " + duration(double(total - done) / rate);
    if (total > 0 && done >= total) line += ", " + duration(seconds);
  }
  return line;
}

ProgressMeter::ProgressMeter(std::string what, int64_t total, std::string unit, bool bytes, FILE *out)
    : what_(std::move(what)), unit_(std::move(unit)), total_(total), bytes_(bytes), enabled_(enabledFor(out)),
      out_(out), start_(Clock::now()), lastDraw_(start_) {}

ProgressMeter::~ProgressMeter() { finish(); }

void ProgressMeter::update(int64_t done) {
  done_ = done;
  if (!enabled_ || finished_) return;
  Clock::time_point now = Clock::now();
  if (now - lastDraw_ < std::chrono::milliseconds(100)) return;
  lastDraw_ = now;
  draw(false);
}

void ProgressMeter::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) draw(true);
}

void ProgressMeter::draw(bool final) {
  double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  std::string line = format(what_, done_, total_, unit_, bytes_, seconds);
  // Pad over what the previous, longer line left on the screen.
  size_t width = line.size();
  if (width < lastWidth_) line.append(lastWidth_ - width, ' ');
  lastWidth_ = width;
  std::fprintf(out_, "\r%s%s", line.c_str(), final ? "\n" : "");
  std::fflush(out_);
}

}  // namespace loom
