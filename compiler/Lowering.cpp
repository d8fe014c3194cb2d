#include "compiler/Lowering.h"

#include <algorithm>
#include <array>
#include <climits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "plan/InstructionSet.h"
#include "plan/PlanAttributes.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/TypeSwitch.h"
#include "mlir/IR/BuiltinOps.h"

namespace loom {
namespace {

constexpr int64_t kAlign = 64;

int64_t numel(mlir::Value v) { return mlir::cast<mlir::RankedTensorType>(v.getType()).getNumElements(); }
int64_t lastDim(mlir::Value v) { return mlir::cast<mlir::RankedTensorType>(v.getType()).getShape().back(); }

plan::DType dtypeOf(mlir::Type t) {
  mlir::Type e = mlir::cast<mlir::RankedTensorType>(t).getElementType();
  if (e.isBF16()) return plan::BF16;
  if (e.isF16()) return plan::F16;
  if (e.isInteger(32) || e.isInteger(64)) return plan::I32;
  return plan::F32;
}

int64_t bytesOf(mlir::Value v) {
  return numel(v) * planattr::elementBytes(dtypeOf(v.getType()));
}

}  // namespace

// The declaration of an IR op's plan instruction (null: none, e.g. func.return).
// An attention core marked context_parallel_ring is the plan's ring form of it (ring_attention,
// ring_grouped_attention and their gradients).
const isa::OpDecl *declOf(mlir::Operation *op) {
  if (op->getName().getDialectNamespace() != "loom") return nullptr;
  const isa::OpDecl *d = isa::find(op->getName().stripDialect());
  if (d && op->hasAttr("context_parallel_ring")) return isa::ringFormOf(d->id);
  if (d && op->hasAttr("expert_parallel_group")) return isa::expertParallelFormOf(d->id);
  return d;
}

namespace {
int64_t contextParallelSize(mlir::Operation *op) {
  auto c = op->getAttrOfType<mlir::IntegerAttr>("context_parallel_size");
  return c ? std::max<int64_t>(1, c.getInt()) : 1;
}
}  // namespace

double flopsOf(mlir::Operation *op) {
  const isa::OpDecl *d = declOf(op);
  if (!d || !d->flops) return 0.0;
  std::vector<isa::Shape> inputs, outputs;
  for (mlir::Value v : op->getOperands()) {
    auto s = mlir::cast<mlir::RankedTensorType>(v.getType()).getShape();
    inputs.emplace_back(s.begin(), s.end());
  }
  for (mlir::Value v : op->getResults()) {
    auto s = mlir::cast<mlir::RankedTensorType>(v.getType()).getShape();
    outputs.emplace_back(s.begin(), s.end());
  }
  auto times = d->flopsTimesAttr ? op->getAttrOfType<mlir::IntegerAttr>(d->flopsTimesAttr) : mlir::IntegerAttr();
  return isa::flopsOf(*d, inputs, outputs, times ? times.getInt() : 1);
}

int64_t bytesMovedOf(mlir::Operation *op) {
  const isa::OpDecl *d = declOf(op);
  if (d && isa::isRingAttention(d->id)) {
    // What the rank sends round the ring: c - 1 times its keys and values (GPT: 2/3 of the fused
    // qkv) in their dtype; the backward c times their gradients as well, in fp32 (the
    // accumulators are partial sums: runtime/cpu/Kernels.h RingAttentionShape::keyWire).
    int64_t c = contextParallelSize(op);
    bool grouped = d->id == isa::OpId::kRingGroupedAttention || d->id == isa::OpId::kRingGroupedAttentionGrad;
    int64_t kvValues = grouped ? numel(op->getOperand(1)) + numel(op->getOperand(2)) : numel(op->getOperand(0)) * 2 / 3;
    int64_t kvBytes = kvValues * planattr::elementBytes(dtypeOf(op->getOperand(grouped ? 1 : 0).getType()));
    bool backward = d->id == isa::OpId::kRingAttentionGrad || d->id == isa::OpId::kRingGroupedAttentionGrad;
    return (c - 1) * kvBytes + (backward ? c * kvValues * 4 : 0);
  }
  if (d && (d->id == isa::OpId::kExpertParallelMoe || d->id == isa::OpId::kExpertParallelMoeGrad)) {
    // With uniform routing (ep - 1) / ep of the rank's T top_k assignments go to other members
    // (H values a row): forward their input rows out and the experts' outputs back, in the
    // activations' dtype (a 16-bit plan's experts round their outputs); the backward the input
    // rows and output gradients out in their dtypes with each row's routing weight (fp32), and
    // the input gradients (fp32 partial sums) and the weights' gradients back
    // (runtime/cpu/MoeKernels.cpp).
    auto ep = op->getAttrOfType<mlir::IntegerAttr>("expert_parallel_size");
    auto k = op->getAttrOfType<mlir::IntegerAttr>("top_k");
    int64_t n = ep ? ep.getInt() : 1, topK = k ? k.getInt() : 1;
    if (n <= 1) return 0;
    mlir::Value input = op->getOperand(0);
    int64_t hidden = lastDim(input), pairs = numel(input) / hidden * topK;
    auto rowBytes = [&](mlir::Value v) { return hidden * planattr::elementBytes(dtypeOf(v.getType())); };
    int64_t perPair = d->id == isa::OpId::kExpertParallelMoeGrad
                          ? rowBytes(input) + rowBytes(op->getOperand(5)) + 4 * hidden + 2 * 4
                          : 2 * rowBytes(input);
    return pairs * perPair * (n - 1) / n;
  }
  if (!d || !d->bytesMoved) return 0;
  auto size = op->getAttrOfType<mlir::IntegerAttr>("group_size");
  int64_t in = op->getNumOperands() ? bytesOf(op->getOperand(0)) : 0, out = op->getNumResults() ? bytesOf(op->getResult(0)) : 0;
  return d->bytesMoved(in, out, size ? size.getInt() : 1);
}

namespace {

llvm::Error lowerError(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s", msg.str().c_str());
}

// One function's lowering: a buffer per SSA value, an instruction per op (data-parallel
// buckets merged, the vocab-parallel cross-entropy expanded into its steps, f elided), the
// events between streams from each buffer's producer.
class ProgramLowering {
 public:
  explicit ProgramLowering(mlir::func::FuncOp f) : f_(f), name_(f.getName().str()) {
    if (auto m = f->getParentOfType<mlir::ModuleOp>())
      if (auto chunks = m->getAttrOfType<mlir::IntegerAttr>(kTpCommOverlapAttr)) chunks_ = chunks.getInt();
  }

