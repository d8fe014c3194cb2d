#include "analysis/PlanViews.h"

#include "formats/CheckpointPieces.h"

#include <filesystem>

#include "analysis/Units.h"
#include "plan/Layout.h"
#include "plan/MemoryAccounting.h"
#include "plan/PlanAttributes.h"
#include "llvm/Support/JSON.h"
#include "support/Checksum.h"
#include "support/FileIO.h"
#include "plan/PlanVersion.h"
#include "llvm/Support/FormatVariadic.h"

namespace loom {
namespace {

// Whether some collective of the programs moves its fp32 values as 16-bit (grad_reduce_in_bf16).
template <typename Programs>
bool reducesOnWire(const Programs &programs) {
  for (const plan::Program &prog : programs)
    for (const plan::Instruction &in : prog.instructions())
      if (!planattr::str(in, "wire_dtype").empty()) return true;
  return false;
}

llvm::Error error(const llvm::Twine &msg) { return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str()); }

llvm::Expected<std::string> readAll(const std::string &path, const char *what) {
  std::string bytes;
  if (Status s = readWholeFile(path, what, &bytes); !s.isOk()) return error(s.message());
  return bytes;
}

const char *streamName(plan::Stream s) {
  switch (s) {
    case plan::COMPUTE: return "compute";
    case plan::TP: return "tp";
    case plan::PP: return "pp";
    case plan::DP: return "dp";
    default: return "?";
  }
}

std::string shapeOf(const plan::Buffer &b) {
  std::string s;
  for (int64_t d : b.shape()) s += (s.empty() ? "" : "x") + std::to_string(d);
  return s.empty() ? "scalar" : s;
}

// "bf16 2x32x64": a buffer's element type and shape.
std::string typeOf(const plan::Buffer &b) { return llvm::StringRef(plan::DType_Name(b.dtype())).lower() + " " + shapeOf(b); }
// A view argument's place in its storage (Binding.offset, part_of): "[at 1024 + dp part]".
std::string viewOf(const plan::Binding &a) {
  if (!a.offset() && a.part_of().empty()) return "";
  std::string s = " [at " + std::to_string(a.offset());
  if (!a.part_of().empty()) s += " + " + a.part_of() + " part";
  return s + "]";
}

}  // namespace

const plan::Program *PlanDirectory::program(int rank, const std::string &name) const {
  for (const plan::Program &p : programsOf(rank).programs())
    if (p.name() == name) return &p;
  return nullptr;
}

llvm::Expected<PlanDirectory> readPlanDirectory(const std::string &dir) {
  PlanDirectory out;
  out.dir = dir;
  for (int rank = 0;; ++rank) {
    std::string path = dir + "/rank_" + std::to_string(rank) + ".plan.pb";
    if (!std::filesystem::exists(path)) break;
    auto bytes = readAll(path, "the rank plan");
    if (!bytes) return bytes.takeError();
    plan::RankPlan rp;
    if (!rp.ParseFromString(*bytes)) return error(path + ": not a valid rank plan (corrupt file)");
    if (std::string why = planVersionError(rp.plan_version(), path); !why.empty()) return error(why);
    if (rp.rank() != rank) return error(path + llvm::formatv(": holds the plan of rank {0}", rp.rank()));
    if (!out.programFiles.count(rp.programs_file())) {
      std::string ppath = dir + "/" + rp.programs_file();
      auto pbytes = readAll(ppath, "the program file");
      if (!pbytes) return pbytes.takeError();
      if (checksum64(*pbytes) != rp.programs_checksum())
        return error(ppath + ": checksum mismatch (corrupt or from another compile)");
      plan::ProgramSet set;
      if (!set.ParseFromString(*pbytes)) return error(ppath + ": not a valid program file");
      out.programFiles[rp.programs_file()] = std::move(set);
    }
    out.ranks.push_back(std::move(rp));
  }
  if (out.ranks.empty()) return error(dir + ": no rank_0.plan.pb (not a plan directory from loomc compile)");
  if (int(out.ranks.size()) != out.ranks[0].world_size())
    return error(dir + llvm::formatv(": {0} rank plans but the world size is {1}", out.ranks.size(),
                                     out.ranks[0].world_size()));
  return out;
}

