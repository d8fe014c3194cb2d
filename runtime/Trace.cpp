#include "runtime/Trace.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "runtime/PlanAttributes.h"

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

// Names in the trace are loom op, program and group names: letters, digits, '_' and '.'.
std::string quoted(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

TraceRecorder::TraceRecorder() : epoch_(std::chrono::steady_clock::now()) {}

void TraceRecorder::record(const plan::Program &program, const plan::Instruction &in, int mb,
                           std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end) {
  Event e{&program, &in, mb, std::chrono::duration<double, std::micro>(start - epoch_).count(),
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
  {
    std::ofstream out(tmp);
    out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
    for (int s = 0; s < 4; ++s)  // stream threads named as the plan's streams
      out << "{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": " << plan.rank() << ", \"tid\": " << s
          << ", \"args\": {\"name\": \"" << streamName(s) << "\"}},\n";
    std::lock_guard<std::mutex> lock(mu_);
    char num[64];
    for (size_t i = 0; i < events_.size(); ++i) {
      const Event &e = events_[i];
      const plan::Instruction &in = *e.instruction;
      std::string group = planattr::str(in, "group");
      if (group.empty()) group = planattr::str(in, "vocab_parallel_group");
      int stream = int(in.stream());
      std::snprintf(num, sizeof num, "%.3f, \"dur\": %.3f", e.startUs, e.durationUs);
      out << "{\"ph\": \"X\", \"name\": " << quoted(in.op()) << ", \"cat\": \"" << streamName(stream)
          << "\", \"pid\": " << plan.rank() << ", \"tid\": " << stream << ", \"ts\": " << num
          << ", \"args\": {\"program\": " << quoted(e.program->name()) << ", \"micro_batch\": " << e.mb
          << ", \"layer\": " << in.layer() << ", \"group\": " << quoted(group) << ", \"bytes\": " << in.bytes_moved()
          << "}}"
          << (i + 1 < events_.size() ? ",\n" : "\n");
    }
    out << "],\n\"otherData\": {\"rank\": " << plan.rank() << ", \"plan_collectives_per_step\": {";
    for (int i = 0; i < plan.collectives_size(); ++i) {
      const plan::CollectiveTotal &c = plan.collectives(i);
      out << (i ? ", " : "") << quoted(c.kind()) << ": {\"count\": " << c.count() << ", \"bytes\": " << c.bytes() << "}";
    }
    out << "}}}\n";
    if (!out) return Status::error(path + ": cannot write the trace");
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Status::error(path + ": cannot write the trace: " + ec.message());
  return Status::ok();
}

}  // namespace loom
