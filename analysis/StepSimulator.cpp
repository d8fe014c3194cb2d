#include "analysis/StepSimulator.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>
#include <set>

#include "analysis/StepSemantics.h"
#include "analysis/Units.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"
#include "plan/InstructionSet.h"
#include "plan/ProgramCheck.h"
#include "plan/PlanAttributes.h"

namespace loom {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

llvm::Error error(const llvm::Twine &msg) { return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str()); }

struct Interval {
  double start, end;
};

// Length of the union of `spans` minus the union of `cover` (both sorted by start on return).
double uncovered(std::vector<Interval> spans, std::vector<Interval> cover) {
  auto merge = [](std::vector<Interval> &v) {
    std::sort(v.begin(), v.end(), [](const Interval &a, const Interval &b) { return a.start < b.start; });
    std::vector<Interval> out;
    for (const Interval &i : v) {
      if (i.end <= i.start) continue;
      if (!out.empty() && i.start <= out.back().end)
        out.back().end = std::max(out.back().end, i.end);
      else
        out.push_back(i);
    }
    v.swap(out);
  };
  merge(spans), merge(cover);
  double total = 0;
  size_t c = 0;
  for (const Interval &s : spans) {
    double at = s.start;
    while (c < cover.size() && cover[c].end <= at) ++c;
    for (size_t k = c; k < cover.size() && cover[k].start < s.end; ++k) {
      if (cover[k].start > at) total += cover[k].start - at;
      at = std::max(at, cover[k].end);
      if (at >= s.end) break;
    }
    if (at < s.end) total += s.end - at;
  }
  return total;
}

// The simulator's driver of the plan semantics (compiler/StepSemantics.h), in time: compute
// takes the cost model's seconds (on a CPU node, a share of its cores), a send's transfer
// starts at once and delivers its message when done, a receive finishes when its message has
// arrived, a collective starts when its last member enters and ends for all together.
class Engine : public StepSemantics::Driver {
 public:
  Engine(const std::vector<RankPrograms> &ranks, std::vector<bool> simulated, CostModel &cost, int coresPerNode,
         int threadsPerRank, double allCoresBusySlowdown)
      : sem_(ranks, std::move(simulated), *this), cost_(cost), state_(ranks.size()), cores_(coresPerNode),
        threads_(std::max(threadsPerRank, 1)), slowdown_(std::max(1.0, allCoresBusySlowdown)) {}

  llvm::Error run() {
    for (int r = 0; r < sem_.ranks(); ++r)
      if (sem_.executed(r))
        if (llvm::Error e = sem_.prepare(r)) return e;
    for (int r = 0; r < sem_.ranks(); ++r)
      if (sem_.executed(r))
        if (llvm::Error e = start(r, nullptr)) return e;
    while (true) {
      double next = events_.empty() ? kInf : events_.top().time;
      for (auto &[node, tasks] : shared_)
        for (const SharedTask &t : tasks) next = std::min(next, now_ + t.work / rate(tasks));
      if (next == kInf) break;
      for (auto &[node, tasks] : shared_) {
        double speed = rate(tasks);
        for (SharedTask &t : tasks) t.work -= (next - now_) * speed;
      }
      now_ = next;
      std::set<int> touched;
      while (!events_.empty() && events_.top().time <= now_) {
        Event e = events_.top();
        events_.pop();
        sem_.complete(e.rank, e.index), touched.insert(e.rank);
      }
      for (auto &[node, tasks] : shared_) {
        std::vector<SharedTask> still;
        std::vector<SharedTask> finished;
        for (const SharedTask &t : tasks)
          (t.work <= 1e-12 * std::max(1.0, now_) ? finished : still).push_back(t);
        tasks.swap(still);
        for (const SharedTask &t : finished) finish(t, &touched);
      }
      while (!touched.empty()) {
        std::set<int> more;
        for (int r : touched)
          if (llvm::Error e = start(r, &more)) return e;
        touched.swap(more);
      }
    }
    std::vector<std::string> stuck;
    for (int r = 0; r < sem_.ranks(); ++r)
      if (sem_.executed(r) && !sem_.finished(r)) stuck.push_back(std::to_string(r));
    if (!stuck.empty())
      return error("the step cannot finish on ranks " + llvm::join(stuck, ", ") +
                   " (run `loomc check` on the plans: it names the deadlock)");
    return llvm::Error::success();
  }