std::string programsAsText(const PlanDirectory &plans, int rank) {
  const plan::RankPlan &rp = plans.ranks[rank];
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("rank {0} (tp {1}, dp {2}, pp {3}{6}) of {4}; programs from {5}\n", rp.rank(), rp.tp_rank(),
                      rp.dp_rank(), rp.pp_rank(), rp.world_size(), rp.programs_file(),
                      rp.c() > 1 ? ", cp " + std::to_string(rp.cp_rank()) : std::string());
  if (rp.c() > 1) {  // context parallelism: the rank's two chunks of each sample's sequence
    ContextChunks ch{rp.seq_length(), rp.c(), rp.cp_rank()};
    int64_t C = ch.chunk(), first = ch.chunkOf(ch.rank, 0), second = ch.chunkOf(ch.rank, 1);
    os << llvm::formatv("  context chunks {0} and {1} of {2}: tokens [{3}, {4}) and [{5}, {6}) of {7}\n", first, second,
                        2 * rp.c(), first * C, (first + 1) * C, second * C, (second + 1) * C, rp.seq_length());
  }
  for (const plan::Group &g : rp.groups()) {
    os << "  group " << g.name() << ": ranks";
    for (int r : g.ranks()) os << " " << r;
    os << " (position " << g.position() << ")\n";
  }
  for (const plan::PipelineLink &l : rp.pipeline_links())
    os << llvm::formatv("  pipeline link {0} pp position {1}: {2} message slots (the most in flight)\n",
                        l.send() ? "to" : "from", l.peer(), l.slots());
  for (const plan::Program &prog : plans.programsOf(rank).programs()) {
    os << llvm::formatv("\nprogram {0}: {1} instructions, workspace {2}, stash {3}\n", prog.name(),
                        prog.instructions_size(), humanBytes(prog.workspace_bytes()), humanBytes(prog.stash_bytes()));
    for (const plan::Binding &a : prog.arguments())
      os << llvm::formatv("  arg  %{0} {1} {2}{3} : {4}{5}\n", a.buffer(), plan::Binding::Role_Name(a.role()), a.name(),
                          viewOf(a), typeOf(prog.buffers(a.buffer())), a.inout() ? " (inout)" : "");
    for (int i = 0; i < prog.instructions_size(); ++i) {
      const plan::Instruction &in = prog.instructions(i);
      os << llvm::formatv("  {0,4}: [{1,-7}] ", i, streamName(in.stream()));
      for (int k = 0; k < in.outputs_size(); ++k) os << (k ? ", " : "") << "%" << in.outputs(k);
      os << (in.outputs_size() ? " = " : "") << in.op() << "(";
      for (int k = 0; k < in.inputs_size(); ++k) os << (k ? ", " : "") << "%" << in.inputs(k);
      os << ")";
      for (const plan::Attribute &a : in.attributes()) {
        os << " " << a.name() << "=";
        if (a.has_i()) os << a.i();
        else if (a.has_f()) os << a.f();
        else if (a.has_s()) os << a.s();
        else os << "true";
      }
      if (in.last_micro_batch()) os << " last-micro-batch";
      if (in.first_micro_batch()) os << " first-micro-batch";
      if (in.wait_for_size()) {
        os << " waits";
        for (int w : in.wait_for()) os << " " << w;
      }
      if (in.flops() > 0) os << llvm::formatv(" flops={0:e}", in.flops());
      if (in.bytes_moved() > 0) os << " moves=" << humanBytes(in.bytes_moved());
      for (int k = 0; k < in.outputs_size(); ++k) os << (k ? ", " : " -> ") << typeOf(prog.buffers(in.outputs(k)));
      os << "\n";
    }
    for (const plan::Binding &r : prog.results())
      os << llvm::formatv("  result %{0} {1} {2}\n", r.buffer(), plan::Binding::Role_Name(r.role()), r.name());
  }
  return s;
}

