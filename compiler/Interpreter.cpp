#include "compiler/Interpreter.h"

#include <cstring>
#include <unordered_map>

#include "ir/LoomDialect.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/TypeSwitch.h"
#include "runtime/cpu/Kernels.h"

namespace loom {
namespace {

llvm::Error fail(mlir::Operation *op, const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 (op->getName().getStringRef() + ": " + msg).str());
}

std::vector<int64_t> shapeOf(mlir::Value v) {
  auto t = mlir::cast<mlir::RankedTensorType>(v.getType());
  return {t.getShape().begin(), t.getShape().end()};
}

int64_t lastDim(mlir::Value v) { return mlir::cast<mlir::RankedTensorType>(v.getType()).getShape().back(); }

ReduceOp reduceOf(llvm::StringRef r) {
  return r == "max" ? ReduceOp::kMax : r == "avg" ? ReduceOp::kAvg : ReduceOp::kSum;
}

// Streams of dropout inside a tensor-parallel region also depend on the rank's tp position.
uint64_t streamFor(uint64_t stream, bool rankDistinct, Collectives *c) {
  if (!rankDistinct || !c) return stream;
  return stream | (uint64_t(c->rankIn("tp") + 1) << 32);
}

class Interpreter {
 public:
  Interpreter(const InterpreterOptions &o) : opt_(o) {}

  llvm::Expected<std::vector<HostTensor>> run(mlir::func::FuncOp f, const std::vector<HostTensor> &args) {
    if (args.size() != f.getNumArguments())
      return llvm::createStringError(llvm::inconvertibleErrorCode(), "expected %u arguments, got %zu",
                                     f.getNumArguments(), args.size());
    for (unsigned i = 0; i < args.size(); ++i) env_[f.getArgument(i).getAsOpaquePointer()] = args[i];
    for (mlir::Operation &op : f.getBody().front()) {
      if (auto ret = mlir::dyn_cast<mlir::func::ReturnOp>(op)) {
        std::vector<HostTensor> out;
        for (mlir::Value v : ret.getOperands()) out.push_back(in(v));
        return out;
      }
      if (llvm::Error e = execute(&op)) return std::move(e);
      // Free values whose last use was this op would save memory; tests are small.
    }
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "function has no return");
  }

 private:
  HostTensor &in(mlir::Value v) { return env_[v.getAsOpaquePointer()]; }
  HostTensor &out(mlir::Value v) {
    HostTensor &t = env_[v.getAsOpaquePointer()];
    t = HostTensor::zeros(shapeOf(v));
    return t;
  }
  Collectives *comm(mlir::Operation *op, llvm::Error &err) {
    if (!opt_.collectives) err = fail(op, "needs collectives but none were given");
    return opt_.collectives;
  }
  // Row offset of a vocab shard: the rank's position in the group times the shard's rows.
  int64_t shardStart(std::optional<llvm::StringRef> group, int64_t rows) {
    if (!group || !opt_.collectives) return 0;
    return int64_t(opt_.collectives->rankIn(group->str())) * rows;
  }
  llvm::Error status(mlir::Operation *op, const Status &s) {
    return s.isOk() ? llvm::Error::success() : fail(op, s.message());
  }

  llvm::Error execute(mlir::Operation *op);
  llvm::Error crossEntropyStats(mlir::Operation *op, const HostTensor &logits, const HostTensor &labels,
                                std::optional<llvm::StringRef> group, int64_t validVocab,
                                std::vector<float> &mx, std::vector<float> &sum, std::vector<float> &target,
                                int64_t &colStart);

  InterpreterOptions opt_;
  // Node-based: references to tensors stay valid while other values are added.
  std::unordered_map<const void *, HostTensor> env_;
};