  // What the prediction reads of a simulated rank.
  struct RankState {
    std::vector<double> startAt;  // per instruction of the current run
    std::vector<Interval> compute;
    std::map<std::string, double> computeByOp;
    std::vector<std::pair<std::string, Interval>> communication;  // kind -> when data moves
    std::vector<ProgramSpan> spans;
    double runStart = 0, firstCompute = kInf, lastCompute = 0, end = 0;
    int64_t pipelineBytes[2] = {0, 0};  // sent per step to a peer on this node, on another node
  };
  const std::vector<RankState> &states() const { return state_; }
  int64_t instructions() const { return sem_.instructionsRun(); }

 private:
  struct Event {
    double time;
    int rank, index;
    bool operator<(const Event &o) const { return time > o.time; }  // earliest first
  };
  using Waiter = StepSemantics::Entry;
  // Work on a CPU node's shared cores: a kernel (on the rank's BLAS threads), or a rank's part
  // of moving a message or a collective's data (one thread: on CPU the copies through the
  // loopback socket and the reductions run on the ranks' own cores).
  enum class TaskKind { kKernel, kSend, kCollective };
  struct SharedTask {
    int rank, index;
    double work;  // seconds left at the full rate
    TaskKind kind = TaskKind::kKernel;
    int peer = -1;           // kSend: the receiving rank
    int64_t collective = 0;  // kCollective: the call it is a part of (collectives_)
  };
  // A collective call whose members are moving its data: done when every member's part is.
  struct CollectiveCall {
    std::vector<Waiter> members;
    size_t partsLeft = 0;
    double start = 0, latency = 0;
    double computing = 0;  // a ring attention's own blocks (not exposed communication)
    std::string kind;
  };

  // Work per second of each task while `tasks` share the node's cores: each gets its share of
  // the cores, at the speed a core has with that many of them busy (1 alone, the device's
  // all_cores_busy_slowdown with all busy, linear between).
  double rate(const std::vector<SharedTask> &tasks) const {
    if (cores_ <= 0) return 1.0;
    double demand = 0;
    for (const SharedTask &t : tasks) demand += t.kind == TaskKind::kKernel ? double(threads_) : 1.0;
    double busy = std::min(double(cores_), demand);
    double contention = cores_ > 1 ? 1 + (slowdown_ - 1) * std::max(0.0, busy - 1) / double(cores_ - 1) : 1.0;
    return std::min(1.0, double(cores_) / demand) / contention;
  }

  // A task on the shared cores has done its work.
  void finish(const SharedTask &t, std::set<int> *touched) {
    touched->insert(t.rank);
    if (t.kind == TaskKind::kKernel) return sem_.complete(t.rank, t.index);
    if (t.kind == TaskKind::kSend) {
      RankState &s = state_[size_t(t.rank)];
      double sent = s.startAt[size_t(t.index)];
      s.communication.push_back({kindOf(sem_.instruction(t.rank, t.index)), {sent, now_}});
      deliver(t.rank, t.peer, sent, now_, touched);
      return sem_.complete(t.rank, t.index);
    }
    auto it = collectives_.find(t.collective);
    if (--it->second.partsLeft > 0) return;  // this member waits (without a core) for the others
    double end = now_ + it->second.latency, exposedFrom = std::min(end, it->second.start + it->second.computing);
    for (const Waiter &w : it->second.members) {
      if (end > exposedFrom) state_[size_t(w.rank)].communication.push_back({it->second.kind, {exposedFrom, end}});
      schedule(w.rank, w.index, end);
    }
    collectives_.erase(it);
  }

