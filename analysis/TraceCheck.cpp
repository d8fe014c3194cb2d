#include "analysis/TraceCheck.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "analysis/StepSemantics.h"
#include "llvm/Support/FormatVariadic.h"
#include "plan/InstructionSet.h"

namespace loom {
namespace {

llvm::Error error(const llvm::Twine &msg) { return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str()); }

// One instruction run: program, micro-batch, instruction index (and, traced, its times).
struct Step {
  std::string program;
  int mb = -1, index = 0;
  std::string op;
  double start = 0, end = 0;
  std::string text() const {
    return llvm::formatv("{0} mb {1} instruction {2} ({3})", program, mb, index, op).str();
  }
  bool sameAs(const Step &o) const { return program == o.program && mb == o.mb && index == o.index; }
};

// What the plan semantics runs on each stream of rank r in one step: rank r executed alone,
// its communication completing as it starts (matching across ranks is checkPlans' part).
class StreamOrder : public StepSemantics::Driver {
 public:
  StreamOrder(const std::vector<RankPrograms> &ranks, int r) : sem_(ranks, only(ranks.size(), r), *this), r_(r) {}

  llvm::Error run(std::vector<Step> (&streams)[4]) {
    streams_ = &streams;
    if (llvm::Error e = sem_.prepare(r_)) return e;
    while (!sem_.finished(r_)) {
      llvm::Expected<bool> moved = sem_.start(r_, /*untilStable=*/true);
      if (!moved) return moved.takeError();
      if (!*moved) return error(llvm::formatv("rank {0}: its step cannot run alone (run loomc check)", r_));
    }
    return llvm::Error::success();
  }

 private:
  static std::vector<bool> only(size_t n, int r) {
    std::vector<bool> v(n, false);
    v[size_t(r)] = true;
    return v;
  }
  llvm::Expected<bool> issue(int r, int i) override {
    const plan::Instruction &in = sem_.instruction(r, i);
    (*streams_)[int(in.stream()) & 3].push_back({sem_.program(r).name(), sem_.run(r).mb, i, in.op()});
    if (isa::isCollective(in.op())) {
      StepSemantics::CallKey key;
      bool complete = false;
      if (llvm::Error e = sem_.enterCollective(r, i, &key, &complete)) return std::move(e);
      sem_.forgetCall(key);
    }
    sem_.complete(r, i);
    return true;
  }