std::string programAsDot(const plan::Program &prog) {
  std::string s;
  llvm::raw_string_ostream os(s);
  const char *color[] = {"lightblue", "orange", "palegreen", "plum"};
  os << "digraph \"" << prog.name() << "\" {\n  rankdir=TB;\n  node [shape=box, style=filled, fontname=Helvetica];\n";
  std::map<int, int> producer;
  for (int i = 0; i < prog.instructions_size(); ++i)
    for (int b : prog.instructions(i).outputs()) producer[b] = i;
  for (const plan::Binding &a : prog.arguments())
    os << llvm::formatv("  a{0} [label=\"{1}\\n{2}\", shape=ellipse, fillcolor=white];\n", a.buffer(), a.name(),
                        shapeOf(prog.buffers(a.buffer())));
  for (int i = 0; i < prog.instructions_size(); ++i) {
    const plan::Instruction &in = prog.instructions(i);
    std::string label = in.op();
    for (const plan::Attribute &a : in.attributes())
      if (a.name() == "group") label += " @" + a.s();
    os << llvm::formatv("  i{0} [label=\"{0}: {1}\", fillcolor={2}];\n", i, label, color[in.stream() & 3]);
    for (int b : in.inputs()) {
      auto it = producer.find(b);
      if (it != producer.end())
        os << llvm::formatv("  i{0} -> i{1} [label=\"{2}\"];\n", it->second, i, shapeOf(prog.buffers(b)));
      else if (prog.buffers(b).kind() == plan::Buffer::ARGUMENT)
        os << llvm::formatv("  a{0} -> i{1};\n", b, i);
    }
  }
  os << "  legend [shape=plaintext, label=\"compute: blue, tp: orange, pp: green, dp: purple\"];\n}\n";
  return s;
}

std::vector<CollectiveCall> collectiveSequence(const PlanDirectory &plans, int rank) {
  const plan::RankPlan &rp = plans.ranks[rank];
  std::map<std::string, const plan::Program *> byName;
  for (const plan::Program &p : plans.programsOf(rank).programs()) byName[p.name()] = &p;
  std::map<const plan::Program *, int> last, first;
  for (int k = 0; k < rp.schedule_size(); ++k)
    if (byName.count(rp.schedule(k).program())) {
      last[byName[rp.schedule(k).program()]] = k;
      first.try_emplace(byName[rp.schedule(k).program()], k);
    }
  std::vector<CollectiveCall> calls;
  std::map<std::string, int64_t> seq;
  for (int k = 0; k < rp.schedule_size(); ++k) {
    auto it = byName.find(rp.schedule(k).program());
    if (it == byName.end()) continue;
    const plan::Program &prog = *it->second;
    for (int i = 0; i < prog.instructions_size(); ++i) {
      const plan::Instruction &in = prog.instructions(i);
      if (!planattr::isCollective(in.op())) continue;
      if ((in.last_micro_batch() && last[&prog] != k) || (in.first_micro_batch() && first[&prog] != k)) continue;
      CollectiveCall c;
      for (const plan::Attribute &a : in.attributes()) {
        if (a.name() == "group") c.group = a.s();
        if (a.name() == "reduce") c.reduce = a.s();
      }
      int64_t n = 0;
      for (int b : in.inputs()) {
        int64_t e = 1;
        for (int64_t d : prog.buffers(b).shape()) e *= d;
        n += e;
      }
      c.index = seq[c.group]++;
      c.op = in.op(), c.elements = n, c.program = prog.name(), c.microBatch = rp.schedule(k).micro_batch();
      c.instruction = i, c.layer = in.layer();
      calls.push_back(c);
    }
  }
  return calls;
}

