// loom-pipeline-partition (see Passes.td). Every op of the differentiated train_step carries
// its virtual stage (loom.stage) and direction (loom.backward); ops are cloned, in program
// order, into the program of their unit, and each operand is brought there:
//   parameter or data argument         -> an argument of the program
//   defined in the same unit           -> the clone
//   forward value, same virtual stage  -> stash: result of forward_k, argument of backward_k
//   forward value, other stage         -> loom.send after its definition, loom.recv in the
//                                         forward program of the consumer's stage (stashed
//                                         from there if a backward op needs it)
//   backward value, other stage        -> loom.send / loom.recv between backward programs
//   backward value into grad_sync_k    -> result of backward_k, argument of grad_sync_k
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "llvm/Support/FormatVariadic.h"
#include "mlir/IR/IRMapping.h"
#include "passes/ModelFacts.h"
#include "passes/Passes.h"

namespace loom {

#define GEN_PASS_DEF_LOOMPIPELINEPARTITION
#include "passes/Passes.h.inc"

namespace {

enum class Kind { kForward = 0, kBackward = 1, kSync = 2 };
const char *kindName[] = {"forward", "backward", "grad_sync"};

struct Unit {
  int64_t stage;
  Kind kind;
  bool operator<(const Unit &o) const { return std::tie(stage, kind) < std::tie(o.stage, o.kind); }
  bool operator==(const Unit &o) const { return stage == o.stage && kind == o.kind; }
};

// One program under construction.
struct Program {
  mlir::func::FuncOp func;
  mlir::Block *block;
  mlir::IRMapping map;
  llvm::SmallVector<mlir::DictionaryAttr> argAttrs;
  llvm::SmallVector<mlir::Value> results;
  llvm::SmallVector<mlir::DictionaryAttr> resultAttrs;
  llvm::DenseMap<mlir::Value, mlir::Value> args;  // original value -> argument (params, inputs, stash)
};

class Partitioner {
 public:
  Partitioner(mlir::ModuleOp m, mlir::func::FuncOp f, int64_t p) : m_(m), f_(f), p_(p), b_(m.getContext()) {}

  mlir::LogicalResult run() {
    auto ret = mlir::cast<mlir::func::ReturnOp>(f_.getBody().front().getTerminator());
    // Units of every op; grad-sync collectives (loom-data-parallel's) run once per step.
    for (mlir::Operation &op : f_.getBody().front().without_terminator()) {
      auto stage = op.getAttrOfType<mlir::IntegerAttr>(attr::kStage);
      if (!stage) return op.emitOpError() << "loom-pipeline-partition: op has no loom.stage (run loom-pipeline-stages first)";
      Kind kind = op.hasAttr(attr::kBackward) ? Kind::kBackward : Kind::kForward;
      if (op.hasAttr(attr::kGradSync)) kind = Kind::kSync;
      unitOf_[&op] = {stage.getInt(), kind};
    }
    b_.setInsertionPoint(f_);
    for (mlir::Operation &op : f_.getBody().front().without_terminator()) {
      Unit u = unitOf_[&op];
      Program &prog = program(u);
      for (mlir::Value operand : op.getOperands())
        if (failed(bring(operand, u))) return mlir::failure();
      mlir::OpBuilder pb = mlir::OpBuilder::atBlockEnd(prog.block);
      pb.clone(op, prog.map);
    }
    // The loss, then every gradient, as results of the programs computing them.
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      Unit u = unitOfValue(v);
      Program &prog = program(u);
      prog.results.push_back(prog.map.lookup(v));
      if (i == 0) {
        prog.resultAttrs.push_back(b_.getDictionaryAttr({b_.getNamedAttr("loom.output", b_.getStringAttr("loss"))}));
        addLossTerms(v, u);
      } else {
        prog.resultAttrs.push_back(f_.getResultAttrDict(i));
      }
    }
    finish();
    f_.erase();
    return mlir::success();
  }

 private:
  Unit unitOfValue(mlir::Value v) { return unitOf_[v.getDefiningOp()]; }

