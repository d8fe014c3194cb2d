#include "formats/HfGpt2.h"

#include <algorithm>

#include "formats/HfVocab.h"

namespace loom {
namespace {

bool isQkv(const std::string &name) { return name.find(".attn.c_attn.") != std::string::npos; }

}  // namespace

HostTensor permuteQkvColumns(const HostTensor &t, int64_t heads, bool toHf) {
  HostTensor out = t;
  int64_t cols = t.shape.back(), rows = t.numel() / cols, hd = cols / (3 * heads);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < 3; ++j)
        for (int64_t d = 0; d < hd; ++d) {
          int64_t loomCol = (h * 3 + j) * hd + d, hfCol = (j * heads + h) * hd + d;
          if (toHf)
            out.data[r * cols + hfCol] = t.data[r * cols + loomCol];
          else
            out.data[r * cols + loomCol] = t.data[r * cols + hfCol];
        }
  return out;
}

std::map<std::string, HostTensor> toHuggingFaceGpt2(const std::map<std::string, HostTensor> &loom, int64_t vocab,
                                                    int64_t heads) {
  std::map<std::string, HostTensor> hf;
  for (auto &[name, t] : loom) {
    if (name.find(".stage") != std::string::npos) continue;
    if (name == "transformer.wte.weight") {
      hf[name] = vocabRows(t, vocab);
    } else if (isQkv(name)) {
      hf[name] = permuteQkvColumns(t, heads, true);
    } else {
      hf[name] = t;
    }
  }
  return hf;
}

Status fromHuggingFaceGpt2(const std::map<std::string, HostTensor> &hf, int64_t paddedVocab, int64_t heads,
                           std::map<std::string, HostTensor> *loom) {
  for (auto &[raw, t] : hf) {
    if (raw.size() >= 9 && raw.compare(raw.size() - 9, 9, ".attn.bias") == 0) continue;  // HF's causal-mask buffer
    if (raw.find("masked_bias") != std::string::npos || raw == "lm_head.weight") continue;
    std::string name = raw.rfind("transformer.", 0) == 0 ? raw : "transformer." + raw;
    if (name == "transformer.wte.weight") {
      if (t.shape.size() != 2) return Status::error(raw + " has rank " + std::to_string(t.shape.size()) + " (expected 2)");
      LOOM_RETURN_IF_ERROR(padVocabRows(raw, t, paddedVocab, &(*loom)[name]));
    } else if (isQkv(name)) {
      if (t.shape.back() % (3 * heads) != 0)
        return Status::error(raw + ": " + std::to_string(t.shape.back()) + " columns do not split into 3 x " +
                             std::to_string(heads) + " heads");
      (*loom)[name] = permuteQkvColumns(t, heads, false);
    } else {
      (*loom)[name] = t;
    }
  }
  return Status::ok();
}

}  // namespace loom