std::string CollectiveCall::text() const {
  return llvm::formatv("{0}@{1} #{2}: {3} of {4} elements ({5} mb {6}, instruction {7}, layer {8})", op, group, index,
                       reduce.empty() ? (op == "all_reduce" ? "sum" : "-") : reduce, elements, program, microBatch,
                       instruction, layer);
}

std::string collectiveDiff(const PlanDirectory &plans, int a, int b) {
  std::vector<CollectiveCall> x = collectiveSequence(plans, a), y = collectiveSequence(plans, b);
  std::string s;
  llvm::raw_string_ostream os(s);
  // Groups the two ranks share: the same communicator (same name and members).
  std::map<std::string, std::vector<int>> ga, gb;
  for (const plan::Group &g : plans.ranks[a].groups()) ga[g.name()] = {g.ranks().begin(), g.ranks().end()};
  for (const plan::Group &g : plans.ranks[b].groups()) gb[g.name()] = {g.ranks().begin(), g.ranks().end()};
  bool shared = false;
  for (auto &[group, members] : ga) {
    if (!gb.count(group) || gb[group] != members || members.size() < 2) continue;
    shared = true;
    std::vector<const CollectiveCall *> ca, cb;
    for (const CollectiveCall &c : x)
      if (c.group == group) ca.push_back(&c);
    for (const CollectiveCall &c : y)
      if (c.group == group) cb.push_back(&c);
    size_t k = 0;
    auto same = [](const CollectiveCall *p, const CollectiveCall *q) {
      return p->op == q->op && p->reduce == q->reduce && p->elements == q->elements;
    };
    while (k < ca.size() && k < cb.size() && same(ca[k], cb[k])) ++k;
    if (k == ca.size() && k == cb.size()) {
      os << llvm::formatv("group {0}: ranks {1} and {2} make the same {3} calls\n", group, a, b, ca.size());
      continue;
    }
    os << llvm::formatv("group {0}: ranks {1} and {2} differ at call #{3}: rank {1} {4}; rank {2} {5}\n", group, a, b, k,
                        k < ca.size() ? ca[k]->text() : "makes no more calls", k < cb.size() ? cb[k]->text() : "makes no more calls");
  }
  if (!shared) os << llvm::formatv("ranks {0} and {1} share no group\n", a, b);
  return s;
}

std::string collectivesSummary(const PlanDirectory &plans, int rank) {
  const plan::RankPlan &rp = plans.ranks[rank];
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("collectives of rank {0} per step ({1} micro-batches, schedule {2}):\n", rank,
                      rp.micro_batches(), rp.schedule_kind());
  for (const plan::CollectiveTotal &c : rp.collectives())
    os << llvm::formatv("  {0,-26} {1,6} calls  {2,12}\n", c.kind(), c.count(), humanBytes(c.bytes()));
  os << "per program (group, peers as global ranks, bytes per call):\n";
  std::map<std::string, std::vector<int>> members;
  for (const plan::Group &g : rp.groups()) members[g.name()] = {g.ranks().begin(), g.ranks().end()};
  for (const plan::Program &prog : plans.programsOf(rank).programs()) {
    std::map<std::string, int> perLayerTp;
    for (const plan::Instruction &in : prog.instructions()) {
      std::string group, peer;
      for (const plan::Attribute &a : in.attributes()) {
        if (a.name() == "group" || a.name() == "vocab_parallel_group") group = a.s();
        if (a.name() == "peer" && members.count(group)) peer = " peer rank " + std::to_string(members[group][a.i()]);
      }
      if (group.empty() || in.stream() == plan::COMPUTE) continue;  // identity, masked lookups: no traffic
      if (in.op() == "all_reduce" && group == "tp" && in.layer() >= 0) ++perLayerTp[std::to_string(in.layer())];
      std::string ranks;
      for (int r : members[group]) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
      os << llvm::formatv("  {0,-12} {1,-20} {2,-10} [{3}]{4} {5}\n", prog.name(), in.op(), group, ranks, peer,
                          humanBytes(in.bytes_moved()));
    }
    for (auto &[layer, n] : perLayerTp)
      os << llvm::formatv("  {0,-12} layer {1}: {2} tensor-parallel all-reduces\n", prog.name(), layer, n);
  }
  os << "the step's collective calls in order (each group's calls are matched by order):\n";
  for (const CollectiveCall &c : collectiveSequence(plans, rank)) os << "  " << c.text() << "\n";
  return s;
}

