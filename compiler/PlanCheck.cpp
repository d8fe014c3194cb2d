#include "compiler/PlanCheck.h"

#include <deque>
#include <map>
#include <set>

#include "llvm/Support/FormatVariadic.h"
#include "runtime/Executor.h"
#include "runtime/PlanAttributes.h"

namespace loom {
namespace {

llvm::Error error(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

using Run = ProgramRun;

struct Message {
  int64_t tag, elements;
  plan::DType dtype;
  std::string from;  // where it was sent, for errors
};

class Simulation {
 public:
  Simulation(const std::vector<RankPrograms> &ranks, std::vector<bool> simulated)
      : ranks_(ranks), simulated_(std::move(simulated)), state_(ranks.size()) {}

  llvm::Error run() {
    for (size_t r = 0; r < ranks_.size(); ++r)
      if (simulated_[r])
        if (llvm::Error e = prepare(int(r))) return e;
    for (bool progress = true; progress;) {
      progress = false;
      for (size_t r = 0; r < ranks_.size(); ++r)
        if (simulated_[r]) {
          llvm::Expected<bool> moved = advance(int(r));
          if (!moved) return moved.takeError();
          progress |= *moved;
        }
      llvm::Expected<bool> completed = completeCollectives();
      if (!completed) return completed.takeError();
      progress |= *completed;
    }
    std::vector<std::string> stuck;
    for (size_t r = 0; r < ranks_.size(); ++r)
      if (simulated_[r] && state_[r].cur < state_[r].runs.size()) stuck.push_back(waitingIn(int(r)));
    if (!stuck.empty()) {
      std::string text;
      for (size_t k = 0; k < stuck.size() && k < 4; ++k) text += (k ? "; " : "") + stuck[k];
      if (stuck.size() > 4) text += llvm::formatv("; and {0} more ranks", stuck.size() - 4).str();
      return error("the plans deadlock: " + text);
    }
    for (auto &[link, queue] : messages_)
      if (!queue.empty())
        return error(llvm::formatv("{0} sends a message (tag {1}) to rank {2}, which never receives it",
                                   queue.front().from, queue.front().tag, link.second));
    return llvm::Error::success();
  }

  int64_t instructionsRun() const { return executed_; }
  const std::map<std::pair<int, int>, int> &inFlight() const { return inFlight_; }

 private:
  struct RankState {
    std::vector<Run> runs;
    size_t cur = 0;
    std::vector<char> done, arrived;
    int next[4] = {};
    int remaining = 0;
    std::map<std::string, std::vector<int>> groups;  // name -> global ranks
    std::map<std::string, int> communicatorOf;      // group name -> communicator id
    std::map<int, int64_t> calls;                    // communicator -> collectives entered
  };

  llvm::Error prepare(int r) {
    RankState &s = state_[r];
    const plan::RankPlan &rp = *ranks_[r].plan;
    if (llvm::Error e = programRunsOf(ranks_[r], r, &s.runs)) return e;
    for (const plan::Group &g : rp.groups()) {
      s.groups[g.name()].assign(g.ranks().begin(), g.ranks().end());
      // A rank's "tp" and its peer's are one communicator: the group's name and members.
      std::string key = g.name() + ":";
      for (int m : g.ranks()) key += std::to_string(m) + ",";
      auto [it, fresh] = communicators_.try_emplace(key, int(communicatorNames_.size()));
      if (fresh) communicatorNames_.push_back(key.substr(0, key.size() - 1));
      s.communicatorOf[g.name()] = it->second;
    }
    begin(r);
    return llvm::Error::success();
  }

  void begin(int r) {
    RankState &s = state_[r];
    for (int k = 0; k < 4; ++k) s.next[k] = 0;
    if (s.cur >= s.runs.size()) return;
    int n = s.runs[s.cur].prog->instructions_size();
    s.done.assign(n, 0), s.arrived.assign(n, 0);
    s.remaining = n;
  }

  std::string at(int r, int i) const {
    const RankState &s = state_[r];
    const Run &run = s.runs[s.cur];
    const plan::Instruction &in = run.prog->instructions(i);
    std::string group = planattr::str(in, "group");
    return llvm::formatv("rank {0} in {1} mb {2} at instruction {3} ({4}{5}, layer {6})", r, run.prog->name(), run.mb, i,
                         in.op(), group.empty() ? "" : "@" + group, in.layer());
  }

  // What a stuck rank waits for: each stream's first unfinished instruction.
  std::string waitingIn(int r) const {
    const RankState &s = state_[r];
    const plan::Program &prog = *s.runs[s.cur].prog;
    std::string text;
    for (int k = 0; k < 4; ++k) {
      int i = s.next[k];
      while (i < prog.instructions_size() && prog.instructions(i).stream() != k) ++i;
      if (i >= prog.instructions_size()) continue;
      const plan::Instruction &in = prog.instructions(i);
      std::string what = at(r, i);
      if (in.op() == "recv")
        what += llvm::formatv(" waits for tag {0} from rank {1}", tagOf(r, in), peerOf(r, in)).str();
      else if (planattr::isCollective(in.op()) && s.arrived[i])
        what += " waits for its group";
      else
        continue;  // waits on another stream's instruction
      text += (text.empty() ? "" : ", ") + what;
    }
    return text.empty() ? at(r, s.next[0] < prog.instructions_size() ? s.next[0] : 0) + " waits" : text;
  }

  int64_t tagOf(int r, const plan::Instruction &in) const {
    int mb = state_[r].runs[state_[r].cur].mb;
    return planattr::i64(in, "tag") + (mb < 0 ? 0 : mb * kTagsPerMicroBatch);
  }
  int peerOf(int r, const plan::Instruction &in) const {
    const auto &members = state_[r].groups.at(planattr::str(in, "group"));
    int64_t peer = planattr::i64(in, "peer");
    return peer >= 0 && peer < int64_t(members.size()) ? members[size_t(peer)] : -1;
  }
  int64_t elements(const plan::Program &prog, const google::protobuf::RepeatedField<int32_t> &buffers) const {
    int64_t n = 0;
    for (int b : buffers) n += planattr::numel(prog.buffers(b));
    return n;
  }

  void finish(int r, int i) {
    RankState &s = state_[r];
    s.done[i] = 1;
    --s.remaining;
    ++executed_;
  }

  // Runs rank r's streams as far as they go; true if anything ran.
  llvm::Expected<bool> advance(int r) {
    RankState &s = state_[r];
    bool moved = false;
    while (s.cur < s.runs.size()) {
      const Run &run = s.runs[s.cur];
      const plan::Program &prog = *run.prog;
      for (int k = 0; k < 4; ++k) {
        while (s.next[k] < prog.instructions_size()) {
          int i = s.next[k];
          const plan::Instruction &in = prog.instructions(i);
          if (in.stream() != k) {
            ++s.next[k];
            continue;
          }
          if (s.done[i]) {  // a collective completed by its group
            ++s.next[k];
            continue;
          }
          if (in.last_micro_batch() && !run.last) {
            finish(r, i), ++s.next[k], moved = true;
            continue;
          }
          bool ready = true;
          for (int w : in.wait_for()) ready &= s.done[w] != 0;
          if (!ready) break;
          const std::string &op = in.op();
          if (op == "send") {
            int peer = peerOf(r, in);
            if (peer < 0) return error(at(r, i) + ": peer outside its group");
            auto &link = messages_[{r, peer}];
            link.push_back({tagOf(r, in), elements(prog, in.inputs()), prog.buffers(in.inputs(0)).dtype(), at(r, i)});
            int &most = inFlight_[{r, peer}];
            most = std::max(most, int(link.size()));
          } else if (op == "recv") {
            int peer = peerOf(r, in);
            if (peer < 0) return error(at(r, i) + ": peer outside its group");
            auto it = messages_.find({peer, r});
            if (it == messages_.end() || it->second.empty()) break;
            Message m = it->second.front();
            // NCCL (the CUDA backend's PipelineLinks) matches a link's messages by order, Gloo
            // by tag: both hold only if the next message on the link is the one with this tag.
            if (m.tag != tagOf(r, in))
              return error(llvm::formatv("{0} receives tag {1} from rank {2}, but that link's next message is tag {3} "
                                         "from {4} (messages over a link are matched in order)",
                                         at(r, i), tagOf(r, in), peer, m.tag, m.from));
            it->second.pop_front();
            int64_t want = elements(prog, in.outputs());
            plan::DType type = prog.buffers(in.outputs(0)).dtype();
            if (m.elements != want || m.dtype != type)
              return error(llvm::formatv("{0} receives {1} {2} elements but {3} sends {4} {5}", at(r, i), want,
                                         plan::DType_Name(type), m.from, m.elements, plan::DType_Name(m.dtype)));
          } else if (planattr::isCollective(op)) {
            if (!s.arrived[i]) {
              if (llvm::Error e = arrive(r, i)) return std::move(e);
              s.arrived[i] = 1, moved = true;
            }
            if (!s.done[i]) break;  // until its group has entered it
            ++s.next[k];
            continue;
          }
          finish(r, i), ++s.next[k], moved = true;
        }
      }
      if (s.remaining > 0) break;
      ++s.cur, moved = true;
      begin(r);
    }
    return moved;
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

  llvm::Error arrive(int r, int i) {
    RankState &s = state_[r];
    const plan::Program &prog = *s.runs[s.cur].prog;
    const plan::Instruction &in = prog.instructions(i);
    std::string group = planattr::str(in, "group");
    auto comm = s.communicatorOf.find(group);
    if (comm == s.communicatorOf.end()) return error(at(r, i) + ": no group '" + group + "' in the rank's plan");
    int64_t seq = s.calls[comm->second]++;
    Entered e{i, in.op(), planattr::str(in, "reduce"), elements(prog, in.inputs()), elements(prog, in.outputs()),
              in.inputs_size() ? prog.buffers(in.inputs(0)).dtype() : plan::F32};
    auto &arrivals = pending_[{comm->second, seq}];
    arrivals.emplace(r, std::move(e));
    // Complete once every simulated member has entered it.
    size_t expected = 0;
    for (int m : s.groups.at(group)) expected += simulated_[size_t(m)];
    if (arrivals.size() >= expected) ready_.push_back({comm->second, seq});
    return llvm::Error::success();
  }

  // Collectives every (simulated) member has entered complete, if they agree.
  llvm::Expected<bool> completeCollectives() {
    bool any = !ready_.empty();
    for (const auto &key : ready_) {
      auto it = pending_.find(key);
      auto &arrivals = it->second;
      int first = arrivals.begin()->first;
      const Entered &e0 = arrivals.begin()->second;
      for (auto &[r, e] : arrivals)
        if (e != e0)
          return error(llvm::formatv("collective #{0} of group {1}: {2} enters {3}, but {4} enters {5}", key.second,
                                     communicatorNames_[size_t(key.first)], at(first, e0.instruction), e0.text(),
                                     at(r, e.instruction), e.text()));
      for (auto &[r, e] : arrivals) finish(r, e.instruction);
      pending_.erase(it);
    }
    ready_.clear();
    return any;
  }

  const std::vector<RankPrograms> &ranks_;
  std::vector<bool> simulated_;
  std::vector<RankState> state_;
  std::map<std::pair<int, int>, std::deque<Message>> messages_;  // (from, to): the link's messages in order
  std::map<std::pair<int, int>, int> inFlight_;                  // (from, to): the most messages queued
  std::map<std::string, int> communicators_;   // "name:members" -> id
  std::vector<std::string> communicatorNames_;  // id -> "name:members"
  std::map<std::pair<int, int64_t>, std::map<int, Entered>> pending_;  // (communicator, call #) -> member -> what
  std::vector<std::pair<int, int64_t>> ready_;  // collectives every simulated member has entered
  int64_t executed_ = 0;
};

}  // namespace

llvm::Error programRunsOf(const RankPrograms &rank, int r, std::vector<ProgramRun> *runs) {
  runs->clear();
  std::map<std::string, const plan::Program *> byName;
  for (const plan::Program &p : rank.programs->programs()) byName[p.name()] = &p;
  std::map<const plan::Program *, size_t> lastOf;
  std::set<const plan::Program *> checked;
  for (const plan::ScheduleEntry &e : rank.plan->schedule()) {
    auto it = byName.find(e.program());
    if (it == byName.end())
      return error(llvm::formatv("rank {0}: the schedule names program '{1}', which its programs lack", r, e.program()));
    if (checked.insert(it->second).second)
      if (Status st = checkProgram(*it->second); !st.isOk()) return error(llvm::formatv("rank {0}: {1}", r, st.message()));
    lastOf[it->second] = runs->size();
    runs->push_back({it->second, e.micro_batch(), false});
  }
  for (size_t k = 0; k < runs->size(); ++k) (*runs)[k].last = lastOf[(*runs)[k].prog] == k;
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
                           ranks.size(), count, uniform && count < ranks.size() ? ", one per pipeline stage" : "",
                           sim.instructionsRun())
                 .str();
  return llvm::Error::success();
}

}  // namespace loom
