// The version of the plan format (protos/plan.proto) that this build writes and reads. A plan
// directory from a loomc of another version is refused by every reader with one line, instead
// of being misread: bump kPlanVersion whenever a field's meaning changes.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

// 2: the first versioned format (model facts from the IR, vocabulary padding per parameter).
// 3: the whole step in the plan: gradients accumulated and synchronised inside the backward
//    (last_micro_batch), flat parameter/gradient buffers, the loss and optimizer programs.
// 4: attention keeps its softmax statistics: attention / grouped_attention may have a second
//    output (lse), and attention_grad / grouped_attention_grad read it after the gradient.
// 5: cross-entropy keeps its log-sum-exp: cross_entropy / cross_entropy_loss may have a second
//    output (lse), cross_entropy_grad reads it as its third input (vocab-parallel too: no
//    collective and no cross_entropy_logits_grad in the backward).
// 6: the instruction set is declared once (plan/InstructionSet.cpp) and every instruction is
//    verified against it; sum_squares names the group across which flagged (r) segments are
//    replicated (replicated_group), instead of the executors assuming tp.
// 7: dropout's rank_distinct and attention's rank_distinct_dropout name the group across which
//    the random streams differ (a string, "tp"), instead of a flag the executors read as tp.
// 8: 16-bit plans as Megatron's mixed precision: PARAMETER arguments of the programs' dtype
//    (bf16 / fp16) are the 16-bit copies of the fp32 master weights (the flat buffer), which the
//    optimizer program remakes with `cast` after each update; GRADIENT and LOSS arguments are
//    fp32 (main gradients: a 16-bit gradient is accumulated into fp32); adamw, sum_squares and
//    grad_norm take fp32 operands only. fp32 plans are as in version 7.
// 9: the workspace shares memory across streams (activations whose accesses are ordered by
//    stream order and wait_for events); a result's bytes are in use only until its producer's
//    stream runs its next instruction, so an executor that hands results over later keeps them
//    elsewhere (their slots). MemoryPlan reports stash per micro-batch and chunks in flight.
// 10: ZeRO-1 by buckets (Megatron's distributed optimizer): the flat buffer is padded bucket by
//    bucket (RankPlan.zero1_buckets), each bucket's gradients reduce-scattered in place in the
//    last backward (the rank's part of the bucket) and its parameters all-gathered in place at the
//    head of the next step's forward (first_micro_batch) or in the `parameter_gather` program;
//    arguments may be views (Binding.offset, part_of); adamw and sum_squares take flat_offset.
// 11: context parallelism: RankPlan.c and cp_rank, the groups "cp" and "dpcp"; token-wise ops
//    over a rank's sequence chunks carry context_parallel_group (positions, rotary, dropout
//    counters and attention map a local token to its global position).
// 12: mixture of experts: the moe / moe_grad instructions, RankPlan's num_experts and its MoE
//    facts.
// 13: ZeRO-1 in 16-bit plans shards the fp32 master weights (RankPlan.master_weights_sharded):
//    the optimizer updates the OPTIMIZER_STATE "master_weights" (the rank's bucket parts back to
//    back) instead of PARAMETER views, and `parameter_gather` casts them into the 16-bit copies
//    and all-gathers those.
inline constexpr uint32_t kPlanVersion = 13;

// "" when `version` is this build's; otherwise why `what` (a plan file) cannot be read.
inline std::string planVersionError(uint32_t version, const std::string &what) {
  if (version == kPlanVersion) return "";
  return what + ": plan format version " + std::to_string(version) +
         (version == 0 ? " (written before plans had versions)" : "") + ", but this build reads version " +
         std::to_string(kPlanVersion) + ": recompile the model with this build's `loomc compile`";
}

}  // namespace loom
