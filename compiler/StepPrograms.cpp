#include "compiler/StepPrograms.h"

#include <algorithm>
#include <map>
#include <set>

#include "compiler/Lowering.h"
#include "ir/ParamAttrs.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "plan/InstructionSet.h"
#include "plan/PlanAttributes.h"
#include "plan/Zero1Parts.h"

namespace loom {
namespace {

constexpr int64_t kFlatAlign = 16;  // elements: every parameter's slice starts 64-byte aligned

llvm::Error error(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

int64_t elementsOf(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

using isa::InstructionBuilder;
using isa::OpId;

// Builds a small program instruction by instruction; each instruction waits on the last
// writer of every buffer it touches and, for the buffers it writes, on their readers since,
// where those ran on another stream.
class ProgramBuilder {
 public:
  ProgramBuilder(const std::string &name, plan::Program::Kind kind) {
    prog_.set_name(name);
    prog_.set_kind(kind);
  }

  int argument(plan::Binding::Role role, const std::string &name, std::vector<int64_t> shape, bool inout,
               plan::DType dtype = plan::F32) {
    int id = buffer(shape, plan::Buffer::ARGUMENT, dtype);
    plan::Binding *b = prog_.add_arguments();
    b->set_buffer(id), b->set_role(role), b->set_name(name), b->set_inout(inout);
    return id;
  }
  int activation(std::vector<int64_t> shape) { return buffer(shape, plan::Buffer::ACTIVATION); }
  // A view argument (Binding.offset / part_of): what touches it is ordered with what touches
  // the other views of the same storage only through alsoAfter.
  int view(plan::Binding::Role role, const std::string &name, std::vector<int64_t> shape, int64_t offset,
           const std::string &partOf, plan::DType dtype = plan::F32) {
    int id = argument(role, name, shape, /*inout=*/true, dtype);
    plan::Binding *b = prog_.mutable_arguments(prog_.arguments_size() - 1);
    b->set_offset(offset), b->set_part_of(partOf);
    return id;
  }

  // An instruction built by operand name (plan/InstructionSet.h), on its declared stream.
  plan::Instruction &emit(const InstructionBuilder &built) {
    std::string group;
    plan::Instruction staged;
    built.writeTo(&staged);
    for (const plan::Attribute &a : staged.attributes())
      if (a.name() == "group") group = a.s();
    plan::Instruction &in = emit(staged.op(), isa::streamOf(built.declaration(), group), built.inputs(), built.outputs());
    *in.mutable_attributes() = staged.attributes();
    return in;
  }
  // A copy of an instruction the lowering built (its op, stream and operands as given).
  plan::Instruction &emit(const std::string &op, plan::Stream stream, std::vector<int> inputs, std::vector<int> outputs) {
    int index = prog_.instructions_size();
    plan::Instruction *in = prog_.add_instructions();
    in->set_op(op), in->set_stream(stream), in->set_layer(-1);
    std::set<int> waits;
    auto dependOn = [&](int instr) {
      if (instr >= 0 && prog_.instructions(instr).stream() != stream) waits.insert(instr);
    };
    for (int b : inputs) {
      in->add_inputs(b);
      dependOn(lastWriter_[b]);
      for (int w : aliasWriters_[b]) dependOn(w);
    }
    for (int b : outputs) {
      in->add_outputs(b);
      dependOn(lastWriter_[b]);
      for (int r : readers_[b]) dependOn(r);
      for (int w : aliasWriters_[b]) dependOn(w);
    }
    for (int w : waits) in->add_wait_for(w);
    for (int b : inputs) readers_[b].push_back(index), touch(b, index);
    for (int b : outputs) lastWriter_[b] = index, readers_[b].clear(), touch(b, index);
    return *in;
  }

  int last() const { return prog_.instructions_size() - 1; }
  // The next instruction touching `buffer` also waits for `instructions` (writers of memory
  // aliasing it).
  void alsoAfter(int buffer, const std::vector<int> &instructions) {
    for (int i : instructions) readers_[buffer].push_back(i), aliasWriters_[buffer].push_back(i);
  }

  void result(plan::Binding::Role role, const std::string &name, int buffer) {
    plan::Binding *b = prog_.add_results();
    b->set_buffer(buffer), b->set_role(role), b->set_name(name);
  }

  plan::Program finish() {
    for (const plan::Binding &r : prog_.results()) prog_.mutable_buffers(r.buffer())->set_last_use(prog_.instructions_size());
    planWorkspace(prog_);
    return std::move(prog_);
  }

 private:
  int buffer(const std::vector<int64_t> &shape, plan::Buffer::Kind kind, plan::DType dtype = plan::F32) {
    plan::Buffer *b = prog_.add_buffers();
    b->set_id(prog_.buffers_size() - 1);
    for (int64_t d : shape) b->add_shape(d);
    b->set_dtype(dtype);
    b->set_bytes(planattr::elementBytes(dtype) * elementsOf(shape));
    b->set_kind(kind);
    b->set_first_use(-1), b->set_last_use(-1);
    lastWriter_.push_back(-1);
    readers_.emplace_back();
    aliasWriters_.emplace_back();
    return b->id();
  }
  void touch(int b, int index) {
    plan::Buffer *buf = prog_.mutable_buffers(b);
    if (buf->kind() == plan::Buffer::ACTIVATION && buf->first_use() < 0) buf->set_first_use(index);
    buf->set_last_use(index);
  }

  plan::Program prog_;
  std::vector<int> lastWriter_;
  std::vector<std::vector<int>> readers_;
  std::vector<std::vector<int>> aliasWriters_;
};

// Marks a collective over fp32 buffers to move `wire` (16-bit) values; returns the bytes it
// moves instead of `fp32Bytes`.
int64_t setWireDtype(plan::Instruction &in, plan::DType wire, int64_t fp32Bytes) {
  plan::Attribute *a = in.add_attributes();
  a->set_name("wire_dtype");
  a->set_s(wire == plan::BF16 ? "bf16" : "f16");
  return fp32Bytes / 2;
}

// A collective over `group` of `size` members on its stream, with the plan's attributes.
// inputs[k] -> outputs[k], in one call (several operands: an all-reduce's only); `bytes` all of them.
plan::Instruction &collective(ProgramBuilder &b, OpId op, const std::string &group, int64_t size,
                              const std::vector<int> &inputs, const std::vector<int> &outputs, int64_t bytes,
                              const std::string &reduce = "") {
  InstructionBuilder built(op);
  built.in("input", inputs).out("result", outputs).attr("group", group).attr("group_size", size);
  if (!reduce.empty()) built.attr("reduce", reduce);
  if (op != OpId::kAllReduce) built.attr("dim", int64_t(0));
  plan::Instruction &in = b.emit(built);
  in.set_bytes_moved(isa::decl(op).bytesMoved(bytes, bytes, size));
  return in;
}

plan::Instruction &collective(ProgramBuilder &b, OpId op, const std::string &group, int64_t size, int input,
                              int output, int64_t bytes, const std::string &reduce = "") {
  return collective(b, op, group, size, std::vector<int>{input}, std::vector<int>{output}, bytes, reduce);
}

// Recomputes every buffer's first and last use from the instruction list (results live to the end).
void recomputeLifetimes(plan::Program &prog) {
  for (plan::Buffer &b : *prog.mutable_buffers()) b.set_first_use(-1), b.set_last_use(-1);
  for (int i = 0; i < prog.instructions_size(); ++i) {
    const plan::Instruction &in = prog.instructions(i);
    for (int b : in.inputs()) prog.mutable_buffers(b)->set_last_use(i);
    for (int b : in.outputs()) {
      plan::Buffer *buf = prog.mutable_buffers(b);
      if (buf->kind() == plan::Buffer::ACTIVATION && buf->first_use() < 0) buf->set_first_use(i);
      buf->set_last_use(i);
    }
  }
  for (const plan::Binding &r : prog.results()) prog.mutable_buffers(r.buffer())->set_last_use(prog.instructions_size());
}

// An inout argument shaped like `like`, in `dtype` (gradients and losses accumulate in fp32
// whatever the dtype of what is added into them: Megatron's main gradients).
int addArgumentBuffer(plan::Program &prog, const plan::Buffer &like, plan::Binding::Role role, const std::string &name,
                      plan::DType dtype = plan::F32) {
  plan::Buffer *b = prog.add_buffers();
  b->set_id(prog.buffers_size() - 1);
  *b->mutable_shape() = like.shape();
  b->set_dtype(dtype);
  b->set_bytes(planattr::elementBytes(dtype) * planattr::numel(like));
  b->set_kind(plan::Buffer::ARGUMENT);
  b->set_first_use(-1), b->set_last_use(-1);
  plan::Binding *arg = prog.add_arguments();
  arg->set_buffer(b->id()), arg->set_role(role), arg->set_name(name), arg->set_inout(true);
  return b->id();
}

// Rewrites `prog` so that each result buffer in `into` (result buffer -> inout argument
// buffer) is added into its argument right after its producer, and appends `tail`
// instructions (their buffers already in `prog`) each right after the last instruction that
// touches one of its buffers (tailAtEnd: after everything, waiting for the last compute
// instruction); the results in `into` are dropped. tailAliases[k] (when given): buffers that
// tail instruction k's operands alias (views of the same storage): it also follows their writers.
void insertAccumulations(plan::Program &prog, const std::map<int, int> &into, std::vector<plan::Instruction> tail,
                         bool tailAtEnd, const std::vector<std::vector<int>> &tailAliases = {}) {
  int old = prog.instructions_size();
  std::vector<plan::Instruction> nodes(prog.instructions().begin(), prog.instructions().end());
  std::vector<std::vector<int>> after(old + 1);  // nodes placed after old instruction i - 1 (0: first)
  std::vector<int> anchorOf(old);
  for (int i = 0; i < old; ++i) anchorOf[i] = i + 1;
  std::map<int, int> producer;  // buffer -> node writing it last
  for (int i = 0; i < old; ++i)
    for (int b : nodes[i].outputs()) producer[b] = i;
  // Node waits are kept as node ids until the final order is known.
  auto addNode = [&](plan::Instruction in, int anchor) {
    nodes.push_back(std::move(in));
    anchorOf.push_back(anchor);
    after[anchor].push_back(int(nodes.size()) - 1);
    return int(nodes.size()) - 1;
  };
  for (auto [result, arg] : into) {
    auto it = producer.find(result);
    int from = it == producer.end() ? -1 : it->second;
    plan::Instruction acc;
    InstructionBuilder(OpId::kAccumulate).in("input", result).out("accumulator", arg).writeTo(&acc);
    acc.set_stream(plan::COMPUTE);
    acc.set_layer(from >= 0 ? nodes[from].layer() : -1);
    if (from >= 0 && nodes[from].stream() != plan::COMPUTE) acc.add_wait_for(from);
    int id = addNode(std::move(acc), from + 1);
    producer[arg] = id;
  }
  std::map<int, std::vector<int>> readers;  // buffer -> tail nodes reading it since its last write
  std::set<int> afterCompute;               // tail nodes that also wait for the last compute instruction
  for (size_t k = 0; k < tail.size(); ++k) {
    plan::Instruction &in = tail[k];
    int anchor = 0;
    std::set<int> waits;
    std::vector<int> touched(in.inputs().begin(), in.inputs().end());
    touched.insert(touched.end(), in.outputs().begin(), in.outputs().end());
    if (k < tailAliases.size()) touched.insert(touched.end(), tailAliases[k].begin(), tailAliases[k].end());
    for (int b : touched) {
      auto it = producer.find(b);
      if (it == producer.end()) continue;
      anchor = std::max(anchor, anchorOf[it->second]);
      if (nodes[it->second].stream() != in.stream()) waits.insert(it->second);
    }
    for (int b : in.outputs())
      for (int r : readers[b])
        if (nodes[r].stream() != in.stream()) waits.insert(r);
    in.clear_wait_for();
    for (int w : waits) in.add_wait_for(w);
    int id = addNode(in, tailAtEnd ? old : anchor);
    if (tailAtEnd) afterCompute.insert(id);
    for (int b : in.inputs()) readers[b].push_back(id);
    for (int b : in.outputs()) producer[b] = id, readers[b].clear();
  }
  // The final order, and every wait rewritten from node ids to instruction indices.
  std::vector<int> order, indexOf(nodes.size());
  for (int i = 0; i <= old; ++i) {
    if (i > 0) order.push_back(i - 1);
    for (int n : after[i]) order.push_back(n);
  }
  for (size_t k = 0; k < order.size(); ++k) indexOf[order[k]] = int(k);
  prog.clear_instructions();
  int lastCompute = -1;
  for (int n : order) {
    plan::Instruction *in = prog.add_instructions();
    *in = nodes[n];
    std::vector<int> waits(in->wait_for().begin(), in->wait_for().end());
    in->clear_wait_for();
    std::set<int> sorted;
    for (int w : waits) sorted.insert(indexOf[w]);
    if (afterCompute.count(n) && lastCompute >= 0 && in->stream() != plan::COMPUTE) sorted.insert(lastCompute);
    for (int w : sorted) in->add_wait_for(w);
    if (in->stream() == plan::COMPUTE) lastCompute = prog.instructions_size() - 1;
  }
  google::protobuf::RepeatedPtrField<plan::Binding> kept;
  for (const plan::Binding &r : prog.results())
    if (!into.count(r.buffer())) *kept.Add() = r;
  prog.mutable_results()->Swap(&kept);
  recomputeLifetimes(prog);
  planWorkspace(prog);
}

}  // namespace

llvm::Expected<StageLayout> stageLayout(mlir::ModuleOp module, const plan::ProgramSet &set, int d, bool zero1,
                                        int64_t bucketBytes, const std::set<std::string> &syncedLater,
                                        const std::string &dpGroup, int ep) {
  if (ep < 1 || d % ep != 0) return error("expert parallelism " + std::to_string(ep) + " does not divide dp " + std::to_string(d));
  std::map<std::string, std::pair<bool, bool>> facts;  // name -> (tied, tensor-parallel shard)
  std::set<std::string> experts;                       // split over "ep" instead
  for (auto f : module.getOps<mlir::func::FuncOp>())
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      if (auto n = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam)) {
        auto &[tied, sharded] = facts[n.str()];
        auto group = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kShardGroup);
        bool expert = group && group.getValue() == "ep";
        tied |= bool(f.getArgAttr(i, attr::kTiedTo));
        sharded |= bool(f.getArgAttr(i, attr::kShardDim)) && !expert;
        if (expert) experts.insert(n.str());
      }
  // Flat order: each backward's gradients in the order it finishes them (its accumulations),
  // so that a data-parallel bucket (consecutive gradients in that order) is one contiguous
  // range of the buffer, reduced in place; parameters without a gradient come last.
  std::map<std::string, const plan::Buffer *> bufferOf;
  for (const plan::Program &prog : set.programs())
    for (const plan::Binding &a : prog.arguments())
      if (a.role() == plan::Binding::PARAMETER && !bufferOf.count(a.name())) bufferOf[a.name()] = &prog.buffers(a.buffer());
  std::vector<std::string> names;
  std::set<std::string> seen;
  std::map<std::string, int> stageOf;  // parameter -> the virtual stage whose backward finishes its gradient
  for (const plan::Program &prog : set.programs()) {
    if (prog.kind() != plan::Program::BACKWARD) continue;
    std::map<int, std::string> gradientOf;  // argument buffer -> parameter
    for (const plan::Binding &a : prog.arguments())
      if (a.role() == plan::Binding::GRADIENT) gradientOf[a.buffer()] = a.name();
    for (const plan::Instruction &in : prog.instructions())
      if (in.op() == "accumulate" && gradientOf.count(in.outputs(0)) && bufferOf.count(gradientOf[in.outputs(0)]) &&
          seen.insert(gradientOf[in.outputs(0)]).second) {
        names.push_back(gradientOf[in.outputs(0)]);
        stageOf[names.back()] = prog.virtual_stage();
      }
  }
  for (const plan::Program &prog : set.programs())
    for (const plan::Binding &a : prog.arguments())
      if (a.role() == plan::Binding::PARAMETER && seen.insert(a.name()).second) names.push_back(a.name());
  StageLayout layout;
  layout.dpGroup = dpGroup;
  bool sharded = zero1 && d > 1;
  int64_t filled = 0;
  // ZeRO-1: closes the open bucket, padded to a multiple of its parts x kFlatAlign.
  auto closeBucket = [&] {
    if (layout.buckets.empty() || layout.buckets.back().elements > 0) return;
    StageBucket &b = layout.buckets.back();
    int64_t unit = kFlatAlign * b.parts;
    layout.flatElements = (layout.flatElements + unit - 1) / unit * unit;
    b.elements = layout.flatElements - b.flatBegin;
    filled = 0;
  };
  for (size_t k = 0; k < names.size(); ++k) {
    const std::string &name = names[k];
    const plan::Buffer &buf = *bufferOf.at(name);
    if (k == 0) layout.computeDtype = buf.dtype();
    if (buf.dtype() != layout.computeDtype)
      return error("parameter '" + name + "' is " + plan::DType_Name(buf.dtype()) + " but '" + names[0] + "' is " +
                   plan::DType_Name(layout.computeDtype) + ": a stage computes with one parameter dtype");
    StageParameter p;
    p.name = name;
    p.shape.assign(buf.shape().begin(), buf.shape().end());
    p.elements = elementsOf(p.shape);
    p.flatOffset = layout.flatElements;
    p.tied = facts[p.name].first;
    p.tpReplicated = !facts[p.name].second;
    p.expert = experts.count(p.name) > 0;
    p.decay = p.shape.size() >= 2;
    if (sharded) {
      auto stage = stageOf.find(name);
      int virtualStage = stage == stageOf.end() ? -1 : stage->second;
      // A gradient reduced across stages first (the tied embedding) is a bucket of its own, left
      // to the optimizer program; the rest of its backward's buckets reduce in the backward.
      bool alone = syncedLater.count(name) > 0;
      std::string group = p.expert ? "edp" : dpGroup;
      if (layout.buckets.empty() || layout.buckets.back().virtualStage != virtualStage ||
          layout.buckets.back().group != group || filled + 4 * p.elements > bucketBytes || alone ||
          layout.buckets.back().alone) {
        closeBucket();
        StageBucket b;
        b.flatBegin = layout.flatElements, b.virtualStage = virtualStage, b.alone = alone;
        b.group = group, b.parts = p.expert ? d / ep : d;
        layout.buckets.push_back(b);
      }
      layout.buckets.back().params.push_back(name);
      filled += 4 * p.elements;
      p.flatOffset = layout.flatElements;
    }
    layout.flatElements += (p.elements + kFlatAlign - 1) / kFlatAlign * kFlatAlign;
    layout.parameters.push_back(std::move(p));
  }
  if (sharded) {
    closeBucket();
    int64_t shard = 0;
    for (StageBucket &b : layout.buckets) b.shardBegin = shard, shard += b.part();
  }
  return layout;
}

int64_t optimizerElements(const StageLayout &layout) {
  if (layout.buckets.empty()) return layout.flatElements;
  int64_t n = 0;
  for (const StageBucket &b : layout.buckets) n += b.part();
  return n;
}

namespace {
// A bucket whose reduce-scatter runs in its backward: it has one and no gradient of it is
// reduced across stages first (the optimizer program's deferred syncs).
bool reducedInBackward(const StageBucket &b, const std::set<std::string> &syncedLater) {
  if (b.virtualStage < 0) return false;
  for (const std::string &p : b.params)
    if (syncedLater.count(p)) return false;
  return true;
}

// An argument viewing elements [offset (+ this rank's part of `partOf`), ... + numel(shape)) of
// the storage `name` names (Binding.offset / part_of).
int addView(plan::Program &prog, plan::Binding::Role role, const std::string &name, std::vector<int64_t> shape,
            int64_t offset, const std::string &partOf, bool inout, plan::DType dtype = plan::F32) {
  plan::Buffer *b = prog.add_buffers();
  b->set_id(prog.buffers_size() - 1);
  for (int64_t dim : shape) b->add_shape(dim);
  b->set_dtype(dtype);
  b->set_bytes(planattr::elementBytes(dtype) * elementsOf(shape));
  b->set_kind(plan::Buffer::ARGUMENT);
  b->set_first_use(-1), b->set_last_use(-1);
  plan::Binding *arg = prog.add_arguments();
  arg->set_buffer(b->id()), arg->set_role(role), arg->set_name(name), arg->set_inout(inout);
  arg->set_offset(offset), arg->set_part_of(partOf);
  return b->id();
}

// A bucket's reduce-scatter from the flat gradients (view `flat`) in place into the rank's part
// of them (view `shard`, inside `flat`: Megatron's distributed optimizer's grad buffer).
plan::Instruction bucketReduceScatter(int flat, int shard, const StageBucket &bucket, plan::DType dpWire) {
  plan::Instruction in;
  InstructionBuilder(OpId::kReduceScatter)
      .in("input", flat)
      .out("result", shard)
      .attr("group", bucket.group)
      .attr("group_size", int64_t(bucket.parts))
      .attr("reduce", std::string("avg"))
      .attr("dim", int64_t(0))
      .writeTo(&in);
  in.set_stream(isa::streamOf(isa::decl(OpId::kReduceScatter), bucket.group));
  in.set_layer(-1);
  int64_t bytes = 4 * bucket.elements;
  if (dpWire != plan::F32) bytes = setWireDtype(in, dpWire, bytes);
  in.set_bytes_moved(isa::decl(OpId::kReduceScatter).bytesMoved(bytes, 0, bucket.parts));
  return in;
}
}  // namespace

void appendBucketReduceScatters(plan::Program &backward, const StageLayout &layout, plan::DType dpWire,
                                bool serial, const std::set<std::string> &syncedLater) {
  std::map<std::string, int> gradientArg;  // parameter -> its GRADIENT argument buffer
  for (const plan::Binding &a : backward.arguments())
    if (a.role() == plan::Binding::GRADIENT) gradientArg[a.name()] = a.buffer();
  std::vector<plan::Instruction> tail;
  std::vector<std::vector<int>> aliases;
  for (const StageBucket &bucket : layout.buckets) {
    if (bucket.virtualStage != backward.virtual_stage() || !reducedInBackward(bucket, syncedLater) || bucket.parts == 1)
      continue;
    int flat = addView(backward, plan::Binding::GRADIENT, "flat", {bucket.elements}, bucket.flatBegin, "", true);
    int shard = addView(backward, plan::Binding::GRADIENT, "flat", {bucket.part()}, bucket.flatBegin, bucket.group, true);
    tail.push_back(bucketReduceScatter(flat, shard, bucket, dpWire));
    tail.back().set_last_micro_batch(true);
    aliases.emplace_back();
    for (const std::string &p : bucket.params)
      if (gradientArg.count(p)) aliases.back().push_back(gradientArg[p]);
  }
  if (!tail.empty()) insertAccumulations(backward, {}, std::move(tail), serial, aliases);
}

void prependParameterGathers(plan::Program &forward, const StageLayout &layout) {
  std::map<int, size_t> bucketOfArg;  // PARAMETER argument buffer -> its bucket
  std::map<std::string, size_t> bucketOfParam;
  for (size_t k = 0; k < layout.buckets.size(); ++k)
    for (const std::string &p : layout.buckets[k].params) bucketOfParam[p] = k;
  for (const plan::Binding &a : forward.arguments())
    if (a.role() == plan::Binding::PARAMETER && bucketOfParam.count(a.name())) bucketOfArg[a.buffer()] = bucketOfParam[a.name()];
  // The buckets of this virtual stage, in the order the forward first reads them.
  std::map<size_t, int> firstReader;
  for (int i = 0; i < forward.instructions_size(); ++i)
    for (int b : forward.instructions(i).inputs())
      if (bucketOfArg.count(b)) firstReader.try_emplace(bucketOfArg[b], i);
  std::vector<size_t> order;
  for (size_t k = 0; k < layout.buckets.size(); ++k)
    if (layout.buckets[k].gatherInForward && layout.buckets[k].virtualStage == forward.virtual_stage()) order.push_back(k);
  if (order.empty()) return;
  auto readAt = [&](size_t k) { return firstReader.count(k) ? firstReader[k] : forward.instructions_size(); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return readAt(a) < readAt(b); });