  llvm::Expected<plan::Program> run() {
    prog_.set_name(name_);
    if (auto s = f_->getAttrOfType<mlir::IntegerAttr>(attr::kStage)) prog_.set_virtual_stage(s.getInt());
    // The kind loom-pipeline-partition gave it; a function it did not make (train_step for the
    // reference interpreter, forward_logits for generation) runs whole, as one forward program.
    // A gradient-sync function lowers as a backward program; foldGradientSync
    // (compiler/StepPrograms.h) then moves its instructions into its chunk's backward.
    auto kind = f_->getAttrOfType<mlir::StringAttr>(attr::kProgramKind);
    llvm::StringRef k = kind ? kind.getValue() : "forward";
    prog_.set_kind(k == "backward" || k == "grad_sync" ? plan::Program::BACKWARD : plan::Program::FORWARD);
    if (llvm::Error e = bindArguments()) return std::move(e);
    findBuckets();
    for (mlir::Operation &op : f_.getBody().front()) {
      // Whatever this op's lowering emits names it as its source.
      auto source = llvm::make_scope_exit([this, &op, before = prog_.instructions_size()] {
        for (int i = before; i < prog_.instructions_size(); ++i)
          if (prog_.instructions(i).source().empty())
            prog_.mutable_instructions(i)->set_source(op.getName().getStringRef().str());
      });
      std::vector<mlir::Operation *> members{&op};
      if (auto key = bucketOf(&op)) {
        pendingOfBucket_[*key].push_back(&op);
        if (lastOfBucket_[*key] != &op) continue;
        members = pendingOfBucket_[*key];
      }
      if (auto ret = mlir::dyn_cast<mlir::func::ReturnOp>(op)) {
        bindResults(ret);
        break;
      }
      if (lowered_.count(&op) || lowerOverlapped(op)) continue;
      // The backward (cross_entropy_grad) needs no expansion: with the kept log-sum-exp it is
      // local to the shard.
      if (auto c = mlir::dyn_cast<CrossEntropyOp>(op); c && c.getVocabParallelGroup()) {
        expandCrossEntropy(c);
        continue;
      }
      // Megatron's f is the identity forward (its gradient rule made the backward all-reduce):
      // no instruction and no copy, its result is its operand's buffer, whose lifetime the
      // result's readers extend.
      if (auto id = mlir::dyn_cast<IdentityOp>(op)) {
        bufferOf_[id.getResult()] = bufferOf_.lookup(id.getInput());
        continue;
      }
      if (llvm::Error e = lowerOp(op, members)) return std::move(e);
    }
    // Every instruction as its declaration has it (an attribute the IR carries that the plan
    // does not declare, an operand of the wrong type: a compiler bug, named here).
    if (auto e = isa::verifyProgram(prog_)) return lowerError(*e);
    planWorkspace(prog_);
    return std::move(prog_);
  }