  // A loss that sums several (BERT's masked LM and sentence order) reports each beside it, as
  // results of the loss's program marked loom.loss_term with its name: its op's loom.loss_name
  // (the builder's "lm loss", "sop loss"), else "loss term k".
  void addLossTerms(mlir::Value loss, Unit u) {
    llvm::SmallVector<mlir::Value> terms = summedLosses(loss);
    if (terms.size() < 2) return;
    Program &prog = program(u);
    for (auto [k, term] : llvm::enumerate(terms)) {
      if (!(unitOfValue(term) == u)) continue;  // computed elsewhere: reported in the sum only
      std::string name = llvm::formatv("loss term {0}", k).str();
      if (auto given = term.getDefiningOp()->getAttrOfType<mlir::StringAttr>(attr::kLossName)) name = given.str();
      prog.results.push_back(prog.map.lookup(term));
      prog.resultAttrs.push_back(b_.getDictionaryAttr({b_.getNamedAttr("loom.loss_term", b_.getStringAttr(name))}));
    }
  }

  Program &program(Unit u) {
    auto [it, inserted] = programs_.try_emplace(u);
    Program &prog = it->second;
    if (inserted) {
      std::string name = llvm::formatv("{0}_{1}", kindName[int(u.kind)], u.stage).str();
      prog.func = b_.create<mlir::func::FuncOp>(f_.getLoc(), name, b_.getFunctionType({}, {}));
      prog.block = prog.func.addEntryBlock();
      prog.func->setAttr("loom.stage", b_.getI64IntegerAttr(u.stage));
      prog.func->setAttr(attr::kProgramKind, b_.getStringAttr(kindName[int(u.kind)]));
    }
    return prog;
  }

  mlir::Value addArg(Program &prog, mlir::Value original, mlir::DictionaryAttr attrs) {
    mlir::Value a = prog.block->addArgument(original.getType(), original.getLoc());
    prog.argAttrs.push_back(attrs);
    prog.args[original] = a;
    prog.map.map(original, a);
    return a;
  }

  // Makes `v` available in unit u (see the file comment).
  mlir::LogicalResult bring(mlir::Value v, Unit u) {
    Program &prog = program(u);
    if (prog.map.contains(v)) return mlir::success();
    if (auto arg = mlir::dyn_cast<mlir::BlockArgument>(v)) {
      addArg(prog, v, f_.getArgAttrDict(arg.getArgNumber()));
      return mlir::success();
    }
    Unit from = unitOfValue(v);
    if (from == u) return mlir::success();  // cloned already (program order)
    if (from.stage == u.stage) {
      if (int(from.kind) > int(u.kind))
        return v.getDefiningOp()->emitOpError() << "loom-pipeline-partition: value flows from "
                                                << kindName[int(from.kind)] << " to " << kindName[int(u.kind)];
      stash(v, from, u);
      return mlir::success();
    }
    if (from.kind == Kind::kForward) {
      Unit fwd{u.stage, Kind::kForward};
      if (!program(fwd).map.contains(v) && failed(sendRecv(v, from, fwd))) return mlir::failure();
      if (u.kind != Kind::kForward) stash(v, fwd, u);
      return mlir::success();
    }
    if (from.kind == Kind::kBackward && u.kind == Kind::kBackward) return sendRecv(v, from, u);
    return v.getDefiningOp()->emitOpError() << "loom-pipeline-partition: cannot move a value from "
                                            << kindName[int(from.kind)] << "_" << from.stage << " to "
                                            << kindName[int(u.kind)] << "_" << u.stage;
  }

  // A result of `from` received as an argument of `to` on the same rank.
  void stash(mlir::Value v, Unit from, Unit to) {
    Program &src = program(from), &dst = program(to);
    auto [it, inserted] = stashNames_.try_emplace(StashKey{v.getAsOpaquePointer(), int(from.kind), from.stage}, "");
    if (inserted) {
      it->second = llvm::formatv("s{0}.{1}", from.stage, stashNames_.size() - 1).str();
      src.results.push_back(src.map.lookup(v));
      src.resultAttrs.push_back(b_.getDictionaryAttr({b_.getNamedAttr("loom.stash", b_.getStringAttr(it->second))}));
    }
    addArg(dst, v, b_.getDictionaryAttr({b_.getNamedAttr("loom.stash", b_.getStringAttr(it->second))}));
  }