  // A message from `from` to `to` has arrived: a waiting receive takes it, or it waits.
  void deliver(int from, int to, double sent, double arrival, std::set<int> *touched) {
    StepSemantics::Message m;
    m.sent = sent, m.arrival = arrival;
    auto &waiting = receivers_[{from, to}];
    if (!waiting.empty()) {  // the receiver already waits
      Waiter w = waiting.front();
      waiting.pop_front();
      receive(w, m);
      if (touched) touched->insert(w.rank);
    } else {
      sem_.link(from, to).push_back(m);
    }
  }

  void runBegan(int r) override {
    RankState &s = state_[size_t(r)];
    s.runStart = now_, s.firstCompute = kInf, s.lastCompute = now_;
    if (sem_.finished(r)) {
      s.end = now_;
      return;
    }
    s.startAt.assign(size_t(sem_.program(r).instructions_size()), 0.0);
  }

  void runEnded(int r) override {
    RankState &s = state_[size_t(r)];
    const ProgramRun &run = sem_.run(r);
    ProgramSpan span{run.prog->name(), run.prog->kind(), run.mb, run.prog->virtual_stage(),
                     s.firstCompute < kInf ? s.firstCompute : s.runStart, std::max(s.lastCompute, s.runStart)};
    s.spans.push_back(span);
  }

  void passedOver(int r, int i) override { state_[size_t(r)].startAt[size_t(i)] = now_; }

  void completed(int r, int i) override {
    RankState &s = state_[size_t(r)];
    const plan::Instruction &in = sem_.instruction(r, i);
    // A collective that computes (ring attention, expert-parallel MoE) counts as compute; only
    // the part of its transfers that its computation does not cover is exposed communication.
    if ((!isa::isCommunication(in.op()) || isa::computesToo(in.op())) && in.op() != "identity") {
      s.compute.push_back({s.startAt[size_t(i)], now_});
      s.computeByOp[in.op()] += now_ - s.startAt[size_t(i)];
      s.firstCompute = std::min(s.firstCompute, s.startAt[size_t(i)]);
      s.lastCompute = std::max(s.lastCompute, now_);
    }
  }

  void schedule(int r, int i, double at) { events_.push({at, r, i}); }

  std::string kindOf(const plan::Instruction &in) const { return in.op() + "@" + planattr::str(in, "group"); }

  // Starts what rank r's streams can start now; ranks whose state it changes go to `touched`.
  llvm::Error start(int r, std::set<int> *touched) {
    touched_ = touched;
    llvm::Expected<bool> moved = sem_.start(r, /*untilStable=*/true);
    touched_ = nullptr;
    return moved ? llvm::Error::success() : moved.takeError();
  }

