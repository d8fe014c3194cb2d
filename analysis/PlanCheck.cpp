#include "analysis/PlanCheck.h"

#include <deque>
#include <map>
#include <set>

#include "analysis/StepSemantics.h"
#include "llvm/Support/FormatVariadic.h"
#include "plan/InstructionSet.h"
#include "plan/ProgramCheck.h"
#include "plan/PlanAttributes.h"

namespace loom {
namespace {

llvm::Error error(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

// The check's driver of the plan semantics (compiler/StepSemantics.h), untimed: compute
// finishes when it starts, a send is buffered on its link, a receive starts when its link's
// next message is there (and must be the one it expects), a collective finishes when every
// executed member has entered it (and they must agree).
class Simulation : public StepSemantics::Driver {
 public:
  Simulation(const std::vector<RankPrograms> &ranks, std::vector<bool> simulated)
      : sem_(ranks, std::move(simulated), *this) {}

  llvm::Error run() {
    for (int r = 0; r < sem_.ranks(); ++r)
      if (sem_.executed(r))
        if (llvm::Error e = sem_.prepare(r)) return e;
    for (bool progress = true; progress;) {
      progress = false;
      for (int r = 0; r < sem_.ranks(); ++r)
        if (sem_.executed(r)) {
          llvm::Expected<bool> moved = sem_.start(r, /*untilStable=*/false);
          if (!moved) return moved.takeError();
          progress |= *moved;
        }
      llvm::Expected<bool> completed = completeCollectives();
      if (!completed) return completed.takeError();
      progress |= *completed;
    }
    std::vector<std::string> stuck;
    for (int r = 0; r < sem_.ranks(); ++r)
      if (sem_.executed(r) && !sem_.finished(r)) stuck.push_back(sem_.waitingIn(r));
    if (!stuck.empty()) {
      std::string text;
      for (size_t k = 0; k < stuck.size() && k < 4; ++k) text += (k ? "; " : "") + stuck[k];
      if (stuck.size() > 4) text += llvm::formatv("; and {0} more ranks", stuck.size() - 4).str();
      return error("the plans deadlock: " + text);
    }
    for (auto &[link, queue] : sem_.links())
      if (!queue.empty())
        return error(llvm::formatv("{0} sends a message (tag {1}) to rank {2}, which never receives it",
                                   queue.front().from, queue.front().tag, link.second));
    return llvm::Error::success();
  }

  int64_t instructionsRun() const { return sem_.instructionsRun(); }
  const std::map<std::pair<int, int>, int> &inFlight() const { return inFlight_; }

 private:
  int64_t elements(const plan::Program &prog, const google::protobuf::RepeatedField<int32_t> &buffers) const {
    int64_t n = 0;
    for (int b : buffers) n += planattr::numel(prog.buffers(b));
    return n;
  }

  llvm::Expected<bool> issue(int r, int i) override {
    const plan::Program &prog = sem_.program(r);
    const plan::Instruction &in = prog.instructions(i);
    const std::string &op = in.op();
    if (op == "send") {
      int peer = sem_.peerOf(r, in);
      if (peer < 0) return error(sem_.at(r, i) + ": peer outside its group");
      auto &link = sem_.link(r, peer);
      StepSemantics::Message m;
      m.tag = sem_.tagOf(r, in), m.elements = elements(prog, in.inputs()), m.dtype = prog.buffers(in.inputs(0)).dtype();
      m.from = sem_.at(r, i);
      link.push_back(std::move(m));
      int &most = inFlight_[{r, peer}];
      most = std::max(most, int(link.size()));
    } else if (op == "recv") {
      int peer = sem_.peerOf(r, in);
      if (peer < 0) return error(sem_.at(r, i) + ": peer outside its group");
      auto &link = sem_.link(peer, r);
      if (link.empty()) return false;  // until its message is sent
      StepSemantics::Message m = link.front();
      // NCCL (the CUDA backend's PipelineLinks) matches a link's messages by order, Gloo by
      // tag: both hold only if the next message on the link is the one with this tag.
      if (m.tag != sem_.tagOf(r, in))
        return error(llvm::formatv("{0} receives tag {1} from rank {2}, but that link's next message is tag {3} "
                                   "from {4} (messages over a link are matched in order)",
                                   sem_.at(r, i), sem_.tagOf(r, in), peer, m.tag, m.from));
      link.pop_front();
      int64_t want = elements(prog, in.outputs());
      plan::DType type = prog.buffers(in.outputs(0)).dtype();
      if (m.elements != want || m.dtype != type)
        return error(llvm::formatv("{0} receives {1} {2} elements but {3} sends {4} {5}", sem_.at(r, i), want,
                                   plan::DType_Name(type), m.from, m.elements, plan::DType_Name(m.dtype)));
    } else if (isa::isCollective(op)) {
      StepSemantics::CallKey key;
      bool complete = false;
      if (llvm::Error e = sem_.enterCollective(r, i, &key, &complete)) return std::move(e);
      if (complete) ready_.push_back(key);
      return true;  // finishes when its group has entered it
    }
    sem_.complete(r, i);
    return true;
  }

  // What a collective does, compared across its members (printed only on a mismatch).
  struct Entered {
    int instruction;
    std::string op, reduce;
    int64_t in, out;
    plan::DType dtype;
    bool operator!=(const Entered &o) const {
      return op != o.op || reduce != o.reduce || in != o.in || out != o.out || dtype != o.dtype;
    }
    std::string text() const {
      return llvm::formatv("{0} {1} of {2} {3} elements into {4}", op, reduce.empty() ? "sum" : reduce, in,
                           plan::DType_Name(dtype), out)
          .str();
    }
  };
  Entered enteredBy(int r, int i) const {
    const plan::Program &prog = sem_.program(r);
    const plan::Instruction &in = prog.instructions(i);
    return {i, in.op(), planattr::str(in, "reduce"), elements(prog, in.inputs()), elements(prog, in.outputs()),
            in.inputs_size() ? prog.buffers(in.inputs(0)).dtype() : plan::F32};
  }

  // Collectives every (executed) member has entered complete, if they agree.
  llvm::Expected<bool> completeCollectives() {
    bool any = !ready_.empty();
    for (const auto &key : ready_) {
      std::map<int, Entered> byRank;
      for (const StepSemantics::Entry &e : sem_.entries(key)) byRank.emplace(e.rank, enteredBy(e.rank, e.index));
      int first = byRank.begin()->first;
      const Entered &e0 = byRank.begin()->second;
      for (auto &[r, e] : byRank)
        if (e != e0)
          return error(llvm::formatv("collective #{0} of group {1}: {2} enters {3}, but {4} enters {5}", key.second,
                                     sem_.communicatorName(key.first), sem_.at(first, e0.instruction), e0.text(),
                                     sem_.at(r, e.instruction), e.text()));
      sem_.forgetCall(key);
      for (auto &[r, e] : byRank) sem_.complete(r, e.instruction);
    }
    ready_.clear();
    return any;
  }

  StepSemantics sem_;
  std::map<std::pair<int, int>, int> inFlight_;  // (from, to): the most messages queued
  std::vector<StepSemantics::CallKey> ready_;    // collectives every executed member has entered
};

}  // namespace

llvm::Error programRunsOf(const RankPrograms &rank, int r, std::vector<ProgramRun> *runs) {
  runs->clear();
  std::map<std::string, const plan::Program *> byName;
  for (const plan::Program &p : rank.programs->programs()) byName[p.name()] = &p;
  std::map<const plan::Program *, size_t> lastOf, firstOf;
  std::set<const plan::Program *> checked;
  for (const plan::ScheduleEntry &e : rank.plan->schedule()) {
    auto it = byName.find(e.program());
    if (it == byName.end())
      return error(llvm::formatv("rank {0}: the schedule names program '{1}', which its programs lack", r, e.program()));
    if (checked.insert(it->second).second)
      if (Status st = checkProgram(*it->second); !st.isOk()) return error(llvm::formatv("rank {0}: {1}", r, st.message()));
    lastOf[it->second] = runs->size();
    firstOf.try_emplace(it->second, runs->size());
    runs->push_back({it->second, e.micro_batch(), false});
  }
  for (size_t k = 0; k < runs->size(); ++k) {
    (*runs)[k].last = lastOf[(*runs)[k].prog] == k;
    (*runs)[k].first = firstOf[(*runs)[k].prog] == k;
  }
  return llvm::Error::success();
}

namespace {

// Ranks of a stage behave alike when they run the same programs in the same schedule.
bool stagesAreUniform(const std::vector<RankPrograms> &ranks) {
  std::map<int, std::pair<std::string, std::string>> seen;  // stage -> (programs, schedule)
  std::map<const plan::ProgramSet *, std::string> bytes;     // ranks of a stage usually share one
  for (const RankPrograms &r : ranks) {
    auto [cached, fresh] = bytes.try_emplace(r.programs);
    if (fresh) r.programs->SerializeToString(&cached->second);
    const std::string &programs = cached->second;
    std::string schedule;
    for (const plan::ScheduleEntry &e : r.plan->schedule()) schedule += e.program() + "#" + std::to_string(e.micro_batch()) + ";";
    auto [it, first] = seen.try_emplace(r.plan->pp_rank(), programs, schedule);
    if (!first && (it->second.first != programs || it->second.second != schedule)) return false;
  }
  return true;
}

}  // namespace

// With context parallelism the tp 0 / dp 0 ranks of a stage are its cp group: every cp rank is
// simulated (their ring of collectives complete).
std::vector<bool> representativeRanks(const std::vector<RankPrograms> &ranks, bool *onePerStage) {
  *onePerStage = stagesAreUniform(ranks);
  std::vector<bool> chosen(ranks.size(), !*onePerStage);
  if (*onePerStage)
    for (size_t r = 0; r < ranks.size(); ++r) chosen[r] = ranks[r].plan->tp_rank() == 0 && ranks[r].plan->dp_rank() == 0;
  return chosen;
}

llvm::Error checkPlans(const std::vector<RankPrograms> &ranks, CheckResult *result) {
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].plan->rank() != int(r)) return error(llvm::formatv("plan {0} says it is rank {1}", r, ranks[r].plan->rank()));
  bool uniform = false;
  std::vector<bool> simulated = representativeRanks(ranks, &uniform);
  Simulation sim(ranks, simulated);
  if (llvm::Error e = sim.run()) return e;
  size_t count = 0;
  for (bool s : simulated) count += s;
  result->linkInFlight = sim.inFlight();
  result->summary = llvm::formatv("checked {0} ranks ({1} simulated{2}): {3} instructions, every collective matched, every "
                           "message received, no deadlock",
                           ranks.size(), count,
                           !uniform || count == ranks.size() ? ""
                           : ranks[0].plan->c() > 1        ? ", one per pipeline stage and cp rank"
                                                           : ", one per pipeline stage",
                           sim.instructionsRun())
                 .str();
  return llvm::Error::success();
}

}  // namespace loom