 private:
  // Data-parallel buckets: the all-reduces of one bucket (same group and reduction) become a
  // single collective over their concatenated buffers, issued where the bucket's last member
  // stood (every member's input exists by then; the members' results feed only the return).
  using BucketKey = std::tuple<std::string, std::string, int64_t>;
  static std::optional<BucketKey> bucketOf(mlir::Operation *op) {
    auto ar = mlir::dyn_cast<AllReduceOp>(op);
    auto bucket = op->getAttrOfType<mlir::IntegerAttr>(attr::kBucket);
    if (!ar || !bucket) return std::nullopt;
    return BucketKey{ar.getGroup().str(), ar.getReduce().str(), bucket.getInt()};
  }
  void findBuckets() {
    for (mlir::Operation &op : f_.getBody().front())
      if (auto key = bucketOf(&op)) lastOfBucket_[*key] = &op;
  }

  int addBuffer(mlir::Value v, plan::Buffer::Kind kind, int firstUse) {
    plan::Buffer *b = prog_.add_buffers();
    b->set_id(prog_.buffers_size() - 1);
    for (int64_t d : mlir::cast<mlir::RankedTensorType>(v.getType()).getShape()) b->add_shape(d);
    b->set_dtype(dtypeOf(v.getType()));
    b->set_bytes(bytesOf(v));
    b->set_kind(kind);
    b->set_first_use(firstUse);
    b->set_last_use(firstUse);
    bufferOf_[v] = b->id();
    return b->id();
  }
  // A buffer of the plan's own (the cross-entropy's statistics), not an SSA value.
  int scratch(std::vector<int64_t> shape, plan::DType dtype, int firstUse) {
    plan::Buffer *b = prog_.add_buffers();
    b->set_id(prog_.buffers_size() - 1);
    int64_t n = 1;
    for (int64_t d : shape) b->add_shape(d), n *= d;
    b->set_dtype(dtype);
    b->set_bytes(4 * n);
    b->set_kind(plan::Buffer::ACTIVATION);
    b->set_first_use(firstUse);
    b->set_last_use(firstUse);
    return b->id();
  }

  llvm::Error bindArguments() {
    for (mlir::BlockArgument arg : f_.getArguments()) {
      int id = addBuffer(arg, plan::Buffer::ARGUMENT, -1);
      plan::Binding *bind = prog_.add_arguments();
      bind->set_buffer(id);
      unsigned i = arg.getArgNumber();
      if (auto n = f_.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam)) {
        bind->set_role(plan::Binding::PARAMETER);
        bind->set_name(n.str());
      } else if (auto n = f_.getArgAttrOfType<mlir::StringAttr>(i, attr::kInput)) {
        bind->set_role(plan::Binding::INPUT);
        bind->set_name(n.str());
      } else if (auto n = f_.getArgAttrOfType<mlir::StringAttr>(i, "loom.stash")) {
        bind->set_role(plan::Binding::STASH);
        bind->set_name(n.str());
      } else {
        return lowerError(name_ + ": argument " + llvm::Twine(i) + " has no role");
      }
    }
    return llvm::Error::success();
  }

  void bindResults(mlir::func::ReturnOp ret) {
    int end = prog_.instructions_size();
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      plan::Binding *bind = prog_.add_results();
      bind->set_buffer(bufferOf_.lookup(v));
      prog_.mutable_buffers(bufferOf_.lookup(v))->set_last_use(end);
      if (auto n = f_.getResultAttrOfType<mlir::StringAttr>(i, attr::kGradOf)) {
        bind->set_role(plan::Binding::GRADIENT);
        bind->set_name(n.str());
      } else if (auto n = f_.getResultAttrOfType<mlir::StringAttr>(i, "loom.stash")) {
        bind->set_role(plan::Binding::STASH);
        bind->set_name(n.str());
        prog_.set_stash_bytes(prog_.stash_bytes() + bytesOf(v));
      } else if (auto n = f_.getResultAttrOfType<mlir::StringAttr>(i, "loom.loss_term")) {
        bind->set_role(plan::Binding::LOSS);  // one of the losses the loss sums (logged by name)
        bind->set_name(n.str());
      } else {
        bind->set_role(plan::Binding::LOSS);
        bind->set_name("loss");
      }
    }
  }

  // An instruction built by operand name (plan/InstructionSet.h), on its declared stream.
  plan::Instruction *emit(const isa::InstructionBuilder &built, int layer) {
    int index = prog_.instructions_size();
    plan::Instruction *in = prog_.add_instructions();
    built.writeTo(in);
    std::string group;
    for (const plan::Attribute &a : in->attributes())
      if (a.name() == "group") group = a.s();
    plan::Stream stream = isa::streamOf(built.declaration(), group);
    in->set_stream(stream);
    in->set_layer(layer);
    std::set<int> waits;
    for (int b : in->inputs()) {
      prog_.mutable_buffers(b)->set_last_use(index);
      auto it = producer_.find(b);
      if (it != producer_.end() && streamOfInstr_[size_t(it->second)] != stream) waits.insert(it->second);
    }
    for (int w : waits) in->add_wait_for(w);
    for (int b : in->outputs()) {
      if (!producer_.count(b)) prog_.mutable_buffers(b)->set_first_use(index);
      prog_.mutable_buffers(b)->set_last_use(index);
      producer_[b] = index;
    }
    streamOfInstr_.push_back(stream);
    return in;
  }

