#include "formats/HfExport.h"

#include <filesystem>
#include <fstream>

#include "formats/HfGpt2.h"
#include "formats/HfBert.h"
#include "formats/HfLlama.h"
#include "formats/Safetensors.h"

namespace loom {

std::string HfExport::className() const {
  return cls == HfModelClass::kGpt2      ? "Hugging Face GPT2LMHeadModel"
         : cls == HfModelClass::kLlama   ? "Hugging Face LlamaForCausalLM"
         : cls == HfModelClass::kMixtral ? "Hugging Face MixtralForCausalLM"
         : cls == HfModelClass::kMegatronBert ? "Hugging Face MegatronBertForPreTraining"
                                         : "the IR's parameter names";
}

namespace {
Status inHfNames(const plan::RankPlan &facts, HfModelClass cls, const std::map<std::string, HostTensor> &loom,
                 std::map<std::string, HostTensor> *hf) {
  if (cls == HfModelClass::kMegatronBert)
    return toHuggingFaceBert(loom, facts.vocab_size(), facts.num_attention_heads(), hf);
  *hf = cls == HfModelClass::kGpt2   ? toHuggingFaceGpt2(loom, facts.vocab_size(), facts.num_attention_heads())
        : cls == HfModelClass::kNone ? loom
                                     : toHuggingFaceLlama(loom);
  return Status::ok();
}

std::string besideIt(const std::string &path, const char *name) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  return (dir.empty() ? std::filesystem::path(name) : dir / name).string();
}
}  // namespace

Status writeHuggingFace(const plan::RankPlan &facts, const std::map<std::string, HostTensor> &params,
                        const std::map<std::string, HostTensor> *adamM, const std::map<std::string, HostTensor> *adamV,
                        const std::string &path, HfExport *out) {
  // A model in the builder's names is written as its Hugging Face class, with the config.json
  // that class reads beside it; any other IR keeps its own parameter names and layout.
  out->cls = hfModelClassOf(facts, params.count("transformer.wte.weight") > 0,
                            params.count("model.embed_tokens.weight") > 0, params.count("bert.wte.weight") > 0);
  SafetensorsFile model;
  model.metadata["format"] = "pt";
  LOOM_RETURN_IF_ERROR(inHfNames(facts, out->cls, params, &model.tensors));
  out->tensors = model.tensors.size();
  LOOM_RETURN_IF_ERROR(writeSafetensors(path, model));
  if (out->cls != HfModelClass::kNone) {
    out->configPath = besideIt(path, "config.json");
    LOOM_RETURN_IF_ERROR(writeFileAtomically(out->configPath, hfConfigJson(facts, out->cls)));
  }
  if (adamM && adamV) {
    // The moments are elementwise companions of their parameters: the same renaming, splitting
    // and transposition.
    SafetensorsFile optimizer;
    optimizer.metadata["format"] = "pt";
    for (auto [prefix, moments] : {std::pair{"exp_avg/", adamM}, std::pair{"exp_avg_sq/", adamV}}) {
      std::map<std::string, HostTensor> named;
      LOOM_RETURN_IF_ERROR(inHfNames(facts, out->cls, *moments, &named));
      for (auto &[name, t] : named) optimizer.tensors[prefix + name] = t;
    }
    out->optimizerPath = besideIt(path, "optimizer.safetensors");
    LOOM_RETURN_IF_ERROR(writeSafetensors(out->optimizerPath, optimizer));
  }
  return Status::ok();
}

Status readHuggingFace(const plan::RankPlan &facts, const std::map<std::string, HostTensor> &hf,
                       std::map<std::string, HostTensor> *loom) {
  if (facts.architecture() == "llama")
    return fromHuggingFaceLlama(hf, facts.padded_vocab_size(), facts.tie_word_embeddings(), loom);
  if (facts.architecture() == "bert")
    return fromHuggingFaceBert(hf, facts.padded_vocab_size(), facts.num_attention_heads(), loom);
  if (facts.architecture() == "gpt")
    return fromHuggingFaceGpt2(hf, facts.padded_vocab_size(), facts.num_attention_heads(), loom);
  return Status::error("no Hugging Face layout for architecture '" + facts.architecture() + "'");
}

}  // namespace loom
