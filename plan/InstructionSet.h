// The plan's instruction set, declared once (plan/InstructionSet.cpp): for every op a plan
// instruction may name, its operands and results (names, element types, optional or variadic),
// its attributes (types, defaults, required), the stream it runs on, whether and over which
// group it communicates, and what the cost model needs (its cost class and FLOPs, the bytes a
// collective moves per rank). Everything that reads or writes plan instructions derives from
// this table: the lowering and the step programs build instructions through InstructionBuilder
// (named operands, no positional contracts), the plan verifier checks every instruction
// against it, both executors dispatch through a kernel registry keyed by OpId and read
// attributes (and their defaults) through Attrs, and the checker, the simulator and the cost
// model ask it what an op is.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protos/plan.pb.h"

namespace loom::isa {

// One entry per declared op, in the table's order (InstructionSet.cpp: kOps).
enum class OpId : uint8_t {
  kEmbedding, kAddPosition, kLayerNorm, kLinear, kAddBias, kGelu, kAttention, kDropout, kAdd, kIdentity,
  kCrossEntropy, kRmsNorm, kRotary, kSwiglu, kGroupedAttention,
  kWeightGrad, kBiasGrad, kLayerNormGrad, kGeluGrad, kAttentionGrad, kEmbeddingGrad, kPositionGrad,
  kCrossEntropyGrad, kRmsNormGrad, kSwigluGrad, kGroupedAttentionGrad,
  kMoe, kMoeGrad, kMoeRoutingStats,
  kTanh, kTanhGrad, kAddTokenType, kTokenTypeGrad,
  kCrossEntropyMax, kCrossEntropySums, kCrossEntropyLoss,
  kAllReduce, kAllGather, kReduceScatter, kSend, kRecv, kShard,
  kRingAttention, kRingAttentionGrad, kRingGroupedAttention, kRingGroupedAttentionGrad,
  kExpertParallelMoe, kExpertParallelMoeGrad,
  kAccumulate, kFill, kScale, kCast, kSumSquares, kGradNorm, kAdamw,
  kCount
};
constexpr int kOpCount = int(OpId::kCount);

// Element types an operand may have (a set of plan::DType bits).
enum DTypes : uint8_t {
  kF32 = 1 << plan::F32,
  kBF16 = 1 << plan::BF16,
  kF16 = 1 << plan::F16,
  kI32 = 1 << plan::I32,
  kFloat = kF32 | kBF16 | kF16,
};

struct OperandDecl {
  enum Arity : uint8_t { kOne, kOptional, kVariadic };
  const char *name;
  uint8_t dtypes = kFloat;
  Arity arity = kOne;
  // An optional operand is told from the next one by its rank (number of dimensions):
  // -1 any. With two optional operands in a row, each names its rank.
  int8_t rank = -1;
};

enum class AttrType : uint8_t { kInt, kFloat, kString, kFlag };

struct AttrDecl {
  const char *name;
  AttrType type;
  bool required = false;
  // The value an absent attribute reads as (the dialect's default where the op is a loom op).
  int64_t defaultInt = 0;
  double defaultFloat = 0;
  const char *defaultString = "";
};

// Which stream an instruction of the op runs on.
enum class StreamRule : uint8_t {
  kCompute,  // plan::COMPUTE
  kOfGroup,  // its "group" attribute's stream: tp -> TP, pp -> PP, any other -> DP
  kPipeline, // plan::PP
};

enum class Comm : uint8_t {
  kNone,
  kCollective,    // matched by order on its group's communicator with every member
  kPointToPoint,  // send / recv with a peer of its group, matched by tag in order per link
};

// How the cost model prices it: GEMMs and attention by FLOPs at the device's efficiency,
// memory-bound ops by the bytes they read and write, free ones not at all.
enum class CostClass : uint8_t { kFree, kMemory, kGemm, kAttention };

struct OpDecl {
  OpId id;
  const char *name;  // the plan's op string: the loom dialect op without its prefix, or a plan-only op
  bool dialectOp;    // also a loom dialect op (lowered from the IR with its attributes)
  std::vector<OperandDecl> inputs, outputs;
  std::vector<AttrDecl> attributes;
  StreamRule stream;
  Comm comm;
  CostClass cost;
  // Collectives: ring steps per member (2 for an all-reduce's reduce-scatter + all-gather, 1
  // otherwise); 0 for everything else.
  int ringFactor = 0;
  const char *summary = "";  // for plan-only ops, what it computes (dialect ops: LoomOps.td)
  // FLOPs from the operands' shapes in declared order (null: none).
  double (*flops)(const std::vector<std::vector<int64_t>> &inputs, const std::vector<std::vector<int64_t>> &outputs) =
      nullptr;
  // Communication: bytes moved per rank, from the bytes of its (first) input and output and the
  // group's size (null: none).
  int64_t (*bytesMoved)(int64_t inputBytes, int64_t outputBytes, int64_t groupSize) = nullptr;
  // An integer attribute the FLOPs from the shapes are multiplied by (null: none): what the
  // shapes do not say (a ring's members, each meeting the rank's queries; the experts each
  // token is routed to).
  const char *flopsTimesAttr = nullptr;
  // A collective form of a dialect op (ring attention, expert-parallel MoE): the IR attribute
  // naming its group, which the lowering writes as the instruction's "group" (null: the op's own
  // "group" attribute, if any).
  const char *groupAttr = nullptr;
  OpDecl withGroupAttr(const char *attr) && {
    groupAttr = attr;
    return std::move(*this);
  }
};

// Every declared op, in OpId order.
const std::vector<OpDecl> &instructionSet();
const OpDecl &decl(OpId id);
// The declaration of a plan op string; null when no op has that name.
const OpDecl *find(std::string_view op);

// The declared stream of an instruction of `d` with group attribute `group`.
plan::Stream streamOf(const OpDecl &d, std::string_view group);
// Context parallelism's "cp" and expert parallelism's "ep" collectives carry activations, as
// tp's do: the TP stream; "dpcp" and "edp" (weight gradients) are the DP stream's.
inline plan::Stream streamOfGroup(std::string_view group) {
  return group == "tp" || group == "cp" || group == "ep" ? plan::TP : group == "pp" ? plan::PP : plan::DP;
}
bool isCollective(std::string_view op);
bool isCommunication(std::string_view op);
// Ring steps of a collective over n ranks (ringFactor (n - 1)); 1 for a send or recv.
int ringSteps(std::string_view op, int n);
CostClass costClassOf(std::string_view op);

// FLOPs of an instruction from its operand shapes (the PTD-P count the lowering writes into
// Instruction.flops): GEMMs 2mnk, attention forward 4 b s^2 h, its backward 10 b s^2 h.
// Shapes are the operands' in declared order (as the IR op or the instruction has them).
using Shape = std::vector<int64_t>;
// `timesAttr`: the value of the op's flopsTimesAttr attribute (1 when it has none).
double flopsOf(const OpDecl &d, const std::vector<Shape> &inputs, const std::vector<Shape> &outputs,
               int64_t timesAttr = 1);
double flopsOf(const OpDecl &d, const plan::Program &program, const plan::Instruction &in);
// Context parallelism's ring attention ops (a collective over "cp" that also computes).
bool isRingAttention(OpId id);
bool isRingAttention(std::string_view op);
// The ring form of an attention core (attention, grouped_attention and their gradients; the
// IR op marked context_parallel_ring lowers to it); null for any other op.
const OpDecl *ringFormOf(OpId id);
// The expert-parallel form of moe and moe_grad (the IR op with expert_parallel_group lowers to
// it); null for any other op.
const OpDecl *expertParallelFormOf(OpId id);
// A collective that also computes (ring attention, expert-parallel MoE): its FLOPs count as
// compute and its bytes as communication.
bool computesToo(const OpDecl &d);
bool computesToo(std::string_view op);
// Bytes a collective moves per rank on a ring of `members` (what Instruction.bytes_moved holds):
// ringFactor (n - 1) / n of the buffer; a send or recv moves its buffer once.
int64_t ringBytesPerRank(int64_t bytes, int64_t members, int factor);

// An instruction's operands matched to their declared slots: slot k of the inputs (outputs)
// holds the buffer id, or -1 for an absent optional operand; a variadic slot holds its first
// buffer, the rest follow in `variadicInputs` / `variadicOutputs`.
constexpr int kMaxOperands = 12;  // the most declared slots of any op (adamw: 11 inputs)
struct BoundOperands {
  std::array<int, kMaxOperands> inputs{}, outputs{};
  std::vector<int> variadicInputs, variadicOutputs;
};
// Matches `in`'s operands against `d` (arity, the optional operands' ranks). An error text
// naming the operand on a mismatch.
std::optional<std::string> bindOperands(const OpDecl &d, const plan::Program &program, const plan::Instruction &in,
                                        BoundOperands *bound);
// The slot of the input (output) named `name` of `d`; aborts on a name `d` does not declare (a
// bug in the caller, not in a plan).
int inputSlot(const OpDecl &d, std::string_view name);
int outputSlot(const OpDecl &d, std::string_view name);
const AttrDecl &attrDecl(const OpDecl &d, std::string_view name);

// Checks one instruction against its declaration: a known op, operands bound to their slots
// with allowed element types, attributes declared, of their declared type, required ones
// present, and the declared stream. The error text names the instruction's index and op;
// the caller adds the rank and program.
std::optional<std::string> verifyInstruction(const plan::Program &program, int index);
// Every instruction of `program`; the first error, prefixed with the program's name.
std::optional<std::string> verifyProgram(const plan::Program &program);

// Reading an instruction's attributes through its declaration: an absent attribute reads as
// its declared default; asking for an attribute the op does not declare aborts (a kernel bug).
class Attrs {
 public:
  Attrs(const OpDecl &d, const plan::Instruction &in) : decl_(d), in_(in) {}
  int64_t i64(std::string_view name) const;
  double f64(std::string_view name) const;
  std::string str(std::string_view name) const;
  bool flag(std::string_view name) const;