// Max, sum of exponentials and target logit per token; over a vocab-parallel group these
// take three all-reduces of [tokens] floats (max, then the two sums).
llvm::Error Interpreter::crossEntropyStats(mlir::Operation *op, const HostTensor &logits,
                                           const HostTensor &labels, std::optional<llvm::StringRef> group,
                                           int64_t validVocab, std::vector<float> &mx,
                                           std::vector<float> &sum, std::vector<float> &target,
                                           int64_t &colStart) {
  int64_t cols = logits.shape.back(), tokens = logits.numel() / cols;
  colStart = shardStart(group, cols);
  mx.assign(tokens, 0);
  sum.assign(tokens, 0);
  target.assign(tokens, 0);
  cpu::crossEntropyLocalMax(logits.data.data(), mx.data(), tokens, cols, colStart, validVocab);
  llvm::Error err = llvm::Error::success();
  if (group) {
    Collectives *c = comm(op, err);
    if (!c) return err;
    if (auto e = status(op, c->allReduce(group->str(), mx.data(), tokens, ReduceOp::kMax))) return e;
  }
  cpu::crossEntropyLocalSums(logits.data.data(), labels.ints.data(), mx.data(), sum.data(), target.data(),
                             tokens, cols, colStart, validVocab);
  if (group) {
    if (auto e = status(op, opt_.collectives->allReduce(group->str(), sum.data(), tokens, ReduceOp::kSum))) return e;
    if (auto e = status(op, opt_.collectives->allReduce(group->str(), target.data(), tokens, ReduceOp::kSum))) return e;
  }
  return err;
}

