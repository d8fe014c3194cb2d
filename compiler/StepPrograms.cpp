#include "compiler/StepPrograms.h"

#include <algorithm>
#include <map>
#include <set>

#include "compiler/Lowering.h"
#include "ir/ParamAttrs.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "plan/InstructionSet.h"
#include "plan/PlanAttributes.h"

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
plan::Instruction &collective(ProgramBuilder &b, OpId op, const std::string &group, int64_t size, int input,
                              int output, int64_t bytes, const std::string &reduce = "") {
  InstructionBuilder built(op);
  built.in("input", input).out("result", output).attr("group", group).attr("group_size", size);
  if (!reduce.empty()) built.attr("reduce", reduce);
  if (op != OpId::kAllReduce) built.attr("dim", int64_t(0));
  plan::Instruction &in = b.emit(built);
  in.set_bytes_moved(isa::decl(op).bytesMoved(bytes, bytes, size));
  return in;
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
// instruction); the results in `into` are dropped.
void insertAccumulations(plan::Program &prog, const std::map<int, int> &into, std::vector<plan::Instruction> tail,
                         bool tailAtEnd) {
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
  for (plan::Instruction &in : tail) {
    int anchor = 0;
    std::set<int> waits;
    std::vector<int> touched(in.inputs().begin(), in.inputs().end());
    touched.insert(touched.end(), in.outputs().begin(), in.outputs().end());
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

llvm::Expected<StageLayout> stageLayout(mlir::ModuleOp module, const plan::ProgramSet &set, int d, bool zero1) {
  std::map<std::string, std::pair<bool, bool>> facts;  // name -> (tied, tensor-parallel shard)
  for (auto f : module.getOps<mlir::func::FuncOp>())
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      if (auto n = f.getArgAttrOfType<mlir::StringAttr>(i, attr::kParam)) {
        auto &[tied, sharded] = facts[n.str()];
        tied |= bool(f.getArgAttr(i, attr::kTiedTo));
        sharded |= bool(f.getArgAttr(i, attr::kShardDim));
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
  for (const plan::Program &prog : set.programs()) {
    if (prog.kind() != plan::Program::BACKWARD) continue;
    std::map<int, std::string> gradientOf;  // argument buffer -> parameter
    for (const plan::Binding &a : prog.arguments())
      if (a.role() == plan::Binding::GRADIENT) gradientOf[a.buffer()] = a.name();
    for (const plan::Instruction &in : prog.instructions())
      if (in.op() == "accumulate" && gradientOf.count(in.outputs(0)) && bufferOf.count(gradientOf[in.outputs(0)]) &&
          seen.insert(gradientOf[in.outputs(0)]).second)
        names.push_back(gradientOf[in.outputs(0)]);
  }
  for (const plan::Program &prog : set.programs())
    for (const plan::Binding &a : prog.arguments())
      if (a.role() == plan::Binding::PARAMETER && seen.insert(a.name()).second) names.push_back(a.name());
  StageLayout layout;
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
    p.decay = p.shape.size() >= 2;
    layout.flatElements += (p.elements + kFlatAlign - 1) / kFlatAlign * kFlatAlign;
    layout.parameters.push_back(std::move(p));
  }
  if (zero1 && d > 1) {  // every dp rank owns one equal, aligned shard
    int64_t unit = kFlatAlign * d;
    layout.flatElements = (layout.flatElements + unit - 1) / unit * unit;
  }
  return layout;
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
      bool withinStage = group == "tp" || group == "dp";
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
      if (group == "dp" && dpWire != plan::F32) bytes = setWireDtype(in, dpWire, bytes);
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

void accumulateLoss(plan::Program &forward) {
  std::map<int, int> into;
  for (const plan::Binding &r : forward.results())
    if (r.role() == plan::Binding::LOSS) {
      plan::Buffer like = forward.buffers(r.buffer());
      into[r.buffer()] = addArgumentBuffer(forward, like, plan::Binding::LOSS, "loss_sum");
    }
  if (!into.empty()) insertAccumulations(forward, into, {}, false);
}

plan::Program lossProgram(int microBatches, int d) {
  ProgramBuilder b("loss", plan::Program::LOSS);
  int sum = b.argument(plan::Binding::LOSS, "loss_sum", {}, /*inout=*/true);
  int mean = b.activation({});
  b.emit(InstructionBuilder(OpId::kScale).in("input", sum).out("output", mean).attr("factor", 1.0 / microBatches));
  int reduced = mean;
  if (d > 1) {
    reduced = b.activation({});
    collective(b, OpId::kAllReduce, "dp", d, mean, reduced, 4, "avg");
  }
  b.emit(InstructionBuilder(OpId::kFill).out("output", sum).attr("value", 0.0));
  b.result(plan::Binding::METRIC, "loss", reduced);
  return b.finish();
}

plan::Program optimizerProgram(const StageLayout &layout, int t, int p, int d, bool zero1, plan::DType dpWire,
                               const std::vector<DeferredSync> &deferred) {
  bool sharded = zero1 && d > 1;
  int64_t flat = layout.flatElements, shard = sharded ? flat / d : flat;
  ProgramBuilder b("optimizer", plan::Program::OPTIMIZER);
  int params = b.argument(plan::Binding::PARAMETER, "flat", {flat}, true);
  int grads = b.argument(plan::Binding::GRADIENT, "flat", {flat}, true);
  int m = b.argument(plan::Binding::OPTIMIZER_STATE, "adam_m", {shard}, true);
  int v = b.argument(plan::Binding::OPTIMIZER_STATE, "adam_v", {shard}, true);
  std::map<std::string, int> hyper;
  for (const char *name : {"learning_rate", "adam_step", "clip_grad", "loss_scale", "weight_decay", "adam_beta1",
                           "adam_beta2", "adam_eps"})
    hyper[name] = b.argument(plan::Binding::HYPERPARAMETER, name, {}, false);

  std::vector<planattr::FlatSegment> segments;
  for (const StageParameter &sp : layout.parameters)
    segments.push_back({sp.flatOffset, sp.elements, !sp.tied && !sp.tpReplicated, !sp.tied && sp.tpReplicated, sp.decay});
  std::string segmentText = planattr::encodeSegments(segments);

  // Gradient sync across stages first, in place on the parameters' slices of the flat
  // gradient buffer (arguments aliasing it: what reads the flat buffer next waits for them).
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
  // ZeRO-1 (Rajbhandari et al., "ZeRO", SC 2020, section 5.1; Megatron's distributed
  // optimizer): each dp rank reduces and updates only its 1/d of the flat buffer.
  b.alsoAfter(grads, syncs);
  int g = grads;
  if (sharded) {
    g = b.activation({shard});
    plan::Instruction &rs = collective(b, OpId::kReduceScatter, "dp", d, grads, g, 4 * flat, "avg");
    if (dpWire != plan::F32)
      rs.set_bytes_moved(isa::decl(OpId::kReduceScatter).bytesMoved(setWireDtype(rs, dpWire, 4 * flat), 0, d));
  }
  int squares = b.activation({});
  InstructionBuilder sq(OpId::kSumSquares);
  sq.in("grads", g).out("squares", squares).attr("segments", segmentText);
  if (sharded) sq.attr("shard_group", "dp");
  // Parameters replicated across tp are counted by the group's first member only (the plan
  // names the group; the executor reads its position from the rank's plan).
  if (t > 1) sq.attr("replicated_group", "tp");
  b.emit(sq);
  // The global norm: every rank's share summed over the groups that hold other shares.
  std::vector<std::pair<std::string, int>> groups = {{"tp", t}, {"pp", p}};
  if (sharded) groups.insert(groups.begin(), {"dp", d});
  for (auto [group, size] : groups) {
    if (size <= 1) continue;
    int next = b.activation({});
    collective(b, OpId::kAllReduce, group, size, squares, next, 4, "sum");
    squares = next;
  }
  int norm = b.activation({}), factor = b.activation({});
  // norm of the unscaled gradients; factor = clipping / loss_scale, or 0 when the norm is not
  // finite (the update is skipped: fp16 dynamic loss scaling, or the recipe stops).
  b.emit(InstructionBuilder(OpId::kGradNorm)
             .in("squares", squares)
             .in("clip_grad", hyper["clip_grad"])
             .in("loss_scale", hyper["loss_scale"])
             .out("norm", norm)
             .out("factor", factor));
  int updated = sharded ? b.activation({shard}) : params;
  InstructionBuilder adam(OpId::kAdamw);
  adam.in("params", params).in("grads", g).in("adam_m", m).in("adam_v", v).in("grad_scale", factor);
  // The hyperparameter arguments bound to the inputs of the same names.
  for (const char *name : {"learning_rate", "adam_step", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps"})
    adam.in(name, hyper[name]);
  adam.out("updated", updated).out("adam_m", m).out("adam_v", v).attr("segments", segmentText);
  if (sharded) adam.attr("shard_group", "dp");
  b.emit(adam);
  if (sharded) collective(b, OpId::kAllGather, "dp", d, updated, params, 4 * flat);
  if (layout.computeDtype != plan::F32) {  // the 16-bit copies the next step computes with
    int compute = b.argument(plan::Binding::PARAMETER, "flat", {flat}, true, layout.computeDtype);
    b.emit(InstructionBuilder(OpId::kCast).in("input", params).out("output", compute));
  }
  b.emit(InstructionBuilder(OpId::kFill).out("output", grads).attr("value", 0.0));  // zero_grad for the next step
  b.result(plan::Binding::METRIC, "grad_norm", norm);
  return b.finish();
}

}  // namespace loom
