#include "data/GptDataset.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "runtime/cpu/Philox.h"

namespace loom {

std::vector<int64_t> philoxPermutation(int64_t n, uint64_t seed, uint64_t stream) {
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

std::vector<bool> validationDocuments(int64_t n, double validationFraction) {
  int64_t valid = std::clamp<int64_t>(int64_t(n * validationFraction + 0.5), 1, std::max<int64_t>(n - 1, 1));
  std::vector<bool> held(size_t(std::max<int64_t>(n, 0)), false);
  for (int64_t k = 0; k < valid && n > 0; ++k) held[size_t(std::min(n - 1, (2 * k + 1) * n / (2 * valid)))] = true;
  return held;
}

ReferenceLosses referenceLosses(const IndexedDataset &data, double validationFraction) {
  int64_t n = data.documents();
  std::vector<bool> held = validationDocuments(n, validationFraction);
  int32_t maxId = 0;
  for (int64_t d = 0; d < n; ++d)
    for (int64_t i = 0; i < data.documentLength(d); ++i) maxId = std::max(maxId, data.token(d, i));
  std::vector<double> unigram(size_t(maxId) + 1, 0.1);
  std::unordered_map<uint64_t, int64_t> pairs;             // (a << 32 | b) -> count, within documents
  std::unordered_map<int32_t, std::pair<int64_t, int64_t>> contexts;  // a -> (pairs starting at a, distinct b)
  ReferenceLosses out;
  for (int64_t d = 0; d < n; ++d) {
    if (held[size_t(d)]) continue;
    for (int64_t i = 0; i < data.documentLength(d); ++i) {
      int32_t b = data.token(d, i);
      unigram[size_t(b)] += 1, ++out.trainTokens;
      if (i == 0) continue;
      int32_t a = data.token(d, i - 1);
      auto &c = contexts[a];
      ++c.first;
      if (++pairs[(uint64_t(uint32_t(a)) << 32) | uint32_t(b)] == 1) ++c.second;
    }
  }
  double total = 0;
  for (double c : unigram) total += c;
  const double discount = 0.75;
  double uniLoss = 0, biLoss = 0;
  int64_t biCount = 0;
  for (int64_t d = 0; d < n; ++d) {
    if (!held[size_t(d)]) continue;
    for (int64_t i = 0; i < data.documentLength(d); ++i) {
      int32_t b = data.token(d, i);
      double pu = unigram[size_t(b)] / total;
      uniLoss -= std::log(pu), ++out.validTokens;
      if (i == 0) continue;
      auto c = contexts.find(data.token(d, i - 1));
      double p = pu;
      if (c != contexts.end()) {
        auto pc = pairs.find((uint64_t(uint32_t(data.token(d, i - 1))) << 32) | uint32_t(b));
        double seen = pc == pairs.end() ? 0 : double(pc->second);
        p = std::max(seen - discount, 0.0) / double(c->second.first) +
            discount * double(c->second.second) / double(c->second.first) * pu;
      }
      biLoss -= std::log(p), ++biCount;
    }
  }
  out.unigram = out.validTokens ? uniLoss / double(out.validTokens) : 0;
  out.bigram = biCount ? biLoss / double(biCount) : 0;
  return out;
}

GptDataset::GptDataset(const IndexedDataset &data, Split split, double validationFraction, int64_t seq, uint64_t seed)
    : data_(data), seq_(seq), seed_(seed) {
  int64_t n = data.documents();
  std::vector<bool> held = validationDocuments(n, validationFraction);
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
  std::vector<int64_t> order = philoxPermutation(int64_t(docs_.size()), seed_, 2 * uint64_t(e));
  cached_.docs.clear();
  cached_.docStart.clear();
  int64_t offset = 0;
  for (int64_t i : order) {
    cached_.docs.push_back(docs_[i]);
    cached_.docStart.push_back(offset);
    offset += data_.documentLength(docs_[i]);
  }
  cached_.sampleOrder = philoxPermutation(samplesPerEpoch_, seed_, 2 * uint64_t(e) + 1);
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
