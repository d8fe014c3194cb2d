// The config.json that Hugging Face's model classes read, written beside an exported
// safetensors file (save_pretrained's layout): GPT2LMHeadModel for GPT, LlamaForCausalLM for
// LLaMA, MixtralForCausalLM for LLaMA with mixture-of-experts layers, MegatronBertForPreTraining for
// BERT, from the model facts of the rank plan (which the compiler read from the IR).
#pragma once

#include <string>

#include "protos/plan.pb.h"

namespace loom {

enum class HfModelClass { kNone, kGpt2, kLlama, kMixtral, kMegatronBert };

// The Hugging Face class whose names the plan's parameters use (kNone: IR in other names).
HfModelClass hfModelClassOf(const plan::RankPlan &plan, bool hasGpt2Names, bool hasLlamaNames, bool hasBertNames);

// config.json for `cls` (not kNone).
std::string hfConfigJson(const plan::RankPlan &plan, HfModelClass cls);

}  // namespace loom