std::vector<RankPrograms> rankPrograms(const PlanDirectory &plans) {
  std::vector<RankPrograms> ranks;
  for (size_t r = 0; r < plans.ranks.size(); ++r) ranks.push_back({&plans.ranks[r], &plans.programsOf(int(r))});
  return ranks;
}

namespace {

std::string dtypeName(plan::DType t) { return llvm::StringRef(plan::DType_Name(t)).lower(); }

// The parts of a rank's memory in Megatron's terms (plan/MemoryAccounting.h), for both forms.
struct MemoryReport {
  const plan::RankPlan &rp;
  const plan::MemoryPlan &mem;
  plan::DType compute;
  int64_t parameters, shards, device;
  bool cuda;
  int64_t expertShards;  // ZeRO-1 with expert parallelism: the experts' optimizer over d / ep
  int64_t weightsAndOptimizer() const {
    return mem.parameter_bytes() + mem.gradient_bytes() + mem.optimizer_bytes() + mem.half_weight_bytes();
  }
  double bytesPerParameter() const { return parameters ? double(weightsAndOptimizer()) / double(parameters) : 0.0; }
};

MemoryReport memoryReport(const PlanDirectory &plans, int rank) {
  const plan::RankPlan &rp = plans.ranks[rank];
  const plan::MemoryPlan &mem = rp.memory();
  const config::ParallelConfig &par = rp.cluster().parallel();
  int64_t shards = par.zero1() ? std::max<int64_t>(par.data_parallel_size(), 1) : 1;
  int64_t ep = rp.num_experts() > 0 ? std::max<int64_t>(par.expert_parallel_size(), 1) : 1;
  // Elements of the flat buffers: the fp32 main gradients' (the master weights may be sharded).
  return {rp, mem, planattr::computeDtype(plans.programsOf(rank).programs()), mem.gradient_bytes() / 4, shards,
          rp.cluster().device().memory_bytes(), rp.cluster().device().kind() == config::CUDA, shards / ep};
}

}  // namespace

// The bytes of the rank's pieces of a checkpoint (formats/CheckpointPieces.h).
static int64_t checkpointPieceBytes(const plan::RankPlan &rp) {
  int64_t n = 0;
  for (const StatePiece &s : piecesToSave(rp)) n += 4 * s.piece.elements();
  return n;
}