  llvm::Expected<bool> issue(int r, int i) override {
    RankState &s = state_[size_t(r)];
    s.startAt[size_t(i)] = now_;
    const plan::Program &prog = sem_.program(r);
    const plan::Instruction &in = prog.instructions(i);
    const std::string &op = in.op();
    if (op == "send" || op == "recv") {
      int peer = sem_.peerOf(r, in);
      std::vector<int> pair{r, peer};
      double seconds = cost_.communication(prog, in, pair);
      if (op == "send") {
        s.pipelineBytes[cost_.nodeOf(r) != cost_.nodeOf(peer)] += prog.buffers(in.inputs(0)).bytes();
        if (cores_ > 0 && seconds > 0) {  // the sender's core moves it: delivered when done
          SharedTask t{r, i, seconds, TaskKind::kSend, peer};
          shared_[cost_.nodeOf(r)].push_back(t);
          return true;
        }
        schedule(r, i, now_ + seconds);
        s.communication.push_back({kindOf(in), {now_, now_ + seconds}});
        deliver(r, peer, now_, now_ + seconds, touched_);
        return true;
      }
      auto &queue = sem_.link(peer, r);
      if (!queue.empty()) {
        StepSemantics::Message m = queue.front();
        queue.pop_front();
        receive({r, i}, m);
      } else {
        receivers_[{peer, r}].push_back({r, i});
      }
      return true;
    }
    if (isa::isCollective(op)) {
      StepSemantics::CallKey key;
      bool complete = false;
      if (llvm::Error e = sem_.enterCollective(r, i, &key, &complete)) return std::move(e);
      if (!complete) return true;
      std::vector<Waiter> arrived = sem_.entries(key);
      sem_.forgetCall(key);
      const std::vector<int> &members = sem_.members(r, planattr::str(in, "group"));
      bool computes = isa::computesToo(in.op());
      double seconds = computes ? cost_.computingCollective(prog, in, members) : cost_.communication(prog, in, members);
      double computing = computes ? cost_.compute(prog, in) : 0.0;
      if (cores_ > 0 && seconds > 0) {  // every member's cores move its part of the data
        int64_t id = nextCollective_++;
        CollectiveCall &call = collectives_[id];
        call.members = arrived, call.partsLeft = arrived.size(), call.start = now_, call.kind = kindOf(in);
        call.computing = computing;
        // The latency part (wake-ups, hand-offs) takes no core; the rest moves bytes on them.
        call.latency = std::min(seconds, cost_.communicationLatency(in, members));
        for (const Waiter &w : arrived)
          shared_[cost_.nodeOf(w.rank)].push_back(
              {w.rank, w.index, std::max(seconds - call.latency, 1e-12), TaskKind::kCollective, -1, id});
        return true;
      }
      double end = now_ + seconds, exposedFrom = std::min(end, now_ + computing);
      for (const Waiter &w : arrived) {
        schedule(w.rank, w.index, end);
        if (end > exposedFrom) state_[size_t(w.rank)].communication.push_back({kindOf(in), {exposedFrom, end}});
        if (touched_) touched_->insert(w.rank);
      }
      return true;
    }
    double seconds = cost_.compute(prog, in);
    if (cores_ > 0 && seconds > 0)
      shared_[cost_.nodeOf(r)].push_back({r, i, seconds});
    else
      schedule(r, i, now_ + seconds);
    return true;
  }

  // A receive meets its message: done when the message has arrived (or now, if it already has).
  void receive(const Waiter &w, const StepSemantics::Message &m) {
    RankState &s = state_[size_t(w.rank)];
    const plan::Instruction &in = sem_.instruction(w.rank, w.index);
    double at = std::max(now_, m.arrival);
    schedule(w.rank, w.index, at);
    s.communication.push_back({kindOf(in), {std::max(s.startAt[size_t(w.index)], m.sent), at}});
  }

  StepSemantics sem_;
  CostModel &cost_;
  std::vector<RankState> state_;
  int cores_, threads_;
  double slowdown_;
  double now_ = 0;
  std::set<int> *touched_ = nullptr;  // during start(): ranks whose state an issue changes
  std::priority_queue<Event> events_;
  std::map<int, std::vector<SharedTask>> shared_;  // node -> compute running on its shared cores
  std::map<std::pair<int, int>, std::deque<Waiter>> receivers_;  // (from, to): receives waiting
  std::map<int64_t, CollectiveCall> collectives_;  // calls whose data is moving on shared cores
  int64_t nextCollective_ = 0;
};

}  // namespace

GemmPrecision defaultPrecision(const plan::RankPlan &plan) {
  return plan.cluster().device().kind() == config::CUDA ? GemmPrecision::kBf16 : GemmPrecision::kFp32;
}

