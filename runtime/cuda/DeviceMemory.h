// What the CUDA backend allocates beyond the plan's buffers, as arithmetic over a plan with
// no CUDA in it: the compiler plans it (loomc compile refuses a layout that does not fit the
// device) and the CUDA executor sizes its buffers with the same functions: each program's
// per-stream scratch (cross-entropy statistics, 16-bit GEMM operands, attention scores or
// statistics, re-laid-out collective blocks), the 16-bit weight copies, cuBLASLt's workspace.
// An fp32 plan's GEMM operand precision is chosen at launch (--precision; the plan assumes
// bf16, the default); a 16-bit plan's GEMMs run in its own type on its 16-bit buffers.
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

// The GEMM precision a program runs at: a 16-bit plan's own type, else the launch's choice.
inline Precision programPrecision(const plan::Program &p, Precision launched) {
  for (const plan::Buffer &b : p.buffers()) {
    if (b.dtype() == plan::BF16) return Precision::kBf16;
    if (b.dtype() == plan::F16) return Precision::kFp16;
  }
  return launched;
}

// Outputs the CUDA kernels accumulate in fp32 across rows or heads (atomics, GEMMs with
// beta = 1): the norms' parameter gradients, the embedding gradient, grouped attention's dK and
// dV. When the plan has them 16-bit, the executor computes them in fp32 scratch and rounds
// them into the plan's buffer once, as the CPU backend rounds every 16-bit output once.
inline bool accumulatedInFp32(const std::string &op, int output) {
  if (op == "layer_norm_grad") return output == 1 || output == 2;
  if (op == "rms_norm_grad") return output == 1;
  if (op == "embedding_grad") return output == 0;
  if (op == "grouped_attention_grad") return output == 1 || output == 2;
  return false;
}
// The fp32 scratch those outputs of `in` take (none in an fp32 plan).
inline size_t wideOutputBytes(const plan::Program &p, const plan::Instruction &in) {
  size_t bytes = 0;
  for (int k = 0; k < in.outputs_size(); ++k) {
    const plan::Buffer &b = p.buffers(in.outputs(k));
    if (accumulatedInFp32(in.op(), k) && b.dtype() != plan::F32)
      bytes += aligned(size_t(planattr::numel(b)) * sizeof(float));
  }
  return bytes;
}

// Scratch beyond the memory plan, per stream: the compute stream's is shared by its ops in
// turn (cross-entropy statistics, 16-bit GEMM operands, attention scores, the optimizer's sum,
// then at its end the fp32 outputs of wideOutputBytes); a communication stream's holds
// gathered blocks being re-laid out.
struct ScratchPlan {
  size_t bytes[4] = {};
  size_t offset(int stream) const {
    size_t at = 0;
    for (int k = 0; k < stream; ++k) at += aligned(bytes[k]);
    return at;
  }
  size_t total() const { return offset(4); }
};

inline ScratchPlan scratchFor(const plan::Program &p, Precision launched, AttentionKernel kernel) {
  ScratchPlan plan;
  Precision precision = programPrecision(p, launched);
  size_t half = size_t(operandBytes(precision));
  for (const plan::Instruction &in : p.instructions()) {
    auto n = [&](int k) { return size_t(planattr::numel(p.buffers(in.inputs(k)))); };
    // A 16-bit plan's GEMM operands are 16-bit already: no rounded copies.
    bool native = in.inputs_size() > 0 && p.buffers(in.inputs(0)).dtype() != plan::F32;
    size_t need = 0;
    const std::string &op = in.op();
    if (op == "cross_entropy") {
      const plan::Buffer &logits = p.buffers(in.inputs(0));
      need = 3 * size_t(planattr::numel(logits) / planattr::dim(logits, -1)) * sizeof(float);
    } else if ((op == "linear" || op == "weight_grad") && precision != Precision::kFp32 && !native) {
      need = aligned(n(0) * half) + aligned(n(1) * half);
    } else if (op == "attention" || op == "attention_grad") {
      cpu::AttentionShape shape = attentionShapeOf(p, in);
      bool grad = op == "attention_grad";
      need = !useFlash(shape, precision, kernel) ? carveAttention(shape, precision, grad, nullptr, native).bytes
             : grad                              ? flashAttentionScratchBytes(shape)
                                                 : 0;
    } else if (op == "grouped_attention" || op == "grouped_attention_grad") {
      cpu::GroupedAttentionShape shape;  // the first head does not change the scratch size
      if (groupedAttentionShape(p, in, [](const std::string &, int64_t) { return int64_t(0); }, &shape).isOk())
        need = carveGroupedAttention(shape, precision, op == "grouped_attention_grad", nullptr, native).bytes;
    } else if ((op == "all_gather" || op == "reduce_scatter") && planattr::i64(in, "dim") > 0) {
      // Blocks along an inner dimension are re-laid out through scratch (the first is contiguous).
      const plan::Buffer &large = p.buffers(op == "all_gather" ? in.outputs(0) : in.inputs(0));
      need = size_t(planattr::numel(large) * planattr::elementBytes(large.dtype()));
    } else if (op == "sum_squares") {
      need = sizeof(double);
    }
    if (size_t wide = wideOutputBytes(p, in)) need = aligned(need) + wide;
    int s = int(in.stream());
    // Aligned: the fp32 outputs at the end of the compute scratch start 256-byte aligned.
    if (s >= 0 && s < 4) plan.bytes[s] = std::max(plan.bytes[s], aligned(need));
  }
  return plan;
}

// Bytes of the 16-bit copies of `elements` parameters the GEMMs read (none in fp32).
inline int64_t halfWeightBytes(int64_t elements, Precision p) { return p == Precision::kFp32 ? 0 : 2 * elements; }

}  // namespace loom::cuda
