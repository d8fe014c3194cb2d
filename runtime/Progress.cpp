#include "runtime/Progress.h"

#include "runtime/PlanAttributes.h"

namespace loom {
namespace {

bool isWait(const std::string &op) { return planattr::isCollective(op) || op == "recv" || op == "send"; }

}  // namespace

void Progress::started(const plan::Program &program, int mb, int index) {
  const plan::Instruction &in = program.instructions(index);
  std::lock_guard<std::mutex> lock(mu_);
  InFlight &f = stream_[int(in.stream()) & 3];
  f.program = &program, f.mb = mb, f.index = index, f.call = -1;
  if (planattr::isCollective(in.op())) f.call = calls_[planattr::str(in, "group")]++;
}

void Progress::finished(const plan::Program &program, int index) {
  const plan::Instruction &in = program.instructions(index);
  std::lock_guard<std::mutex> lock(mu_);
  ++completed_;
  InFlight &f = stream_[int(in.stream()) & 3];
  if (f.program == &program && f.index == index) f.program = nullptr;
}

void Progress::waitingOutside(const std::string &what) {
  std::lock_guard<std::mutex> lock(mu_);
  outside_ = what;
}

Progress::Report Progress::report() const {
  std::lock_guard<std::mutex> lock(mu_);
  Report r;
  r.completed = completed_;
  std::string work, wait;
  for (const InFlight &f : stream_) {
    if (!f.program) continue;
    const plan::Instruction &in = f.program->instructions(f.index);
    std::string group = planattr::str(in, "group");
    std::string at = f.program->name() + " mb " + std::to_string(f.mb);
    if (isWait(in.op())) {
      std::string what = in.op() + (group.empty() ? "" : "@" + group);
      if (f.call >= 0) what += " #" + std::to_string(f.call);
      if (in.op() == "recv" || in.op() == "send") what += " (peer " + std::to_string(planattr::i64(in, "peer")) + ")";
      wait += (wait.empty() ? "" : ", ") + what + " of " + at;
    } else {
      work += (work.empty() ? "" : ", ") + at + " at instruction " + std::to_string(f.index) + " (" + in.op() +
              ", layer " + std::to_string(in.layer()) + ")";
    }
  }
  if (work.empty() && wait.empty() && !outside_.empty()) wait = outside_;
  r.waiting = work.empty() && !wait.empty();
  r.idle = work.empty() && wait.empty();
  r.where = !work.empty() ? work : wait.empty() ? "between programs" : wait;
  return r;
}

}  // namespace loom