llvm::Error simulateStep(const std::vector<RankPrograms> &ranks, const SimulateOptions &options, StepPrediction *out) {
  if (ranks.empty()) return error("no ranks to simulate");
  const plan::RankPlan &r0 = *ranks[0].plan;
  if (!r0.has_cluster())
    return error("the plans carry no cluster spec (compiled by an older loomc): compile them again to simulate");
  config::ClusterSpec cluster = r0.cluster();
  if (options.device) {
    *cluster.mutable_device() = options.device->device();
    if (options.device->has_intra_node()) *cluster.mutable_intra_node() = options.device->intra_node();
    if (options.device->has_inter_node()) *cluster.mutable_inter_node() = options.device->inter_node();
  }
  const config::Device &device = cluster.device();
  if (!options.unitCost && device.peak_flops() <= 0 && device.fp32_peak_flops() <= 0 && device.bf16_peak_flops() <= 0)
    return error("the device has no peak FLOP/s (device.peak_flops): nothing to turn FLOPs into time");
  CostModel cost(cluster, options.precision, options.unitCost);
  int cores = device.kind() == config::CPU && !options.unitCost ? device.cores_per_node() : 0;
  bool onePerStage = false;
  std::vector<bool> simulated = representativeRanks(ranks, &onePerStage);
  if (cores > 0) simulated.assign(ranks.size(), true);  // sharing the cores depends on every rank's timing
  Engine engine(ranks, simulated, cost, cores, device.threads_per_rank(), device.all_cores_busy_slowdown());
  if (llvm::Error e = engine.run()) return e;

  StepPrediction p;
  p.worldSize = int(ranks.size());
  if (!options.unitCost && ranks.size() > 1) {
    if (cluster.devices_per_node() > 1 && cluster.intra_node().bandwidth_bytes_per_s() <= 0)
      p.warnings.push_back("the cluster spec gives no intra_node link bandwidth: communication within a node is "
                           "counted as free");
    if (cluster.nodes() > 1 && cluster.inter_node().bandwidth_bytes_per_s() <= 0)
      p.warnings.push_back("the cluster spec gives no inter_node link bandwidth: communication between nodes is "
                           "counted as free");
  }
  if (!options.unitCost && device.memory_bandwidth_bytes_per_s() <= 0 && device.op_rates().empty())
    p.warnings.push_back("the device has no memory_bandwidth_bytes_per_s or op_rates: memory-bound ops cost only "
                         "their launch overhead");
  p.instructions = engine.instructions();
  for (size_t r = 0; r < ranks.size(); ++r)
    if (simulated[r]) p.stepSeconds = std::max(p.stepSeconds, engine.states()[r].end);
  double bubbles = 0, hardwareFlops = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    p.peakMemoryBytes = std::max(p.peakMemoryBytes, ranks[r].plan->memory().peak_bytes());
    hardwareFlops += ranks[r].plan->flops_per_step();
    if (!simulated[r]) continue;
    const Engine::RankState &s = engine.states()[r];
    RankPrediction rp;
    rp.rank = int(r), rp.stage = ranks[r].plan->pp_rank();
    for (const Interval &i : s.compute) rp.computeSeconds += i.end - i.start;
    std::vector<Interval> all;
    std::map<std::string, std::vector<Interval>> byKind;
    for (const auto &[kind, i] : s.communication) all.push_back(i), byKind[kind].push_back(i);
    rp.exposedCommunicationSeconds = uncovered(all, s.compute);
    for (auto &[kind, spans] : byKind) {
      double seconds = uncovered(spans, s.compute);
      if (seconds > 0) rp.exposedByKind[kind] = seconds, p.exposedByKind[kind] += seconds;
    }
    rp.idleSeconds = std::max(0.0, p.stepSeconds - rp.computeSeconds - rp.exposedCommunicationSeconds);
    rp.peakMemoryBytes = ranks[r].plan->memory().peak_bytes();
    rp.spans = s.spans;
    for (const auto &[kind, i] : s.communication) rp.communication.push_back({kind, i.start, i.end});
    rp.computeByOp = s.computeByOp;
    rp.pipelineBytesWithinNode = s.pipelineBytes[0], rp.pipelineBytesAcrossNodes = s.pipelineBytes[1];
    p.pipelineBytesWithinNode = std::max(p.pipelineBytesWithinNode, rp.pipelineBytesWithinNode);
    p.pipelineBytesAcrossNodes = std::max(p.pipelineBytesAcrossNodes, rp.pipelineBytesAcrossNodes);
    double busy = p.stepSeconds - rp.idleSeconds;
    bubbles += busy > 0 ? rp.idleSeconds / busy : 0;
    p.ranks.push_back(std::move(rp));
  }
  p.simulatedRanks = int(p.ranks.size());
  for (auto &[kind, seconds] : p.exposedByKind) seconds /= double(p.simulatedRanks);
  p.bubble = bubbles / double(p.simulatedRanks);
  if (p.stepSeconds > 0) {
    double tokens = double(r0.global_batch_size()) * double(r0.seq_length());
    p.modelTflopsPerDevice = r0.model_flops_per_token() * tokens / p.stepSeconds / double(ranks.size()) / 1e12;
    p.hardwareTflopsPerDevice = hardwareFlops / p.stepSeconds / double(ranks.size()) / 1e12;
    if (device.peak_flops() > 0) p.mfu = p.modelTflopsPerDevice * 1e12 / device.peak_flops();
  }
  *out = std::move(p);
  return llvm::Error::success();
}

