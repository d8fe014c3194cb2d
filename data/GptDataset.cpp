#include "data/GptDataset.h"

#include <algorithm>

#include "runtime/cpu/Philox.h"

namespace loom {
namespace {

// Fisher-Yates with Philox draws: a permutation that depends only on (seed, stream).
std::vector<int64_t> permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    auto r = cpu::philox4x32({uint32_t(i), uint32_t(uint64_t(i) >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                             {uint32_t(seed), uint32_t(seed >> 32)});
    uint64_t draw = (uint64_t(r[0]) << 32) | r[1];
    std::swap(p[i], p[int64_t(draw % uint64_t(i + 1))]);
  }
  return p;
}

}  // namespace

GptDataset::GptDataset(const IndexedDataset &data, Split split, double validationFraction, int64_t seq, uint64_t seed)
    : data_(data), seq_(seq), seed_(seed) {
  int64_t n = data.documents();
  int64_t valid = std::clamp<int64_t>(int64_t(n * validationFraction + 0.5), 1, std::max<int64_t>(n - 1, 1));
  // Validation document k is the one at (k + 1/2) n / valid: evenly spread over the corpus.
  std::vector<bool> held(size_t(n), false);
  for (int64_t k = 0; k < valid; ++k) held[size_t(std::min(n - 1, (2 * k + 1) * n / (2 * valid)))] = true;
  for (int64_t d = 0; d < n; ++d) {
    if (held[size_t(d)] != (split == Split::kValidation)) continue;
    docs_.push_back(d);
    tokensPerEpoch_ += data.documentLength(d);
  }
  samplesPerEpoch_ = std::max<int64_t>((tokensPerEpoch_ - 1) / seq_, 0);
}

const GptDataset::Epoch &GptDataset::epoch(int64_t e) {
  if (cached_.number == e) return cached_;
  cached_.number = e;
  std::vector<int64_t> order = permutation(int64_t(docs_.size()), seed_, 2 * uint64_t(e));
  cached_.docs.clear();
  cached_.docStart.clear();
  int64_t offset = 0;
  for (int64_t i : order) {
    cached_.docs.push_back(docs_[i]);
    cached_.docStart.push_back(offset);
    offset += data_.documentLength(docs_[i]);
  }
  cached_.sampleOrder = permutation(samplesPerEpoch_, seed_, 2 * uint64_t(e) + 1);
  return cached_;
}

std::vector<int32_t> GptDataset::sample(int64_t index) {
  std::vector<int32_t> out;
  if (samplesPerEpoch_ == 0) return out;
  const Epoch &ep = epoch(index / samplesPerEpoch_);
  int64_t start = ep.sampleOrder[index % samplesPerEpoch_] * seq_;
  // The document holding `start`, then walk forward across documents.
  size_t d = size_t(std::upper_bound(ep.docStart.begin(), ep.docStart.end(), start) - ep.docStart.begin()) - 1;
  int64_t pos = start - ep.docStart[d];
  while (int64_t(out.size()) < seq_ + 1 && d < ep.docs.size()) {
    int64_t len = data_.documentLength(ep.docs[d]);
    for (; pos < len && int64_t(out.size()) < seq_ + 1; ++pos) out.push_back(data_.token(ep.docs[d], pos));
    ++d, pos = 0;
  }
  return out;
}

}  // namespace loom
