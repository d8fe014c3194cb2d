#include "formats/HfConfig.h"

#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

namespace loom {
namespace {

// The plan's f32 attribute as the shortest decimal that reads back as the same f32, so that
// config.json shows 1e-05 and 10000.0 rather than the f32's binary expansion.
double f32Decimal(double v) {
  float f = float(v);
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {  // 9 significant digits always round-trip
    std::snprintf(buf, sizeof buf, "%.*g", digits, double(f));
    if (std::strtof(buf, nullptr) == f) break;
  }
  return std::strtod(buf, nullptr);
}

}  // namespace

HfModelClass hfModelClassOf(const plan::RankPlan &plan, bool hasGpt2Names, bool hasLlamaNames, bool hasBertNames) {
  if (plan.architecture() == "gpt" && hasGpt2Names) return HfModelClass::kGpt2;
  if (plan.architecture() == "bert" && hasBertNames) return HfModelClass::kMegatronBert;
  if (plan.architecture() == "llama" && hasLlamaNames)
    return plan.num_experts() > 0 ? HfModelClass::kMixtral : HfModelClass::kLlama;
  return HfModelClass::kNone;
}

std::string hfConfigJson(const plan::RankPlan &p, HfModelClass cls) {
  nlohmann::ordered_json c;  // keys in save_pretrained's order
  if (cls == HfModelClass::kGpt2) {
    // Keys of transformers' GPT2Config; GPT-2's tanh GeLU is "gelu_new".
    c = {{"architectures", nlohmann::ordered_json::array({"GPT2LMHeadModel"})},
         {"model_type", "gpt2"},
         {"vocab_size", p.vocab_size()},
         {"n_positions", p.max_position_embeddings()},
         {"n_ctx", p.max_position_embeddings()},
         {"n_embd", p.hidden_size()},
         {"n_layer", p.num_layers()},
         {"n_head", p.num_attention_heads()},
         {"n_inner", p.ffn_hidden_size()},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", f32Decimal(p.norm_epsilon())},
         {"tie_word_embeddings", true},
         {"torch_dtype", "float32"}};
  } else if (cls == HfModelClass::kMegatronBert) {
    // Keys of transformers' MegatronBertConfig (the pre-LN BERT; Loom's GeLU is the tanh
    // approximation, "gelu_new").
    c = {{"architectures", nlohmann::ordered_json::array({"MegatronBertForPreTraining"})},
         {"model_type", "megatron-bert"},
         {"vocab_size", p.vocab_size()},
         {"hidden_size", p.hidden_size()},
         {"num_hidden_layers", p.num_layers()},
         {"num_attention_heads", p.num_attention_heads()},
         {"intermediate_size", p.ffn_hidden_size()},
         {"hidden_act", "gelu_new"},
         {"max_position_embeddings", p.max_position_embeddings()},
         {"type_vocab_size", 2},
         {"layer_norm_eps", f32Decimal(p.norm_epsilon())},
         {"pad_token_id", 0},
         {"tie_word_embeddings", true},
         {"torch_dtype", "float32"}};
  } else {
    // Keys of transformers' LlamaConfig.
    int64_t headDim = p.num_attention_heads() ? p.hidden_size() / p.num_attention_heads() : 0;
    c = {{"architectures", nlohmann::ordered_json::array({"LlamaForCausalLM"})},
         {"model_type", "llama"},
         {"vocab_size", p.vocab_size()},
         {"hidden_size", p.hidden_size()},
         {"intermediate_size", p.ffn_hidden_size()},
         {"num_hidden_layers", p.num_layers()},
         {"num_attention_heads", p.num_attention_heads()},
         {"num_key_value_heads", p.num_key_value_heads()},
         {"head_dim", headDim},
         {"max_position_embeddings", p.seq_length()},
         {"rms_norm_eps", f32Decimal(p.norm_epsilon())},
         {"rope_theta", f32Decimal(p.rope_theta())},
         {"hidden_act", "silu"},
         {"attention_bias", false},
         {"mlp_bias", false},
         {"tie_word_embeddings", p.tie_word_embeddings()},
         {"torch_dtype", "float32"}};
    if (cls == HfModelClass::kMixtral) {
      // Keys of transformers' MixtralConfig; moe_layer_freq and capacity_factor are Loom's
      // (Mixtral has every layer MoE and no capacity), written only when they say otherwise.
      c["architectures"] = nlohmann::ordered_json::array({"MixtralForCausalLM"});
      c["model_type"] = "mixtral";
      c.erase("mlp_bias");
      c.erase("attention_bias");
      c["num_local_experts"] = p.num_experts();
      c["num_experts_per_tok"] = p.num_experts_per_tok();
      c["router_aux_loss_coef"] = f32Decimal(p.router_aux_loss_coef());
      c["output_router_logits"] = p.router_aux_loss_coef() > 0;
      if (p.moe_layer_freq() > 1) c["moe_layer_freq"] = p.moe_layer_freq();
      if (p.capacity_factor() > 0) c["capacity_factor"] = f32Decimal(p.capacity_factor());
    }
  }
  return c.dump(2) + "\n";
}

}  // namespace loom