  // tp_comm_overlap (Megatron-Core's --tp-comm-overlap, torchtitan's async tensor parallelism,
  // here for the all-reduce without sequence parallelism): a GEMM whose result only a
  // tensor-parallel all-reduce reads (the row-parallel linear's partial sums forward, the
  // column-parallel linear's input gradient backward) runs as chunks_ blocks of rows, and each
  // block's all-reduce goes to the tp stream as soon as the block is computed, overlapping the
  // next block's GEMM. Each element is the same dot product and the same sum: identical values.
  bool lowerOverlapped(mlir::Operation &op) {
    if (chunks_ < 2) return false;
    if (auto gather = mlir::dyn_cast<AllGatherOp>(op)) return lowerGatherThenGemm(gather);
    auto gemm = mlir::dyn_cast<LinearOp>(op);
    if (!gemm || gemm.getBias() || !gemm.getResult().hasOneUse()) return false;
    if (auto scatter = mlir::dyn_cast<ReduceScatterOp>(*gemm.getResult().getUsers().begin()))
      return lowerGemmThenScatter(gemm, scatter);
    auto reduce = mlir::dyn_cast<AllReduceOp>(*gemm.getResult().getUsers().begin());
    if (!reduce || reduce.getGroup() != "tp" || bucketOf(reduce)) return false;
    int64_t cols = lastDim(gemm.getResult()), rows = numel(gemm.getResult()) / cols, k = chunks_;
    while (k > 1 && rows % k != 0) --k;  // the most blocks (up to chunks_) of equal rows
    if (k < 2) return false;
    auto layerAttr = gemm->getAttrOfType<mlir::IntegerAttr>(attr::kLayer);
    int layer = layerAttr ? int(layerAttr.getInt()) : -1;
    int x = bufferOf_.lookup(gemm.getInput()), w = bufferOf_.lookup(gemm.getWeight());
    int index = prog_.instructions_size();
    int partial = addBuffer(gemm.getResult(), plan::Buffer::ACTIVATION, index);
    int summed = addBuffer(reduce.getResult(), plan::Buffer::ACTIVATION, index);
    for (int64_t c = 0; c < k; ++c) {
      int64_t begin = c * rows / k, end = (c + 1) * rows / k;
      isa::InstructionBuilder block(isa::OpId::kLinear);
      block.in("input", x).in("weight", w).out("result", partial).attr("row_begin", begin).attr("row_end", end);
      if (gemm.getTransposeWeight()) block.flag("transpose_weight");
      emit(block, layer)->set_flops(flopsOf(gemm) / double(k));
      plan::Instruction *sum = emit(isa::InstructionBuilder(isa::OpId::kAllReduce)
                                        .in("input", partial)
                                        .out("result", summed)
                                        .attr("group", reduce.getGroup().str())
                                        .attr("group_size", int64_t(reduce.getGroupSize()))
                                        .attr("reduce", reduce.getReduce().str())
                                        .attr("row_begin", begin)
                                        .attr("row_end", end),
                                    layer);
      sum->set_bytes_moved(bytesMovedOf(reduce) / k);
    }
    lowered_.insert(reduce.getOperation());
    return true;
  }