  // Inserted instructions: the gathers (dp stream), in the order the forward first reads the
  // buckets. A 16-bit plan gathers the copies it computes with (the optimizer rounded the rank's
  // updated part into them), an fp32 plan the parameters themselves.
  struct Inserted {
    int before;  // original instruction index it precedes
    plan::Instruction in;
  };
  std::vector<Inserted> inserted;
  std::map<size_t, int> readyOf;  // bucket -> the inserted instruction its readers wait for
  plan::DType dtype = layout.computeDtype;
  for (size_t k : order) {
    const StageBucket &bucket = layout.buckets[k];
    int own = addView(forward, plan::Binding::PARAMETER, "flat", {bucket.part()}, bucket.flatBegin, bucket.group, true, dtype);
    int whole = addView(forward, plan::Binding::PARAMETER, "flat", {bucket.elements}, bucket.flatBegin, "", true, dtype);
    Inserted g{0, {}};
    InstructionBuilder(OpId::kAllGather)
        .in("input", own)
        .out("result", whole)
        .attr("group", bucket.group)
        .attr("group_size", int64_t(bucket.parts))
        .attr("dim", int64_t(0))
        .writeTo(&g.in);
    g.in.set_stream(isa::streamOf(isa::decl(OpId::kAllGather), bucket.group));
    g.in.set_layer(-1);
    g.in.set_first_micro_batch(true);
    int64_t bytes = planattr::elementBytes(dtype) * bucket.elements;
    g.in.set_bytes_moved(isa::decl(OpId::kAllGather).bytesMoved(bytes, bytes, bucket.parts));
    inserted.push_back(std::move(g));
    readyOf[k] = int(inserted.size()) - 1;
  }
  // The new order: inserted instructions before their original instruction, in insertion order.
  int old = forward.instructions_size();
  std::vector<std::vector<int>> before(size_t(old) + 1);
  for (size_t j = 0; j < inserted.size(); ++j) before[size_t(inserted[j].before)].push_back(int(j));
  std::vector<int> newOfOld(static_cast<size_t>(old)), newOfInserted(inserted.size());
  int next = 0;
  for (int i = 0; i <= old; ++i) {
    for (int j : before[size_t(i)]) newOfInserted[size_t(j)] = next++;
    if (i < old) newOfOld[size_t(i)] = next++;
  }
  std::vector<plan::Instruction> result(static_cast<size_t>(next));
  for (size_t j = 0; j < inserted.size(); ++j) result[size_t(newOfInserted[j])] = inserted[j].in;
  // Each stream's first reader of a bucket waits for it (later readers follow it in stream order).
  std::set<std::pair<size_t, int>> waited;  // (bucket, stream)
  for (int i = 0; i < old; ++i) {
    plan::Instruction in = forward.instructions(i);
    std::vector<int> waits;
    for (int w : in.wait_for()) waits.push_back(newOfOld[size_t(w)]);
    for (int b : in.inputs()) {
      auto it = bucketOfArg.find(b);
      if (it == bucketOfArg.end() || !readyOf.count(it->second)) continue;
      const plan::Instruction &ready = inserted[size_t(readyOf[it->second])].in;
      if (waited.insert({it->second, int(in.stream())}).second && ready.stream() != in.stream())
        waits.push_back(newOfInserted[size_t(readyOf[it->second])]);
    }
    std::sort(waits.begin(), waits.end());
    waits.erase(std::unique(waits.begin(), waits.end()), waits.end());
    in.clear_wait_for();
    for (int w : waits) in.add_wait_for(w);
    result[size_t(newOfOld[size_t(i)])] = std::move(in);
  }
  forward.clear_instructions();
  for (plan::Instruction &in : result) *forward.add_instructions() = std::move(in);
  recomputeLifetimes(forward);
  planWorkspace(forward);
}

