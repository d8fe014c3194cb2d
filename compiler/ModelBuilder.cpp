#include "compiler/ModelBuilder.h"

#include <cmath>

#include "config/ConfigLoader.h"
#include "ir/LoomDialect.h"
#include "ir/ParamAttrs.h"
#include "passes/ModelFacts.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace loom {
namespace {

using mlir::Type;
using mlir::Value;

// BERT's two segments (type_vocab_size) and the sentence-order head's two classes.
constexpr int64_t kTokenTypes = 2, kSentenceOrderClasses = 2;

// Builds the train_step function: parameters and inputs are appended as block arguments
// while the body is emitted, and the function type is fixed up at the end.
class TrainStepBuilder {
 public:
  TrainStepBuilder(mlir::MLIRContext &ctx, const config::ModelConfig &cfg, const BuildOptions &opt)
      : ctx_(ctx), cfg_(cfg), b_(&ctx), loc_(mlir::UnknownLoc::get(&ctx)), outputLogits_(opt.outputLogits) {
    // The batch is dynamic (`?`) unless asked for: the compiler specialises it to the
    // cluster's micro-batch.
    batch_ = opt.microBatch > 0 ? opt.microBatch
             : cfg.micro_batch_size() > 0 ? cfg.micro_batch_size()
                                          : mlir::ShapedType::kDynamic;
    seq_ = cfg.seq_length();
    hidden_ = cfg.hidden_size();
    vocab_ = cfg.vocab_size();
    dtype_ = b_.getF32Type();  // the model in fp32; params_dtype is the module's precision policy
  }

  mlir::OwningOpRef<mlir::ModuleOp> build() {
    module_ = mlir::ModuleOp::create(loc_, llvm::StringRef(cfg_.name()));
    setModuleAttrs();
    b_.setInsertionPointToEnd(module_->getBody());
    func_ = b_.create<mlir::func::FuncOp>(loc_, "train_step", b_.getFunctionType({}, {}));
    block_ = func_.addEntryBlock();
    b_.setInsertionPointToStart(block_);
    Value loss = cfg_.architecture() == config::BERT    ? buildBert()
                 : cfg_.architecture() == config::LLAMA ? buildLlama()
                                                        : buildGpt();
    if (outputLogits_) func_.setName("forward_logits");
    llvm::SmallVector<Value> results{loss};
    if (secondLogits_) results.push_back(secondLogits_);
    b_.create<mlir::func::ReturnOp>(loc_, results);
    func_.setType(b_.getFunctionType(block_->getArgumentTypes(), mlir::ValueRange(results).getTypes()));
    for (unsigned i = 0; i < argAttrs_.size(); ++i) func_.setArgAttrs(i, argAttrs_[i]);
    return std::move(module_);
  }

 private:
  mlir::RankedTensorType tensor(llvm::ArrayRef<int64_t> shape, Type elem = {}) {
    return mlir::RankedTensorType::get(shape, elem ? elem : dtype_);
  }

  // A parameter argument with its global name and initializer.
  Value param(const std::string &name, llvm::ArrayRef<int64_t> shape, llvm::StringRef init,
              double std = 0) {
    llvm::SmallVector<mlir::NamedAttribute> attrs{
        b_.getNamedAttr(attr::kParam, b_.getStringAttr(name)),
        b_.getNamedAttr(attr::kInit, b_.getStringAttr(init))};
    if (init == "normal") attrs.push_back(b_.getNamedAttr(attr::kInitStd, b_.getF32FloatAttr(std)));
    argAttrs_.push_back(b_.getDictionaryAttr(attrs));
    return block_->addArgument(tensor(shape), mlir::NameLoc::get(b_.getStringAttr(name)));
  }

  Value input(llvm::StringRef role, Type elem) {
    argAttrs_.push_back(
        b_.getDictionaryAttr({b_.getNamedAttr(attr::kInput, b_.getStringAttr(role))}));
    return block_->addArgument(tensor({batch_, seq_}, elem), mlir::NameLoc::get(b_.getStringAttr(role)));
  }