nlohmann::ordered_json predictionObject(const StepPrediction &p) {
  nlohmann::ordered_json j = {{"step_time_s", p.stepSeconds},
                              {"tflops_per_device", p.modelTflopsPerDevice},
                              {"tflops_per_device_with_recompute", p.hardwareTflopsPerDevice},
                              {"mfu", p.mfu},
                              {"bubble", p.bubble},
                              {"peak_memory_bytes", p.peakMemoryBytes},
                              {"pipeline_bytes_within_node", p.pipelineBytesWithinNode},
                              {"pipeline_bytes_across_nodes", p.pipelineBytesAcrossNodes},
                              {"world_size", p.worldSize},
                              {"simulated_ranks", p.simulatedRanks}};
  j["exposed_communication_s"] = nlohmann::ordered_json::object();
  for (auto &[kind, seconds] : p.exposedByKind) j["exposed_communication_s"][kind] = seconds;
  j["warnings"] = p.warnings;
  j["ranks"] = nlohmann::ordered_json::array();
  for (const RankPrediction &r : p.ranks)
    j["ranks"].push_back({{"rank", r.rank},
                          {"stage", r.stage},
                          {"compute_s", r.computeSeconds},
                          {"exposed_communication_s", r.exposedCommunicationSeconds},
                          {"idle_s", r.idleSeconds},
                          {"peak_memory_bytes", r.peakMemoryBytes},
                          {"pipeline_bytes_within_node", r.pipelineBytesWithinNode},
                          {"pipeline_bytes_across_nodes", r.pipelineBytesAcrossNodes}});
  return j;
}

std::string predictionJson(const StepPrediction &p) { return predictionObject(p).dump() + "\n"; }