llvm::Error foldGradientSync(plan::Program &backward, const plan::Program *gradSync, bool serial, plan::DType dpWire,
                             std::vector<DeferredSync> *deferred) {
  // Which gradient each backward result becomes: its own (GRADIENT) or, through the sync
  // program's collectives, the parameter the sync's result names.
  std::map<std::string, std::string> gradientOfStash;  // sync argument (backward output) -> parameter
  std::vector<int> rootOf;                             // sync buffer -> sync argument index (-1: none)
  if (gradSync) {
    rootOf.assign(gradSync->buffers_size(), -1);
    for (int a = 0; a < gradSync->arguments_size(); ++a) {
      if (gradSync->arguments(a).role() != plan::Binding::STASH)
        return error(gradSync->name() + ": argument '" + gradSync->arguments(a).name() + "' is not a backward output");
      rootOf[gradSync->arguments(a).buffer()] = a;
    }
    for (const plan::Instruction &in : gradSync->instructions()) {
      if (in.op() != "all_reduce" || in.inputs_size() != in.outputs_size())
        return error(gradSync->name() + ": op '" + in.op() + "' in gradient synchronisation (only all-reduces fold into the backward)");
      for (int k = 0; k < in.inputs_size(); ++k) rootOf[in.outputs(k)] = rootOf[in.inputs(k)];
    }
    for (const plan::Binding &r : gradSync->results()) {
      int root = rootOf[r.buffer()];
      if (r.role() != plan::Binding::GRADIENT || root < 0)
        return error(gradSync->name() + ": result '" + r.name() + "' is not a synchronised gradient");
      gradientOfStash[gradSync->arguments(root).name()] = r.name();
    }
  }
  std::map<int, int> into;                 // backward result buffer -> inout GRADIENT argument
  std::map<std::string, int> argOfParam;   // parameter -> its GRADIENT argument buffer
  std::vector<plan::Binding> results(backward.results().begin(), backward.results().end());
  for (const plan::Binding &r : results) {
    std::string param;
    if (r.role() == plan::Binding::GRADIENT)
      param = r.name();
    else if (r.role() == plan::Binding::STASH && gradientOfStash.count(r.name()))
      param = gradientOfStash[r.name()];
    else
      continue;
    plan::Buffer like = backward.buffers(r.buffer());
    int arg = addArgumentBuffer(backward, like, plan::Binding::GRADIENT, param);
    into[r.buffer()] = arg;
    argOfParam[param] = arg;
  }
  std::vector<plan::Instruction> tail;
  if (gradSync) {
    std::map<std::string, int> stashResult;  // backward output name -> its result buffer
    for (const plan::Binding &r : results)
      if (r.role() == plan::Binding::STASH) stashResult[r.name()] = r.buffer();
    for (const plan::Instruction &src : gradSync->instructions()) {
      plan::Instruction in = src;
      in.clear_inputs(), in.clear_outputs(), in.clear_wait_for();
      std::string group = planattr::str(src, "group");
      // The weight gradients' reduction ("edp": expert parallelism's experts, over the ranks
      // holding the same ones).
      bool dataParallel = group == "dp" || group == "dpcp" || group == "edp";
      bool withinStage = group == "tp" || dataParallel;
      DeferredSync later;
      int64_t bytes = 0;
      for (int k = 0; k < src.inputs_size(); ++k) {
        const std::string &stash = gradSync->arguments(rootOf[src.inputs(k)]).name();
        if (!stashResult.count(stash))
          return error(gradSync->name() + ": '" + stash + "' is not an output of " + backward.name());
        int arg = into.at(stashResult[stash]);
        in.add_inputs(arg), in.add_outputs(arg);  // in place on the accumulated gradient
        bytes += backward.buffers(arg).bytes();
        later.params.push_back(gradientOfStash[stash]);
      }
      // The collective reduces the fp32 main gradients, whatever the dtype the backward
      // computed them in (Megatron's --accumulate-allreduce-grads-in-fp32), or, over dp with
      // grad_reduce_in_bf16, moves them as bf16 (widened back into the main gradients).
      if (dataParallel && dpWire != plan::F32) bytes = setWireDtype(in, dpWire, bytes);
      if (const isa::OpDecl *decl = isa::find(src.op()); decl && decl->bytesMoved)
        in.set_bytes_moved(decl->bytesMoved(bytes, bytes, planattr::i64(src, "group_size", 1)));
      if (!withinStage) {
        later.collective = std::move(in);
        later.collective.clear_inputs(), later.collective.clear_outputs();
        deferred->push_back(std::move(later));
        continue;
      }
      in.set_last_micro_batch(true);
      tail.push_back(std::move(in));
    }
  }
  insertAccumulations(backward, into, std::move(tail), serial);
  return llvm::Error::success();
}