  // The IR carries the model in its ops; the only module attribute is the padding multiple,
  // and only when the config departs from Megatron's default.
  void setModuleAttrs() {
    if (cfg_.params_dtype() == config::BF16 || cfg_.params_dtype() == config::FP16)
      module_->getOperation()->setAttr(attr::kParamsDtype,
                                       b_.getStringAttr(cfg_.params_dtype() == config::BF16 ? "bf16" : "f16"));
    if (cfg_.make_vocab_size_divisible_by() != kDefaultVocabDivisibleBy)
      module_->getOperation()->setAttr(attr::kVocabDivisibleBy,
                                       b_.getI64IntegerAttr(cfg_.make_vocab_size_divisible_by()));
  }

  // Tags an op as part of Transformer layer `layer_` (or leaves it untagged outside layers).
  template <typename Op, typename... Args>
  Value op(Args &&...args) {
    auto o = b_.create<Op>(loc_, std::forward<Args>(args)...);
    if (layer_ >= 0) o->setAttr(attr::kLayer, b_.getI64IntegerAttr(layer_));
    return o->getResult(0);
  }

  Value dropout(Value x, float rate) {
    if (rate == 0) return x;
    return op<DropoutOp>(x.getType(), x, b_.getF32FloatAttr(rate), b_.getI64IntegerAttr(nextStream_++),
                         /*rank_distinct=*/nullptr, /*context_parallel_group=*/nullptr);
  }

  Value layerNorm(Value x, const std::string &prefix) {
    Value g = param(prefix + ".weight", {hidden_}, "ones");
    Value beta = param(prefix + ".bias", {hidden_}, "zeros");
    return op<LayerNormOp>(x.getType(), x, g, beta, b_.getF32FloatAttr(cfg_.layernorm_epsilon()));
  }

  // y = x W + bias with W stored [in, out].
  Value linear(Value x, const std::string &prefix, int64_t in, int64_t out, double std) {
    Value w = param(prefix + ".weight", {in, out}, "normal", std);
    Value bias = param(prefix + ".bias", {out}, "zeros");
    auto shape = llvm::to_vector(mlir::cast<mlir::RankedTensorType>(x.getType()).getShape());
    shape.back() = out;
    return op<LinearOp>(tensor(shape), x, w, bias, /*transpose_weight=*/nullptr);
  }

  // One pre-LN Transformer layer (Megatron-LM paper, figure 2 with the layer norms moved
  // to the input of each branch):
  //   x = x + dropout(proj(attention(qkv(ln_1(x)))))
  //   x = x + dropout(fc2(gelu(fc1(ln_2(x)))))
  Value transformerLayer(Value x, const std::string &prefix, bool causal, Value keyMask) {
    double std = cfg_.init_method_std();
    // Output projections of residual branches: std / sqrt(2 L) (GPT-2; Megatron's
    // scaled_init_method_normal).
    double scaledStd = std / std::sqrt(2.0 * cfg_.num_layers());
    int64_t ffn = cfg_.ffn_hidden_size();
    Value h = layerNorm(x, prefix + ".ln_1");
    Value qkv = linear(h, prefix + ".attn.c_attn", hidden_, 3 * hidden_, std);
    Value attn = op<AttentionOp>(tensor({batch_, seq_, hidden_}), /*lse=*/mlir::Type(), qkv, keyMask,
                                 b_.getI64IntegerAttr(cfg_.num_attention_heads()),
                                 causal ? b_.getUnitAttr() : nullptr,
                                 b_.getF32FloatAttr(cfg_.attention_dropout()),
                                 b_.getI64IntegerAttr(cfg_.attention_dropout() > 0 ? nextStream_++ : 0),
                                 /*rank_distinct_dropout=*/nullptr, /*context_parallel_group=*/nullptr,
                                 /*context_parallel_ring=*/nullptr, b_.getI64IntegerAttr(1));
    Value proj = linear(attn, prefix + ".attn.c_proj", hidden_, hidden_, scaledStd);
    x = op<AddOp>(x, dropout(proj, cfg_.hidden_dropout()));
    h = layerNorm(x, prefix + ".ln_2");
    Value fc = linear(h, prefix + ".mlp.c_fc", hidden_, ffn, std);
    fc = op<GeluOp>(fc);
    Value down = linear(fc, prefix + ".mlp.c_proj", ffn, hidden_, scaledStd);
    return op<AddOp>(x, dropout(down, cfg_.hidden_dropout()));
  }