std::string memoryJson(const PlanDirectory &plans, int rank) {
  MemoryReport r = memoryReport(plans, rank);
  const plan::MemoryPlan &mem = r.mem;
  auto part = [](const std::string &dtype, int64_t bytes) { return llvm::json::Object{{"dtype", dtype}, {"bytes", bytes}}; };
  llvm::json::Array timeline;
  for (int i = 0; i < r.rp.schedule_size() && i < mem.timeline_bytes_size(); ++i)
    timeline.push_back(llvm::json::Object{{"program", r.rp.schedule(i).program()},
                                          {"micro_batch", r.rp.schedule(i).micro_batch()},
                                          {"bytes", mem.timeline_bytes(i)}});
  llvm::json::Object adamw = part("fp32", mem.optimizer_bytes());
  adamw["shards"] = r.shards;
  llvm::json::Object masters = part("fp32", mem.parameter_bytes());
  masters["shards"] = r.rp.master_weights_sharded() ? r.shards : 1;
  if (r.expertShards != r.shards) adamw["expert_shards"] = r.expertShards;
  llvm::json::Object report{
      {"rank", rank},
      {"pipeline_stage", r.rp.pp_rank()},
      {"backend", r.cuda ? "cuda" : "cpu"},
      {"precision", dtypeName(r.compute)},
      {"device_bytes", r.device},
      {"checkpoint_piece_bytes", checkpointPieceBytes(r.rp)},
      {"peak_bytes", mem.peak_bytes()},
      {"weights_and_optimizer",
       llvm::json::Object{{"bytes", r.weightsAndOptimizer()},
                          {"parameters", r.parameters},
                          {"bytes_per_parameter", r.bytesPerParameter()},
                          {"master_weights", std::move(masters)},
                          {"main_gradients", part("fp32", mem.gradient_bytes())},
                          {"adamw_moments", std::move(adamw)},
                          {"half_weight_copies", part(r.compute == plan::F32 ? "bf16" : dtypeName(r.compute),
                                                      mem.half_weight_bytes())}}},
      {"activations",
       llvm::json::Object{{"stash_bytes_per_micro_batch", mem.stash_bytes_per_micro_batch()},
                          {"chunks", mem.chunks()},
                          {"peak_stash_bytes", mem.peak_stash_bytes()},
                          {"peak_stash_chunks", mem.peak_stash_chunks()},
                          {"micro_batches_in_flight", memory::microBatchesInFlight(mem)},
                          {"peak_input_bytes", mem.peak_input_bytes()}}},
      {"workspace", llvm::json::Object{{"bytes", mem.max_workspace_bytes()}, {"program", mem.workspace_program()}}},
      {"communication_buffers", llvm::json::Object{{"pipeline_message_slots", mem.pipeline_slot_bytes()}}},
      {"kernel_scratch_bytes", mem.scratch_bytes()},
      {"step_scalar_bytes", mem.step_scalar_bytes()},
      {"timeline", std::move(timeline)}};
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(report))) << "\n";
  return s;
}