std::string lossSumName(const std::string &loss) { return loss == "loss" ? "loss_sum" : "loss_sum:" + loss; }

void accumulateLoss(plan::Program &forward) {
  std::map<int, int> into;
  for (const plan::Binding &r : forward.results())
    if (r.role() == plan::Binding::LOSS) {
      plan::Buffer like = forward.buffers(r.buffer());
      into[r.buffer()] = addArgumentBuffer(forward, like, plan::Binding::LOSS, lossSumName(r.name()));
    }
  if (!into.empty()) insertAccumulations(forward, into, {}, false);
}

std::vector<std::string> lossTermsOf(const plan::Program &forward) {
  std::vector<std::string> terms;
  const std::string prefix = lossSumName("");  // "loss_sum:"
  for (const plan::Binding &a : forward.arguments())
    if (a.role() == plan::Binding::LOSS && a.name().rfind(prefix, 0) == 0 && a.name().size() > prefix.size())
      terms.push_back(a.name().substr(prefix.size()));
  return terms;
}

plan::Program lossProgram(int microBatches, const std::string &group, int d, const std::vector<std::string> &terms) {
  ProgramBuilder b("loss", plan::Program::LOSS);
  std::vector<std::string> losses{"loss"};
  losses.insert(losses.end(), terms.begin(), terms.end());
  std::vector<int> sums, means;
  for (const std::string &loss : losses) {
    sums.push_back(b.argument(plan::Binding::LOSS, lossSumName(loss), {}, /*inout=*/true));
    means.push_back(b.activation({}));
    b.emit(InstructionBuilder(OpId::kScale).in("input", sums.back()).out("output", means.back()).attr("factor",
                                                                                                   1.0 / microBatches));
  }
  std::vector<int> reduced = means;
  if (d > 1) {  // every loss in one all-reduce
    for (int &r : reduced) r = b.activation({});
    collective(b, OpId::kAllReduce, group, d, means, reduced, 4 * int64_t(means.size()), "avg");
  }
  for (int sum : sums) b.emit(InstructionBuilder(OpId::kFill).out("output", sum).attr("value", 0.0));
  for (size_t k = 0; k < losses.size(); ++k) b.result(plan::Binding::METRIC, losses[k], reduced[k]);
  return b.finish();
}

