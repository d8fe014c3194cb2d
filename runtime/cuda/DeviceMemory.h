// What the CUDA backend allocates beyond the plan's buffers, as arithmetic over a plan with
// no CUDA in it: the compiler plans it (loomc compile refuses a layout that does not fit the
// device) and the CUDA executor sizes its buffers with the same functions: each program's
// per-stream scratch (cross-entropy statistics, 16-bit GEMM operands, attention scores or
// statistics, re-laid-out collective blocks), the 16-bit weight copies, cuBLASLt's workspace.
// GEMM operand precision is chosen at launch (--precision); the plan assumes bf16, the default.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "protos/plan.pb.h"
#include "runtime/Executor.h"
#include "plan/PlanAttributes.h"
#include "runtime/cuda/ScratchLayout.h"

namespace loom::cuda {

inline cpu::AttentionShape attentionShapeOf(const plan::Program &p, const plan::Instruction &in) {
  const plan::Buffer &qkv = p.buffers(in.inputs(0));
  int64_t heads = planattr::i64(in, "num_heads");
  int64_t headDim = heads > 0 ? planattr::dim(qkv, 2) / (3 * heads) : 0;
  return {planattr::dim(qkv, 0), planattr::dim(qkv, 1), heads, headDim, planattr::flag(in, "causal"), 0.0f, 0, 0};
}

// Scratch beyond the memory plan, per stream: the compute stream's is shared by its ops in
// turn (cross-entropy statistics, 16-bit GEMM operands, attention scores, the optimizer's sum);
// a communication stream's holds gathered blocks being re-laid out.
struct ScratchPlan {
  size_t bytes[4] = {};
  size_t offset(int stream) const {
    size_t at = 0;
    for (int k = 0; k < stream; ++k) at += aligned(bytes[k]);
    return at;
  }
  size_t total() const { return offset(4); }
};

inline ScratchPlan scratchFor(const plan::Program &p, Precision precision, AttentionKernel kernel) {
  ScratchPlan plan;
  size_t half = size_t(operandBytes(precision));
  for (const plan::Instruction &in : p.instructions()) {
    auto n = [&](int k) { return size_t(planattr::numel(p.buffers(in.inputs(k)))); };
    size_t need = 0;
    const std::string &op = in.op();
    if (op == "cross_entropy") {
      const plan::Buffer &logits = p.buffers(in.inputs(0));
      need = 3 * size_t(planattr::numel(logits) / planattr::dim(logits, -1)) * sizeof(float);
    } else if ((op == "linear" || op == "weight_grad") && precision != Precision::kFp32) {
      need = aligned(n(0) * half) + aligned(n(1) * half);
    } else if (op == "attention" || op == "attention_grad") {
      cpu::AttentionShape shape = attentionShapeOf(p, in);
      bool grad = op == "attention_grad";
      need = !useFlash(shape, precision, kernel) ? carveAttention(shape, precision, grad, nullptr).bytes
             : grad                              ? flashAttentionScratchBytes(shape)
                                                 : 0;
    } else if (op == "grouped_attention" || op == "grouped_attention_grad") {
      cpu::GroupedAttentionShape shape;  // the first head does not change the scratch size
      if (groupedAttentionShape(p, in, [](const std::string &, int64_t) { return int64_t(0); }, &shape).isOk())
        need = carveGroupedAttention(shape, precision, op == "grouped_attention_grad", nullptr).bytes;
    } else if ((op == "all_gather" || op == "reduce_scatter") && planattr::i64(in, "dim") > 0) {
      // Blocks along an inner dimension are re-laid out through scratch (the first is contiguous).
      size_t large = size_t(planattr::numel(p.buffers(op == "all_gather" ? in.outputs(0) : in.inputs(0))));
      need = large * sizeof(float);
    } else if (op == "sum_squares") {
      need = sizeof(double);
    }
    int s = int(in.stream());
    if (s >= 0 && s < 4) plan.bytes[s] = std::max(plan.bytes[s], need);
  }
  return plan;
}

// Bytes of the 16-bit copies of `elements` parameters the GEMMs read (none in fp32).
inline int64_t halfWeightBytes(int64_t elements, Precision p) { return p == Precision::kFp32 ? 0 : 2 * elements; }

}  // namespace loom::cuda