  // Embedding, layers and final layer norm, shared by GPT and BERT. BERT adds its segments'
  // embeddings (token types) to the tokens' and the positions'.
  Value trunk(const std::string &root, Value tokens, bool causal, Value keyMask, Value &wordOut,
              Value tokenTypes = Value()) {
    double std = cfg_.init_method_std();
    wordOut = param(root + ".wte.weight", {vocab_, hidden_}, "normal", std);
    Value wpe = param(root + ".wpe.weight", {cfg_.max_position_embeddings(), hidden_}, "normal", std);
    Value x = op<EmbeddingOp>(tensor({batch_, seq_, hidden_}), tokens, wordOut, wpe,
                              /*vocab_parallel_group=*/nullptr, /*context_parallel_group=*/nullptr);
    if (tokenTypes) {
      Value table = param(root + ".tte.weight", {kTokenTypes, hidden_}, "normal", std);
      x = op<AddTokenTypeOp>(x.getType(), x, tokenTypes, table, /*sequence_parallel_group=*/nullptr);
    }
    x = dropout(x, cfg_.hidden_dropout());
    // Each layer's ops are located by the layer's name, so errors name the layer.
    mlir::Location outside = loc_;
    for (int64_t l = 0; l < cfg_.num_layers(); ++l) {
      layer_ = l;
      std::string prefix = root + ".h." + std::to_string(l);
      loc_ = mlir::NameLoc::get(b_.getStringAttr(prefix));
      x = transformerLayer(x, prefix, causal, keyMask);
    }
    loc_ = outside;
    layer_ = -1;
    return layerNorm(x, root + ".ln_f");
  }

  // A linear without bias, its weight stored [out, in] as Hugging Face's nn.Linear.
  Value linearOutIn(Value x, const std::string &name, int64_t in, int64_t out, double std) {
    Value w = param(name + ".weight", {out, in}, "normal", std);
    auto shape = llvm::to_vector(mlir::cast<mlir::RankedTensorType>(x.getType()).getShape());
    shape.back() = out;
    return op<LinearOp>(tensor(shape), x, w, Value(), b_.getUnitAttr());
  }

  Value rmsNorm(Value x, const std::string &name) {
    Value g = param(name + ".weight", {hidden_}, "ones");
    return op<RmsNormOp>(x.getType(), x, g, b_.getF32FloatAttr(cfg_.rms_norm_eps()));
  }

