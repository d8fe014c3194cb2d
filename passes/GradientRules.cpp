// The gradient rule of every loom op. Forward math is in ir/LoomOps.td; here, for
// y = op(x...), each rule builds dL/dx from dL/dy.
//
// The communication algebra of tensor parallelism (Megatron-Core's mappings.py in our
// terms):
//   all_reduce (g)      -> identity           every rank already holds the full dL/dy
//   identity (f)        -> all_reduce         each rank's shard contributes part of dL/dx
//   all_gather(dim)     -> reduce_scatter(dim), or with split_gradient (replicated consumers)
//                          shard(dim)
//   reduce_scatter(dim) -> all_gather(dim)
#include "passes/GradientRules.h"

#include "ir/LoomDialect.h"
#include "llvm/ADT/TypeSwitch.h"

namespace loom {

using mlir::Value;
using Grads = llvm::SmallVector<Value>;

mlir::FailureOr<Grads> gradientOf(mlir::OpBuilder &b, mlir::Operation *op, llvm::ArrayRef<Value> resultGrads) {
  mlir::Location loc = op->getLoc();
  Value g = resultGrads.empty() ? Value() : resultGrads[0];
  Grads none(op->getNumOperands(), Value());
  return llvm::TypeSwitch<mlir::Operation *, mlir::FailureOr<Grads>>(op)
      .Case([&](EmbeddingOp o) -> mlir::FailureOr<Grads> {
        Grads d = none;
        d[1] = b.create<EmbeddingGradOp>(loc, o.getWord().getType(), o.getTokens(), g,
                                         o.getVocabParallelGroupAttr());
        if (o.getPosition())
          d[2] = b.create<PositionGradOp>(loc, o.getPosition().getType(), g, nullptr, o.getContextParallelGroupAttr());
        return d;
      })
      .Case([&](AddTokenTypeOp o) -> mlir::FailureOr<Grads> {
        return Grads{g, Value(), b.create<TokenTypeGradOp>(loc, o.getTable().getType(), o.getTokenTypes(), g,
                                                           o.getSequenceParallelGroupAttr())};
      })
      .Case([&](TanhOp o) -> mlir::FailureOr<Grads> {
        return Grads{b.create<TanhGradOp>(loc, o.getType(), o.getInput(), g)};
      })
      .Case([&](AddPositionOp o) -> mlir::FailureOr<Grads> {
        return Grads{g, b.create<PositionGradOp>(loc, o.getPosition().getType(), g, o.getSequenceParallelGroupAttr(),
                                                 o.getContextParallelGroupAttr())};
      })
      .Case([&](LayerNormOp o) -> mlir::FailureOr<Grads> {
        auto lg = b.create<LayerNormGradOp>(loc, o.getInput().getType(), o.getGamma().getType(),
                                            o.getBeta().getType(), o.getInput(), o.getGamma(), g,
                                            o.getEpsilonAttr());
        return Grads{lg.getGradInput(), lg.getGradGamma(), lg.getGradBeta()};
      })
      .Case([&](LinearOp o) -> mlir::FailureOr<Grads> {
        // y = x W (+ b): dx = g W^T (a linear with the weight's layout flipped),
        // dW = x^T g, db = sum of g over rows.
        Grads d = none;
        bool t = o.getTransposeWeight();
        d[0] = b.create<LinearOp>(loc, o.getInput().getType(), g, o.getWeight(), Value(),
                                  t ? nullptr : b.getUnitAttr());
        d[1] = b.create<WeightGradOp>(loc, o.getWeight().getType(), o.getInput(), g, t ? b.getUnitAttr() : nullptr);
        if (o.getBias()) d[2] = b.create<BiasGradOp>(loc, o.getBias().getType(), g);
        return d;
      })
      .Case([&](AddBiasOp o) -> mlir::FailureOr<Grads> {
        return Grads{g, b.create<BiasGradOp>(loc, o.getBias().getType(), g)};
      })
      .Case([&](GeluOp o) -> mlir::FailureOr<Grads> {
        return Grads{b.create<GeluGradOp>(loc, o.getType(), o.getInput(), g)};
      })
      .Case([&](AttentionOp o) -> mlir::FailureOr<Grads> {
        Grads d = none;
        if (!o.getLse()) return o.emitOpError() << "has no softmax statistics (lse) result to differentiate with";
        // The ring's backward takes the forward's output (FlashAttention-2's D = rowsum(dO * O)).
        Value out = o.getContextParallelRing() ? o.getResult() : Value();
        d[0] = b.create<AttentionGradOp>(loc, o.getQkv().getType(), o.getQkv(), g, o.getLse(), o.getKeyMask(), out,
                                         o.getNumHeadsAttr(), o.getCausalAttr(), o.getDropoutAttr(),
                                         o.getStreamAttr(), o.getRankDistinctDropoutAttr(),
                                         o.getContextParallelGroupAttr(), o.getContextParallelRingAttr(),
                                         o.getContextParallelSizeAttr());
        return d;
      })
      .Case([&](RmsNormOp o) -> mlir::FailureOr<Grads> {
        auto rg = b.create<RmsNormGradOp>(loc, o.getInput().getType(), o.getGamma().getType(), o.getInput(),
                                          o.getGamma(), g, o.getEpsilonAttr());
        return Grads{rg.getGradInput(), rg.getGradGamma()};
      })
      .Case([&](RotaryOp o) -> mlir::FailureOr<Grads> {
        // A rotation: its transpose is the rotation by the opposite angle.
        return Grads{b.create<RotaryOp>(loc, o.getType(), g, o.getHeadDimAttr(), o.getThetaAttr(),
                                        o.getInverse() ? nullptr : b.getUnitAttr(), o.getContextParallelGroupAttr())};
      })
      .Case([&](SwigluOp o) -> mlir::FailureOr<Grads> {
        auto sg = b.create<SwigluGradOp>(loc, o.getType(), o.getType(), o.getGate(), o.getUp(), g);
        return Grads{sg.getGradGate(), sg.getGradUp()};
      })
      .Case([&](GroupedAttentionOp o) -> mlir::FailureOr<Grads> {
        if (!o.getLse()) return o.emitOpError() << "has no softmax statistics (lse) result to differentiate with";
        auto ag = b.create<GroupedAttentionGradOp>(
            loc, o.getQ().getType(), o.getK().getType(), o.getV().getType(), o.getQ(), o.getK(), o.getV(), g,
            o.getLse(), o.getContextParallelRing() ? o.getResult() : Value(),
            o.getNumHeadsAttr(), o.getNumKvHeadsAttr(), o.getCausalAttr(), o.getDropoutAttr(), o.getStreamAttr(),
            o.getRankDistinctDropoutAttr(), o.getKvReplicatedGroupAttr(), o.getGroupSizeAttr(),
            o.getContextParallelGroupAttr(), o.getContextParallelRingAttr(), o.getContextParallelSizeAttr());
        return Grads{ag.getGradQ(), ag.getGradK(), ag.getGradV()};
      })
      .Case([&](MoeOp o) -> mlir::FailureOr<Grads> {
        // The routing recomputed from the logits; the load-balancing loss's gradient joins the
        // router's inside the op (aux has no users: its share of the loss is aux_loss_coef).
        if (!g) return Grads(none);
        auto mg = b.create<MoeGradOp>(loc, o.getInput().getType(), o.getLogits().getType(), o.getGate().getType(),
                                      o.getUp().getType(), o.getDown().getType(), o.getInput(), o.getLogits(),
                                      o.getGate(), o.getUp(), o.getDown(), g, o.getRoutingStats(), o.getTopKAttr(),
                                      o.getCapacityFactorAttr(), o.getAuxLossCoefAttr(), b.getF32FloatAttr(1.0f),
                                      o.getExpertParallelGroupAttr(), o.getExpertParallelSizeAttr());
        // routing_stats: constants here (the probabilities' share of the aux loss's gradient is
        // in grad_logits), no gradient.
        Grads d = none;
        d[0] = mg.getGradInput(), d[1] = mg.getGradLogits(), d[2] = mg.getGradGate(), d[3] = mg.getGradUp();
        d[4] = mg.getGradDown();
        return d;
      })
      .Case([&](DropoutOp o) -> mlir::FailureOr<Grads> {
        // The same mask, regenerated from the same counter-based stream.
        return Grads{b.create<DropoutOp>(loc, o.getType(), g, o.getRateAttr(), o.getStreamAttr(),
                                         o.getRankDistinctAttr(), o.getContextParallelGroupAttr())};
      })
      .Case([&](AddOp) -> mlir::FailureOr<Grads> { return Grads{g, g}; })
      .Case([&](CrossEntropyOp o) -> mlir::FailureOr<Grads> {
        // A null g means this loss is the function's result: its gradient is 1.
        if (!o.getLse()) return o.emitOpError() << "has no softmax statistics (lse) result to differentiate with";
        Grads d = none;
        d[0] = b.create<CrossEntropyGradOp>(loc, o.getLogits().getType(), o.getLogits(), o.getLabels(), o.getLse(), g,
                                            o.getLossMask(), o.getValidVocabAttr(),
                                            o.getVocabParallelGroupAttr(), b.getF32FloatAttr(1.0f));
        return d;
      })
      .Case([&](AllReduceOp o) -> mlir::FailureOr<Grads> {
        if (o.getReduce() != "sum")
          return o.emitOpError() << "has no gradient rule for reduce \"" << o.getReduce() << "\"";
        return Grads{g};
      })
      .Case([&](IdentityOp o) -> mlir::FailureOr<Grads> {
        return Grads{b.create<AllReduceOp>(loc, o.getType(), g, o.getGroupAttr(), o.getGroupSizeAttr(),
                                           b.getStringAttr("sum"))};
      })
      .Case([&](AllGatherOp o) -> mlir::FailureOr<Grads> {
        if (o.getSplitGradient())  // replicated consumers: every rank holds the whole gradient
          return Grads{b.create<ShardOp>(loc, o.getInput().getType(), g, o.getGroupAttr(), o.getGroupSizeAttr(),
                                         o.getDimAttr())};
        return Grads{b.create<ReduceScatterOp>(loc, o.getInput().getType(), g, o.getGroupAttr(),
                                               o.getGroupSizeAttr(), o.getDimAttr())};
      })
      .Case([&](ReduceScatterOp o) -> mlir::FailureOr<Grads> {
        return Grads{b.create<AllGatherOp>(loc, o.getInput().getType(), g, o.getGroupAttr(), o.getGroupSizeAttr(),
                                           o.getDimAttr(), /*split_gradient=*/nullptr)};
      })
      .Default([&](mlir::Operation *o) -> mlir::FailureOr<Grads> {
        return o->emitOpError() << "has no gradient rule";
      });
}

}  // namespace loom