std::string predictionText(const StepPrediction &p) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("predicted step time {0}; {1:F2} TFLOP/s per device ({2:F2} with recomputation), MFU {3:F1}%\n",
                      humanSeconds(p.stepSeconds), p.modelTflopsPerDevice, p.hardwareTflopsPerDevice, 100 * p.mfu);
  os << llvm::formatv("pipeline bubble {0:F1}% of busy time; peak memory {1} (the largest rank)\n", 100 * p.bubble,
                      humanBytes(p.peakMemoryBytes));
  if (p.pipelineBytesWithinNode + p.pipelineBytesAcrossNodes > 0)
    os << llvm::formatv("pipeline messages sent per step, the most of any rank: {0} across nodes, {1} within a node\n",
                        humanBytes(p.pipelineBytesAcrossNodes), humanBytes(p.pipelineBytesWithinNode));
  if (!p.exposedByKind.empty()) {
    os << "exposed communication per rank (mean):";
    for (auto &[kind, seconds] : p.exposedByKind) os << " " << kind << " " << humanSeconds(seconds) << ";";
    os << "\n";
  }
  os << llvm::formatv("{0} ranks ({1} simulated), {2} instructions replayed\n", p.worldSize, p.simulatedRanks,
                      p.instructions);
  for (const std::string &w : p.warnings) os << "warning: " << w << "\n";
  // Where the busiest rank's compute goes: its six costliest ops.
  const RankPrediction *busiest = nullptr;
  for (const RankPrediction &r : p.ranks)
    if (!busiest || r.computeSeconds > busiest->computeSeconds) busiest = &r;
  if (busiest && busiest->computeSeconds > 0) {
    std::vector<std::pair<double, std::string>> ops;
    for (auto &[op, seconds] : busiest->computeByOp) ops.push_back({seconds, op});
    std::sort(ops.rbegin(), ops.rend());
    os << llvm::formatv("rank {0}'s compute by op:", busiest->rank);
    for (size_t k = 0; k < ops.size() && k < 6; ++k)
      os << llvm::formatv(" {0} {1} ({2:F0}%);", ops[k].second, humanSeconds(ops[k].first),
                          100 * ops[k].first / busiest->computeSeconds);
    os << "\n";
  }
  for (const RankPrediction &r : p.ranks)
    os << llvm::formatv("  rank {0,4} stage {1,3}: compute {2}, exposed communication {3}, idle {4}, peak {5}\n", r.rank,
                        r.stage, humanSeconds(r.computeSeconds), humanSeconds(r.exposedCommunicationSeconds),
                        humanSeconds(r.idleSeconds), humanBytes(r.peakMemoryBytes));
  return s;
}

