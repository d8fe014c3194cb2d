// The instruction set's declarations against the loom dialect (attribute names and defaults
// of every op the IR lowers), and the plan verifier, operand binding and builder on
// hand-built instructions.
#include "plan/InstructionSet.h"

#include <gtest/gtest.h>

#include <set>

#include "ir/LoomDialect.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"

namespace loom::isa {
namespace {

// Attributes of dialect ops that are not the op's own (ODS) attributes: the data-parallel
// bucket the IR marks (copied by the lowering), reduce_scatter's average and the data-parallel
// reductions' wire dtype (set by the step programs).
// And the row ranges of tp_comm_overlap's chunked GEMMs and all-reduces (set by the lowering).
const std::set<std::string> kNotOds = {"all_reduce.loom.bucket", "reduce_scatter.reduce", "all_reduce.wire_dtype",
                                       "reduce_scatter.wire_dtype", "linear.row_begin", "linear.row_end",
                                       "all_reduce.row_begin", "all_reduce.row_end", "all_gather.row_begin",
                                       "all_gather.row_end", "reduce_scatter.row_begin", "reduce_scatter.row_end"};

TEST(InstructionSet, EveryDialectOpIsDeclaredWithTheDialectsAttributesAndDefaults) {
  mlir::MLIRContext context;
  context.loadDialect<LoomDialect>();
  std::set<std::string> declared;
  for (const OpDecl &d : instructionSet()) {
    if (!d.dialectOp) continue;
    declared.insert(d.name);
    auto name = mlir::RegisteredOperationName::lookup("loom." + std::string(d.name), &context);
    ASSERT_TRUE(name.has_value()) << d.name << " is declared a dialect op but the dialect has no loom." << d.name;
    std::set<std::string> odsAttrs, planAttrs;
    for (mlir::StringAttr a : name->getAttributeNames())
      if (a.getValue() != "operandSegmentSizes") odsAttrs.insert(a.str());
    for (const AttrDecl &a : d.attributes)
      if (!kNotOds.count(std::string(d.name) + "." + a.name)) planAttrs.insert(a.name);
    EXPECT_EQ(odsAttrs, planAttrs) << d.name;
    // The dialect's defaults are the declaration's.
    // An op created bare has the dialect's defaults in its properties (ODS's
    // populateDefaultProperties); every other inherent attribute is absent.
    mlir::OperationState state(mlir::UnknownLoc::get(&context), *name);
    mlir::Operation *bare = mlir::Operation::create(state);
    mlir::NamedAttrList defaults;
    for (mlir::StringAttr n : name->getAttributeNames())
      if (std::optional<mlir::Attribute> v = bare->getInherentAttr(n.getValue()); v && *v) defaults.append(n, *v);
    bare->destroy();
    for (const mlir::NamedAttribute &n : defaults) {
      if (n.getName().strref() == "operandSegmentSizes") continue;
      const AttrDecl &a = attrDecl(d, n.getName().strref());
      EXPECT_FALSE(a.required) << d.name << "." << a.name;
      if (auto f = mlir::dyn_cast<mlir::FloatAttr>(n.getValue()))
        EXPECT_EQ(float(f.getValueAsDouble()), float(a.defaultFloat)) << d.name << "." << a.name;
      else if (auto i = mlir::dyn_cast<mlir::IntegerAttr>(n.getValue()))
        EXPECT_EQ(i.getInt(), a.defaultInt) << d.name << "." << a.name;
      else if (auto s = mlir::dyn_cast<mlir::StringAttr>(n.getValue()))
        EXPECT_EQ(s.str(), a.defaultString) << d.name << "." << a.name;
      else
        ADD_FAILURE() << d.name << "." << a.name << ": a default of a kind the plan has no type for";
    }
    // Declared defaults of attributes the dialect gives none are zero / empty: an absent one
    // reads as absent.
    for (const AttrDecl &a : d.attributes) {
      if (a.required || defaults.get(a.name) || kNotOds.count(std::string(d.name) + "." + a.name)) continue;
      EXPECT_EQ(a.defaultInt, 0) << d.name << "." << a.name;
      EXPECT_EQ(a.defaultFloat, 0.0) << d.name << "." << a.name;
      EXPECT_STREQ(a.defaultString, "") << d.name << "." << a.name;
    }
  }
  // Every dialect op reaches plans (identity is dropped by the lowering but still declared).
  for (mlir::RegisteredOperationName op : context.getRegisteredOperations()) {
    llvm::StringRef n = op.getStringRef();
    if (!n.consume_front("loom.")) continue;
    EXPECT_TRUE(declared.count(n.str())) << "loom." << n.str() << " has no plan instruction declared";
  }
}

TEST(InstructionSet, NamesAreUniqueAndFound) {
  std::set<std::string> names;
  for (const OpDecl &d : instructionSet()) {
    EXPECT_TRUE(names.insert(d.name).second) << d.name;
    EXPECT_EQ(find(d.name), &d);
  }
  EXPECT_EQ(find("matmul"), nullptr);
}

// A program with buffers of the given ranks (f32 unless listed in ints).
plan::Program programWith(const std::vector<std::vector<int64_t>> &shapes, std::set<int> ints = {}) {
  plan::Program p;
  p.set_name("backward_0");
  for (size_t k = 0; k < shapes.size(); ++k) {
    plan::Buffer *b = p.add_buffers();
    b->set_id(int(k));
    for (int64_t d : shapes[k]) b->add_shape(d);
    b->set_dtype(ints.count(int(k)) ? plan::I32 : plan::F32);
  }
  return p;
}

TEST(InstructionSet, OptionalOperandsAreToldApartByRank) {
  // cross_entropy_grad(logits, labels, lse, [grad: scalar], [loss_mask: [b, s]])
  plan::Program p = programWith({{2, 4, 8}, {2, 4}, {2, 4}, {}, {2, 4}, {2, 4, 8}}, {1});
  const OpDecl &d = decl(OpId::kCrossEntropyGrad);
  for (auto [inputs, grad, mask] : std::vector<std::tuple<std::vector<int>, int, int>>{
           {{0, 1, 2}, -1, -1}, {{0, 1, 2, 3}, 3, -1}, {{0, 1, 2, 4}, -1, 4}, {{0, 1, 2, 3, 4}, 3, 4}}) {
    plan::Instruction in;
    in.set_op("cross_entropy_grad");
    for (int b : inputs) in.add_inputs(b);
    in.add_outputs(5);
    BoundOperands bound;
    ASSERT_FALSE(bindOperands(d, p, in, &bound));
    EXPECT_EQ(bound.inputs[size_t(inputSlot(d, "grad"))], grad);
    EXPECT_EQ(bound.inputs[size_t(inputSlot(d, "loss_mask"))], mask);
  }
}

TEST(InstructionSet, VerifierNamesWhatIsWrong) {
  plan::Program p = programWith({{4, 8}, {8, 16}, {4, 16}, {4, 8}}, {3});
  auto linear = [&] {
    plan::Instruction *in = p.add_instructions();
    in->set_op("linear");
    in->add_inputs(0), in->add_inputs(1), in->add_outputs(2);
    return in;
  };
  auto check = [&] {
    auto e = verifyProgram(p);
    p.clear_instructions();
    return e.value_or("ok");
  };
  linear();
  EXPECT_EQ(check(), "ok");
  linear()->set_op("matmul");
  EXPECT_EQ(check(), "backward_0: instruction 0: unknown op 'matmul'");
  linear()->mutable_inputs()->RemoveLast();
  EXPECT_EQ(check(), "backward_0: instruction 0 (linear): no input 'weight'");
  linear()->set_inputs(0, 3);
  EXPECT_EQ(check(), "backward_0: instruction 0 (linear): input 'input' (buffer 3) is I32, not an element type the op takes");
  plan::Attribute *a = linear()->add_attributes();
  a->set_name("epsilon"), a->set_f(1e-5);
  EXPECT_EQ(check(), "backward_0: instruction 0 (linear): unknown attribute 'epsilon'");
  a = linear()->add_attributes();
  a->set_name("transpose_weight"), a->set_i(1);
  EXPECT_EQ(check(), "backward_0: instruction 0 (linear): attribute 'transpose_weight' is not a flag");
  linear()->set_stream(plan::TP);
  EXPECT_EQ(check(), "backward_0: instruction 0 (linear): runs on stream TP, declared COMPUTE");
  plan::Instruction *ar = p.add_instructions();
  ar->set_op("all_reduce"), ar->add_inputs(2), ar->add_outputs(2), ar->set_stream(plan::TP);
  a = ar->add_attributes();
  a->set_name("group"), a->set_s("tp");
  EXPECT_EQ(check(), "backward_0: instruction 0 (all_reduce): no attribute 'group_size'");
}

TEST(InstructionSet, BuilderLaysOperandsOutInDeclaredOrder) {
  InstructionBuilder b(OpId::kGradNorm);
  b.in("loss_scale", 7).in("squares", 5).in("clip_grad", 6).out("factor", 9).out("norm", 8);
  plan::Instruction in;
  b.writeTo(&in);
  EXPECT_EQ(in.op(), "grad_norm");
  EXPECT_EQ(std::vector<int>(in.inputs().begin(), in.inputs().end()), (std::vector<int>{5, 6, 7}));
  EXPECT_EQ(std::vector<int>(in.outputs().begin(), in.outputs().end()), (std::vector<int>{8, 9}));
}

TEST(InstructionSet, AttrsReadDeclaredDefaults) {
  plan::Instruction in;
  in.set_op("layer_norm");
  Attrs a(decl(OpId::kLayerNorm), in);
  EXPECT_FLOAT_EQ(float(a.f64("epsilon")), 1e-5f);
  plan::Attribute *x = in.add_attributes();
  x->set_name("epsilon"), x->set_f(1e-3);
  EXPECT_DOUBLE_EQ(a.f64("epsilon"), 1e-3);
  plan::Instruction ar;
  EXPECT_EQ(Attrs(decl(OpId::kAllReduce), ar).str("reduce"), "sum");
}

TEST(InstructionSetDeathTest, BuilderRefusesUndeclaredNames) {
  EXPECT_DEATH(InstructionBuilder(OpId::kFill).in("input", 1), "declares no input 'input'");
  EXPECT_DEATH(InstructionBuilder(OpId::kFill).attr("value", int64_t(1)), "declared a float, set as an integer");
  EXPECT_DEATH(
      {
        plan::Instruction in;
        InstructionBuilder(OpId::kSend).in("input", 1).writeTo(&in);
      },
      "without its attribute 'group'");
}

}  // namespace
}  // namespace loom::isa