std::string memoryTimeline(const PlanDirectory &plans, int rank) {
  MemoryReport r = memoryReport(plans, rank);
  const plan::RankPlan &rp = r.rp;
  const plan::MemoryPlan &mem = r.mem;
  plan::DType compute = r.compute;
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("memory of rank {0} (pipeline stage {1}): peak {2}{3}\n", rank, rp.pp_rank(),
                      humanBytes(mem.peak_bytes()),
                      r.device > 0 ? " of the device's " + humanBytes(r.device) : std::string(" (no device size)"));
  // Megatron's terms (megatron/training/theoretical_memory_usage.py): weights and optimizer in
  // bytes per parameter (18 for its mixed precision without the distributed optimizer), the
  // activations of the micro-batches in flight, then what it does not count.
  std::string shard = llvm::formatv(" (ZeRO-1: the 1/{0} shard)", r.shards).str();
  os << llvm::formatv("  weights and optimizer {0} ({1:F1} bytes per parameter, {2} parameters): fp32 master weights "
                      "{3}{7}, fp32 main gradients {4}, fp32 AdamW moments {5}{6}",
                      humanBytes(r.weightsAndOptimizer()), r.bytesPerParameter(), r.parameters,
                      humanBytes(mem.parameter_bytes()), humanBytes(mem.gradient_bytes()),
                      humanBytes(mem.optimizer_bytes()),
                      r.shards == 1 ? std::string()
                      : r.expertShards != r.shards
                          ? llvm::formatv(" (ZeRO-1: the 1/{0} shard, the experts' 1/{1})", r.shards, r.expertShards).str()
                          : shard,
                      rp.master_weights_sharded() ? shard : std::string());
  if (mem.half_weight_bytes() > 0)
    os << llvm::formatv(", {0} weight copies {1}{2}", compute == plan::F32 ? "bf16" : dtypeName(compute),
                        humanBytes(mem.half_weight_bytes()),
                        compute == plan::F32 ? " (the CUDA backend's, for its bf16 GEMMs)" : "");
  os << "\n";
  os << llvm::formatv("  activations {0}: stash {1} per micro-batch ({2} chunk{3}), {4:F2} micro-batches in flight at "
                      "the peak ({5} chunk forwards); micro-batch inputs {6}\n",
                      humanBytes(mem.peak_stash_bytes() + mem.peak_input_bytes()),
                      humanBytes(mem.stash_bytes_per_micro_batch()), mem.chunks(), mem.chunks() == 1 ? "" : "s",
                      memory::microBatchesInFlight(mem), mem.peak_stash_chunks(), humanBytes(mem.peak_input_bytes()));
  os << llvm::formatv("  workspace {0} (the arena of {1}, the largest program's)\n", humanBytes(mem.max_workspace_bytes()),
                      mem.workspace_program().empty() ? std::string("?") : mem.workspace_program());
  if (compute == plan::F32)
    os << "  precision: fp32 throughout\n";
  else
    os << llvm::formatv("  precision: {0} weights for compute (a copy of the fp32 master weights, remade after each "
                        "update: the 16-bit weight copies above), activations, stashes, pipeline messages, "
                        "tensor-parallel collectives, context parallelism's keys and values and expert parallelism's "
                        "rows; fp32 master weights, main gradients{1} and AdamW moments\n",
                        dtypeName(compute),
                        reducesOnWire(plans.programsOf(rank).programs())
                            ? " (their data-parallel reduction in bf16 on the wire: grad_reduce_in_bf16)"
                            : " (and their data-parallel reduction)");
  if (!r.cuda && mem.scratch_bytes() > 0)
    os << llvm::formatv("  CPU backend: the kernels' scratch (attention; fp32 copies of 16-bit operands) {0} (held all step)\n",
                        humanBytes(mem.scratch_bytes()));
  else if (mem.half_weight_bytes() + mem.scratch_bytes() + mem.pipeline_slot_bytes() > 0)
    os << llvm::formatv("  CUDA backend: 16-bit weight copies {0}, scratch and cuBLASLt workspace {1}, pipeline message "
                        "slots {2} (held all step{3})\n",
                        humanBytes(mem.half_weight_bytes()), humanBytes(mem.scratch_bytes()),
                        humanBytes(mem.pipeline_slot_bytes()),
                        compute == plan::F32 ? "; planned for bf16 GEMMs, the executor's copies" : "");
  os << llvm::formatv("  step scalars {0} (hyperparameters, loss sums, metrics)\n", humanBytes(mem.step_scalar_bytes()));
  os << "  (what the backend allocates for the rank; the process adds its binaries and libraries, gRPC's, Gloo's and\n"
        "  OpenBLAS's buffers and the executor's small per-instruction temporaries: loom-rank logs both after its\n"
        "  first iteration.)\n";
  os << llvm::formatv("  checkpoints: this rank's pieces are {0} per save; with --async-save one copy of them is held in "
                      "host memory while it is written\n",
                      humanBytes(checkpointPieceBytes(rp)));
  int64_t peak = std::max<int64_t>(mem.peak_bytes(), 1);
  for (int i = 0; i < rp.schedule_size() && i < mem.timeline_bytes_size(); ++i) {
    const plan::ScheduleEntry &e = rp.schedule(i);
    int bar = int(50.0 * mem.timeline_bytes(i) / peak);
    os << llvm::formatv("  {0,3} {1,-14} mb {2,3}  {3,12}  {4}\n", i, e.program(), e.micro_batch(),
                        humanBytes(mem.timeline_bytes(i)), std::string(bar, '#'));
  }
  return s;
}

}  // namespace loom
