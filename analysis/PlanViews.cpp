#include "analysis/PlanViews.h"

#include <filesystem>

#include "analysis/Units.h"
#include "plan/PlanAttributes.h"
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
  os << llvm::formatv("rank {0} (tp {1}, dp {2}, pp {3}) of {4}; programs from {5}\n", rp.rank(), rp.tp_rank(),
                      rp.dp_rank(), rp.pp_rank(), rp.world_size(), rp.programs_file());
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
      os << llvm::formatv("  arg  %{0} {1} {2} : {3}{4}\n", a.buffer(), plan::Binding::Role_Name(a.role()), a.name(),
                          typeOf(prog.buffers(a.buffer())), a.inout() ? " (inout)" : "");
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
  std::map<const plan::Program *, int> last;
  for (int k = 0; k < rp.schedule_size(); ++k)
    if (byName.count(rp.schedule(k).program())) last[byName[rp.schedule(k).program()]] = k;
  std::vector<CollectiveCall> calls;
  std::map<std::string, int64_t> seq;
  for (int k = 0; k < rp.schedule_size(); ++k) {
    auto it = byName.find(rp.schedule(k).program());
    if (it == byName.end()) continue;
    const plan::Program &prog = *it->second;
    for (int i = 0; i < prog.instructions_size(); ++i) {
      const plan::Instruction &in = prog.instructions(i);
      if (!planattr::isCollective(in.op())) continue;
      if (in.last_micro_batch() && last[&prog] != k) continue;
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

std::string memoryTimeline(const PlanDirectory &plans, int rank) {
  const plan::RankPlan &rp = plans.ranks[rank];
  const plan::MemoryPlan &mem = rp.memory();
  std::string s;
  llvm::raw_string_ostream os(s);
  os << llvm::formatv("memory of rank {0}: parameters {1}, gradients {2}, optimizer {3}, peak stash {4}, peak inputs "
                      "{5}, largest workspace {6}, peak {7}\n",
                      rank, humanBytes(mem.parameter_bytes()), humanBytes(mem.gradient_bytes()), humanBytes(mem.optimizer_bytes()),
                      humanBytes(mem.peak_stash_bytes()), humanBytes(mem.peak_input_bytes()),
                      humanBytes(mem.max_workspace_bytes()), humanBytes(mem.peak_bytes()));
  // The dtype the programs compute with: their PARAMETER arguments' (the flat buffer is the
  // fp32 master copy in every plan).
  plan::DType compute = planattr::computeDtype(plans.programsOf(rank).programs());
  if (compute == plan::F32)
    os << "  precision: fp32 throughout\n";
  else
    os << llvm::formatv("  precision: {0} weights for compute (a copy of the fp32 master weights, remade after each "
                        "update: the 16-bit weight copies below), activations, stashes, pipeline messages and "
                        "tensor-parallel collectives; fp32 master weights, main gradients{1} and AdamW moments\n",
                        llvm::StringRef(plan::DType_Name(compute)).lower(),
                        reducesOnWire(plans.programsOf(rank).programs())
                            ? " (their data-parallel reduction in bf16 on the wire: grad_reduce_in_bf16)"
                            : " (and their data-parallel reduction)");
  if (rp.cluster().device().kind() != config::CUDA && mem.scratch_bytes() > 0)
    os << llvm::formatv("  CPU backend: the kernels' scratch (attention; fp32 copies of 16-bit operands) {0} (held all step)\n",
                        humanBytes(mem.scratch_bytes()));
  else if (mem.half_weight_bytes() + mem.scratch_bytes() + mem.pipeline_slot_bytes() > 0)
    os << llvm::formatv("  CUDA backend: 16-bit weight copies {0}, scratch and cuBLASLt workspace {1}, pipeline message "
                        "slots {2} (held all step{3})\n",
                        humanBytes(mem.half_weight_bytes()), humanBytes(mem.scratch_bytes()),
                        humanBytes(mem.pipeline_slot_bytes()),
                        compute == plan::F32 ? "; planned for bf16 GEMMs, the executor's copies" : "");
  os << "  (what the backend allocates for the rank; the process adds its binaries and libraries, gRPC's, Gloo's and\n"
        "  OpenBLAS's buffers and the executor's small per-instruction temporaries: loom-rank logs both after its\n"
        "  first iteration.)\n";
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
