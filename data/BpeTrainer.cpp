#include "data/BpeTrainer.h"

#include <algorithm>
#include <map>
#include <memory>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "data/Bpe.h"
#include "formats/Safetensors.h"

namespace loom {
namespace {

using Pair = uint64_t;  // (left id << 32) | right id
Pair pairOf(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
int32_t leftOf(Pair p) { return int32_t(p >> 32); }
int32_t rightOf(Pair p) { return int32_t(p & 0xFFFFFFFFu); }

// The distinct pieces of the corpus as symbol sequences, their counts, and the count of every
// adjacent pair weighted by the pieces' counts. Each merge rewrites only the pieces that
// contain its pair (found through `where`), so training costs the pieces touched, not the
// corpus, per merge.
class PairCounter {
 public:
  PairCounter(std::vector<std::vector<int32_t>> words, std::vector<int64_t> counts,
              const std::vector<std::string> &tokens)
      : words_(std::move(words)), counts_(std::move(counts)), tokens_(tokens), stamp_(words_.size(), -1) {
    for (size_t w = 0; w < words_.size(); ++w) addPairs(int32_t(w), +1);
    for (auto &[p, c] : pairCounts_) heap_.push({c, p});
  }

  // The most frequent pair (ties: the smaller left token, then the smaller right token, as
  // byte strings); false when no pair is left.
  bool best(Pair *out) {
    while (!heap_.empty()) {
      Entry top = heap_.top();
      auto it = pairCounts_.find(top.pair);
      if (it == pairCounts_.end() || it->second != top.count) {  // stale: the count changed since
        heap_.pop();
        continue;
      }
      // Among the entries of this count, the smallest by the tie rule.
      std::vector<Entry> same;
      while (!heap_.empty() && heap_.top().count == top.count) {
        Entry e = heap_.top();
        heap_.pop();
        auto f = pairCounts_.find(e.pair);
        if (f != pairCounts_.end() && f->second == e.count) same.push_back(e);
      }
      auto smaller = [&](const Entry &a, const Entry &b) {
        const std::string &al = tokens_[leftOf(a.pair)], &bl = tokens_[leftOf(b.pair)];
        if (al != bl) return al < bl;
        return tokens_[rightOf(a.pair)] < tokens_[rightOf(b.pair)];
      };
      std::sort(same.begin(), same.end(), smaller);
      same.erase(std::unique(same.begin(), same.end(), [](const Entry &a, const Entry &b) { return a.pair == b.pair; }),
                 same.end());
      for (size_t k = 1; k < same.size(); ++k) heap_.push(same[k]);
      *out = same.front().pair;
      return true;
    }
    return false;
  }

  // Replaces every occurrence of `p` (left to right, not overlapping) by the symbol `merged`.
  void merge(Pair p, int32_t merged, int64_t mergeIndex) {
    std::vector<int32_t> affected = std::move(where_[p]);
    where_.erase(p);
    int32_t a = leftOf(p), b = rightOf(p);
    for (int32_t w : affected) {
      if (stamp_[w] == mergeIndex) continue;  // listed twice
      stamp_[w] = mergeIndex;
      std::vector<int32_t> &word = words_[w];
      bool present = false;
      for (size_t k = 0; k + 1 < word.size() && !present; ++k) present = word[k] == a && word[k + 1] == b;
      if (!present) continue;  // an old listing: the pair left this word in an earlier merge
      addPairs(w, -1);
      std::vector<int32_t> out;
      out.reserve(word.size());
      for (size_t k = 0; k < word.size();) {
        if (k + 1 < word.size() && word[k] == a && word[k + 1] == b) {
          out.push_back(merged);
          k += 2;
        } else {
          out.push_back(word[k++]);
        }
      }
      word = std::move(out);
      addPairs(w, +1);
    }
    for (Pair changed : changed_) {
      auto it = pairCounts_.find(changed);
      if (it != pairCounts_.end()) heap_.push({it->second, changed});
    }
    changed_.clear();
  }

 private:
  struct Entry {
    int64_t count;
    Pair pair;
    bool operator<(const Entry &o) const { return count < o.count; }  // max-heap on the count
  };

  void addPairs(int32_t w, int sign) {
    const std::vector<int32_t> &word = words_[w];
    for (size_t k = 0; k + 1 < word.size(); ++k) {
      Pair p = pairOf(word[k], word[k + 1]);
      int64_t &c = pairCounts_[p];
      c += sign * counts_[w];
      if (c == 0) pairCounts_.erase(p);
      if (sign > 0) where_[p].push_back(w);
      changed_.push_back(p);
    }
  }

  std::vector<std::vector<int32_t>> words_;
  std::vector<int64_t> counts_;
  const std::vector<std::string> &tokens_;
  std::vector<int64_t> stamp_;  // the last merge that rewrote each word
  std::unordered_map<Pair, int64_t> pairCounts_;
  std::unordered_map<Pair, std::vector<int32_t>> where_;
  std::priority_queue<Entry> heap_;
  std::vector<Pair> changed_;
};

}  // namespace

Status trainByteLevelBpe(const std::vector<std::string> &documents, int64_t vocabSize, TrainedBpe *out) {
  if (vocabSize < 257)
    return Status::error("a byte-level BPE needs a vocabulary of at least 257 tokens (256 bytes and "
                         "<|endoftext|>), got " + std::to_string(vocabSize));
  if (vocabSize > INT32_MAX) return Status::error("vocabulary size " + std::to_string(vocabSize) + " is too large");
  std::unique_ptr<Gpt2PreTokenizer> preTokenizer;
  LOOM_RETURN_IF_ERROR(Gpt2PreTokenizer::create(&preTokenizer));
  std::map<std::string, int64_t> pieceCounts;  // ordered: the words' order does not depend on hashing
  for (const std::string &doc : documents) preTokenizer->split(doc, [&](const std::string &p) { ++pieceCounts[p]; });

  TrainedBpe bpe;
  // The 256 byte symbols by code point (GPT-2's encoder.json starts with them in this order).
  std::vector<int> bytesByCodePoint(256);
  for (int b = 0; b < 256; ++b) bytesByCodePoint[b] = b;
  std::sort(bytesByCodePoint.begin(), bytesByCodePoint.end(),
            [](int x, int y) { return byteLevelCodePoint(uint8_t(x)) < byteLevelCodePoint(uint8_t(y)); });
  int32_t idOfByte[256];
  for (int k = 0; k < 256; ++k) {
    idOfByte[bytesByCodePoint[k]] = k;
    bpe.tokens.push_back(byteLevelAlphabet()[bytesByCodePoint[k]]);
  }

  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  for (auto &[piece, count] : pieceCounts) {
    std::vector<int32_t> symbols;
    for (unsigned char c : piece) symbols.push_back(idOfByte[c]);
    words.push_back(std::move(symbols));
    counts.push_back(count);
  }
  PairCounter counter(std::move(words), std::move(counts), bpe.tokens);
  for (int64_t m = 0; int64_t(bpe.tokens.size()) + 1 < vocabSize; ++m) {
    Pair p;
    if (!counter.best(&p)) break;  // every piece is one token already
    const std::string &a = bpe.tokens[leftOf(p)], &b = bpe.tokens[rightOf(p)];
    bpe.merges.push_back({a, b});
    bpe.tokens.push_back(a + b);  // `a` and `b` refer into tokens: copy before the push
    counter.merge(p, int32_t(bpe.tokens.size() - 1), m);
  }
  bpe.tokens.push_back("<|endoftext|>");
  *out = std::move(bpe);
  return Status::ok();
}

Status writeBpeFiles(const TrainedBpe &bpe, const std::string &encoderJson, const std::string &vocabBpe) {
  nlohmann::ordered_json encoder = nlohmann::ordered_json::object();
  for (size_t id = 0; id < bpe.tokens.size(); ++id) encoder[bpe.tokens[id]] = id;
  std::string merges = "#version: 0.2\n";
  for (auto &[a, b] : bpe.merges) merges += a + " " + b + "\n";
  LOOM_RETURN_IF_ERROR(writeFileAtomically(encoderJson, encoder.dump()));
  return writeFileAtomically(vocabBpe, merges);
}

}  // namespace loom
