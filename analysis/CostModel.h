// What an instruction of a compiled plan costs on a device (`loomc simulate`): the device and
// link model of the cluster spec the plans were compiled for (protos/cluster.proto: Device,
// Link; a device file merged in), or a unit-cost model for checking schedules.
//
// Compute: linear and weight_grad at the GEMM peak of the precision times the device's
// efficiency for a GEMM of that many FLOPs (attention ops: their own curve); every other op by
// the bytes it reads and writes, at its calibrated rate or the memory bandwidth; each
// instruction pays the launch overhead. Communication: the instruction's bytes per rank (the
// ring's traffic, computed by the lowering) over the link its group uses (every member on one
// node: intra_node, else inter_node; both per device and direction, so concurrent groups each
// have their own share), plus one latency per ring step.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "protos/cluster.pb.h"
#include "protos/plan.pb.h"

namespace loom {

enum class GemmPrecision { kFp32, kBf16 };

class CostModel {
 public:
  // unitCost: every forward program run costs 1 and every backward 2 (spread over their compute
  // instructions by FLOPs), everything else nothing: the schedule's analytic bubble.
  CostModel(const config::ClusterSpec &cluster, GemmPrecision precision, bool unitCost);

  // Seconds on one device at its full rate.
  double compute(const plan::Program &program, const plan::Instruction &in);
  // Seconds for a collective, send or recv among `members` (global ranks).
  double communication(const plan::Program &program, const plan::Instruction &in, const std::vector<int> &members) const;
  // A collective that computes (isa::computesToo): ring attention's transfers overlapped with
  // its blocks, the expert-parallel MoE's after and before its experts.
  double computingCollective(const plan::Program &program, const plan::Instruction &in, const std::vector<int> &members);
  // The part of communication() that does not grow with the bytes (the link's per-step
  // latency: wake-ups and hand-offs, waiting rather than moving data).
  double communicationLatency(const plan::Instruction &in, const std::vector<int> &members) const;
  // `steps` ring steps moving `bytes` per rank in all over the intra-node link (oneNode) or
  // the inter-node one: per step a latency, or the link's measured step time.
  double transferSeconds(bool oneNode, int steps, double bytes) const;
  int nodeOf(int rank) const { return int(rank / devicesPerNode_); }
  // The same model for an op known by its name, FLOPs and bytes (the global IR's ops, before
  // lowering: the stage balancer's costs).
  // `dropout`: an attention op with attention dropout (its own efficiency curve when the
  // device has one).
  double computeSeconds(const std::string &op, double flops, double bytes, bool dropout = false) const;
  bool unitCost() const { return unitCost_; }

 private:
  double efficiency(const google::protobuf::RepeatedPtrField<config::EfficiencyPoint> &curve, double flops) const;
  double stepSeconds(const config::Link &link, double bytes) const;  // from the link's measured step times
  double transferAmong(const plan::Instruction &in, const std::vector<int> &members, double bytes) const;

  config::Device device_;
  config::Link intra_, inter_;
  int64_t devicesPerNode_ = 1;
  double gemmPeak_ = 0;
  bool unitCost_ = false;
  std::map<std::string, const config::OpRate *> rates_;
  std::map<const plan::Program *, double> programFlops_;  // unit cost: a program's compute FLOPs
};

// The op classes the model (and `loomc calibrate`) cost apart: GEMMs, attention.
bool isGemmOp(const std::string &op);
bool isAttentionOp(const std::string &op);
// Bytes an instruction reads and writes: its input and output buffers.
double instructionBytes(const plan::Program &program, const plan::Instruction &in);

// Ring steps of a collective over n ranks: 2 (n - 1) for an all-reduce, n - 1 otherwise.
int ringSteps(const std::string &op, int n);

}  // namespace loom
