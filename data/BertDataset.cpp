#include "data/BertDataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "data/GptDataset.h"
#include "formats/Safetensors.h"
#include "runtime/cpu/Philox.h"
#include "support/FileIO.h"

namespace loom {
namespace {

constexpr int64_t kLongSentence = 512;  // Megatron's LONG_SENTENCE_LEN: such documents are left out
// Philox streams (the counter's last word) of the dataset's draws.
constexpr uint32_t kGroupStream = 0xBE270001u, kSampleStream = 0xBE270002u, kCorpusStream = 0xBE270003u;
constexpr uint64_t kOrderStream = uint64_t(0xBE270004u) << 32;

// Draws of one (seed, stream, index): Philox4x32 blocks at counters 0, 1, 2, ...
class Draws {
 public:
  Draws(uint64_t seed, uint32_t stream, uint64_t index) : seed_(seed), stream_(stream), index_(index) {}
  uint32_t next() {
    if (used_ == 4) {
      block_ = cpu::philox4x32({counter_++, uint32_t(index_), uint32_t(index_ >> 32), stream_},
                               {uint32_t(seed_), uint32_t(seed_ >> 32)});
      used_ = 0;
    }
    return block_[size_t(used_++)];
  }
  // Uniform in [0, 1), 53 bits.
  double uniform() {
    uint64_t a = next() >> 5, b = next() >> 6;
    return double(a * 67108864u + b) * (1.0 / 9007199254740992.0);
  }
  // Uniform in [0, n) (n > 0; the modulo bias of 64 bits is negligible).
  int64_t below(int64_t n) {
    uint64_t hi = next(), lo = next();  // in this order on every compiler
    return int64_t(((hi << 32) | lo) % uint64_t(n));
  }

 private:
  uint64_t seed_;
  uint32_t stream_;
  uint64_t index_;
  uint32_t counter_ = 0;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
};

class IndexedSentences : public SentenceCorpus {
 public:
  explicit IndexedSentences(const IndexedDataset &d) : d_(d) {}
  int64_t documents() const override { return d_.sentenceDocuments(); }
  int64_t firstSentence(int64_t doc) const override { return d_.firstSentence(doc); }
  int64_t sentenceLength(int64_t s) const override { return d_.documentLength(s); }
  int32_t token(int64_t s, int64_t i) const override { return d_.token(s, i); }

 private:
  const IndexedDataset &d_;
};

class MemorySentences : public SentenceCorpus {
 public:
  int64_t documents() const override { return int64_t(docStart_.size()) - 1; }
  int64_t firstSentence(int64_t doc) const override { return docStart_[size_t(doc)]; }
  int64_t sentenceLength(int64_t s) const override { return start_[size_t(s) + 1] - start_[size_t(s)]; }
  int32_t token(int64_t s, int64_t i) const override { return tokens_[size_t(start_[size_t(s)] + i)]; }