  // send right after the value's definition in `from`, recv at the top of `to`.
  mlir::LogicalResult sendRecv(mlir::Value v, Unit from, Unit to) {
    if (from.stage % p_ == to.stage % p_)
      return v.getDefiningOp()->emitOpError()
             << "loom-pipeline-partition: a value of virtual stage " << from.stage << " is needed by virtual stage "
             << to.stage << " on the same pipeline stage (a rank cannot send to itself)";
    int64_t tag = nextTag_++;
    Program &src = program(from), &dst = program(to);
    mlir::Value local = src.map.lookup(v);
    mlir::OpBuilder sb(m_.getContext());
    sb.setInsertionPointAfterValue(local);
    auto send = sb.create<SendOp>(v.getLoc(), local, sb.getStringAttr("pp"), sb.getI64IntegerAttr(p_),
                                  sb.getI64IntegerAttr(to.stage % p_), sb.getI64IntegerAttr(tag));
    copyStage(v, send);
    mlir::OpBuilder rb = mlir::OpBuilder::atBlockBegin(dst.block);
    if (!dst.block->empty()) {  // after earlier receives, keeping channels in tag order
      mlir::Operation *last = nullptr;
      for (mlir::Operation &op : *dst.block)
        if (mlir::isa<RecvOp>(op)) last = &op;
      if (last) rb.setInsertionPointAfter(last);
    }
    auto recv = rb.create<RecvOp>(v.getLoc(), v.getType(), rb.getStringAttr("pp"), rb.getI64IntegerAttr(p_),
                                  rb.getI64IntegerAttr(from.stage % p_), rb.getI64IntegerAttr(tag));
    copyStage(v, recv);
    recv->setAttr(attr::kStage, rb.getI64IntegerAttr(to.stage));
    dst.map.map(v, recv.getResult());
    return mlir::success();
  }

  void copyStage(mlir::Value v, mlir::Operation *to) {
    if (mlir::Operation *def = v.getDefiningOp())
      for (llvm::StringRef a : {attr::kStage.data(), attr::kBackward.data(), attr::kLayer.data()})
        if (auto x = def->getAttr(a)) to->setAttr(a, x);
  }

  void finish() {
    for (auto &[u, prog] : programs_) {
      mlir::OpBuilder pb = mlir::OpBuilder::atBlockEnd(prog.block);
      pb.create<mlir::func::ReturnOp>(f_.getLoc(), prog.results);
      llvm::SmallVector<mlir::Type> types;
      for (mlir::Value r : prog.results) types.push_back(r.getType());
      prog.func.setType(pb.getFunctionType(prog.block->getArgumentTypes(), types));
      for (auto [i, a] : llvm::enumerate(prog.argAttrs)) prog.func.setArgAttrs(i, a);
      for (auto [i, a] : llvm::enumerate(prog.resultAttrs)) prog.func.setResultAttrs(i, a);
    }
  }

  mlir::ModuleOp m_;
  mlir::func::FuncOp f_;
  int64_t p_;
  mlir::OpBuilder b_;
  std::map<Unit, Program> programs_;
  llvm::DenseMap<mlir::Operation *, Unit> unitOf_;
  // A value stashed by one program (its unit's kind and virtual stage) has one name.
  using StashKey = std::tuple<const void *, int, int64_t>;
  std::map<StashKey, std::string> stashNames_;
  int64_t nextTag_ = 0;
};

struct PipelinePartitionPass : impl::LoomPipelinePartitionBase<PipelinePartitionPass> {
  void runOnOperation() override {
    mlir::ModuleOp m = getOperation();
    auto f = m.lookupSymbol<mlir::func::FuncOp>("train_step");
    if (!f) {
      m.emitError() << "loom-pipeline-partition: no func.func @train_step";
      return signalPassFailure();
    }
    auto p = m->getAttrOfType<mlir::IntegerAttr>("loom.pipeline_parallel_size");
    if (!p) {
      m.emitError() << "loom-pipeline-partition: run loom-pipeline-stages first";
      return signalPassFailure();
    }
    if (failed(Partitioner(m, f, p.getInt()).run())) signalPassFailure();
  }
};

}  // namespace
}  // namespace loom
