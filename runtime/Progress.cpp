#include "runtime/Progress.h"

#include <algorithm>
#include <climits>

#include "plan/PlanAttributes.h"

namespace loom {
int64_t Progress::callNumber(const plan::Instruction &in) {
  return planattr::isCollective(in.op()) ? calls_[planattr::str(in, "group")]++ : -1;
}

void Progress::started(const plan::Program &program, int mb, int index) {
  const plan::Instruction &in = program.instructions(index);
  std::lock_guard<std::mutex> lock(mu_);
  stream_[int(in.stream()) & 3] = InFlight{&program, mb, index, callNumber(in), std::chrono::steady_clock::now()};
}

void Progress::finished(const plan::Program &program, int index) {
  const plan::Instruction &in = program.instructions(index);
  std::lock_guard<std::mutex> lock(mu_);
  ++completed_;
  InFlight &f = stream_[int(in.stream()) & 3];
  if (f.program == &program && f.index == index) {
    if (!planattr::isCommunication(in.op()))
      computeSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - f.start).count();
    timed_ = true;
    f.program = nullptr;
  }
}

double Progress::computeSeconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return timed_ ? computeSeconds_ : -1;
}

void Progress::issued(const plan::Program &program, int mb, int index, int64_t run, CompletionProbe *probe,
                      uint64_t token) {
  const plan::Instruction &in = program.instructions(index);
  std::lock_guard<std::mutex> lock(mu_);
  reapIssued();  // keeps the queues (and the probe's tokens in use) as short as the device is behind
  issued_[int(in.stream()) & 3].push_back(Issued{InFlight{&program, mb, index, callNumber(in)}, run, probe, token});
}

// A stream's instructions complete in issue order, so only the front of each queue is asked.
void Progress::reapIssued() {
  for (std::deque<Issued> &q : issued_)
    while (!q.empty() && q.front().probe->done(q.front().token)) {
      q.front().probe->release(q.front().token);
      q.pop_front();
      ++completed_;
    }
}

bool Progress::pending(int64_t run, int index) const {
  for (const std::deque<Issued> &q : issued_)
    for (const Issued &i : q)
      if (i.run == run && i.at.index == index) return true;
  return false;
}

void Progress::detach(CompletionProbe *probe) {
  std::lock_guard<std::mutex> lock(mu_);
  for (std::deque<Issued> &q : issued_) {
    std::deque<Issued> kept;
    for (Issued &i : q)
      if (i.probe == probe)
        probe->release(i.token);
      else
        kept.push_back(i);
    q.swap(kept);
  }
}

void Progress::waitingOutside(const std::string &what) {
  std::lock_guard<std::mutex> lock(mu_);
  outside_ = what;
}

Progress::Report Progress::report() {
  std::lock_guard<std::mutex> lock(mu_);
  reapIssued();
  Report r;
  r.completed = completed_;
  std::string work, wait;
  int64_t oldestRun = INT64_MAX;
  for (const std::deque<Issued> &q : issued_)
    if (!q.empty()) oldestRun = std::min(oldestRun, q.front().run);
  for (int k = 0; k < 4; ++k) {
    InFlight f = stream_[k];
    if (!f.program && !issued_[k].empty()) {
      const Issued &front = issued_[k].front();
      bool blocked = front.run != oldestRun;
      for (int w : front.at.program->instructions(front.at.index).wait_for()) blocked |= pending(front.run, w);
      if (!blocked) f = front.at;  // else what it waits for is in flight on another stream
    }
    if (!f.program) continue;
    const plan::Instruction &in = f.program->instructions(f.index);
    std::string group = planattr::str(in, "group");
    std::string at = f.program->name() + " mb " + std::to_string(f.mb);
    if (planattr::isCommunication(in.op())) {
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
