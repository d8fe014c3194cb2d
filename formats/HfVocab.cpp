#include "formats/HfVocab.h"

#include <algorithm>

namespace loom {

Status padVocabRows(const std::string &name, const HostTensor &t, int64_t paddedVocab, HostTensor *out) {
  if (t.shape.empty() || t.shape[0] > paddedVocab)
    return Status::error(name + " has " + std::to_string(t.shape.empty() ? 0 : t.shape[0]) +
                         " rows, more than the model's padded vocabulary " + std::to_string(paddedVocab));
  std::vector<int64_t> shape = t.shape;
  shape[0] = paddedVocab;
  HostTensor padded = HostTensor::zeros(shape);
  std::copy(t.data.begin(), t.data.end(), padded.data.begin());
  *out = std::move(padded);
  return Status::ok();
}

HostTensor vocabRows(const HostTensor &t, int64_t vocab) {
  std::vector<int64_t> shape = t.shape;
  int64_t per = t.shape[0] > 0 ? t.numel() / t.shape[0] : 0;
  shape[0] = vocab;
  HostTensor out{shape};
  out.data.assign(t.data.begin(), t.data.begin() + std::min(vocab, t.shape[0]) * per);
  out.data.resize(size_t(vocab * per), 0.0f);
  return out;
}

}  // namespace loom