  // One LLaMA decoder layer (Touvron et al. 2023, section 2.2; Hugging Face's
  // LlamaDecoderLayer), pre-norm with RMSNorm:
  //   x = x + o_proj(attention(rope(q_proj(h)), rope(k_proj(h)), v_proj(h))),  h = norm_1(x)
  //   x = x + down_proj(silu(gate_proj(h)) * up_proj(h)),                     h = norm_2(x)
  Value llamaLayer(Value x, const std::string &prefix) {
    double std = cfg_.init_method_std(), scaledStd = std / std::sqrt(2.0 * cfg_.num_layers());
    int64_t heads = cfg_.num_attention_heads(), kvHeads = cfg_.num_key_value_heads(), hd = hidden_ / heads;
    int64_t ffn = cfg_.ffn_hidden_size();
    Value h = rmsNorm(x, prefix + ".input_layernorm");
    Value q = linearOutIn(h, prefix + ".self_attn.q_proj", hidden_, heads * hd, std);
    Value k = linearOutIn(h, prefix + ".self_attn.k_proj", hidden_, kvHeads * hd, std);
    Value v = linearOutIn(h, prefix + ".self_attn.v_proj", hidden_, kvHeads * hd, std);
    q = op<RotaryOp>(q.getType(), q, b_.getI64IntegerAttr(hd), b_.getF32FloatAttr(cfg_.rope_theta()), nullptr, nullptr);
    k = op<RotaryOp>(k.getType(), k, b_.getI64IntegerAttr(hd), b_.getF32FloatAttr(cfg_.rope_theta()), nullptr, nullptr);
    Value a = op<GroupedAttentionOp>(q.getType(), /*lse=*/mlir::Type(), q, k, v, b_.getI64IntegerAttr(heads), b_.getI64IntegerAttr(kvHeads),
                                     b_.getUnitAttr(), b_.getF32FloatAttr(cfg_.attention_dropout()),
                                     b_.getI64IntegerAttr(cfg_.attention_dropout() > 0 ? nextStream_++ : 0),
                                     /*rank_distinct_dropout=*/nullptr, /*kv_replicated_group=*/nullptr,
                                     b_.getI64IntegerAttr(1), /*context_parallel_group=*/nullptr,
                                     /*context_parallel_ring=*/nullptr, b_.getI64IntegerAttr(1));
    Value o = linearOutIn(a, prefix + ".self_attn.o_proj", heads * hd, hidden_, scaledStd);
    x = op<AddOp>(x, dropout(o, cfg_.hidden_dropout()));
    h = rmsNorm(x, prefix + ".post_attention_layernorm");
    Value down;
    if (isMoeLayer(layer_)) {
      down = moeMlp(h, prefix + ".block_sparse_moe", std, scaledStd);
    } else {
      Value gate = linearOutIn(h, prefix + ".mlp.gate_proj", hidden_, ffn, std);
      Value up = linearOutIn(h, prefix + ".mlp.up_proj", hidden_, ffn, std);
      Value m = op<SwigluOp>(gate, up);
      down = linearOutIn(m, prefix + ".mlp.down_proj", ffn, hidden_, scaledStd);
    }
    return op<AddOp>(x, dropout(down, cfg_.hidden_dropout()));
  }

  // Every moe_layer_freq-th layer from layer 0 (Megatron-Core's --moe-layer-freq).
  bool isMoeLayer(int64_t layer) const { return cfg_.num_experts() > 0 && layer % cfg_.moe_layer_freq() == 0; }

  // Mixtral's sparse MoE block (Hugging Face's MixtralSparseMoeBlock): the router, a linear
  // without bias kept whole on every tensor-parallel rank, and the experts' SwiGLU MLPs stacked
  // [E, F, H] (w1: gate, w3: up) and [E, H, F] (w2: down), the output projection with the
  // residual branches' scaled init.
  Value moeMlp(Value h, const std::string &prefix, double std, double scaledStd) {
    int64_t E = cfg_.num_experts(), F = cfg_.ffn_hidden_size();
    Value logits = linearOutIn(h, prefix + ".gate", hidden_, E, std);
    logits.getDefiningOp()->setAttr(attr::kReplicated, b_.getUnitAttr());
    Value gate = param(prefix + ".experts.w1.weight", {E, F, hidden_}, "normal", std);
    Value up = param(prefix + ".experts.w3.weight", {E, F, hidden_}, "normal", std);
    Value down = param(prefix + ".experts.w2.weight", {E, hidden_, F}, "normal", scaledStd);
    auto moe = b_.create<MoeOp>(loc_, mlir::TypeRange{h.getType(), tensor({}, b_.getF32Type())}, h, logits, gate, up,
                                down, /*routing_stats=*/mlir::Value(), b_.getI64IntegerAttr(cfg_.num_experts_per_tok()),
                                b_.getF32FloatAttr(cfg_.capacity_factor()),
                                b_.getF32FloatAttr(cfg_.router_aux_loss_coef()), /*expert_parallel_group=*/nullptr,
                                b_.getI64IntegerAttr(1));
    moe->setAttr(attr::kLayer, b_.getI64IntegerAttr(layer_));
    return moe.getResult();
  }