  std::vector<int64_t> docStart_{0}, start_{0};
  std::vector<int32_t> tokens_;
};

// Python's round(): to nearest, ties to even (the default floating-point rounding mode).
int64_t roundHalfEven(double x) { return int64_t(std::nearbyint(x)); }

}  // namespace

std::unique_ptr<SentenceCorpus> indexedSentences(const IndexedDataset &data) {
  return std::make_unique<IndexedSentences>(data);
}

std::unique_ptr<SentenceCorpus> syntheticSentences(int64_t documents, int64_t seq, int64_t vocab, uint64_t seed) {
  auto c = std::make_unique<MemorySentences>();
  int64_t maxLen = std::max<int64_t>(2, seq / 2);
  for (int64_t d = 0; d < documents; ++d) {
    Draws r(seed, kCorpusStream, uint64_t(d));
    int64_t sentences = 1 + r.below(8);
    for (int64_t s = 0; s < sentences; ++s) {
      int64_t len = 1 + r.below(maxLen);
      for (int64_t i = 0; i < len; ++i) c->tokens_.push_back(int32_t(104 + r.below(vocab - 104)));
      c->start_.push_back(int64_t(c->tokens_.size()));
    }
    c->docStart_.push_back(int64_t(c->start_.size()) - 1);
  }
  return c;
}

BertDataset::BertDataset(std::shared_ptr<const SentenceCorpus> corpus, BertVocab vocab, BertMasking masking,
                         Split split, double validationFraction, int64_t seq, uint64_t seed)
    : corpus_(std::move(corpus)), vocab_(std::move(vocab)), masking_(masking), seq_(seq), seed_(seed) {
  continuation_.assign(size_t(std::max<int64_t>(vocab_.size, 0)), false);
  for (int32_t id : vocab_.continuations)
    if (id >= 0 && id < vocab_.size) continuation_[size_t(id)] = true;
  const int64_t maxTokens = seq_ - 3;  // [CLS] A [SEP] B [SEP]
  if (maxTokens < 2) return;           // no room for two segments: no samples
  int64_t n = corpus_->documents();
  std::vector<bool> held = validationDocuments(n, validationFraction);
  for (int64_t doc = 0; doc < n; ++doc) {
    if (held[size_t(doc)] != (split == Split::kValidation)) continue;
    int64_t first = corpus_->firstSentence(doc), last = corpus_->firstSentence(doc + 1);
    if (last - first < 2) continue;
    bool longSentence = false;
    for (int64_t s = first; s < last && !longSentence; ++s) longSentence = corpus_->sentenceLength(s) > kLongSentence;
    if (longSentence) continue;
    Draws r(seed_, kGroupStream, uint64_t(doc));
    auto target = [&] {
      if (masking_.shortSeqProb > 0 && r.uniform() < masking_.shortSeqProb) return 2 + r.below(maxTokens - 1);
      return maxTokens;
    };
    int64_t start = first, len = 0, sentences = 0, remaining = last - first, want = target();
    for (int64_t s = first; s < last; ++s) {
      len += corpus_->sentenceLength(s), ++sentences, --remaining;
      if ((len >= want && remaining > 1 && sentences >= 2) || remaining == 0) {
        groups_.push_back(Group{start, s + 1, want});
        start = s + 1, len = 0, sentences = 0, want = target();
      }
    }
  }
}

int64_t BertDataset::groupOf(int64_t index) {
  int64_t perEpoch = samplesPerEpoch(), e = index / perEpoch;
  if (cachedEpoch_ != e) {
    order_ = philoxPermutation(perEpoch, seed_, kOrderStream | uint64_t(e));
    cachedEpoch_ = e;
  }
  return order_[size_t(index % perEpoch)];
}

BertSample BertDataset::build(int64_t index) {
  BertSample out;
  out.tokens.assign(size_t(seq_), vocab_.pad);
  out.tokenTypes.assign(size_t(seq_), 0);
  out.labels.assign(size_t(seq_), 0);
  out.masked.assign(size_t(seq_), 0);
  out.original.assign(size_t(seq_), vocab_.pad);
  if (groups_.empty()) return out;
  const Group &g = groups_[size_t(groupOf(index))];
  Draws r(seed_, kSampleStream, uint64_t(index));

  // A and B: the group split after a random sentence, swapped half of the time.
  int64_t sentences = g.end - g.first, aEnd = 1;
  if (sentences >= 3) aEnd = 1 + r.below(sentences - 1);
  std::vector<int32_t> a, b;
  for (int64_t s = g.first; s < g.end; ++s)
    for (int64_t i = 0; i < corpus_->sentenceLength(s); ++i) (s < g.first + aEnd ? a : b).push_back(corpus_->token(s, i));
  if (r.uniform() < 0.5) std::swap(a, b), out.sopLabel = 1;

  // Truncated to the target: a token at a time from the longer, at a random end.
  size_t aLo = 0, aHi = a.size(), bLo = 0, bHi = b.size();
  while (int64_t(aHi - aLo + bHi - bLo) > g.target) {
    bool fromA = aHi - aLo > bHi - bLo;
    size_t &lo = fromA ? aLo : bLo, &hi = fromA ? aHi : bHi;
    if (r.uniform() < 0.5) ++lo;
    else --hi;
  }

  // [CLS] A [SEP] B [SEP].
  std::vector<int32_t> &t = out.original;
  int64_t n = 0;
  t[size_t(n++)] = vocab_.cls;
  for (size_t i = aLo; i < aHi; ++i) t[size_t(n++)] = a[i];
  t[size_t(n++)] = vocab_.sep;
  for (size_t i = bLo; i < bHi; ++i) out.tokenTypes[size_t(n)] = 1, t[size_t(n++)] = b[i];
  out.tokenTypes[size_t(n)] = 1, t[size_t(n++)] = vocab_.sep;
  out.length = n, out.lengthA = int64_t(aHi - aLo), out.lengthB = int64_t(bHi - bLo), out.target = g.target;
  std::copy(t.begin(), t.end(), out.tokens.begin());

  // Masking candidates: whole words (a "##" piece joins the word before it).
  std::vector<std::vector<int64_t>> words;
  for (int64_t i = 0; i < n; ++i) {
    int32_t id = t[size_t(i)];
    if (id == vocab_.cls || id == vocab_.sep) continue;
    bool continues = masking_.wholeWordMask && id >= 0 && id < vocab_.size && continuation_[size_t(id)];
    if (continues && !words.empty() && words.back().back() == i - 1) words.back().push_back(i);
    else words.push_back({i});
  }
  // Megatron's create_masked_lm_predictions: num_to_predict = min(max_predictions_per_seq,
  // max(1, round(len * p))) with max_predictions_per_seq = p * max_num_tokens (the sample's
  // target, a float); a word that would pass it is skipped, so at most its floor is masked.
  int64_t numToPredict = int64_t(std::floor(std::min(masking_.maskProb * double(g.target),
                                                     double(std::max<int64_t>(1, roundHalfEven(double(n) * masking_.maskProb))))));
  out.numToPredict = numToPredict;
  if (masking_.maskProb <= 0 || words.empty()) return out;
  std::vector<int64_t> starts(words.size());
  for (size_t i = 0; i < starts.size(); ++i) starts[i] = int64_t(i);
  for (size_t i = starts.size() - 1; i > 0; --i) std::swap(starts[i], starts[size_t(r.below(int64_t(i) + 1))]);
  // n-gram lengths 1..maxNgrams with probabilities proportional to 1/k.
  int maxN = std::max(1, masking_.maxNgrams);
  double harmonic = 0;
  for (int k = 1; k <= maxN; ++k) harmonic += 1.0 / k;
  int64_t masked = 0;
  std::vector<int64_t> set;
  for (int64_t w : starts) {
    if (masked >= numToPredict) break;
    int k = 1;
    if (maxN > 1) {
      double u = r.uniform() * harmonic, acc = 0;
      for (k = 1; k < maxN; ++k)
        if (u < (acc += 1.0 / k)) break;
    }
    for (; k >= 1; --k) {  // the longest of k, k - 1, ..., 1 words that fits the budget
      set.clear();
      for (int64_t j = w; j < std::min<int64_t>(w + k, int64_t(words.size())); ++j)
        set.insert(set.end(), words[size_t(j)].begin(), words[size_t(j)].end());
      if (masked + int64_t(set.size()) <= numToPredict) break;
    }
    if (k < 1) continue;
    if (std::any_of(set.begin(), set.end(), [&](int64_t p) { return out.masked[size_t(p)] != 0; })) continue;
    for (int64_t p : set) {
      out.masked[size_t(p)] = 1;
      out.labels[size_t(p)] = t[size_t(p)];
      if (r.uniform() < 0.8) out.tokens[size_t(p)] = vocab_.mask;
      else if (r.uniform() >= 0.5) out.tokens[size_t(p)] = int32_t(r.below(vocab_.size));
      // else the token stays
    }
    masked += int64_t(set.size());
  }
  return out;
}

std::vector<int32_t> BertDataset::sample(int64_t index) { return build(index).tokens; }

std::map<std::string, HostTensor> BertDataset::batch(int64_t first, int64_t count, int64_t seq) {
  if (seq != seq_) {
    std::fprintf(stderr, "loom: error: a BERT micro-batch of sequence length %lld from a dataset built for %lld\n",
                 (long long)seq, (long long)seq_);
    std::abort();
  }
  auto ints = [&] {
    HostTensor h{{count, seq}};
    h.isInt = true;
    h.ints.assign(size_t(count * seq), 0);
    return h;
  };
  HostTensor tokens = ints(), types = ints(), labels = ints(), sop = ints();
  HostTensor attention = HostTensor::zeros({count, seq}), loss = HostTensor::zeros({count, seq}),
             sopMask = HostTensor::zeros({count, seq});
  for (int64_t b = 0; b < count; ++b) {
    BertSample s = build(first + b);
    size_t row = size_t(b * seq);
    for (int64_t i = 0; i < seq; ++i) {
      tokens.ints[row + size_t(i)] = s.tokens[size_t(i)];
      types.ints[row + size_t(i)] = s.tokenTypes[size_t(i)];
      labels.ints[row + size_t(i)] = s.labels[size_t(i)];
      attention.data[row + size_t(i)] = i < s.length ? 1.0f : 0.0f;
      loss.data[row + size_t(i)] = s.masked[size_t(i)] ? 1.0f : 0.0f;
    }
    sop.ints[row] = s.sopLabel;
    sopMask.data[row] = 1.0f;
  }
  return {{"tokens", tokens},        {"token_types", types}, {"attention_mask", attention}, {"labels", labels},
          {"loss_mask", loss},       {"sop_labels", sop},    {"sop_mask", sopMask}};
}

std::unique_ptr<BertDataset> syntheticBertData(int64_t seq, int64_t vocab, uint64_t seed) {
  BertVocab v;
  v.size = vocab;
  BertMasking m;
  m.wholeWordMask = false, m.maxNgrams = 1;
  std::shared_ptr<const SentenceCorpus> corpus = syntheticSentences(512, seq, vocab, seed);
  return std::make_unique<BertDataset>(corpus, v, m, BertDataset::Split::kTrain, 0.0, seq, seed);
}

BertBaseline bertBaseline(const IndexedDataset &data, const BertMetadata &meta, double validationFraction, int64_t seq,
                          uint64_t seed) {
  std::shared_ptr<const SentenceCorpus> corpus = indexedSentences(data);
  BertDataset train(corpus, meta.vocab, meta.masking, BertDataset::Split::kTrain, validationFraction, seq, seed);
  BertDataset valid(corpus, meta.vocab, meta.masking, BertDataset::Split::kValidation, validationFraction, seq, seed);
  BertBaseline out;
  std::unordered_map<int32_t, int64_t> counts;
  out.trainSamples = train.samplesPerEpoch(), out.validSamples = valid.samplesPerEpoch();
  for (int64_t k = 0; k < out.trainSamples; ++k) {
    BertSample s = train.build(k);
    for (int64_t i = 0; i < seq; ++i)
      if (s.masked[size_t(i)]) ++counts[s.labels[size_t(i)]], ++out.trainMasked;
  }
  int64_t best = 0;
  for (auto &[id, c] : counts)
    if (c > best || (c == best && id < out.token)) best = c, out.token = id;
  out.trainHits = best;
  for (int64_t k = 0; k < out.validSamples; ++k) {
    BertSample s = valid.build(k);
    for (int64_t i = 0; i < seq; ++i)
      if (s.masked[size_t(i)]) ++out.validMasked, out.validHits += s.labels[size_t(i)] == out.token;
  }
  out.accuracy = out.validMasked ? double(out.validHits) / double(out.validMasked) : 0;
  return out;
}

std::string bertMetadataPath(const std::string &prefix) { return prefix + ".bert.json"; }

Status writeBertMetadata(const std::string &prefix, const BertMetadata &meta) {
  nlohmann::ordered_json j;
  j["format"] = "loom-bert-dataset";
  j["version"] = 1;
  j["tokenizer"] = meta.tokenizer;
  j["vocab"] = meta.vocabPath;
  j["vocab_size"] = meta.vocab.size;
  j["special_ids"] = {{"pad", meta.vocab.pad}, {"unk", meta.vocab.unk}, {"cls", meta.vocab.cls},
                      {"sep", meta.vocab.sep}, {"mask", meta.vocab.mask}};
  j["masking"] = {{"mask_prob", meta.masking.maskProb}, {"short_seq_prob", meta.masking.shortSeqProb},
                  {"whole_word_mask", meta.masking.wholeWordMask}, {"max_ngrams", meta.masking.maxNgrams}};
  j["documents"] = meta.documents;
  j["sentences"] = meta.sentences;
  j["tokens"] = meta.tokens;
  // The "##" pieces' ids on one line, after the fields a person reads.
  std::string text = j.dump(1);
  text.resize(text.size() - 2);  // "\n}"
  text += ",\n \"continuation_ids\": " + nlohmann::json(meta.vocab.continuations).dump() + "\n}\n";
  return writeFileAtomically(bertMetadataPath(prefix), text);
}

Status readBertMetadata(const std::string &prefix, BertMetadata *meta) {
  std::string path = bertMetadataPath(prefix), bytes;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return Status::error(path + ": no such file: " + prefix + " is not a BERT dataset (a GPT one? write one with "
                         "loom-preprocess --tokenizer wordpiece)");
  LOOM_RETURN_IF_ERROR(readWholeFile(path, "the BERT dataset's metadata", &bytes));
  nlohmann::json j = nlohmann::json::parse(bytes, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::error(path + ": not JSON");
  if (j.value("format", "") != "loom-bert-dataset" || j.value("version", 0) != 1)
    return Status::error(path + ": not a loom-bert-dataset version 1 file");
  try {
    BertMetadata m;
    m.tokenizer = j.at("tokenizer").get<std::string>();
    m.vocabPath = j.value("vocab", "");
    m.vocab.size = j.at("vocab_size").get<int64_t>();
    const auto &sp = j.at("special_ids");
    m.vocab.pad = sp.at("pad").get<int32_t>(), m.vocab.unk = sp.at("unk").get<int32_t>();
    m.vocab.cls = sp.at("cls").get<int32_t>(), m.vocab.sep = sp.at("sep").get<int32_t>();
    m.vocab.mask = sp.at("mask").get<int32_t>();
    m.vocab.continuations = j.at("continuation_ids").get<std::vector<int32_t>>();
    const auto &mk = j.at("masking");
    m.masking.maskProb = mk.at("mask_prob").get<double>();
    m.masking.shortSeqProb = mk.at("short_seq_prob").get<double>();
    m.masking.wholeWordMask = mk.at("whole_word_mask").get<bool>();
    m.masking.maxNgrams = mk.at("max_ngrams").get<int>();
    m.documents = j.value("documents", int64_t(0));
    m.sentences = j.value("sentences", int64_t(0));
    m.tokens = j.value("tokens", int64_t(0));
    for (int32_t id : {m.vocab.pad, m.vocab.unk, m.vocab.cls, m.vocab.sep, m.vocab.mask})
      if (id < 0 || id >= m.vocab.size) return Status::error(path + ": a special id outside the vocabulary");
    if (m.vocab.size <= 0 || m.vocab.size > 65536) return Status::error(path + ": vocab_size out of range");
    if (!(m.masking.maskProb >= 0 && m.masking.maskProb < 1) || !(m.masking.shortSeqProb >= 0 && m.masking.shortSeqProb <= 1) ||
        m.masking.maxNgrams < 1)
      return Status::error(path + ": masking settings out of range");
    *meta = std::move(m);
  } catch (const nlohmann::json::exception &e) {
    return Status::error(path + ": " + e.what());
  }
  return Status::ok();
}

}  // namespace loom
