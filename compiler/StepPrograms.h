// The training step beyond one micro-batch's forward and backward, lowered into the plan so
// that the runtime runs exactly its plan:
// - gradient accumulation over micro-batches and gradient synchronisation (tied embeddings,
//   tensor-parallel partial gradients, data-parallel buckets) folded into each backward
//   program: every gradient is added in place into its slice of the rank's flat gradient
//   buffer, and each synchronising collective runs in the step's last backward as soon as its
//   own gradients are final, on its stream, overlapping the rest of the backward;
// - the loss sum of each forward, and a `loss` program (the mean over micro-batches and dp);
// - an `optimizer` program: global gradient norm with its groups, clipping, AdamW over the
//   flat buffer (ZeRO-1: reduce-scatter, the shard's update, all-gather), zeroed gradients.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "llvm/Support/Error.h"
#include "mlir/IR/BuiltinOps.h"
#include "protos/plan.pb.h"

namespace loom {

// One parameter of a pipeline stage, where it lives in the stage's flat buffers.
struct StageParameter {
  std::string name;
  std::vector<int64_t> shape;  // local (this rank's shard)
  int64_t elements = 0;
  int64_t flatOffset = 0;      // elements, 16-aligned (64 bytes)
  bool tied = false;           // a pipeline-tied copy (its twin is counted in the norm)
  bool tpReplicated = false;   // the same on every tp rank (counted once in the norm)
  bool expert = false;         // experts split over "ep" (each member's differ: their norm summed over it)
  bool decay = false;          // AdamW's weight decay (Megatron: matrices, not biases or norms)
};

// ZeRO-1's unit of communication (Megatron's distributed optimizer buckets): consecutive
// parameters of one backward, their gradients reduce-scattered over dp as soon as that backward's
// last run has them, their parameters all-gathered before the next step's forward reads them.
// Member r of the bucket's group owns elements [flatBegin + r q, flatBegin + (r + 1) q) of it,
// q = elements / parts: their reduced gradients (in place in the flat gradients), their update, and
// their AdamW moments at shardBegin of the rank's moments. The group is dp (dpcp with context
// parallelism) of d parts, or for an MoE's experts split over "ep" (Megatron-Core's expert data
// parallelism) "edp" of d / ep parts: the ranks holding the same experts; a bucket of one part
// (d = ep) is the rank's own, with no collective.
struct StageBucket {
  int64_t flatBegin = 0, elements = 0;  // elements: a multiple of parts x 16
  int64_t shardBegin = 0;
  std::string group = "dp";
  int parts = 1;
  int64_t part() const { return elements / parts; }
  // The view of the rank's part: a part of `group`, or (one part) the whole bucket.
  std::string partOf() const { return parts > 1 ? group : std::string(); }
  int virtualStage = -1;                // the backward (and forward) of its gradients; -1: none
  bool gatherInForward = false;         // all-gathered by its forward's first run, else by the optimizer
  bool alone = false;                   // a gradient reduced across stages first: its own bucket
  std::vector<std::string> params;
};

struct StageLayout {
  std::vector<StageParameter> parameters;  // in the order the stage's programs first bind them
  int64_t flatElements = 0;                // with ZeRO-1 the buckets' sum
  std::vector<StageBucket> buckets;        // ZeRO-1 with d > 1 only
  // The dtype the stage's programs compute with (their PARAMETER arguments'). fp32: the flat
  // buffer itself. bf16 / fp16 (Megatron's mixed precision): a 16-bit flat copy of the fp32
  // master weights, remade by the optimizer program after each update; the main gradients and
  // the AdamW moments stay fp32.
  plan::DType computeDtype = plan::F32;
  // ZeRO-1 in a 16-bit plan (Megatron's distributed optimizer, 6 + 12/d bytes per parameter):
  // the fp32 master weights are the rank's bucket parts only, the optimizer state
  // kMasterWeights (plan/Zero1Parts.h) at each bucket's shardBegin, as AdamW's moments.
  bool mastersSharded() const { return computeDtype != plan::F32 && !buckets.empty(); }
  // The weight gradients' reduction group (ZeRO-1's shards, the norm's sum over them): "dp", or
  // "dpcp" (the d x c ranks of a (tp, pp) position) with context parallelism.
  std::string dpGroup = "dp";
};

// The stage's parameters from its programs' PARAMETER arguments and the IR's argument
// attributes (tied copies, tensor-parallel shards), laid out in the order the backwards
// finish their gradients (a data-parallel bucket is then one contiguous range). Parameters
// of more than one float dtype in a stage are an error naming two of them.
// With ZeRO-1 (d > 1) the parameters are cut into buckets of at most bucketBytes of fp32
// gradients (one parameter at least), never across backwards nor between experts (split over "ep",
// sharded over "edp", d / ep parts) and the rest (over dpGroup, d parts), each padded to a multiple
// of its parts x 16;
// a parameter in `syncedLater` (reduced across stages by the optimizer program first: the tied
// embedding) is a bucket of its own, so that the rest reduce in their backwards.
llvm::Expected<StageLayout> stageLayout(mlir::ModuleOp module, const plan::ProgramSet &set, int d, bool zero1,
                                        int64_t bucketBytes, const std::set<std::string> &syncedLater,
                                        const std::string &dpGroup = "dp", int ep = 1);
// The elements of the rank's AdamW moments: its part of every bucket with ZeRO-1, else all.
int64_t optimizerElements(const StageLayout &layout);

// ZeRO-1: appends to `backward` (after foldGradientSync) the reduce-scatter over dp of each
// bucket of its virtual stage, in its last run, as soon as the bucket's gradients are final
// (on the dp stream, overlapping the rest of the backward), from the flat gradients into the
// rank's part of the bucket, in place; buckets holding a parameter in `syncedLater` (reduced across stages by the
// optimizer program first) are left to the optimizer program.
void appendBucketReduceScatters(plan::Program &backward, const StageLayout &layout, plan::DType dpWire,
                                bool serial, const std::set<std::string> &syncedLater);
// ZeRO-1: prepends to `forward` the all-gather over dp of each bucket of its virtual stage, in
// place in the flat parameters (a 16-bit plan: in their 16-bit copies, which the optimizer
// rounded its part into), in its first run; each instruction reading a bucket's parameters waits
// for that bucket only.
void prependParameterGathers(plan::Program &forward, const StageLayout &layout);
// ZeRO-1: the `parameter_gather` program: the fp32 master weights' all-gathers the step did not
// do (every bucket's in a 16-bit plan), run by the step driver when something outside the step
// reads the parameters (a checkpoint, an export).
plan::Program parameterGatherProgram(const StageLayout &layout);

// A gradient-sync collective over a group that spans pipeline stages (the tied embedding's
// "embedding" group): it cannot run inside a backward (the stages reach their last backward
// at different points of the schedule, and a stage blocked in it would never serve its
// peers' pipeline messages), so it runs at the head of the optimizer program, once every
// stage has finished its schedule (Megatron: finalize_model_grads).
struct DeferredSync {
  plan::Instruction collective;     // its inputs and outputs are filled in by the optimizer program
  std::vector<std::string> params;  // the gradients it reduces, in operand order
};

// Folds `gradSync` (the chunk's gradient-sync program, or null) into `backward`: collectives
// within the stage (tp, dp) run in the backward's last run; the others are appended to
// `deferred`. The backward adds its gradients into inout GRADIENT arguments (see above).
// serial: the folded collectives wait for the backward's last compute instruction instead of
// only for their own gradients (no overlap; cluster spec serial_grad_reduce). dpWire: the
// dtype the data-parallel reductions move (F32, or BF16: cluster spec grad_reduce_in_bf16).
llvm::Error foldGradientSync(plan::Program &backward, const plan::Program *gradSync, bool serial, plan::DType dpWire,
                             std::vector<DeferredSync> *deferred);
// The inout LOSS argument a forward adds its LOSS result `loss` into: "loss_sum" for the
// loss, "loss_sum:<name>" for each of the losses it sums (BERT's "lm loss", "sop loss").
std::string lossSumName(const std::string &loss);
// A forward with LOSS results adds each into its inout LOSS argument (lossSumName) instead.
void accumulateLoss(plan::Program &forward);
// The names of the losses a forward's loss sums (its "loss_sum:<name>" arguments, after
// accumulateLoss).
std::vector<std::string> lossTermsOf(const plan::Program &forward);

// The last stage's `loss` program: loss_sum / m, averaged over dp, as METRIC "loss" (and each
// term's likewise, as METRIC <term>, the dp average of all in one all-reduce); then the sums
// are zeroed.
plan::Program lossProgram(int microBatches, const std::string &group, int d,
                          const std::vector<std::string> &terms = {});
// The `optimizer` program of a stage (t, p, d: the group sizes of the layout).
// With ZeRO-1 by buckets (layout.buckets): each bucket's reduce-scatter that no backward ran,
// AdamW on the rank's part of every bucket, in place (a 16-bit plan: then rounded into that part
// of the 16-bit copies), and the all-gather of each bucket that no forward gathers (virtual
// stage -1; the copies only, in a 16-bit plan). ep: expert parallelism's size (the experts' gradient
// squares are summed over "ep" apart from the rest's).
plan::Program optimizerProgram(const StageLayout &layout, int t, int p, int d, bool zero1, plan::DType dpWire,
                               const std::vector<DeferredSync> &deferred, int ep = 1);
// ZeRO-1: the `gradient_gather` program: the all-gathers, in place in the flat gradients, of the
// parts the backwards reduce-scattered (the buckets the optimizer reduces are left as they are),
// so every replica holds those buckets' reduced gradients whole; empty when no backward reduces.
plan::Program gradientGatherProgram(const StageLayout &layout, const std::vector<DeferredSync> &deferred);

}  // namespace loom
