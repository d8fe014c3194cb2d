#include "analysis/CostModel.h"

#include <algorithm>
#include <cmath>

#include "plan/InstructionSet.h"
#include "plan/PlanAttributes.h"

namespace loom {
namespace {


int64_t bufferBytes(const plan::Buffer &b) {
  return b.bytes() > 0 ? b.bytes() : planattr::numel(b) * (b.dtype() == plan::BF16 || b.dtype() == plan::F16 ? 2 : 4);
}

// y at x on the points (x_i, y_i), linear in log(x) between them, the nearest end outside.
double interpolateInLog(std::vector<std::pair<double, double>> pts, double x) {
  std::sort(pts.begin(), pts.end());
  if (x <= pts.front().first) return pts.front().second;
  for (size_t i = 1; i < pts.size(); ++i)
    if (x <= pts[i].first) {
      double a = std::log(pts[i - 1].first), b = std::log(pts[i].first);
      double w = b > a ? (std::log(x) - a) / (b - a) : 1.0;
      return pts[i - 1].second + w * (pts[i].second - pts[i - 1].second);
    }
  return pts.back().second;
}

}  // namespace

// By the instruction set's cost class (GEMMs: linear, weight_grad, the MoE experts; attention:
// the cores, their gradients and ring forms).
bool isGemmOp(const std::string &op) { return isa::costClassOf(op) == isa::CostClass::kGemm; }
bool isAttentionOp(const std::string &op) { return isa::costClassOf(op) == isa::CostClass::kAttention; }

double instructionBytes(const plan::Program &program, const plan::Instruction &in) {
  int64_t bytes = 0;
  for (int b : in.inputs()) bytes += bufferBytes(program.buffers(b));
  for (int b : in.outputs()) bytes += bufferBytes(program.buffers(b));
  return double(bytes);
}

int ringSteps(const std::string &op, int n) { return op == "all_reduce" ? 2 * (n - 1) : n - 1; }

CostModel::CostModel(const config::ClusterSpec &cluster, GemmPrecision precision, bool unitCost)
    : device_(cluster.device()), intra_(cluster.intra_node()), inter_(cluster.inter_node()),
      devicesPerNode_(std::max<int64_t>(cluster.devices_per_node(), 1)), unitCost_(unitCost) {
  double specific = precision == GemmPrecision::kBf16 ? device_.bf16_peak_flops() : device_.fp32_peak_flops();
  gemmPeak_ = specific > 0 ? specific : device_.peak_flops();
  for (const config::OpRate &r : device_.op_rates()) rates_[r.op()] = &r;
}

double CostModel::efficiency(const google::protobuf::RepeatedPtrField<config::EfficiencyPoint> &curve,
                             double flops) const {
  if (curve.empty()) return 1.0;
  std::vector<std::pair<double, double>> pts;
  for (const config::EfficiencyPoint &p : curve) pts.push_back({p.flops(), p.efficiency()});
  return interpolateInLog(pts, flops);
}

double CostModel::compute(const plan::Program &program, const plan::Instruction &in) {
  if (in.op() == "identity") return 0;
  if (unitCost_) {
    double units = program.kind() == plan::Program::FORWARD ? 1 : program.kind() == plan::Program::BACKWARD ? 2 : 0;
    if (units == 0) return 0;
    auto [it, fresh] = programFlops_.try_emplace(&program, 0.0);
    if (fresh)
      for (const plan::Instruction &i : program.instructions())
        if (!planattr::isCommunication(i.op()) || isa::computesToo(i.op())) it->second += i.flops();  // these compute
    return it->second > 0 ? units * in.flops() / it->second : 0;
  }
  return computeSeconds(in.op(), in.flops(), isGemmOp(in.op()) || isAttentionOp(in.op()) ? 0 : instructionBytes(program, in),
                        isAttentionOp(in.op()) && planattr::f64(in, "dropout") > 0);
}

double CostModel::computeSeconds(const std::string &op, double flops, double bytes, bool dropout) const {
  double seconds = device_.launch_overhead_s();
  if (isGemmOp(op) || isAttentionOp(op)) {
    const auto &curve = !isAttentionOp(op)                                             ? device_.gemm_efficiency()
                        : dropout && !device_.attention_dropout_efficiency().empty() ? device_.attention_dropout_efficiency()
                        : !device_.attention_efficiency().empty()                     ? device_.attention_efficiency()
                                                                                      : device_.gemm_efficiency();
    if (gemmPeak_ > 0) seconds += flops / (gemmPeak_ * efficiency(curve, flops));
    return seconds;
  }
  if (auto it = rates_.find(op); it != rates_.end()) return seconds + it->second->overhead_s() + bytes / it->second->bytes_per_s();
  if (device_.memory_bandwidth_bytes_per_s() > 0) seconds += bytes / device_.memory_bandwidth_bytes_per_s();
  return seconds;
}

double CostModel::communication(const plan::Program &program, const plan::Instruction &in,
                                const std::vector<int> &members) const {
  (void)program;
  return transferAmong(in, members, double(in.bytes_moved()));
}

double CostModel::computingCollective(const plan::Program &program, const plan::Instruction &in,
                                      const std::vector<int> &members) {
  // Context parallelism's ring: each step's transfer runs beside the previous member's blocks,
  // so the steps cost the larger of the two (Liu et al. 2023, section 3: the transfer is hidden
  // when a block's compute takes longer). The expert-parallel MoE dispatches, computes, then
  // combines: the sum.
  if (isa::isRingAttention(in.op())) return std::max(communication(program, in, members), compute(program, in));
  return communication(program, in, members) + compute(program, in);
}

double CostModel::communicationLatency(const plan::Instruction &in, const std::vector<int> &members) const {
  return transferAmong(in, members, 0.0);
}

// `in` moving `bytes` among `members`: one step for a send or recv, the op's ring steps for a
// collective, over the intra-node link when every member shares a node.
double CostModel::transferAmong(const plan::Instruction &in, const std::vector<int> &members, double bytes) const {
  if (unitCost_ || members.size() < 2) return 0;
  bool oneNode = true;
  for (int m : members) oneNode &= nodeOf(m) == nodeOf(members[0]);
  bool p2p = in.op() == "send" || in.op() == "recv";
  return transferSeconds(oneNode, p2p ? 1 : ringSteps(in.op(), int(members.size())), bytes);
}

double CostModel::transferSeconds(bool oneNode, int steps, double bytes) const {
  const config::Link &link = oneNode ? intra_ : inter_;
  if (!link.step_times().empty()) return steps * stepSeconds(link, bytes / std::max(steps, 1));
  double seconds = steps * link.latency_s();
  if (link.bandwidth_bytes_per_s() > 0) seconds += bytes / link.bandwidth_bytes_per_s();
  return seconds;
}

double CostModel::stepSeconds(const config::Link &link, double bytes) const {
  std::vector<std::pair<double, double>> pts;
  for (const config::TransferPoint &p : link.step_times()) pts.push_back({p.bytes(), p.seconds()});
  double last = std::max_element(pts.begin(), pts.end())->first, bw = link.bandwidth_bytes_per_s();
  if (bytes > last) return interpolateInLog(pts, last) + (bw > 0 ? (bytes - last) / bw : 0);
  return interpolateInLog(pts, bytes);
}

}  // namespace loom