  StepSemantics sem_;
  int r_;
  std::vector<Step> (*streams_)[4] = nullptr;
};

llvm::Error readTrace(const std::string &path, int rank, std::vector<Step> (&streams)[4]) {
  std::ifstream in(path);
  if (!in) return error(path + ": cannot read the trace");
  nlohmann::json trace = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (trace.is_discarded() || !trace.contains("traceEvents"))
    return error(path + ": not a trace (no traceEvents)");
  if (trace.contains("otherData") && trace["otherData"].value("rank", rank) != rank)
    return error(llvm::formatv("{0}: the trace of rank {1}, not {2}", path, trace["otherData"].value("rank", -1), rank));
  for (const nlohmann::json &e : trace["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const nlohmann::json &a = e.value("args", nlohmann::json::object());
    int tid = e.value("tid", 0);
    if (tid < 0 || tid > 3 || !a.contains("instruction"))
      return error(path + ": an event without a stream or instruction (a trace of another version)");
    double ts = e.value("ts", 0.0);
    streams[tid].push_back({a.value("program", ""), a.value("micro_batch", -1), a.value("instruction", 0),
                            e.value("name", ""), ts, ts + e.value("dur", 0.0)});
  }
  return llvm::Error::success();
}

const char *streamName(int k) { return k == 1 ? "tp" : k == 2 ? "pp" : k == 3 ? "dp" : "compute"; }

// Rank r's trace against its plan's order; the steps traced (the same on every stream).
llvm::Error checkRank(const std::vector<RankPrograms> &ranks, int r, const std::string &path, int64_t *events,
                      int *steps) {
  std::vector<Step> plan[4], traced[4];
  StreamOrder order(ranks, r);
  if (llvm::Error e = order.run(plan)) return e;
  if (llvm::Error e = readTrace(path, r, traced)) return e;
  *steps = -1;
  for (int k = 0; k < 4; ++k) {
    if (plan[k].empty()) {
      if (!traced[k].empty())
        return error(llvm::formatv("{0}: rank {1} runs {2} on its {3} stream, where the plan runs nothing", path, r,
                                   traced[k][0].text(), streamName(k)));
      continue;
    }
    size_t n = plan[k].size();
    for (size_t j = 0; j < traced[k].size(); ++j)
      if (!traced[k][j].sameAs(plan[k][j % n]))
        return error(llvm::formatv("{0}: rank {1}, {2} stream, step {3}: the runtime ran {4} where the plan runs {5}",
                                   path, r, streamName(k), j / n + 1, traced[k][j].text(), plan[k][j % n].text()));
    if (traced[k].size() % n != 0)
      return error(llvm::formatv("{0}: rank {1}, {2} stream: the trace ends inside a step ({3} instructions, {4} per "
                                 "step); the next the plan runs is {5}",
                                 path, r, streamName(k), traced[k].size(), n, plan[k][traced[k].size() % n].text()));
    int s = int(traced[k].size() / n);
    if (*steps >= 0 && s != *steps)
      return error(llvm::formatv("{0}: rank {1}: {2} steps traced on one stream, {3} on another", path, r, *steps, s));
    *steps = s;
    *events += int64_t(traced[k].size());
  }
  // Events: each instruction starts after the ones it waits for have ended, in the same run.
  // A run is identified by its program, micro-batch and how many times that pair has run.
  std::map<std::tuple<std::string, int, int, int>, const Step *> ended;  // (program, mb, run #, index)
  std::map<std::tuple<std::string, int, int, int>, int> runOf;           // (program, mb, stream, index) -> runs seen
  std::map<std::string, const plan::Program *> programs;
  for (const plan::Program &p : ranks[size_t(r)].programs->programs()) programs[p.name()] = &p;
  for (int k = 0; k < 4; ++k)
    for (const Step &s : traced[k]) ended[{s.program, s.mb, runOf[{s.program, s.mb, k, s.index}]++, s.index}] = &s;
  runOf.clear();
  for (int k = 0; k < 4; ++k)
    for (const Step &s : traced[k]) {
      int run = runOf[{s.program, s.mb, k, s.index}]++;
      const plan::Instruction &in = programs.at(s.program)->instructions(s.index);
      for (int w : in.wait_for()) {
        auto it = ended.find({s.program, s.mb, run, w});
        if (it == ended.end()) continue;  // passed over in this run
        if (s.start + 0.002 < it->second->end)  // the trace's times are rounded to the nanosecond
          return error(llvm::formatv("{0}: rank {1}: {2} started at {3} us, before {4}, which it waits for, ended at "
                                     "{5} us",
                                     path, r, s.text(), s.start, it->second->text(), it->second->end));
      }
    }
  return llvm::Error::success();
}

}  // namespace

llvm::Error checkTraces(const std::vector<RankPrograms> &ranks, const std::string &traceDir, std::string *summary) {
  int64_t events = 0;
  int steps = -1;
  for (size_t r = 0; r < ranks.size(); ++r) {
    int s = 0;
    if (llvm::Error e = checkRank(ranks, int(r), traceDir + "/rank_" + std::to_string(r) + ".json", &events, &s))
      return e;
    if (steps >= 0 && s != steps)
      return error(llvm::formatv("{0}: rank {1} traced {2} steps, rank 0 {3}", traceDir, r, s, steps));
    steps = s;
  }
  *summary = llvm::formatv("traces of {0} ranks, {1} steps: {2} instructions, each stream in the plan's order, every "
                           "event respected",
                           ranks.size(), steps, events)
                 .str();
  return llvm::Error::success();
}

}  // namespace loom
