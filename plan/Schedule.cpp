#include "plan/Schedule.h"

#include <algorithm>
#include <map>

#include "llvm/Support/FormatVariadic.h"

namespace loom {
namespace {

llvm::Error error(const std::string &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

// GPipe: all forwards, then all backwards in reverse order of micro-batches.
std::vector<StageSchedule> gpipe(int p, int v, int m) {
  std::vector<StageSchedule> out(p);
  for (int s = 0; s < p; ++s) {
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < m; ++mb) out[s].push_back({Task::kForward, c, mb});
    for (int c = v - 1; c >= 0; --c)
      for (int mb = m - 1; mb >= 0; --mb) out[s].push_back({Task::kBackward, c, mb});
  }
  return out;
}

// 1F1B (PipeDream-Flush): p - s - 1 warm-up forwards, then one forward and one backward
// alternately, then the remaining backwards.
std::vector<StageSchedule> oneFOneB(int p, int m) {
  std::vector<StageSchedule> out(p);
  for (int s = 0; s < p; ++s) {
    int warmup = std::min(p - s - 1, m), f = 0, b = 0;
    for (; f < warmup; ++f) out[s].push_back({Task::kForward, 0, f});
    while (f < m) {
      out[s].push_back({Task::kForward, 0, f++});
      out[s].push_back({Task::kBackward, 0, b++});
    }
    while (b < m) out[s].push_back({Task::kBackward, 0, b++});
  }
  return out;
}

// Interleaved 1F1B (section 2.2.2): micro-batches go through the chunks in groups of p;
// warm-up (p - s - 1) * 2 + (v - 1) * p forwards, then alternate, then drain.
std::vector<StageSchedule> interleaved(int p, int v, int m) {
  std::vector<StageSchedule> out(p);
  int total = m * v;
  auto chunkOf = [&](int k, bool forward) {
    int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto microBatchOf = [&](int k) { return (k / (p * v)) * p + k % p; };
  for (int s = 0; s < p; ++s) {
    int warmup = m == p ? total : std::min((p - s - 1) * 2 + (v - 1) * p, total);
    int f = 0, b = 0;
    for (; f < warmup; ++f) out[s].push_back({Task::kForward, chunkOf(f, true), microBatchOf(f)});
    while (f < total) {
      out[s].push_back({Task::kForward, chunkOf(f, true), microBatchOf(f)});
      ++f;
      out[s].push_back({Task::kBackward, chunkOf(b, false), microBatchOf(b)});
      ++b;
    }
    for (; b < total; ++b) out[s].push_back({Task::kBackward, chunkOf(b, false), microBatchOf(b)});
  }
  return out;
}

}  // namespace

std::string toString(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe: return "GPipe";
    case ScheduleKind::kOneFOneB: return "1F1B";
    case ScheduleKind::kInterleaved: return "interleaved 1F1B";
  }
  return "?";
}

llvm::Expected<std::vector<StageSchedule>> buildSchedule(ScheduleKind kind, int p, int v, int m) {
  if (p < 1 || v < 1 || m < 1)
    return error(llvm::formatv("schedule: p = {0}, v = {1}, m = {2} must all be >= 1", p, v, m).str());
  switch (kind) {
    case ScheduleKind::kGPipe: return gpipe(p, v, m);
    case ScheduleKind::kOneFOneB:
      if (v != 1) return error(llvm::formatv("1F1B runs one chunk per stage, got v = {0} (use interleaved)", v).str());
      if (m < p)
        return error(llvm::formatv("1F1B needs at least as many micro-batches as stages: m = {0} < p = {1}", m, p).str());
      return oneFOneB(p, m);
    case ScheduleKind::kInterleaved:
      if (v < 2) return error(llvm::formatv("interleaved 1F1B needs v >= 2 chunks per stage, got v = {0}", v).str());
      if (m % p != 0)
        return error(
            llvm::formatv("interleaved 1F1B needs m to be a multiple of p: m = {0}, p = {1}", m, p).str());
      return interleaved(p, v, m);
  }
  return error("unknown schedule");
}

Simulation simulate(const std::vector<StageSchedule> &schedule, int p, int v, int m, double tf, double tb) {
  Simulation sim = simulate(schedule, p, v, m, [&](int, Task::Type t) { return (t == Task::kForward ? tf : tb) / v; });
  if (!sim.deadlock) {
    double ideal = m * (tf + tb);
    sim.bubbleFraction = (sim.makespan - ideal) / ideal;
  }
  return sim;
}

Simulation simulate(const std::vector<StageSchedule> &schedule, int p, int v, int m,
                    const std::function<double(int, Task::Type)> &durationOf) {
  Simulation sim;
  sim.timeline.assign(p, {});
  int stages = p * v;
  // finish[type][virtual stage][micro-batch]; negative = not done.
  std::vector<std::vector<std::vector<double>>> finish(
      2, std::vector<std::vector<double>>(stages, std::vector<double>(m, -1)));
  std::vector<size_t> next(p, 0);
  std::vector<double> freeAt(p, 0);
  auto dependency = [&](int s, const Task &t, int &type, int &vs) -> bool {
    int k = t.chunk * p + s;
    if (t.type == Task::kForward) {
      if (k == 0) return false;
      type = Task::kForward, vs = k - 1;
    } else {
      type = k == stages - 1 ? Task::kForward : Task::kBackward;
      vs = k == stages - 1 ? k : k + 1;
    }
    return true;
  };
  auto name = [&](int s, const Task &t) {
    return llvm::formatv("{0}(virtual stage {1}, micro-batch {2})", t.type == Task::kForward ? "forward" : "backward",
                         t.chunk * p + s, t.microBatch)
        .str();
  };
  size_t remaining = 0;
  for (auto &l : schedule) remaining += l.size();
  while (remaining > 0) {
    bool progressed = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < schedule[s].size()) {
        const Task &t = schedule[s][next[s]];
        double ready = freeAt[s];
        int type, vs;
        if (dependency(s, t, type, vs)) {
          double f = finish[type][vs][t.microBatch];
          if (f < 0) break;
          ready = std::max(ready, f);
        }
        if (t.type == Task::kBackward && finish[Task::kForward][t.chunk * p + s][t.microBatch] < 0) break;
        double duration = durationOf(t.chunk * p + s, t.type);
        finish[t.type][t.chunk * p + s][t.microBatch] = ready + duration;
        sim.timeline[s].push_back({t, ready, ready + duration});
        freeAt[s] = ready + duration;
        ++next[s];
        --remaining;
        progressed = true;
      }
    }
    if (!progressed) {
      sim.deadlock = true;
      for (int s = 0; s < p; ++s) {
        if (next[s] >= schedule[s].size()) continue;
        const Task &t = schedule[s][next[s]];
        int type, vs;
        std::string waits = "its own forward";
        if (dependency(s, t, type, vs) && finish[type][vs][t.microBatch] < 0)
          waits = llvm::formatv("{0} of virtual stage {1} (stage {2})", type == Task::kForward ? "forward" : "backward",
                                vs, vs % p)
                      .str();
        sim.diagnosis += llvm::formatv("{0}stage {1} is stuck at {2}, waiting for {3}", sim.diagnosis.empty() ? "" : "; ",
                                       s, name(s, t), waits)
                             .str();
      }
      return sim;
    }
  }
  double busiest = 0;
  for (int s = 0; s < p; ++s) {
    sim.makespan = std::max(sim.makespan, freeAt[s]);
    double work = 0;
    for (const TimedTask &t : sim.timeline[s]) work += t.end - t.start;
    busiest = std::max(busiest, work);
  }
  sim.bubbleFraction = busiest > 0 ? (sim.makespan - busiest) / busiest : 0;
  return sim;
}

}  // namespace loom
