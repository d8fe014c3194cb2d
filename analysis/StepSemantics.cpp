#include "analysis/StepSemantics.h"

#include "llvm/Support/FormatVariadic.h"
#include "plan/InstructionSet.h"
#include "plan/ProgramCheck.h"
#include "plan/PlanAttributes.h"

namespace loom {
namespace {

llvm::Error error(const llvm::Twine &msg) { return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str()); }

}  // namespace

StepSemantics::StepSemantics(const std::vector<RankPrograms> &ranks, std::vector<bool> executed, Driver &driver)
    : ranks_(ranks), executed_(std::move(executed)), driver_(driver), state_(ranks.size()) {}

llvm::Error StepSemantics::prepare(int r) {
  RankState &s = state_[size_t(r)];
  if (llvm::Error e = programRunsOf(ranks_[size_t(r)], r, &s.runs)) return e;
  for (const plan::Group &g : ranks_[size_t(r)].plan->groups()) {
    s.groups[g.name()].assign(g.ranks().begin(), g.ranks().end());
    // A rank's "tp" and its peer's are one communicator: the group's name and members.
    std::string key = g.name() + ":";
    for (int m : g.ranks()) key += std::to_string(m) + ",";
    auto [it, fresh] = communicators_.try_emplace(key, int(communicatorNames_.size()));
    if (fresh) communicatorNames_.push_back(key.substr(0, key.size() - 1));
    s.communicatorOf[g.name()] = it->second;
  }
  beginRun(r);
  return llvm::Error::success();
}

void StepSemantics::beginRun(int r) {
  RankState &s = state_[size_t(r)];
  for (int k = 0; k < 4; ++k) s.next[k] = 0, s.running[k] = -1;
  driver_.runBegan(r);
  if (finished(r)) return;
  int n = program(r).instructions_size();
  s.done.assign(size_t(n), 0);
  s.remaining = n;
  if (n == 0) {
    driver_.runEnded(r);
    ++s.cur;
    beginRun(r);
  }
}

llvm::Expected<bool> StepSemantics::start(int r, bool untilStable) {
  RankState &s = state_[size_t(r)];
  bool any = false;
  while (!finished(r)) {
    size_t run = s.cur;
    const ProgramRun &current = s.runs[run];
    const plan::Program &prog = *current.prog;
    bool moved = false;
    for (int k = 0; k < 4 && s.cur == run; ++k) {
      while (s.cur == run && s.running[k] < 0 && s.next[k] < prog.instructions_size()) {
        int i = s.next[k];
        const plan::Instruction &in = prog.instructions(i);
        if (in.stream() != k || s.done[size_t(i)]) {
          ++s.next[k];
          continue;
        }
        if ((in.last_micro_batch() && !current.last) || (in.first_micro_batch() && !current.first)) {
          // not this run: passed over, done at once
          ++s.next[k], moved = true;
          driver_.passedOver(r, i);
          complete(r, i);
          continue;
        }
        bool ready = true;
        for (int w : in.wait_for()) ready &= s.done[size_t(w)] != 0;
        if (!ready) break;
        s.running[k] = i, ++s.next[k];
        llvm::Expected<bool> started = driver_.issue(r, i);  // may complete it at once
        if (!started) return started.takeError();
        if (!*started) {
          if (s.cur == run) s.running[k] = -1, --s.next[k];
          break;
        }
        moved = true;
      }
    }
    any |= moved;
    if (s.cur != run) continue;  // the pass ended the run: on with the next
    if (!untilStable || !moved) break;
  }
  return any;
}

void StepSemantics::complete(int r, int i) {
  RankState &s = state_[size_t(r)];
  driver_.completed(r, i);
  s.done[size_t(i)] = 1;
  ++completed_;
  int k = int(instruction(r, i).stream()) & 3;
  if (s.running[k] == i) s.running[k] = -1;
  if (--s.remaining == 0) {
    driver_.runEnded(r);
    ++s.cur;
    beginRun(r);
  }
}

int StepSemantics::peerOf(int r, const plan::Instruction &in) const {
  const std::vector<int> &m = members(r, planattr::str(in, "group"));
  int64_t peer = planattr::i64(in, "peer");
  return peer >= 0 && peer < int64_t(m.size()) ? m[size_t(peer)] : -1;
}

int64_t StepSemantics::tagOf(int r, const plan::Instruction &in) const {
  int mb = run(r).mb;
  return planattr::i64(in, "tag") + (mb < 0 ? 0 : mb * kTagsPerMicroBatch);
}

const std::vector<int> &StepSemantics::members(int r, const std::string &group) const {
  static const std::vector<int> none;
  const auto &groups = state_[size_t(r)].groups;
  auto it = groups.find(group);
  return it == groups.end() ? none : it->second;
}

llvm::Error StepSemantics::enterCollective(int r, int i, CallKey *key, bool *complete) {
  RankState &s = state_[size_t(r)];
  std::string group = planattr::str(instruction(r, i), "group");
  auto comm = s.communicatorOf.find(group);
  if (comm == s.communicatorOf.end()) return error(at(r, i) + ": no group '" + group + "' in the rank's plan");
  *key = {comm->second, s.calls[comm->second]++};
  std::vector<Entry> &entered = calls_[*key];
  entered.push_back({r, i});
  // Complete once every executed member has entered it.
  size_t expected = 0;
  for (int m : s.groups.at(group)) expected += executed_[size_t(m)];
  *complete = entered.size() >= expected;
  return llvm::Error::success();
}

std::string StepSemantics::at(int r, int i) const {
  const ProgramRun &current = run(r);
  const plan::Instruction &in = current.prog->instructions(i);
  std::string group = planattr::str(in, "group");
  return llvm::formatv("rank {0} in {1} mb {2} at instruction {3} ({4}{5}, layer {6})", r, current.prog->name(),
                       current.mb, i, in.op(), group.empty() ? "" : "@" + group, in.layer());
}

std::string StepSemantics::waitingIn(int r) const {
  const RankState &s = state_[size_t(r)];
  const plan::Program &prog = program(r);
  std::string text;
  for (int k = 0; k < 4; ++k) {
    std::string what;
    if (int i = s.running[k]; i >= 0 && isa::isCollective(prog.instructions(i).op())) {
      what = at(r, i) + " waits for its group";
    } else {
      int j = s.next[k];
      while (j < prog.instructions_size() && prog.instructions(j).stream() != k) ++j;
      if (j >= prog.instructions_size() || prog.instructions(j).op() != "recv") continue;  // waits on another stream
      const plan::Instruction &in = prog.instructions(j);
      what = at(r, j) + llvm::formatv(" waits for tag {0} from rank {1}", tagOf(r, in), peerOf(r, in)).str();
    }
    text += (text.empty() ? "" : ", ") + what;
  }
  return text.empty() ? at(r, s.next[0] < prog.instructions_size() ? s.next[0] : 0) + " waits" : text;
}

}  // namespace loom