  // LLaMA in Hugging Face LlamaForCausalLM's parameter names and layouts: token embedding
  // (no positions: rotary embeddings in every layer), layers, final RMSNorm, the output layer
  // (lm_head, or the embedding with tie_word_embeddings).
  Value buildLlama() {
    Value tokens = deferInput("tokens", b_.getI32Type());
    Value embed = param("model.embed_tokens.weight", {vocab_, hidden_}, "normal", cfg_.init_method_std());
    Value x = op<EmbeddingOp>(tensor({batch_, seq_, hidden_}), tokens, embed, Value(), /*vocab_parallel_group=*/nullptr,
                              /*context_parallel_group=*/nullptr);
    x = dropout(x, cfg_.hidden_dropout());
    mlir::Location outside = loc_;
    for (int64_t l = 0; l < cfg_.num_layers(); ++l) {
      layer_ = l;
      std::string prefix = "model.layers." + std::to_string(l);
      loc_ = mlir::NameLoc::get(b_.getStringAttr(prefix));
      x = llamaLayer(x, prefix);
    }
    loc_ = outside;
    layer_ = -1;
    x = rmsNorm(x, "model.norm");
    Value head = cfg_.tie_word_embeddings()
                     ? embed
                     : param("lm_head.weight", {vocab_, hidden_}, "normal", cfg_.init_method_std());
    return lossOrLogits(op<LinearOp>(tensor({batch_, seq_, vocab_}), x, head, Value(), b_.getUnitAttr()));
  }

  // The mean cross-entropy over the masked positions; `classes` 0: the vocabulary's.
  Value crossEntropy(Value logits, Value labels, Value lossMask, int64_t classes = 0) {
    return op<CrossEntropyOp>(tensor({}, b_.getF32Type()), /*lse=*/mlir::Type(), logits, labels, lossMask,
                              b_.getI64IntegerAttr(classes ? classes : vocab_), /*vocab_parallel_group=*/nullptr,
                              /*vocab_parallel_size=*/nullptr);
  }

  // A decoder's end: the logits (generation), or the loss over labels and a loss mask.
  Value lossOrLogits(Value logits) {
    if (!outputLogits_) {
      Value labels = deferInput("labels", b_.getI32Type());
      Value lossMask = deferInput("loss_mask", b_.getF32Type());
      logits = crossEntropy(logits, labels, lossMask);
    }
    finishInputs();
    return logits;
  }

  Value buildGpt() {
    Value word;
    Value tokens = deferInput("tokens", b_.getI32Type());
    Value x = trunk("transformer", tokens, /*causal=*/true, /*keyMask=*/nullptr, word);
    return lossOrLogits(op<LinearOp>(tensor({batch_, seq_, vocab_}), x, word, Value(), b_.getUnitAttr()));
  }

  // Pre-LN BERT as the Megatron-LM paper trains it (section 3 and figure 7: the layer norms at
  // each branch's input), in Megatron's BertModel: token, position and segment embeddings, the
  // bidirectional trunk with padded keys masked, then two heads whose losses are summed
  // (Megatron's pretrain_bert): the masked LM and the sentence-order prediction (Lan et al.
  // 2020, ALBERT section 3.1; Megatron's binary head).
  Value buildBert() {
    Value word;
    Value tokens = deferInput("tokens", b_.getI32Type());
    Value tokenTypes = deferInput("token_types", b_.getI32Type());
    Value keyMask = deferInput("attention_mask", b_.getF32Type());
    Value x = trunk("bert", tokens, /*causal=*/false, keyMask, word, tokenTypes);
    // Masked-LM head (Megatron's BertLMHead): dense + GeLU + layer norm, then the tied
    // output embedding plus a per-token bias.
    double std = cfg_.init_method_std();
    // Its output goes through a layer norm, so no row-parallel GEMM can follow it: it stays
    // replicated under tensor parallelism, as in Megatron.
    Value h = replicatedLinear(x, "cls.dense", hidden_, std);
    h = op<GeluOp>(h);
    h = layerNorm(h, "cls.ln");
    Value bias = param("cls.bias", {vocab_}, "zeros");
    Value logits = op<LinearOp>(tensor({batch_, seq_, vocab_}), h, word, bias,
                                b_.getUnitAttr());
    // Sentence-order head (Megatron's Pooler + binary head): tanh(dense(h_[CLS])), then two
    // classes. It runs at every position and the loss's mask keeps each sample's first (the
    // [CLS] token's): the same loss and gradients as slicing h_[CLS] out, with ops that
    // partition like the rest (under sequence parallelism the logits are gathered).
    Value pooled = op<TanhOp>(replicatedLinear(x, "bert.pooler", hidden_, std));
    Value sopLogits = replicatedLinear(pooled, "cls.seq_relationship", kSentenceOrderClasses, std);
    if (outputLogits_) {  // evaluation: both heads' logits, [batch, seq, vocab] and [batch, seq, 2]
      secondLogits_ = sopLogits;
      finishInputs();
      return logits;
    }
    Value labels = deferInput("labels", b_.getI32Type());
    Value lossMask = deferInput("loss_mask", b_.getF32Type());
    // Each loss named (loom.loss_name): the training log reports the terms of a summed loss by
    // their names, as Megatron's pretrain_bert logs "lm loss" and "sop loss".
    Value mlm = crossEntropy(logits, labels, lossMask);
    mlm.getDefiningOp()->setAttr(attr::kLossName, b_.getStringAttr("lm loss"));
    Value sopLabels = deferInput("sop_labels", b_.getI32Type());
    Value sopMask = deferInput("sop_mask", b_.getF32Type());
    Value sop = crossEntropy(sopLogits, sopLabels, sopMask, kSentenceOrderClasses);
    sop.getDefiningOp()->setAttr(attr::kLossName, b_.getStringAttr("sop loss"));
    Value loss = op<AddOp>(mlm, sop);
    finishInputs();
    return loss;
  }

