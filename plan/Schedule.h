// Pipeline schedules (PTD-P paper, arXiv:2104.04473, section 2.2): for p stages, v chunks per
// stage and m micro-batches, the ordered list of forward/backward tasks each stage runs; a
// simulator that executes every stage's list against the others' sends and receives,
// rejecting any list that can deadlock, and measuring the bubble.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "llvm/Support/Error.h"

namespace loom {

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved };

struct Task {
  enum Type { kForward, kBackward } type;
  int chunk;       // chunk on this stage: virtual stage = chunk * p + stage
  int microBatch;
  bool operator==(const Task &) const = default;
};
using StageSchedule = std::vector<Task>;

// Errors name the numbers: 1F1B needs m >= p; interleaved needs v >= 2 and m a multiple of p.
llvm::Expected<std::vector<StageSchedule>> buildSchedule(ScheduleKind kind, int p, int v, int m);

struct TimedTask {
  Task task;
  double start, end;
};

struct Simulation {
  bool deadlock = false;
  std::string diagnosis;  // on deadlock: each stuck stage, its next task, what it waits for
  double makespan = 0;
  std::vector<std::vector<TimedTask>> timeline;  // per stage
  // Idle time per stage over the ideal busy time m * (tf + tb): (p - 1) / m for 1F1B.
  double bubbleFraction = 0;
};

// Runs the stages' lists with sends that never block and receives that wait for the value
// (the runtime's semantics). A forward of virtual stage k needs the forward of k - 1 for the
// same micro-batch; a backward needs the backward of k + 1 (or, on the last virtual stage,
// its own forward). A chunk's forward takes tf / v and its backward tb / v.
Simulation simulate(const std::vector<StageSchedule> &schedule, int p, int v, int m, double tf = 1.0,
                    double tb = 2.0);

// The same with a duration per (virtual stage, forward/backward): for timelines drawn from
// the programs' FLOPs. bubbleFraction is then relative to the busiest stage's work.
Simulation simulate(const std::vector<StageSchedule> &schedule, int p, int v, int m,
                    const std::function<double(int virtualStage, Task::Type)> &duration);

std::string toString(ScheduleKind kind);

}  // namespace loom
