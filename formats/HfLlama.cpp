#include "formats/HfLlama.h"

#include <algorithm>
#include <regex>

#include "formats/HfVocab.h"

namespace loom {
namespace {

// A Mixtral expert's tensor, per expert (Hugging Face) or stacked (Loom).
const std::regex kPerExpert(R"((.*\.block_sparse_moe\.experts)\.([0-9]+)\.(w[123])\.weight)");
const std::regex kStacked(R"((.*\.block_sparse_moe\.experts)\.(w[123])\.weight)");

}  // namespace

Status fromHuggingFaceLlama(const std::map<std::string, HostTensor> &hf, int64_t paddedVocab, bool tiedEmbeddings,
                            std::map<std::string, HostTensor> *loom) {
  // (".../experts", "wK") -> expert index -> tensor
  std::map<std::pair<std::string, std::string>, std::map<int64_t, const HostTensor *>> experts;
  for (auto &[name, t] : hf) {
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // a buffer, not a parameter
    if (name == "lm_head.weight" && tiedEmbeddings) continue;
    std::smatch m;
    if (std::regex_match(name, m, kPerExpert)) {
      experts[{m[1].str(), m[3].str()}][std::stoll(m[2].str())] = &t;
      continue;
    }
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      if (t.shape.size() != 2) return Status::error(name + " has rank " + std::to_string(t.shape.size()) + " (expected 2)");
      LOOM_RETURN_IF_ERROR(padVocabRows(name, t, paddedVocab, &(*loom)[name]));
      continue;
    }
    (*loom)[name] = t;
  }
  for (auto &[key, byExpert] : experts) {
    auto &[prefix, matrix] = key;
    int64_t n = int64_t(byExpert.size());
    const std::vector<int64_t> &shape = byExpert.begin()->second->shape;
    for (int64_t e = 0; e < n; ++e) {
      std::string name = prefix + "." + std::to_string(e) + "." + matrix + ".weight";
      auto it = byExpert.find(e);
      if (it == byExpert.end())
        return Status::error("no " + name + " (the experts are numbered 0.." + std::to_string(n - 1) + ")");
      if (it->second->shape != shape || shape.size() != 2) return Status::error(name + " has another shape than expert 0's");
    }
    HostTensor w = HostTensor::zeros({n, shape[0], shape[1]});
    for (auto &[e, t] : byExpert) std::copy(t->data.begin(), t->data.end(), w.data.begin() + e * shape[0] * shape[1]);
    (*loom)[prefix + "." + matrix + ".weight"] = std::move(w);
  }
  return Status::ok();
}

std::map<std::string, HostTensor> toHuggingFaceLlama(std::map<std::string, HostTensor> loom) {
  std::map<std::string, HostTensor> hf;
  for (auto &[name, t] : loom) {
    std::smatch m;
    if (!std::regex_match(name, m, kStacked) || t.shape.size() != 3) {
      hf[name] = std::move(t);
      continue;
    }
    int64_t per = t.shape[1] * t.shape[2];
    for (int64_t e = 0; e < t.shape[0]; ++e) {
      HostTensor w = HostTensor::zeros({t.shape[1], t.shape[2]});
      std::copy(t.data.begin() + e * per, t.data.begin() + (e + 1) * per, w.data.begin());
      hf[m[1].str() + "." + std::to_string(e) + "." + m[2].str() + ".weight"] = std::move(w);
    }
  }
  return hf;
}

}  // namespace loom