  // A linear kept whole on every tensor-parallel rank (loom.replicated): BERT's heads.
  Value replicatedLinear(Value x, const std::string &prefix, int64_t out, double std) {
    Value y = linear(x, prefix, hidden_, out, std);
    y.getDefiningOp()->setAttr(attr::kReplicated, b_.getUnitAttr());
    return y;
  }

  // Data inputs are used before all parameters exist, but belong after them in the
  // signature: each gets a placeholder argument now and is moved to the end at the end.
  Value deferInput(llvm::StringRef role, Type elem) {
    Value v = input(role, elem);
    deferred_.push_back(mlir::cast<mlir::BlockArgument>(v).getArgNumber());
    return v;
  }

  void finishInputs() {
    // Append a fresh argument for every deferred input, redirect uses, erase the old one.
    llvm::SmallVector<unsigned> order(deferred_.begin(), deferred_.end());
    for (unsigned idx : order) {
      mlir::BlockArgument old = block_->getArgument(idx);
      Value fresh = block_->addArgument(old.getType(), old.getLoc());
      old.replaceAllUsesWith(fresh);
      argAttrs_.push_back(argAttrs_[idx]);
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      block_->eraseArgument(*it);
      argAttrs_.erase(argAttrs_.begin() + *it);
    }
  }

  mlir::MLIRContext &ctx_;
  const config::ModelConfig &cfg_;
  mlir::OpBuilder b_;
  mlir::Location loc_;
  mlir::OwningOpRef<mlir::ModuleOp> module_;
  mlir::func::FuncOp func_;
  mlir::Block *block_ = nullptr;
  llvm::SmallVector<mlir::DictionaryAttr> argAttrs_;
  llvm::SmallVector<unsigned> deferred_;
  Type dtype_;
  int64_t batch_, seq_, hidden_, vocab_;
  int64_t layer_ = -1;
  int64_t nextStream_ = 1;  // 0 means "no dropout"
  bool outputLogits_ = false;
  Value secondLogits_;  // BERT's sentence-order logits beside the masked LM's (outputLogits_)
};

}  // namespace

void registerLoomDialects(mlir::MLIRContext &ctx) {
  // Diagnostics are one line each: no "see current operation" dumps.
  ctx.printOpOnDiagnostic(false);
  ctx.getOrLoadDialect<LoomDialect>();
  ctx.getOrLoadDialect<mlir::func::FuncDialect>();
}

mlir::OwningOpRef<mlir::ModuleOp> buildModel(mlir::MLIRContext &ctx, const config::ModelConfig &cfg,
                                             const BuildOptions &options) {
  registerLoomDialects(ctx);
  return TrainStepBuilder(ctx, cfg, options).build();
}

}  // namespace loom