  // With sequence parallelism the tp collectives are all-gathers (before the column-parallel
  // GEMMs, and the row-parallel ones' input gradients) and reduce-scatters (after the
  // row-parallel GEMMs, and the column-parallel ones' input gradients) along the sequence
  // (dim 1 of [B, S, H]). A sample's rows of the gathered tensor are contiguous, so both split
  // by samples: chunks of whole slices before `dim`, the collective of chunk c on the tp stream
  // beside the GEMM of chunk c - 1 (gather) or c + 1 (scatter). The chunks (up to chunks_) of
  // equal slices; none when the micro-batch is one sample (then nothing is split).
  int64_t sliceChunks(mlir::Value large, int64_t dim, int64_t *slices) {
    auto shape = mlir::cast<mlir::RankedTensorType>(large.getType()).getShape();
    *slices = 1;
    for (int64_t j = 0; j < dim && j < int64_t(shape.size()); ++j) *slices *= shape[size_t(j)];
    int64_t k = std::min<int64_t>(chunks_, *slices);
    while (k > 1 && *slices % k != 0) --k;
    return k;
  }
  // The rows of chunk c of k over `slices` slices of the large buffer.
  static std::pair<int64_t, int64_t> chunkRows(mlir::Value large, int64_t slices, int64_t k, int64_t c) {
    int64_t per = numel(large) / lastDim(large) / slices;
    return {c * slices / k * per, (c + 1) * slices / k * per};
  }
  static bool definedBefore(mlir::Value v, mlir::Operation &op) {
    mlir::Operation *def = v.getDefiningOp();
    return !def || (def->getBlock() == op.getBlock() && def->isBeforeInBlock(&op));
  }
  plan::Instruction *emitCollective(isa::OpId id, int input, int result, mlir::Operation *op, int64_t dim,
                                    std::pair<int64_t, int64_t> rows, int64_t k, int layer) {
    auto group = op->getAttrOfType<mlir::StringAttr>("group").getValue().str();
    auto size = op->getAttrOfType<mlir::IntegerAttr>("group_size").getInt();
    plan::Instruction *in = emit(isa::InstructionBuilder(id)
                                     .in("input", input)
                                     .out("result", result)
                                     .attr("group", group)
                                     .attr("group_size", size)
                                     .attr("dim", dim)
                                     .attr("row_begin", rows.first)
                                     .attr("row_end", rows.second),
                                 layer);
    in->set_bytes_moved(bytesMovedOf(op) / k);
    return in;
  }
  plan::Instruction *emitGemmRows(LinearOp gemm, int x, int y, std::pair<int64_t, int64_t> rows, int64_t k, int layer) {
    isa::InstructionBuilder block(isa::OpId::kLinear);
    block.in("input", x).in("weight", bufferOf_.lookup(gemm.getWeight()));
    if (gemm.getBias()) block.in("bias", bufferOf_.lookup(gemm.getBias()));
    block.out("result", y).attr("row_begin", rows.first).attr("row_end", rows.second);
    if (gemm.getTransposeWeight()) block.flag("transpose_weight");
    plan::Instruction *in = emit(block, layer);
    in->set_flops(flopsOf(gemm) / double(k));
    return in;
  }
  static int layerOf(mlir::Operation *op) {
    auto layerAttr = op->getAttrOfType<mlir::IntegerAttr>(attr::kLayer);
    return layerAttr ? int(layerAttr.getInt()) : -1;
  }

  // all_gather -> the GEMMs that read the gathered tensor (LLaMA's q, k and v projections read
  // one gather): each chunk's gather, then every such GEMM's rows of it (hoisted to the gather:
  // their weights and biases are arguments or made before it). The gathered tensor's other
  // readers (a weight gradient) wait for the last chunk's gather (the tp stream runs them in
  // order).
  bool lowerGatherThenGemm(AllGatherOp gather) {
    if (gather.getGroup() != "tp" || gather.getDim() < 1) return false;
    std::vector<LinearOp> gemms;
    for (mlir::Operation *user : gather.getResult().getUsers()) {
      auto l = mlir::dyn_cast<LinearOp>(user);
      if (!l || l.getInput() != gather.getResult() || l->getBlock() != gather->getBlock() ||
          !definedBefore(l.getWeight(), *gather) || (l.getBias() && !definedBefore(l.getBias(), *gather)))
        continue;
      gemms.push_back(l);
    }
    if (gemms.empty()) return false;
    std::sort(gemms.begin(), gemms.end(), [](LinearOp a, LinearOp b) { return a->isBeforeInBlock(b); });
    int64_t slices, k = sliceChunks(gather.getResult(), gather.getDim(), &slices);
    if (k < 2) return false;
    int x = bufferOf_.lookup(gather.getInput()), index = prog_.instructions_size();
    int gathered = addBuffer(gather.getResult(), plan::Buffer::ACTIVATION, index);
    std::vector<int> results;
    for (LinearOp gemm : gemms) results.push_back(addBuffer(gemm.getResult(), plan::Buffer::ACTIVATION, index));
    for (int64_t c = 0; c < k; ++c) {
      auto rows = chunkRows(gather.getResult(), slices, k, c);
      emitCollective(isa::OpId::kAllGather, x, gathered, gather, gather.getDim(), rows, k, layerOf(gather));
      for (size_t j = 0; j < gemms.size(); ++j) emitGemmRows(gemms[j], gathered, results[j], rows, k, layerOf(gemms[j]));
    }
    for (LinearOp gemm : gemms) lowered_.insert(gemm.getOperation());
    return true;
  }

  // A GEMM whose result only a reduce-scatter reads: each chunk's GEMM rows, then its
  // reduce-scatter.
  bool lowerGemmThenScatter(LinearOp gemm, ReduceScatterOp scatter) {
    if (scatter.getGroup() != "tp" || scatter.getDim() < 1 || scatter->hasAttr("reduce") || scatter->hasAttr("wire_dtype"))
      return false;
    int64_t slices, k = sliceChunks(gemm.getResult(), scatter.getDim(), &slices);
    if (k < 2) return false;
    int layer = layerOf(gemm);
    int x = bufferOf_.lookup(gemm.getInput()), index = prog_.instructions_size();
    int partial = addBuffer(gemm.getResult(), plan::Buffer::ACTIVATION, index);
    int scattered = addBuffer(scatter.getResult(), plan::Buffer::ACTIVATION, index);
    for (int64_t c = 0; c < k; ++c) {
      auto rows = chunkRows(gemm.getResult(), slices, k, c);
      emitGemmRows(gemm, x, partial, rows, k, layer);
      emitCollective(isa::OpId::kReduceScatter, partial, scattered, scatter, scatter.getDim(), rows, k, layer);
    }
    lowered_.insert(scatter.getOperation());
    return true;
  }