 private:
  const plan::Attribute *find(const AttrDecl &a) const;
  const OpDecl &decl_;
  const plan::Instruction &in_;
};

// Builds one instruction of `op` by operand name: every input and output is given by its
// declared name (optional ones may be left out, variadic ones given as lists), attributes by
// name with their declared type. finish() lays the operands out in declared order and aborts on
// an undeclared name, a missing required operand or attribute, or a type mismatch: a bug in the
// compiler, caught by any test that compiles that program.
class InstructionBuilder {
 public:
  explicit InstructionBuilder(OpId op);
  InstructionBuilder &in(std::string_view name, int buffer);
  InstructionBuilder &in(std::string_view name, const std::vector<int> &buffers);
  InstructionBuilder &out(std::string_view name, int buffer);
  InstructionBuilder &out(std::string_view name, const std::vector<int> &buffers);
  InstructionBuilder &attr(std::string_view name, int64_t v);
  InstructionBuilder &attr(std::string_view name, double v);
  InstructionBuilder &attr(std::string_view name, const std::string &v);
  InstructionBuilder &attr(std::string_view name, const char *v) { return attr(name, std::string(v)); }
  InstructionBuilder &flag(std::string_view name);
  const OpDecl &declaration() const { return decl_; }
  // The operands in declared order (what Instruction.inputs / outputs hold).
  std::vector<int> inputs() const;
  std::vector<int> outputs() const;
  // Writes op, inputs, outputs and attributes into `instruction` (stream, events, layer and
  // costs are the caller's: they depend on the program around it).
  void writeTo(plan::Instruction *instruction) const;

 private:
  const OpDecl &decl_;
  std::vector<std::vector<int>> inputs_, outputs_;
  std::vector<plan::Attribute> attributes_;
};

}  // namespace loom::isa
