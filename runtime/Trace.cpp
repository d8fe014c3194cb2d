#include "runtime/Trace.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "plan/PlanAttributes.h"

namespace loom {
namespace {

const char *streamName(int s) {
  switch (s) {
    case plan::TP: return "tp";
    case plan::PP: return "pp";
    case plan::DP: return "dp";
    default: return "compute";
  }
}

using Json = nlohmann::ordered_json;  // fields in the order written

// Microseconds to the nanosecond: shorter lines than the double's full expansion.
double micros(double us) { return std::round(us * 1000) / 1000; }

// One compact line; a name that is not UTF-8 is written with U+FFFD rather than refused.
std::string line(const Json &j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace

TraceRecorder::TraceRecorder() : epoch_(std::chrono::steady_clock::now()) {}

void TraceRecorder::record(const plan::Program &program, int index, int mb, std::chrono::steady_clock::time_point start,
                           std::chrono::steady_clock::time_point end) {
  Event e{&program, &program.instructions(index), index, mb, std::chrono::duration<double, std::micro>(start - epoch_).count(),
          std::chrono::duration<double, std::micro>(end - start).count()};
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back(e);
}

std::vector<TraceRecorder::Timing> TraceRecorder::timings() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<const plan::Instruction *, size_t> at;
  std::vector<Timing> out;
  for (const Event &e : events_) {
    auto [it, fresh] = at.try_emplace(e.instruction, out.size());
    if (fresh) out.push_back({e.program, e.instruction, {}});
    out[it->second].seconds.push_back(e.durationUs * 1e-6);
  }
  return out;
}

Status TraceRecorder::write(const std::string &path, const plan::RankPlan &plan) const {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::string tmp = path + ".tmp";
  Json other = {{"rank", plan.rank()}, {"plan_collectives_per_step", Json::object()}};
  for (const plan::CollectiveTotal &c : plan.collectives())
    other["plan_collectives_per_step"][c.kind()] = {{"count", c.count()}, {"bytes", c.bytes()}};
  {
    // {"displayTimeUnit", "traceEvents": [...], "otherData"}, the events streamed one per line
    // so that a long trace is never held a second time as JSON values.
    std::ofstream out(tmp);
    out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    for (int s = 0; s < 4; ++s)  // stream threads named as the plan's streams
      out << line({{"ph", "M"}, {"name", "thread_name"}, {"pid", plan.rank()}, {"tid", s},
                   {"args", {{"name", streamName(s)}}}})
          << ",\n";
    // One event value refilled for every instruction: building a fresh one per event costs
    // about three times as much on a long trace.
    Json event = {{"ph", "X"}, {"name", ""}, {"cat", ""}, {"pid", plan.rank()}, {"tid", 0}, {"ts", 0.0}, {"dur", 0.0},
                  {"args", {{"program", ""}, {"micro_batch", 0}, {"instruction", 0}, {"layer", 0}, {"group", ""}, {"bytes", 0}}}};
    Json &args = event["args"];
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < events_.size(); ++i) {
      const Event &e = events_[i];
      const plan::Instruction &in = *e.instruction;
      std::string group = planattr::str(in, "group");
      if (group.empty()) group = planattr::str(in, "vocab_parallel_group");
      int stream = int(in.stream());
      event["name"] = in.op();
      event["cat"] = streamName(stream);
      event["tid"] = stream;
      event["ts"] = micros(e.startUs);
      event["dur"] = micros(e.durationUs);
      args["program"] = e.program->name();
      args["micro_batch"] = e.mb;
      args["instruction"] = e.index;
      args["layer"] = in.layer();
      args["group"] = std::move(group);
      args["bytes"] = in.bytes_moved();
      out << line(event) << (i + 1 < events_.size() ? ",\n" : "\n");
    }
    out << "],\n\"otherData\":" << line(other) << "}\n";
    if (!out) return Status::error(path + ": cannot write the trace");
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::error(path + ": cannot write the trace: " + ec.message());
  return Status::ok();
}

}  // namespace loom