  // Vocab-parallel cross-entropy (Megatron's VocabParallelCrossEntropy) as its visible steps:
  // local max -> all-reduce (max) over the group -> local sums of exponentials (and the
  // target logit) -> all-reduce (sum) -> the loss and the kept log-sum-exp. The collectives run
  // on the tp stream like every tp collective; the math stays in the fused steps.
  void expandCrossEntropy(CrossEntropyOp fwd) {
    using isa::InstructionBuilder;
    using isa::OpId;
    mlir::Value logits = fwd.getLogits(), labels = fwd.getLabels();
    std::string group = fwd.getVocabParallelGroup()->str();
    int64_t valid = fwd.getValidVocab(), tokens = numel(labels);
    int64_t t = int64_t(fwd.getVocabParallelSize().value_or(1));
    auto layerAttr = fwd->getAttrOfType<mlir::IntegerAttr>(attr::kLayer);
    int layer = layerAttr ? int(layerAttr.getInt()) : -1;
    auto local = [&](InstructionBuilder b) {
      emit(b.attr("valid_vocab", valid).attr("vocab_parallel_group", group), layer);
    };
    auto allReduce = [&](int input, const char *reduce) {
      int index = prog_.instructions_size();
      const plan::Buffer &like = prog_.buffers(input);
      int out = scratch({like.shape().begin(), like.shape().end()}, plan::F32, index);
      plan::Instruction *in = emit(InstructionBuilder(OpId::kAllReduce)
                                       .in("input", input)
                                       .out("result", out)
                                       .attr("group", group)
                                       .attr("group_size", t)
                                       .attr("reduce", reduce),
                                   layer);
      int64_t bytes = prog_.buffers(input).bytes();
      in->set_bytes_moved(isa::decl(OpId::kAllReduce).bytesMoved(bytes, bytes, t));
      return out;
    };
    int lg = bufferOf_.lookup(logits), lb = bufferOf_.lookup(labels);
    int rowMax = scratch({tokens}, plan::F32, prog_.instructions_size());
    local(InstructionBuilder(OpId::kCrossEntropyMax).in("logits", lg).out("max", rowMax));
    rowMax = allReduce(rowMax, "max");
    int stats = scratch({2, tokens}, plan::F32, prog_.instructions_size());  // sums of exponentials, target logits
    local(InstructionBuilder(OpId::kCrossEntropySums).in("logits", lg).in("labels", lb).in("max", rowMax).out("sums", stats));
    stats = allReduce(stats, "sum");
    InstructionBuilder loss(OpId::kCrossEntropyLoss);
    loss.in("max", rowMax).in("sums", stats);
    if (fwd.getLossMask()) loss.in("loss_mask", bufferOf_.lookup(fwd.getLossMask()));
    loss.out("loss", addBuffer(fwd.getLoss(), plan::Buffer::ACTIVATION, prog_.instructions_size()));
    // The log-sum-exp kept for the backward (max + log of the summed exponentials).
    if (fwd.getLse()) loss.out("lse", addBuffer(fwd.getLse(), plan::Buffer::ACTIVATION, prog_.instructions_size()));
    emit(loss, layer);
  }