llvm::Error Interpreter::execute(mlir::Operation *op) {
  uint64_t seed = opt_.seed;
  return llvm::TypeSwitch<mlir::Operation *, llvm::Error>(op)
      .Case([&](EmbeddingOp o) -> llvm::Error {
        HostTensor &tok = in(o.getTokens()), &w = in(o.getWord());
        HostTensor *pos = o.getPosition() ? &in(o.getPosition()) : nullptr;
        HostTensor &y = out(o.getResult());
        int64_t rows = w.shape[0], hidden = w.shape[1];
        cpu::embeddingForward(tok.ints.data(), w.data.data(), pos ? pos->data.data() : nullptr, y.data.data(),
                              tok.numel(), tok.shape[1], hidden, shardStart(o.getVocabParallelGroup(), rows), rows);
        return llvm::Error::success();
      })
      .Case([&](AddPositionOp o) -> llvm::Error {
        HostTensor &x = in(o.getInput()), &p = in(o.getPosition());
        cpu::addPositionForward(x.data.data(), p.data.data(), out(o.getResult()).data.data(), x.shape[0],
                                x.shape[1], x.shape[2]);
        return llvm::Error::success();
      })
      .Case([&](LayerNormOp o) -> llvm::Error {
        HostTensor &x = in(o.getInput());
        int64_t n = x.shape.back();
        cpu::layerNormForward(x.data.data(), in(o.getGamma()).data.data(), in(o.getBeta()).data.data(),
                              out(o.getResult()).data.data(), x.numel() / n, n, o.getEpsilon().convertToFloat());
        return llvm::Error::success();
      })
      .Case([&](LinearOp o) -> llvm::Error {
        HostTensor &x = in(o.getInput()), &w = in(o.getWeight());
        int64_t k = x.shape.back(), n = lastDim(o.getResult());
        cpu::linearForward(x.data.data(), w.data.data(), o.getBias() ? in(o.getBias()).data.data() : nullptr,
                           out(o.getResult()).data.data(), x.numel() / k, k, n, o.getTransposeWeight());
        return llvm::Error::success();
      })
      .Case([&](AddBiasOp o) -> llvm::Error {
        HostTensor &x = in(o.getInput()), &b = in(o.getBias());
        HostTensor &y = out(o.getResult());
        int64_t n = b.numel();
        for (int64_t i = 0; i < x.numel(); ++i) y.data[i] = x.data[i] + b.data[i % n];
        return llvm::Error::success();
      })
      .Case([&](GeluOp o) -> llvm::Error {
        HostTensor &x = in(o.getInput());
        cpu::geluForward(x.data.data(), out(o.getResult()).data.data(), x.numel());
        return llvm::Error::success();
      })
      .Case([&](AttentionOp o) -> llvm::Error {
        HostTensor &qkv = in(o.getQkv());
        int64_t heads = o.getNumHeads();
        cpu::AttentionShape s{qkv.shape[0], qkv.shape[1], heads, qkv.shape[2] / (3 * heads), o.getCausal(),
                              o.getDropout().convertToFloat(), seed,
                              streamFor(o.getStream(), o.getRankDistinctDropout(), opt_.collectives)};
        cpu::attentionForward(qkv.data.data(), o.getKeyMask() ? in(o.getKeyMask()).data.data() : nullptr,
                              out(o.getResult()).data.data(), s);
        return llvm::Error::success();
      })
      .Case([&](DropoutOp o) -> llvm::Error {
        HostTensor &x = in(o.getInput());
        cpu::dropoutForward(x.data.data(), out(o.getResult()).data.data(), x.numel(), o.getRate().convertToFloat(),
                            seed, streamFor(o.getStream(), o.getRankDistinct(), opt_.collectives));
        return llvm::Error::success();
      })
      .Case([&](AddOp o) -> llvm::Error {
        HostTensor &a = in(o.getLhs()), &b = in(o.getRhs());
        HostTensor &y = out(o.getResult());
        for (int64_t i = 0; i < a.numel(); ++i) y.data[i] = a.data[i] + b.data[i];
        return llvm::Error::success();
      })
      .Case([&](CrossEntropyOp o) -> llvm::Error {
        HostTensor &logits = in(o.getLogits()), &labels = in(o.getLabels());
        std::vector<float> mx, sum, target;
        int64_t colStart;
        if (auto e = crossEntropyStats(op, logits, labels, o.getVocabParallelGroup(), o.getValidVocab(), mx, sum,
                                       target, colStart))
          return e;
        float loss = cpu::crossEntropyLoss(mx.data(), sum.data(), target.data(),
                                           o.getLossMask() ? in(o.getLossMask()).data.data() : nullptr, mx.size());
        out(o.getLoss()).data[0] = loss;
        return llvm::Error::success();
      })
      .Case([&](CrossEntropyGradOp o) -> llvm::Error {
        HostTensor &logits = in(o.getLogits()), &labels = in(o.getLabels());
        std::vector<float> mx, sum, target;
        int64_t colStart;
        if (auto e = crossEntropyStats(op, logits, labels, o.getVocabParallelGroup(), o.getValidVocab(), mx, sum,
                                       target, colStart))
          return e;
        float g = o.getGrad() ? in(o.getGrad()).data[0] : o.getLossScale().convertToFloat();
        int64_t cols = logits.shape.back();
        cpu::crossEntropyBackward(logits.data.data(), labels.ints.data(),
                                  o.getLossMask() ? in(o.getLossMask()).data.data() : nullptr, mx.data(), sum.data(),
                                  g, out(o.getResult()).data.data(), mx.size(), cols, colStart, o.getValidVocab());
        return llvm::Error::success();
      })
      .Case([&](WeightGradOp o) -> llvm::Error {
        HostTensor &x = in(o.getInput()), &g = in(o.getGrad());
        int64_t k = x.shape.back(), n = g.shape.back();
        cpu::linearWeightGrad(x.data.data(), g.data.data(), out(o.getResult()).data.data(), x.numel() / k, k, n,
                              o.getTransposeWeight());
        return llvm::Error::success();
      })
      .Case([&](BiasGradOp o) -> llvm::Error {
        HostTensor &g = in(o.getGrad());
        int64_t n = g.shape.back();
        cpu::biasGrad(g.data.data(), out(o.getResult()).data.data(), g.numel() / n, n);
        return llvm::Error::success();
      })
      .Case([&](LayerNormGradOp o) -> llvm::Error {
        HostTensor &x = in(o.getInput()), &g = in(o.getGrad());
        int64_t n = x.shape.back();
        cpu::layerNormBackward(x.data.data(), in(o.getGamma()).data.data(), g.data.data(),
                               out(o.getGradInput()).data.data(), out(o.getGradGamma()).data.data(),
                               out(o.getGradBeta()).data.data(), x.numel() / n, n, o.getEpsilon().convertToFloat());
        return llvm::Error::success();
      })
      .Case([&](GeluGradOp o) -> llvm::Error {
        HostTensor &x = in(o.getInput());
        cpu::geluBackward(x.data.data(), in(o.getGrad()).data.data(), out(o.getResult()).data.data(), x.numel());
        return llvm::Error::success();
      })
      .Case([&](AttentionGradOp o) -> llvm::Error {
        HostTensor &qkv = in(o.getQkv());
        int64_t heads = o.getNumHeads();
        cpu::AttentionShape s{qkv.shape[0], qkv.shape[1], heads, qkv.shape[2] / (3 * heads), o.getCausal(),
                              o.getDropout().convertToFloat(), seed,
                              streamFor(o.getStream(), o.getRankDistinctDropout(), opt_.collectives)};
        cpu::attentionBackward(qkv.data.data(), o.getKeyMask() ? in(o.getKeyMask()).data.data() : nullptr,
                               in(o.getGrad()).data.data(), out(o.getResult()).data.data(), s);
        return llvm::Error::success();
      })
      .Case([&](EmbeddingGradOp o) -> llvm::Error {
        HostTensor &tok = in(o.getTokens()), &g = in(o.getGrad());
        HostTensor &dw = out(o.getResult());
        int64_t rows = dw.shape[0], hidden = dw.shape[1];
        cpu::embeddingBackward(tok.ints.data(), g.data.data(), dw.data.data(), tok.numel(), hidden,
                               shardStart(o.getVocabParallelGroup(), rows), rows);
        return llvm::Error::success();
      })
      .Case([&](PositionGradOp o) -> llvm::Error {
        HostTensor &g = in(o.getGrad());
        HostTensor &dp = out(o.getResult());
        cpu::positionBackward(g.data.data(), dp.data.data(), g.shape[0], g.shape[1], g.shape[2], dp.shape[0]);
        return llvm::Error::success();
      })
      .Case([&](IdentityOp o) -> llvm::Error {
        out(o.getResult()).data = in(o.getInput()).data;
        return llvm::Error::success();
      })
      .Case([&](AllReduceOp o) -> llvm::Error {
        llvm::Error err = llvm::Error::success();
        Collectives *c = comm(op, err);
        if (!c) return err;
        HostTensor &y = out(o.getResult());
        y.data = in(o.getInput()).data;
        return llvm::joinErrors(std::move(err), status(op, c->allReduce(o.getGroup().str(), y.data.data(),
                                                                         y.numel(), reduceOf(o.getReduce()))));
      })
      .Case([&](AllGatherOp o) -> llvm::Error {
        llvm::Error err = llvm::Error::success();
        Collectives *c = comm(op, err);
        if (!c) return err;
        HostTensor &x = in(o.getInput());
        HostTensor &y = out(o.getResult());
        int64_t g = o.getGroupSize(), n = x.numel();
        std::vector<float> all(g * n);
        if (auto e = status(op, c->allGather(o.getGroup().str(), x.data.data(), all.data(), n)))
          return llvm::joinErrors(std::move(err), std::move(e));
        // Member r's block goes to slice r along `dim`: outer x (g x inner).
        int64_t outer = 1, inner = 1;
        for (int64_t i = 0; i < int64_t(x.shape.size()); ++i)
          (i < o.getDim() ? outer : inner) *= x.shape[i];
        for (int64_t r = 0; r < g; ++r)
          for (int64_t a = 0; a < outer; ++a)
            std::memcpy(&y.data[(a * g + r) * inner], &all[r * n + a * inner], inner * sizeof(float));
        return err;
      })
      .Case([&](ReduceScatterOp o) -> llvm::Error {
        llvm::Error err = llvm::Error::success();
        Collectives *c = comm(op, err);
        if (!c) return err;
        HostTensor &x = in(o.getInput());
        HostTensor &y = out(o.getResult());
        int64_t g = o.getGroupSize(), n = y.numel();
        int64_t outer = 1, inner = 1;
        for (int64_t i = 0; i < int64_t(y.shape.size()); ++i)
          (i < o.getDim() ? outer : inner) *= y.shape[i];
        std::vector<float> blocks(g * n);  // block r = slice r along dim
        for (int64_t r = 0; r < g; ++r)
          for (int64_t a = 0; a < outer; ++a)
            std::memcpy(&blocks[r * n + a * inner], &x.data[(a * g + r) * inner], inner * sizeof(float));
        return llvm::joinErrors(std::move(err), status(op, c->reduceScatter(o.getGroup().str(), blocks.data(),
                                                                             y.data.data(), n)));
      })
      .Case([&](SendOp o) -> llvm::Error {
        llvm::Error err = llvm::Error::success();
        Collectives *c = comm(op, err);
        if (!c) return err;
        HostTensor &x = in(o.getInput());
        return llvm::joinErrors(std::move(err), status(op, c->send(o.getGroup().str(), o.getPeer(), x.data.data(),
                                                                    x.numel(), o.getTag())));
      })
      .Case([&](RecvOp o) -> llvm::Error {
        llvm::Error err = llvm::Error::success();
        Collectives *c = comm(op, err);
        if (!c) return err;
        HostTensor &y = out(o.getResult());
        return llvm::joinErrors(std::move(err), status(op, c->recv(o.getGroup().str(), o.getPeer(), y.data.data(),
                                                                    y.numel(), o.getTag())));
      })
      .Default([&](mlir::Operation *o) { return fail(o, "the interpreter does not implement this op"); });
}

}  // namespace

llvm::Expected<std::vector<HostTensor>> interpret(mlir::func::FuncOp func, const std::vector<HostTensor> &args,
                                                  const InterpreterOptions &options) {
  return Interpreter(options).run(func, args);
}

}  // namespace loom
