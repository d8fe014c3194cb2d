#include "formats/HfLlama.h"

#include <algorithm>

namespace loom {

Status fromHuggingFaceLlama(const std::map<std::string, HostTensor> &hf, int64_t paddedVocab, bool tiedEmbeddings,
                            std::map<std::string, HostTensor> *loom) {
  for (auto &[name, t] : hf) {
    if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // a buffer, not a parameter
    if (name == "lm_head.weight" && tiedEmbeddings) continue;
    if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
      if (t.shape.size() != 2 || t.shape[0] > paddedVocab)
        return Status::error(name + " has " + std::to_string(t.shape.empty() ? 0 : t.shape[0]) +
                             " rows, more than the model's padded vocabulary " + std::to_string(paddedVocab));
      HostTensor w = HostTensor::zeros({paddedVocab, t.shape[1]});
      std::copy(t.data.begin(), t.data.end(), w.data.begin());
      (*loom)[name] = std::move(w);
      continue;
    }
    (*loom)[name] = t;
  }
  return Status::ok();
}

}  // namespace loom
