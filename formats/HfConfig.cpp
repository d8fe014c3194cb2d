#include "formats/HfConfig.h"

#include <cstdio>
#include <sstream>

namespace loom {
namespace {

// A number as JSON, to the precision of the f32 attribute it came from.
std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.7g", v);  // the values come from f32 attributes
  return buf;
}

}  // namespace

HfModelClass hfModelClassOf(const plan::RankPlan &plan, bool hasGpt2Names, bool hasLlamaNames) {
  if (plan.architecture() == "gpt" && hasGpt2Names) return HfModelClass::kGpt2;
  if (plan.architecture() == "llama" && hasLlamaNames) return HfModelClass::kLlama;
  return HfModelClass::kNone;
}

std::string hfConfigJson(const plan::RankPlan &p, HfModelClass cls) {
  std::ostringstream os;
  if (cls == HfModelClass::kGpt2) {
    // Keys of transformers' GPT2Config; GPT-2's tanh GeLU is "gelu_new".
    os << "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
       << "  \"vocab_size\": " << p.vocab_size() << ",\n  \"n_positions\": " << p.max_position_embeddings()
       << ",\n  \"n_ctx\": " << p.max_position_embeddings() << ",\n  \"n_embd\": " << p.hidden_size()
       << ",\n  \"n_layer\": " << p.num_layers() << ",\n  \"n_head\": " << p.num_attention_heads()
       << ",\n  \"n_inner\": " << p.ffn_hidden_size() << ",\n  \"activation_function\": \"gelu_new\""
       << ",\n  \"layer_norm_epsilon\": " << number(p.norm_epsilon())
       << ",\n  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\"\n}\n";
  } else {
    // Keys of transformers' LlamaConfig.
    int64_t headDim = p.num_attention_heads() ? p.hidden_size() / p.num_attention_heads() : 0;
    os << "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
       << "  \"vocab_size\": " << p.vocab_size() << ",\n  \"hidden_size\": " << p.hidden_size()
       << ",\n  \"intermediate_size\": " << p.ffn_hidden_size() << ",\n  \"num_hidden_layers\": " << p.num_layers()
       << ",\n  \"num_attention_heads\": " << p.num_attention_heads()
       << ",\n  \"num_key_value_heads\": " << p.num_key_value_heads() << ",\n  \"head_dim\": " << headDim
       << ",\n  \"max_position_embeddings\": " << p.seq_length() << ",\n  \"rms_norm_eps\": " << number(p.norm_epsilon())
       << ",\n  \"rope_theta\": " << number(p.rope_theta()) << ",\n  \"hidden_act\": \"silu\""
       << ",\n  \"attention_bias\": false,\n  \"mlp_bias\": false"
       << ",\n  \"tie_word_embeddings\": " << (p.tie_word_embeddings() ? "true" : "false")
       << ",\n  \"torch_dtype\": \"float32\"\n}\n";
  }
  return os.str();
}

}  // namespace loom
