#include "formats/HfBert.h"

#include <regex>

#include "formats/HfGpt2.h"
#include "formats/HfVocab.h"

namespace loom {
namespace {

// Loom name (after "bert.h.N.") -> Hugging Face name (after "bert.encoder.layer.N."), and
// whether the tensor is a linear's weight (transposed between the two layouts).
struct Rename {
  const char *loom, *hf;
  bool linearWeight;
};
constexpr Rename kLayer[] = {
    {"ln_1.weight", "attention.ln.weight", false},
    {"ln_1.bias", "attention.ln.bias", false},
    {"attn.c_proj.weight", "attention.output.dense.weight", true},
    {"attn.c_proj.bias", "attention.output.dense.bias", false},
    {"ln_2.weight", "ln.weight", false},
    {"ln_2.bias", "ln.bias", false},
    {"mlp.c_fc.weight", "intermediate.dense.weight", true},
    {"mlp.c_fc.bias", "intermediate.dense.bias", false},
    {"mlp.c_proj.weight", "output.dense.weight", true},
    {"mlp.c_proj.bias", "output.dense.bias", false},
};
constexpr Rename kOutside[] = {
    {"bert.wpe.weight", "bert.embeddings.position_embeddings.weight", false},
    {"bert.tte.weight", "bert.embeddings.token_type_embeddings.weight", false},
    {"bert.ln_f.weight", "bert.encoder.ln.weight", false},
    {"bert.ln_f.bias", "bert.encoder.ln.bias", false},
    {"bert.pooler.weight", "bert.pooler.dense.weight", true},
    {"bert.pooler.bias", "bert.pooler.dense.bias", false},
    {"cls.dense.weight", "cls.predictions.transform.dense.weight", true},
    {"cls.dense.bias", "cls.predictions.transform.dense.bias", false},
    {"cls.ln.weight", "cls.predictions.transform.LayerNorm.weight", false},
    {"cls.ln.bias", "cls.predictions.transform.LayerNorm.bias", false},
    {"cls.seq_relationship.weight", "cls.seq_relationship.weight", true},
    {"cls.seq_relationship.bias", "cls.seq_relationship.bias", false},
};
const std::regex kLoomLayer(R"(bert\.h\.([0-9]+)\.(.*))");
const std::regex kHfLayer(R"(bert\.encoder\.layer\.([0-9]+)\.(.*))");
const char *kQkvNames[3] = {"query", "key", "value"};
const std::regex kLayerNormWeight(R"((^|\.)ln\.weight$)");  // MegatronBERT's pre-LN norms

HostTensor transposed(const HostTensor &t) {
  HostTensor out = HostTensor::zeros({t.shape[1], t.shape[0]});
  for (int64_t r = 0; r < t.shape[0]; ++r)
    for (int64_t c = 0; c < t.shape[1]; ++c) out.data[c * t.shape[0] + r] = t.data[r * t.shape[1] + c];
  return out;
}

}  // namespace

Status toHuggingFaceBert(const std::map<std::string, HostTensor> &loom, int64_t vocab, int64_t heads,
                         std::map<std::string, HostTensor> *hf) {
  for (auto &[name, t] : loom) {
    if (name.find(".stage") != std::string::npos) continue;
    std::smatch m;
    if (name == "bert.wte.weight") {
      (*hf)["bert.embeddings.word_embeddings.weight"] = vocabRows(t, vocab);
    } else if (name == "cls.bias") {
      (*hf)["cls.predictions.bias"] = vocabRows(t, vocab);
    } else if (std::regex_match(name, m, kLoomLayer)) {
      std::string hfPrefix = "bert.encoder.layer." + m[1].str() + ".", rest = m[2].str();
      if (rest == "attn.c_attn.weight" || rest == "attn.c_attn.bias") {
        bool weight = rest == "attn.c_attn.weight";
        int64_t cols = t.shape.back(), in = weight ? t.shape[0] : 1, out = cols / 3;
        if (cols % (3 * heads) != 0) return Status::error(name + ": columns do not split into 3 x heads");
        // GPT-2's column order [3, heads, hd], then each third transposed into its own nn.Linear.
        HostTensor ordered = permuteQkvColumns(t, heads, /*toHf=*/true);
        for (int j = 0; j < 3; ++j) {
          HostTensor part = HostTensor::zeros(weight ? std::vector<int64_t>{out, in} : std::vector<int64_t>{out});
          for (int64_t o = 0; o < out; ++o)
            for (int64_t r = 0; r < in; ++r) part.data[o * in + r] = ordered.data[r * cols + j * out + o];
          (*hf)[hfPrefix + "attention.self." + kQkvNames[j] + (weight ? ".weight" : ".bias")] = std::move(part);
        }
        continue;
      }
      const Rename *r = std::find_if(std::begin(kLayer), std::end(kLayer), [&](const Rename &x) { return rest == x.loom; });
      if (r == std::end(kLayer)) return Status::error("no Hugging Face name for BERT parameter '" + name + "'");
      (*hf)[hfPrefix + r->hf] = r->linearWeight ? transposed(t) : t;
    } else {
      const Rename *r =
          std::find_if(std::begin(kOutside), std::end(kOutside), [&](const Rename &x) { return name == x.loom; });
      if (r == std::end(kOutside)) return Status::error("no Hugging Face name for BERT parameter '" + name + "'");
      (*hf)[r->hf] = r->linearWeight ? transposed(t) : t;
    }
  }
  return Status::ok();
}

Status fromHuggingFaceBert(const std::map<std::string, HostTensor> &hf, int64_t paddedVocab, int64_t heads,
                           std::map<std::string, HostTensor> *loom) {
  std::map<std::string, std::map<int, const HostTensor *>> qkv;  // "bert.h.N.attn.c_attn.weight" -> q, k, v
  for (auto &[name, t] : hf) {
    // Buffers and the tied decoder are not parameters of Loom's.
    if (name.find("position_ids") != std::string::npos || name.rfind("cls.predictions.decoder.", 0) == 0) continue;
    // Weights and embeddings are matrices, the rest vectors: anything else is a corrupt file.
    bool matrix = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 && name.find("LayerNorm") == std::string::npos &&
                  !std::regex_search(name, kLayerNormWeight);
    if (t.shape.size() != (matrix ? 2u : 1u) || t.numel() == 0)
      return Status::error("'" + name + "' has rank " + std::to_string(t.shape.size()) + " (expected " +
                           (matrix ? "2" : "1") + ")");
    std::smatch m;
    if (name == "bert.embeddings.word_embeddings.weight") {
      LOOM_RETURN_IF_ERROR(padVocabRows(name, t, paddedVocab, &(*loom)["bert.wte.weight"]));
    } else if (name == "cls.predictions.bias") {
      LOOM_RETURN_IF_ERROR(padVocabRows(name, t, paddedVocab, &(*loom)["cls.bias"]));
    } else if (std::regex_match(name, m, kHfLayer)) {
      std::string prefix = "bert.h." + m[1].str() + ".", rest = m[2].str();
      bool matched = false;
      for (int j = 0; j < 3; ++j)
        for (const char *kind : {".weight", ".bias"})
          if (rest == std::string("attention.self.") + kQkvNames[j] + kind) {
            qkv[prefix + "attn.c_attn" + kind][j] = &t;
            matched = true;
          }
      if (matched) continue;
      const Rename *r = std::find_if(std::begin(kLayer), std::end(kLayer), [&](const Rename &x) { return rest == x.hf; });
      if (r == std::end(kLayer)) return Status::error("'" + name + "' is not a MegatronBertForPreTraining parameter");
      (*loom)[prefix + r->loom] = r->linearWeight ? transposed(t) : t;
    } else {
      const Rename *r =
          std::find_if(std::begin(kOutside), std::end(kOutside), [&](const Rename &x) { return name == x.hf; });
      if (r == std::end(kOutside)) return Status::error("'" + name + "' is not a MegatronBertForPreTraining parameter");
      (*loom)[r->loom] = r->linearWeight ? transposed(t) : t;
    }
  }
  for (auto &[name, parts] : qkv) {
    if (parts.size() != 3) return Status::error(name + ": the query, key and value are not all there");
    bool weight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    const HostTensor &q = *parts[0];
    int64_t out = q.shape[0], in = weight ? q.shape[1] : 1;
    if (out % heads != 0) return Status::error(name + ": " + std::to_string(out) + " rows do not split into heads");
    for (auto &[j, p] : parts)
      if (p->shape != q.shape) return Status::error(name + ": query, key and value differ in shape");
    // The three transposed side by side in GPT-2's column order [3, heads, hd], then Loom's.
    HostTensor ordered = HostTensor::zeros(weight ? std::vector<int64_t>{in, 3 * out} : std::vector<int64_t>{3 * out});
    for (int j = 0; j < 3; ++j)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t r = 0; r < in; ++r) ordered.data[r * 3 * out + j * out + o] = parts[j]->data[o * in + r];
    (*loom)[name] = permuteQkvColumns(ordered, heads, /*toHf=*/false);
  }
  return Status::ok();
}

}  // namespace loom