std::string predictionTimelineSvg(const std::vector<RankPrograms> &ranks, const StepPrediction &p) {
  const plan::RankPlan &r0 = *ranks[0].plan;
  std::map<int, const RankPrediction *> byStage, byRank;
  for (const RankPrediction &r : p.ranks) byRank[r.rank] = &r, byStage.try_emplace(r.stage, &r);
  // Rows: every rank up to 64 (a rank not simulated shows its stage's simulated rank), else stages.
  std::vector<std::pair<int, const RankPrediction *>> rows;  // (rank, prediction)
  for (const RankPrograms &rp : ranks) {
    int rank = rp.plan->rank();
    bool show = ranks.size() <= 64 || byRank.count(rank);
    if (!show) continue;
    auto it = byRank.find(rank);
    const RankPrediction *pred = it != byRank.end() ? it->second : byStage[rp.plan->pp_rank()];
    if (pred) rows.push_back({rank, pred});
  }
  std::stable_sort(rows.begin(), rows.end(), [](auto a, auto b) { return a.second->stage < b.second->stage; });
  double width = 1100, rowH = 34, left = 150, top = 40;
  double scale = (width - left - 20) / std::max(p.stepSeconds, 1e-12);
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" font-family=\"Helvetica\" "
                      "font-size=\"11\">\n",
                      width, top + rowH * rows.size() + 60);
  os << llvm::formatv("<text x=\"10\" y=\"20\" font-size=\"14\">{0}: t={1} p={2} d={3} v={4}, {5} micro-batches, {6}; "
                      "predicted step {7}, bubble {8:F1}%</text>\n",
                      r0.model(), r0.t(), r0.p(), r0.d(), r0.v(), r0.micro_batches(), r0.schedule_kind(),
                      humanSeconds(p.stepSeconds), 100 * p.bubble);
  for (size_t row = 0; row < rows.size(); ++row) {
    auto [rank, pred] = rows[row];
    double y = top + double(row) * rowH;
    os << llvm::formatv("<text x=\"10\" y=\"{0}\">rank {1} (stage {2})</text>\n", y + rowH * 0.65, rank, pred->stage);
    os << llvm::formatv("<rect x=\"{0}\" y=\"{1}\" width=\"{2:F2}\" height=\"{3}\" fill=\"#eeeeee\"/>\n", left, y + 2,
                        p.stepSeconds * scale, rowH - 10);
    // Communication in flight, a thin strip under the compute: what it overlaps and what it does
    // not. Per group, the spans closer than half a pixel are drawn as one (a large plan has
    // thousands per rank), its title counting them.
    std::map<std::string, std::vector<const CommunicationSpan *>> byGroup;
    for (const CommunicationSpan &c : pred->communication) byGroup[c.kind.substr(c.kind.find('@') + 1)].push_back(&c);
    for (auto &[group, spans] : byGroup) {
      std::sort(spans.begin(), spans.end(), [](auto *a, auto *b) { return a->start < b->start; });
      const char *fill = group == "tp" ? "#e69138" : group == "pp" ? "#cc0000" : group == "dp" ? "#7f6000" : "#674ea7";
      for (size_t i = 0; i < spans.size();) {
        double start = spans[i]->start, end = spans[i]->end;
        std::string kind = spans[i]->kind;
        size_t j = i + 1;
        for (; j < spans.size() && (spans[j]->start - end) * scale < 0.5; ++j) end = std::max(end, spans[j]->end);
        std::string what = j - i == 1 ? kind : std::to_string(j - i) + " transfers on " + group;
        os << llvm::formatv("<rect x=\"{0:F2}\" y=\"{1}\" width=\"{2:F2}\" height=\"4\" fill=\"{3}\"><title>{4}: {5} .. "
                            "{6}</title></rect>\n",
                            left + start * scale, y + rowH - 7, std::max((end - start) * scale, 0.5), fill, what,
                            humanSeconds(start), humanSeconds(end));
        i = j;
      }
    }
    for (const ProgramSpan &sp : pred->spans) {
      bool fwd = sp.kind == plan::Program::FORWARD, bwd = sp.kind == plan::Program::BACKWARD;
      int chunk = r0.p() > 0 ? sp.virtualStage / r0.p() : 0;
      const char *fill = fwd   ? (chunk % 2 ? "#6fa8dc" : "#3d85c6")
                         : bwd ? (chunk % 2 ? "#93c47d" : "#6aa84f")
                               : "#b4a7d6";
      const char *what = fwd ? "forward" : bwd ? "backward" : sp.program.c_str();
      os << llvm::formatv("<rect x=\"{0:F2}\" y=\"{1}\" width=\"{2:F2}\" height=\"{3}\" fill=\"{4}\" stroke=\"white\" "
                          "stroke-width=\"0.5\"><title>{5} chunk {6} micro-batch {7}: {8} .. {9}</title></rect>\n",
                          left + sp.start * scale, y + 2, std::max((sp.end - sp.start) * scale, 0.5), rowH - 10, fill,
                          what, chunk, sp.microBatch, humanSeconds(sp.start), humanSeconds(sp.end));
      if ((sp.end - sp.start) * scale > 14 && (fwd || bwd))
        os << llvm::formatv("<text x=\"{0:F2}\" y=\"{1}\" fill=\"white\" font-size=\"9\">{2}{3}</text>\n",
                            left + sp.start * scale + 2, y + rowH * 0.55, fwd ? "F" : "B", sp.microBatch);
    }
  }
  double ly = top + double(rows.size()) * rowH + 20;
  for (int tick = 0; tick <= 10; ++tick) {
    double x = left + tick * (width - left - 20) / 10;
    os << llvm::formatv("<text x=\"{0:F1}\" y=\"{1}\" font-size=\"9\">{2}</text>\n", x, ly,
                        humanSeconds(p.stepSeconds * tick / 10));
  }
  os << llvm::formatv("<text x=\"{0}\" y=\"{1}\">predicted time (loomc simulate); blue: forward, green: backward, "
                      "purple: loss and optimizer, grey: idle or waiting on communication; thin bars: communication in "
                      "flight (orange tp, red pp, brown dp, violet other groups)</text>\n</svg>\n",
                      left, ly + 20);
  return s;
}

}  // namespace loom