  // An IR op (or a data-parallel bucket of all-reduces) as one instruction of its declared op,
  // with the op's attributes.
  llvm::Error lowerOp(mlir::Operation &op, const std::vector<mlir::Operation *> &members) {
    const isa::OpDecl *decl = declOf(&op);
    if (!decl) return lowerError(name_ + ": op " + op.getName().getStringRef() + " has no plan instruction declared");
    int index = prog_.instructions_size();
    plan::Instruction *in = prog_.add_instructions();
    in->set_op(decl->name);
    auto group = op.getAttrOfType<mlir::StringAttr>(decl->groupAttr ? decl->groupAttr : "group");
    in->set_stream(isa::streamOf(*decl, group ? group.getValue() : llvm::StringRef()));
    in->set_flops(flopsOf(&op));
    int64_t moved = 0;
    for (mlir::Operation *m : members) moved += bytesMovedOf(m);
    in->set_bytes_moved(moved);
    // Pipeline tags live in one micro-batch's range of the runtime (4096 channels).
    if (auto t = op.getAttrOfType<mlir::IntegerAttr>("tag"); t && (t.getInt() < 0 || t.getInt() >= 4096))
      return lowerError(name_ + ": pipeline tag " + llvm::Twine(t.getInt()) + " outside 0..4095");
    auto layer = op.getAttrOfType<mlir::IntegerAttr>(attr::kLayer);
    in->set_layer(layer ? layer.getInt() : -1);
    std::set<int> waits;
    for (mlir::Operation *m : members)
      for (mlir::Value v : m->getOperands()) {
        int b = bufferOf_.lookup(v);
        in->add_inputs(b);
        prog_.mutable_buffers(b)->set_last_use(index);
        auto it = producer_.find(b);
        if (it != producer_.end() && streamOfInstr_[size_t(it->second)] != in->stream()) waits.insert(it->second);
      }
    for (int w : waits) in->add_wait_for(w);
    for (mlir::Operation *m : members)
      for (mlir::Value r : m->getResults()) {
        int b = addBuffer(r, plan::Buffer::ACTIVATION, index);
        in->add_outputs(b);
        producer_[b] = index;
      }
    streamOfInstr_.push_back(in->stream());
    if (llvm::Error e = copyAttributes(op, in)) return e;
    if (decl->groupAttr) {  // a collective form: its group, as every collective names it
      if (!group) return lowerError(name_ + ": " + decl->name + " without " + decl->groupAttr);
      plan::Attribute *g = in->add_attributes();
      g->set_name("group"), g->set_s(group.str());
    }
    return llvm::Error::success();
  }

  // The op's attributes, less the passes' bookkeeping (layer, stage, backward and grad-sync
  // marks, replication opt-outs) and a loss's name (the program's LOSS results carry it).
  llvm::Error copyAttributes(mlir::Operation &op, plan::Instruction *in) {
    for (mlir::NamedAttribute a : op.getAttrs()) {
      llvm::StringRef n = a.getName().strref();
      if (n == attr::kLayer || n == attr::kStage || n == attr::kBackward || n == attr::kGradSync ||
          n == attr::kReplicated || n == attr::kLossName || n == "operandSegmentSizes")
        continue;
      plan::Attribute *pa = in->add_attributes();
      pa->set_name(n.str());
      if (auto i = mlir::dyn_cast<mlir::IntegerAttr>(a.getValue()))
        pa->set_i(i.getInt());
      else if (auto fl = mlir::dyn_cast<mlir::FloatAttr>(a.getValue()))
        pa->set_f(fl.getValueAsDouble());
      else if (auto s = mlir::dyn_cast<mlir::StringAttr>(a.getValue()))
        pa->set_s(s.str());
      else if (mlir::isa<mlir::UnitAttr>(a.getValue()))
        pa->set_flag(true);
      else
        return lowerError(name_ + ": unsupported attribute " + n + " on " + in->op());
    }
    return llvm::Error::success();
  }

  mlir::func::FuncOp f_;
  std::string name_;
  plan::Program prog_;
  llvm::DenseMap<mlir::Value, int> bufferOf_;
  std::vector<plan::Stream> streamOfInstr_;
  llvm::DenseMap<int, int> producer_;  // buffer -> instruction
  std::map<BucketKey, mlir::Operation *> lastOfBucket_;
  std::map<BucketKey, std::vector<mlir::Operation *>> pendingOfBucket_;
  int64_t chunks_ = 0;                       // tp_comm_overlap's blocks (0: off)
  std::set<mlir::Operation *> lowered_;      // all-reduces already lowered with their GEMM
};

}  // namespace

llvm::Expected<plan::Program> lowerProgram(mlir::func::FuncOp f) { return ProgramLowering(f).run(); }