namespace {
// The deferred syncs' instructions at the head of an optimizer program, in place on the
// parameters' slices of the flat gradients; returns their indices.
std::vector<int> emitDeferredSyncs(ProgramBuilder &b, const StageLayout &layout, const std::vector<DeferredSync> &deferred) {
  std::vector<int> syncs;
  for (const DeferredSync &sync : deferred) {
    std::vector<int> slices;
    for (const std::string &name : sync.params) {
      auto it = std::find_if(layout.parameters.begin(), layout.parameters.end(),
                             [&](const StageParameter &sp) { return sp.name == name; });
      if (it == layout.parameters.end()) continue;  // another stage's (cannot happen: same program set)
      slices.push_back(b.argument(plan::Binding::GRADIENT, name, it->shape, true));
    }
    plan::Instruction &in = b.emit(sync.collective.op(), sync.collective.stream(), slices, slices);
    *in.mutable_attributes() = sync.collective.attributes();
    in.set_bytes_moved(sync.collective.bytes_moved());
    in.set_layer(sync.collective.layer());
    syncs.push_back(b.last());
  }
  return syncs;
}

// The global norm: the rank's partial sum of squares all-reduced over the groups holding other
// shares, then grad_norm: the norm of the unscaled gradients and the factor AdamW scales them by
// (clipping / loss_scale, or 0 when the norm is not finite: the update is skipped, fp16 dynamic
// loss scaling, or the recipe stops). Returns (norm, factor).
std::pair<int, int> clippedNorm(ProgramBuilder &b, int squares, const std::vector<std::pair<std::string, int>> &groups,
                                std::map<std::string, int> &hyper) {
  for (auto [group, size] : groups) {
    if (size <= 1) continue;
    int next = b.activation({});
    collective(b, OpId::kAllReduce, group, size, squares, next, 4, "sum");
    squares = next;
  }
  int norm = b.activation({}), factor = b.activation({});
  b.emit(InstructionBuilder(OpId::kGradNorm)
             .in("squares", squares)
             .in("clip_grad", hyper["clip_grad"])
             .in("loss_scale", hyper["loss_scale"])
             .out("norm", norm)
             .out("factor", factor));
  return {norm, factor};
}

// ZeRO-1's all-gather of a bucket's parameters in place (the rank's part inside the whole), in
// `dtype`: the fp32 master weights (fp32 plans; parameter_gather), or the 16-bit copies the
// forward computes with (16-bit plans: Megatron's distributed optimizer gathers its bf16
// parameters, half the bytes). own: the view of the rank's part (-1: a view of its own).
void emitBucketGather(ProgramBuilder &b, const StageBucket &bucket, plan::DType dtype, int own = -1) {
  if (bucket.parts == 1) return;
  if (own < 0) own = b.view(plan::Binding::PARAMETER, "flat", {bucket.part()}, bucket.flatBegin, bucket.partOf(), dtype);
  int whole = b.view(plan::Binding::PARAMETER, "flat", {bucket.elements}, bucket.flatBegin, "", dtype);
  collective(b, OpId::kAllGather, bucket.group, bucket.parts, own, whole,
             planattr::elementBytes(dtype) * bucket.elements);
}

// The optimizer's HYPERPARAMETER arguments, by name.
std::map<std::string, int> hyperparameterArguments(ProgramBuilder &b) {
  std::map<std::string, int> hyper;
  for (const char *name : {"learning_rate", "adam_step", "clip_grad", "loss_scale", "weight_decay", "adam_beta1",
                           "adam_beta2", "adam_eps"})
    hyper[name] = b.argument(plan::Binding::HYPERPARAMETER, name, {}, false);
  return hyper;
}

// The `segments` attribute of the parameters starting in flat elements [begin, end): the norm's
// counting (tied copies and tp-replicated ones) and AdamW's weight decay per parameter.
// normed: which parameters the norm counts here (expert parallelism sums the experts' squares
// over "ep" apart from the rest; null: all).
std::string segmentsIn(const StageLayout &layout, int64_t begin, int64_t end,
                       bool (*normed)(const StageParameter &) = nullptr) {
  std::vector<planattr::FlatSegment> segments;
  for (const StageParameter &sp : layout.parameters)
    if (sp.flatOffset >= begin && sp.flatOffset < end) {
      bool counted = !sp.tied && (!normed || normed(sp));
      segments.push_back({sp.flatOffset, sp.elements, counted && !sp.tpReplicated, counted && sp.tpReplicated, sp.decay});
    }
  return planattr::encodeSegments(segments);
}

std::set<std::string> syncedLaterOf(const std::vector<DeferredSync> &deferred) {
  std::set<std::string> names;
  for (const DeferredSync &sync : deferred) names.insert(sync.params.begin(), sync.params.end());
  return names;
}

// ZeRO-1 by buckets (Rajbhandari et al., "ZeRO", SC 2020, section 5.1; Megatron's distributed
// optimizer): the reduced gradients of the rank's part of every bucket are in that part of the
// flat gradients (reduce-scattered in place by the backwards, or here after the cross-stage
// syncs); the norm over the parts, AdamW on each part in place in the flat parameters, and the
// all-gathers no forward does.
plan::Program shardedOptimizerProgram(const StageLayout &layout, int t, int p, int d, plan::DType dpWire,
                                      const std::vector<DeferredSync> &deferred) {
  int64_t flat = layout.flatElements;
  ProgramBuilder b("optimizer", plan::Program::OPTIMIZER);
  int grads = b.argument(plan::Binding::GRADIENT, "flat", {flat}, true);
  std::map<std::string, int> hyper = hyperparameterArguments(b);
  // Each bucket's instructions name the segments inside it only.
  std::vector<std::string> segmentText;
  for (const StageBucket &bucket : layout.buckets)
    segmentText.push_back(segmentsIn(layout, bucket.flatBegin, bucket.flatBegin + bucket.elements));

  std::vector<int> syncs = emitDeferredSyncs(b, layout, deferred);
  std::set<std::string> syncedLater = syncedLaterOf(deferred);
  std::vector<int> shards, readsOfFlat;  // per bucket: its reduced gradients; what read the flat gradients
  for (const StageBucket &bucket : layout.buckets) {
    int shard = b.view(plan::Binding::GRADIENT, "flat", {bucket.part()}, bucket.flatBegin, bucket.partOf());
    shards.push_back(shard);
    if (reducedInBackward(bucket, syncedLater) || bucket.parts == 1) {
      if (bucket.parts == 1) b.alsoAfter(shard, syncs);
      continue;
    }
    int from = b.view(plan::Binding::GRADIENT, "flat", {bucket.elements}, bucket.flatBegin, "");
    b.alsoAfter(from, syncs);
    plan::Instruction rs = bucketReduceScatter(from, shard, bucket, dpWire);
    plan::Instruction &in = b.emit(rs.op(), rs.stream(), {from}, {shard});
    *in.mutable_attributes() = rs.attributes();
    in.set_bytes_moved(rs.bytes_moved());
    readsOfFlat.push_back(b.last());
  }
  // The norm: each part's sum of squares, added up, then over dp, tp and pp. An expert bucket's
  // parts are over "edp", and dp = ep x edp: the sum over dp counts every expert's once too.
  int squares = -1;
  for (size_t k = 0; k < layout.buckets.size(); ++k) {
    int part = b.activation({});
    InstructionBuilder sq(OpId::kSumSquares);
    sq.in("grads", shards[k]).out("squares", part).attr("segments", segmentText[k]);
    if (layout.buckets[k].parts > 1) sq.attr("shard_group", layout.buckets[k].group);
    sq.attr("flat_offset", layout.buckets[k].flatBegin);
    if (t > 1) sq.attr("replicated_group", std::string("tp"));
    b.emit(sq);
    if (squares < 0)
      squares = part;
    else
      b.emit(InstructionBuilder(OpId::kAccumulate).in("input", part).out("accumulator", squares));
  }
  auto [norm, factor] = clippedNorm(b, squares, {{layout.dpGroup, d}, {"tp", t}, {"pp", p}}, hyper);
  std::vector<int> owns;  // per bucket: the view of the rank's part of the parameters
  for (size_t k = 0; k < layout.buckets.size(); ++k) {
    const StageBucket &bucket = layout.buckets[k];
    int64_t part = bucket.part();
    int own = layout.mastersSharded()
                  ? b.view(plan::Binding::OPTIMIZER_STATE, kMasterWeights, {part}, bucket.shardBegin, "")
                  : b.view(plan::Binding::PARAMETER, "flat", {part}, bucket.flatBegin, bucket.partOf());
    int m = b.view(plan::Binding::OPTIMIZER_STATE, "adam_m", {part}, bucket.shardBegin, "");
    int v = b.view(plan::Binding::OPTIMIZER_STATE, "adam_v", {part}, bucket.shardBegin, "");
    InstructionBuilder adam(OpId::kAdamw);
    adam.in("params", own).in("grads", shards[k]).in("adam_m", m).in("adam_v", v).in("grad_scale", factor);
    for (const char *name : {"learning_rate", "adam_step", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps"})
      adam.in(name, hyper[name]);
    adam.out("updated", own).out("adam_m", m).out("adam_v", v).attr("segments", segmentText[k]);
    if (bucket.parts > 1) adam.attr("shard_group", bucket.group);
    adam.attr("flat_offset", bucket.flatBegin);
    b.emit(adam);
    if (layout.computeDtype != plan::F32) {  // the updated part rounded into the 16-bit copies
      int compute =
          b.view(plan::Binding::PARAMETER, "flat", {part}, bucket.flatBegin, bucket.partOf(), layout.computeDtype);
      b.emit(InstructionBuilder(OpId::kCast).in("input", own).out("output", compute));
      own = compute;
    }
    owns.push_back(own);
  }
  // The gathers no forward does. With 16-bit compute only the copies are gathered (the fp32
  // master weights are the rank's parts only).
  for (size_t k = 0; k < layout.buckets.size(); ++k)
    if (!layout.buckets[k].gatherInForward) emitBucketGather(b, layout.buckets[k], layout.computeDtype, owns[k]);
  b.alsoAfter(grads, readsOfFlat);
  b.emit(InstructionBuilder(OpId::kFill).out("output", grads).attr("value", 0.0));  // zero_grad for the next step
  b.result(plan::Binding::METRIC, "grad_norm", norm);
  return b.finish();
}
}  // namespace

plan::Program optimizerProgram(const StageLayout &layout, int t, int p, int d, bool zero1, plan::DType dpWire,
                               const std::vector<DeferredSync> &deferred, int ep) {
  if (zero1 && d > 1 && !layout.buckets.empty()) return shardedOptimizerProgram(layout, t, p, d, dpWire, deferred);
  int64_t flat = layout.flatElements;
  ProgramBuilder b("optimizer", plan::Program::OPTIMIZER);
  int params = b.argument(plan::Binding::PARAMETER, "flat", {flat}, true);
  int grads = b.argument(plan::Binding::GRADIENT, "flat", {flat}, true);
  int m = b.argument(plan::Binding::OPTIMIZER_STATE, "adam_m", {flat}, true);
  int v = b.argument(plan::Binding::OPTIMIZER_STATE, "adam_v", {flat}, true);
  std::map<std::string, int> hyper = hyperparameterArguments(b);

  std::string segmentText = segmentsIn(layout, 0, layout.flatElements);

  // Gradient sync across stages first, in place on the parameters' slices of the flat
  // gradient buffer (arguments aliasing it: what reads the flat buffer next waits for them).
  b.alsoAfter(grads, emitDeferredSyncs(b, layout, deferred));
  // The sum of squares of the gradients: parameters replicated across tp are counted by the
  // group's first member only (the plan names the group; the executor reads its position from
  // the rank's plan). With expert parallelism the experts' (different on each member of "ep")
  // are summed over "ep" before they join the rest's.
  bool experts = std::any_of(layout.parameters.begin(), layout.parameters.end(),
                             [](const StageParameter &sp) { return sp.expert; });
  auto sumSquares = [&](const std::string &segments) {
    int squares = b.activation({});
    InstructionBuilder sq(OpId::kSumSquares);
    sq.in("grads", grads).out("squares", squares).attr("segments", segments);
    if (t > 1) sq.attr("replicated_group", "tp");
    b.emit(sq);
    return squares;
  };
  int squares = -1;
  if (!experts || ep <= 1) {
    squares = sumSquares(segmentText);
  } else {
    squares = sumSquares(segmentsIn(layout, 0, flat, [](const StageParameter &sp) { return !sp.expert; }));
    int expertSquares = sumSquares(segmentsIn(layout, 0, flat, [](const StageParameter &sp) { return sp.expert; }));
    int summed = b.activation({});
    collective(b, OpId::kAllReduce, "ep", ep, expertSquares, summed, 4, "sum");
    b.emit(InstructionBuilder(OpId::kAccumulate).in("input", summed).out("accumulator", squares));
  }
  auto [norm, factor] = clippedNorm(b, squares, {{"tp", t}, {"pp", p}}, hyper);
  InstructionBuilder adam(OpId::kAdamw);
  adam.in("params", params).in("grads", grads).in("adam_m", m).in("adam_v", v).in("grad_scale", factor);
  // The hyperparameter arguments bound to the inputs of the same names.
  for (const char *name : {"learning_rate", "adam_step", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps"})
    adam.in(name, hyper[name]);
  adam.out("updated", params).out("adam_m", m).out("adam_v", v).attr("segments", segmentText);
  b.emit(adam);
  if (layout.computeDtype != plan::F32) {  // the 16-bit copies the next step computes with
    int compute = b.argument(plan::Binding::PARAMETER, "flat", {flat}, true, layout.computeDtype);
    b.emit(InstructionBuilder(OpId::kCast).in("input", params).out("output", compute));
  }
  b.emit(InstructionBuilder(OpId::kFill).out("output", grads).attr("value", 0.0));  // zero_grad for the next step
  b.result(plan::Binding::METRIC, "grad_norm", norm);
  return b.finish();
}

plan::Program parameterGatherProgram(const StageLayout &layout) {
  ProgramBuilder b("parameter_gather", plan::Program::PARAMETER_GATHER);
  // fp32 plans: the master weights whole, for a reader outside the step (the optimizer gathers
  // the buckets no forward gathers). 16-bit plans: the 16-bit copies remade from the sharded
  // masters (each rank's parts cast, then gathered), after the masters were written from
  // outside the step (initialisation, a checkpoint).
  for (const StageBucket &bucket : layout.buckets) {
    if (!layout.mastersSharded()) {
      if (bucket.gatherInForward) emitBucketGather(b, bucket, plan::F32);
      continue;
    }
    int master = b.view(plan::Binding::OPTIMIZER_STATE, kMasterWeights, {bucket.part()}, bucket.shardBegin, "");
    int own = b.view(plan::Binding::PARAMETER, "flat", {bucket.part()}, bucket.flatBegin, bucket.partOf(),
                     layout.computeDtype);
    b.emit(InstructionBuilder(OpId::kCast).in("input", master).out("output", own));
    emitBucketGather(b, bucket, layout.computeDtype, own);
  }
  return b.finish();
}

plan::Program gradientGatherProgram(const StageLayout &layout, const std::vector<DeferredSync> &deferred) {
  ProgramBuilder b("gradient_gather", plan::Program::GRADIENT_GATHER);
  std::set<std::string> syncedLater = syncedLaterOf(deferred);
  for (const StageBucket &bucket : layout.buckets) {
    if (!reducedInBackward(bucket, syncedLater) || bucket.parts == 1) continue;
    int own = b.view(plan::Binding::GRADIENT, "flat", {bucket.part()}, bucket.flatBegin, bucket.group);
    int whole = b.view(plan::Binding::GRADIENT, "flat", {bucket.elements}, bucket.flatBegin, "");
    collective(b, OpId::kAllGather, bucket.group, bucket.parts, own, whole, 4 * bucket.elements);
  }
  return b.finish();
}

}  // namespace loom