// Memory plan of one program's activations (each buffer's offset in the workspace arena).
// Two buffers may share memory only when every access (write or read) of one happens before
// every access of the other on every backend: instructions on one stream run in program
// order, and an instruction runs after the instructions it waits for (wait_for: CUDA events,
// the CPU executor's done flags). Happens-before is tracked with a vector clock per
// instruction (the latest instruction of each stream known to be finished when it starts).
// A result is handed to its slot right after its producer, on the producer's stream (the
// CUDA executor's copy; the CPU executor computes it in place): until the producer's stream
// runs its next instruction, or the program's end, it stays in use.
void planWorkspace(plan::Program &prog) {
  constexpr int kStreams = 4;
  const int n = prog.instructions_size();
  using Clock = std::array<int, kStreams>;
  std::vector<Clock> clock(static_cast<size_t>(n));
  std::vector<int> nextOnStream(static_cast<size_t>(n), n);  // n: none (the program's end)
  {
    Clock none;
    none.fill(-1);
    std::array<int, kStreams> previous;
    previous.fill(-1);
    for (int i = 0; i < n; ++i) {
      const plan::Instruction &in = prog.instructions(i);
      int s = int(in.stream()) & (kStreams - 1);
      Clock c = previous[s] >= 0 ? clock[size_t(previous[s])] : none;
      for (int w : in.wait_for())
        if (w >= 0 && w < i)
          for (int k = 0; k < kStreams; ++k) c[k] = std::max(c[k], clock[size_t(w)][k]);
      c[s] = i;
      clock[size_t(i)] = c;
      if (previous[s] >= 0) nextOnStream[size_t(previous[s])] = i;
      previous[s] = i;
    }
  }
  // Each buffer's accesses: the first and the last on each stream, and over all streams.
  struct Accesses {
    std::array<int, kStreams> first, last;
    int lo = INT32_MAX, hi = -1;
    void add(int stream, int i) {
      first[stream] = first[stream] < 0 ? i : std::min(first[stream], i);
      last[stream] = std::max(last[stream], i);
      lo = std::min(lo, i), hi = std::max(hi, i);
    }
  };
  std::vector<Accesses> access(size_t(prog.buffers_size()));
  for (Accesses &a : access) a.first.fill(-1), a.last.fill(-1);
  std::vector<int> producer(size_t(prog.buffers_size()), -1);
  for (int i = 0; i < n; ++i) {
    const plan::Instruction &in = prog.instructions(i);
    int s = int(in.stream()) & (kStreams - 1);
    for (int b : in.inputs()) access[size_t(b)].add(s, i);
    for (int b : in.outputs()) access[size_t(b)].add(s, i), producer[size_t(b)] = i;
  }
  std::vector<bool> heldToEnd(size_t(prog.buffers_size()), false);
  for (const plan::Binding &r : prog.results()) {
    int b = r.buffer(), p = producer[size_t(b)];
    if (p < 0 || nextOnStream[size_t(p)] >= n) {
      heldToEnd[size_t(b)] = true;
    } else {
      int next = nextOnStream[size_t(p)];
      access[size_t(b)].add(int(prog.instructions(next).stream()) & (kStreams - 1), next);
    }
  }
  // Every access of `a` happens before every access of `b`.
  auto before = [&](int a, int b) {
    if (heldToEnd[size_t(a)]) return false;
    const Accesses &x = access[size_t(a)], &y = access[size_t(b)];
    if (x.hi < 0 || y.hi < 0) return !heldToEnd[size_t(b)];  // one no instruction touches
    if (x.hi >= y.lo) return false;  // happens-before follows the program order
    for (int s2 = 0; s2 < kStreams; ++s2) {
      if (y.first[s2] < 0) continue;
      const Clock &c = clock[size_t(y.first[s2])];
      for (int s1 = 0; s1 < kStreams; ++s1)
        if (x.last[s1] >= 0 && c[s1] < x.last[s1]) return false;
    }
    return true;
  };
  // First fit in a given order: each buffer at the lowest offset free of every placed buffer
  // whose accesses it may overlap. Two orders, the smaller arena kept: program order, and
  // largest first (greedy by size: the big buffers set the arena, the small ones fill the gaps).
  std::vector<plan::Buffer *> inProgramOrder;
  for (plan::Buffer &b : *prog.mutable_buffers())
    if (b.kind() == plan::Buffer::ACTIVATION) inProgramOrder.push_back(&b);
  std::vector<plan::Buffer *> bySize = inProgramOrder;
  std::stable_sort(bySize.begin(), bySize.end(),
                   [](const plan::Buffer *x, const plan::Buffer *y) { return x->bytes() > y->bytes(); });
  struct Placed {
    int id;
    int64_t offset, bytes;
  };
  auto place = [&](const std::vector<plan::Buffer *> &order, std::vector<int64_t> *offsets) {
    std::vector<Placed> placed;
    int64_t arena = 0;
    for (plan::Buffer *b : order) {
      int64_t size = (b->bytes() + kAlign - 1) / kAlign * kAlign;
      std::vector<std::pair<int64_t, int64_t>> busy;
      for (const Placed &p : placed)
        if (!before(p.id, b->id()) && !before(b->id(), p.id)) busy.push_back({p.offset, p.offset + p.bytes});
      std::sort(busy.begin(), busy.end());
      int64_t offset = 0;
      for (auto [lo, hi] : busy) {
        if (offset + size <= lo) break;
        offset = std::max(offset, hi);
      }
      (*offsets)[size_t(b->id())] = offset;
      placed.push_back({b->id(), offset, size});
      arena = std::max(arena, offset + size);
    }
    return arena;
  };
  std::vector<int64_t> first(size_t(prog.buffers_size()), 0), second(first);
  int64_t a1 = place(inProgramOrder, &first), a2 = place(bySize, &second);
  const std::vector<int64_t> &offsets = a2 < a1 ? second : first;
  int64_t arena = std::min(a1, a2);
  for (plan::Buffer *b : inProgramOrder) b->set_offset(offsets[size_t(b->id())]);
  prog.set_workspace_bytes(arena);
}

}  // namespace loom
