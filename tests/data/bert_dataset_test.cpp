// BERT's data: the indexed dataset's sentences (and the GPT path unchanged), the sentence
// splitter, the metadata, and the sample construction's invariants (determinism by seed and
// index, the [CLS] A [SEP] B [SEP] layout and token types, the masking rates, the sentence-order
// labels, padding, whole-word masking), the synthetic source and the MLM yardstick.
#include "data/BertDataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "data/GptDataset.h"
#include "data/IndexedDataset.h"
#include "data/TextSources.h"

namespace loom {
namespace {

std::string tmp(const std::string &name) { return std::string(std::getenv("TEST_TMPDIR")) + "/" + name; }

std::string readFile(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

template <typename T>
void put(std::string &out, T v) {
  out.append(reinterpret_cast<const char *>(&v), sizeof v);
}

TEST(IndexedDatasetSentences, GptDocumentsAreWrittenAsBefore) {
  // The format Loom wrote before sentences existed, byte for byte: one sequence per document.
  std::vector<std::vector<int32_t>> docs = {{5, 6, 7}, {8}, {9, 10}};
  IndexedDatasetWriter writer(tmp("gpt"));
  for (auto &d : docs) writer.addDocument(d);
  ASSERT_TRUE(writer.finish().isOk());
  std::string idx("MMIDIDX\0\0", 9);
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, 8);
  put<uint64_t>(idx, 3);
  put<uint64_t>(idx, 4);
  for (int32_t s : {3, 1, 2}) put<int32_t>(idx, s);
  for (int64_t p : {0, 6, 8}) put<int64_t>(idx, p);
  for (int64_t d : {0, 1, 2, 3}) put<int64_t>(idx, d);
  EXPECT_EQ(readFile(tmp("gpt.idx")), idx);
  std::string bin;
  for (uint16_t t : {5, 6, 7, 8, 9, 10}) put<uint16_t>(bin, t);
  EXPECT_EQ(readFile(tmp("gpt.bin")), bin);
  IndexedDataset ds;
  ASSERT_TRUE(IndexedDataset::open(tmp("gpt"), &ds).isOk());
  EXPECT_TRUE(ds.oneSequencePerDocument());
  EXPECT_EQ(ds.documents(), 3);
  EXPECT_EQ(ds.documentSentences(2), (std::vector<std::vector<int32_t>>{{9, 10}}));
}

TEST(IndexedDatasetSentences, DocumentsOfSentencesRoundTrip) {
  std::vector<std::vector<std::vector<int32_t>>> docs = {
      {{1, 2, 3}, {4}, {5, 6}}, {{7}}, {}, {{8, 9}, {}, {10, 11, 12}, {13}}};
  IndexedDatasetWriter writer(tmp("sentences"));
  for (auto &d : docs) writer.addSentences(d);
  EXPECT_EQ(writer.documents(), 3);  // the one without sentences is left out
  EXPECT_EQ(writer.sequences(), 7);  // and so are empty sentences
  ASSERT_TRUE(writer.finish().isOk());
  IndexedDataset ds;
  ASSERT_TRUE(IndexedDataset::open(tmp("sentences"), &ds).isOk());
  EXPECT_FALSE(ds.oneSequencePerDocument());
  ASSERT_EQ(ds.sentenceDocuments(), 3);
  EXPECT_EQ(ds.sequences(), 7);
  EXPECT_EQ(ds.documentSentences(0), docs[0]);
  EXPECT_EQ(ds.documentSentences(1), docs[1]);
  EXPECT_EQ(ds.documentSentences(2), (std::vector<std::vector<int32_t>>{{8, 9}, {10, 11, 12}, {13}}));
  EXPECT_EQ(ds.firstSentence(2), 4);
  EXPECT_EQ(ds.documentLength(5), 3);  // the GPT view: sequence 5
  EXPECT_EQ(ds.token(5, 2), 12);
}

TEST(IndexedDatasetSentences, CorruptDocumentIndexIsOneLineError) {
  IndexedDatasetWriter writer(tmp("corrupt"));
  writer.addSentences({{1}, {2}});
  writer.addSentences({{3}});
  ASSERT_TRUE(writer.finish().isOk());
  std::string idx = readFile(tmp("corrupt.idx"));
  int64_t bad = 7;  // the last document index entry beyond the 3 sequences
  idx.replace(idx.size() - 8, 8, reinterpret_cast<const char *>(&bad), 8);
  std::ofstream(tmp("corrupt.idx"), std::ios::binary) << idx;
  IndexedDataset ds;
  Status s = IndexedDataset::open(tmp("corrupt"), &ds);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("corrupt.idx: corrupt document index"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
}

TEST(SentenceSplitter, PlainTextAndBrown) {
  EXPECT_EQ(splitSentences("Mr. Smith went to Washington. He saw the U.S. Capitol! Did he? \"Yes!\" he said.\n"
                           "It cost 3.5 dollars, e.g. a lot...\n\nA new paragraph\nwithout a stop"),
            (std::vector<std::string>{"Mr. Smith went to Washington.", "He saw the U.S. Capitol!", "Did he?",
                                      "\"Yes!\" he said.", "It cost 3.5 dollars, e.g. a lot...",
                                      "A new paragraph without a stop"}));
  EXPECT_EQ(splitSentences("J. R. R. Tolkien wrote. 第一句。第二句！"),
            (std::vector<std::string>{"J. R. R. Tolkien wrote.", "第一句。", "第二句！"}));
  EXPECT_EQ(splitSentences("  \n\n "), std::vector<std::string>{});
  std::ofstream(tmp("ca01"), std::ios::binary)
      << "\n\n\tThe/at jury/nn said/vbd ``/`` no/at ''/'' ./.\n\n\n\tIt/pps ended/vbd ./.\n\n";
  std::vector<std::vector<std::string>> docs;
  ASSERT_TRUE(readDocumentSentences(tmp("ca01"), "brown", "text", &docs).isOk());
  EXPECT_EQ(docs, (std::vector<std::vector<std::string>>{{"The jury said \"no\".", "It ended."}}));
}

TEST(BertMetadataFile, RoundTripAndErrors) {
  BertMetadata m;
  m.tokenizer = "wordpiece-uncased";
  m.vocabPath = "/v/vocab.txt";
  m.vocab.size = 30522;
  m.vocab.continuations = {2015, 2075};
  m.masking.maxNgrams = 2;
  m.documents = 3, m.sentences = 9, m.tokens = 100;
  ASSERT_TRUE(writeBertMetadata(tmp("meta"), m).isOk());
  BertMetadata r;
  Status s = readBertMetadata(tmp("meta"), &r);
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_EQ(r.vocab.size, 30522);
  EXPECT_EQ(r.vocab.mask, 103);
  EXPECT_EQ(r.vocab.continuations, m.vocab.continuations);
  EXPECT_EQ(r.masking.maxNgrams, 2);
  EXPECT_TRUE(r.masking.wholeWordMask);
  EXPECT_EQ(r.vocabPath, "/v/vocab.txt");
  // A GPT dataset given as BERT: no metadata.
  IndexedDatasetWriter gpt(tmp("gptdata"));
  gpt.addDocument({1, 2, 3});
  ASSERT_TRUE(gpt.finish().isOk());
  s = readBertMetadata(tmp("gptdata"), &r);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("gptdata.bert.json: no such file"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("not a BERT dataset"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
  std::ofstream(tmp("broken.bert.json")) << "{\"format\": \"loom-bert-dataset\", \"version\": 1}";
  s = readBertMetadata(tmp("broken"), &r);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  std::ofstream(tmp("notjson.bert.json")) << "MMIDIDX";
  s = readBertMetadata(tmp("notjson"), &r);
  EXPECT_NE(s.message().find("not JSON"), std::string::npos) << s.message();
}

// Layout, token types, padding and the tensors of a batch, on every sample drawn.
void checkLayout(const BertSample &s, const BertVocab &v, int64_t seq) {
  ASSERT_EQ(int64_t(s.tokens.size()), seq);
  ASSERT_GE(s.lengthA, 1);
  ASSERT_GE(s.lengthB, 1);
  ASSERT_EQ(s.length, s.lengthA + s.lengthB + 3);
  ASSERT_LE(s.length, seq);
  EXPECT_EQ(s.original[0], v.cls);
  EXPECT_EQ(s.original[size_t(s.lengthA + 1)], v.sep);
  EXPECT_EQ(s.original[size_t(s.length - 1)], v.sep);
  for (int64_t i = 0; i < seq; ++i) {
    size_t k = size_t(i);
    bool special = i == 0 || i == s.lengthA + 1 || i == s.length - 1;
    if (i < s.length && !special) {
      EXPECT_NE(s.original[k], v.cls);
      EXPECT_NE(s.original[k], v.sep);
      EXPECT_NE(s.original[k], v.pad);
    }
    EXPECT_EQ(s.tokenTypes[k], (i >= s.lengthA + 2 && i < s.length) ? 1 : 0) << i;
    if (special || i >= s.length) {
      EXPECT_EQ(s.masked[k], 0) << i;
      EXPECT_EQ(s.tokens[k], i >= s.length ? v.pad : s.original[k]) << i;
    }
    EXPECT_EQ(s.labels[k], s.masked[k] ? s.original[k] : 0) << i;
    if (!s.masked[k]) {
      EXPECT_EQ(s.tokens[k], s.original[k]) << i;
    }
  }
}

TEST(BertSamples, SyntheticSamplesAreDeterministicByIndex) {
  const int64_t seq = 64;
  auto a = syntheticBertData(seq, 1000, 7), b = syntheticBertData(seq, 1000, 7), c = syntheticBertData(seq, 1000, 8);
  ASSERT_GT(a->samplesPerEpoch(), 100);
  int64_t differ = 0;
  for (int64_t k = 0; k < 300; ++k) {
    BertSample x = a->build(k);
    EXPECT_EQ(x.tokens, b->build(k).tokens) << k;
    differ += x.tokens != c->build(k).tokens;
  }
  EXPECT_GT(differ, 290);  // another seed, other samples
  // Out of order and across epochs (a resume starts anywhere): the same samples.
  int64_t late = 3 * a->samplesPerEpoch() + 5;
  BertSample lateA = a->build(late);
  EXPECT_EQ(b->build(2).tokens, a->build(2).tokens);
  EXPECT_EQ(b->build(late).tokens, lateA.tokens);
  EXPECT_EQ(a->sample(late), lateA.tokens);
}

TEST(BertSamples, BatchTensors) {
  const int64_t seq = 32, count = 16;
  auto data = syntheticBertData(seq, 997, 3);
  std::map<std::string, HostTensor> batch = data->batch(40, count, seq);
  ASSERT_EQ(batch.size(), 7u);
  for (const char *name : {"tokens", "token_types", "labels", "sop_labels"}) {
    ASSERT_TRUE(batch.count(name)) << name;
    EXPECT_TRUE(batch[name].isInt) << name;
    EXPECT_EQ(batch[name].shape, (std::vector<int64_t>{count, seq})) << name;
    EXPECT_EQ(int64_t(batch[name].ints.size()), count * seq) << name;
  }
  for (const char *name : {"attention_mask", "loss_mask", "sop_mask"}) {
    ASSERT_TRUE(batch.count(name)) << name;
    EXPECT_FALSE(batch[name].isInt) << name;
    EXPECT_EQ(batch[name].shape, (std::vector<int64_t>{count, seq})) << name;
    EXPECT_EQ(int64_t(batch[name].data.size()), count * seq) << name;
  }
  for (int64_t b = 0; b < count; ++b) {
    BertSample s = data->build(40 + b);
    checkLayout(s, data->vocab(), seq);
    for (int64_t i = 0; i < seq; ++i) {
      size_t k = size_t(b * seq + i);
      EXPECT_EQ(batch["tokens"].ints[k], s.tokens[size_t(i)]);
      EXPECT_EQ(batch["token_types"].ints[k], s.tokenTypes[size_t(i)]);
      EXPECT_EQ(batch["labels"].ints[k], s.labels[size_t(i)]);
      EXPECT_EQ(batch["loss_mask"].data[k], s.masked[size_t(i)] ? 1.0f : 0.0f);
      EXPECT_EQ(batch["attention_mask"].data[k], i < s.length ? 1.0f : 0.0f);
      EXPECT_EQ(batch["sop_labels"].ints[k], i == 0 ? s.sopLabel : 0);
      EXPECT_EQ(batch["sop_mask"].data[k], i == 0 ? 1.0f : 0.0f);
    }
  }
}

// 5 standard deviations of a binomial proportion over n draws.
double bound(double p, int64_t n) { return 5 * std::sqrt(p * (1 - p) / double(n)); }

TEST(BertSamples, MaskingRatesSentenceOrderAndPadding) {
  const int64_t seq = 64, vocab = 1000, samples = 6000;
  auto data = syntheticBertData(seq, vocab, 11);
  const BertVocab &v = data->vocab();
  int64_t maskedTotal = 0, candidates = 0, lengths = 0, asMask = 0, kept = 0, swapped = 0, padded = 0, full = 0;
  for (int64_t k = 0; k < samples; ++k) {
    BertSample s = data->build(k);
    checkLayout(s, v, seq);
    int64_t masked = 0;
    for (int64_t i = 0; i < s.length; ++i) {
      if (!s.masked[size_t(i)]) continue;
      ++masked;
      asMask += s.tokens[size_t(i)] == v.mask;
      kept += s.tokens[size_t(i)] == s.original[size_t(i)];
    }
    // Plain token masking (the synthetic source): exactly num_to_predict of the non-special tokens.
    int64_t want = int64_t(std::floor(std::min(0.15 * double(s.target),
                                               double(std::max<int64_t>(1, int64_t(std::nearbyint(0.15 * double(s.length))))))));
    EXPECT_LE(s.target, seq - 3);
    EXPECT_EQ(s.numToPredict, want);
    EXPECT_EQ(masked, std::min(want, s.length - 3)) << k;
    maskedTotal += masked, candidates += s.length - 3, lengths += s.length;
    swapped += s.sopLabel;
    (s.length < seq ? padded : full) += 1;
  }
  // 15% of the tokens ([CLS] and the [SEP]s counted, as Megatron does), each sample's count
  // rounded, and capped at the floor of 15% of its target (3 fewer than the sequence): within
  // one token per sample of 15%.
  EXPECT_NEAR(double(maskedTotal) / double(lengths), 0.15, 1.0 * samples / double(lengths));
  std::printf("masked: %.4f of all tokens, %.4f of the non-special ones; full samples %lld, padded %lld\n",
              double(maskedTotal) / double(lengths), double(maskedTotal) / double(candidates), (long long)full,
              (long long)padded);
  // 80% [MASK], 10% kept, 10% random (a random id is [MASK] or the original 1 / vocab of the time).
  double pMask = 0.8 + 0.1 / vocab, pKept = 0.1 + 0.1 / vocab;
  EXPECT_NEAR(double(asMask) / double(maskedTotal), pMask, bound(pMask, maskedTotal));
  EXPECT_NEAR(double(kept) / double(maskedTotal), pKept, bound(pKept, maskedTotal));
  EXPECT_NEAR(double(swapped) / double(samples), 0.5, bound(0.5, samples));
  // Short documents and short targets: padded samples, and full ones.
  EXPECT_GT(padded, samples / 10);
  EXPECT_GT(full, samples / 10);
}

// A corpus whose token encodes (document, sentence): order and provenance are visible.
std::string orderedCorpus(const std::string &name, int docs, int sentences, int len) {
  IndexedDatasetWriter writer(tmp(name));
  for (int d = 0; d < docs; ++d) {
    std::vector<std::vector<int32_t>> doc;
    for (int s = 0; s < sentences; ++s) doc.push_back(std::vector<int32_t>(size_t(len), int32_t(1000 + d * 100 + s)));
    writer.addSentences(doc);
  }
  EXPECT_TRUE(writer.finish().isOk());
  return tmp(name);
}

TEST(BertSamples, SentenceOrderTruncationAndSplits) {
  const int64_t seq = 48;
  IndexedDataset ds;
  ASSERT_TRUE(IndexedDataset::open(orderedCorpus("ordered", 40, 12, 7), &ds).isOk());
  BertVocab v;
  v.size = 6000;
  std::shared_ptr<const SentenceCorpus> corpus = indexedSentences(ds);
  BertDataset train(corpus, v, BertMasking{}, BertDataset::Split::kTrain, 0.1, seq, 5);
  BertDataset valid(corpus, v, BertMasking{}, BertDataset::Split::kValidation, 0.1, seq, 5);
  std::vector<bool> held = validationDocuments(40, 0.1);
  std::set<int> trainDocs, validDocs;
  int64_t shortTargets = 0;
  for (BertDataset *data : {&train, &valid}) {
    ASSERT_GT(data->samplesPerEpoch(), 0);
    for (int64_t k = 0; k < 3 * data->samplesPerEpoch(); ++k) {
      BertSample s = data->build(k);
      checkLayout(s, v, seq);
      // Tokens of A and B (before masking), each from one document, sentences in order.
      std::vector<int32_t> a(s.original.begin() + 1, s.original.begin() + 1 + s.lengthA);
      std::vector<int32_t> b(s.original.begin() + 2 + s.lengthA, s.original.begin() + s.length - 1);
      int doc = (a[0] - 1000) / 100;
      for (int32_t t : a) EXPECT_EQ((t - 1000) / 100, doc);
      for (int32_t t : b) EXPECT_EQ((t - 1000) / 100, doc);
      EXPECT_TRUE(std::is_sorted(a.begin(), a.end()) && std::is_sorted(b.begin(), b.end()));
      if (s.sopLabel == 0) {
        EXPECT_LT(a.back(), b.front()) << "A before B unless swapped";
      } else {
        EXPECT_GT(a.front(), b.back()) << "swapped: B's sentences first";
      }
      (data == &train ? trainDocs : validDocs).insert(doc);
      shortTargets += s.length < seq;
    }
  }
  for (int d : validDocs) EXPECT_TRUE(held[size_t(d)]) << d;
  for (int d : trainDocs) EXPECT_FALSE(held[size_t(d)]) << d;
  EXPECT_EQ(validDocs.size(), 4u);
  EXPECT_EQ(trainDocs.size(), 36u);
  EXPECT_GT(shortTargets, 0);  // short_seq_prob's shorter targets (12 x 7 tokens per document otherwise fill it)
}

TEST(BertSamples, WholeWordAndNgramMasking) {
  // Words of 1 to 3 pieces: a word-initial id (even, from 2000) then "##" ids (odd).
  const int64_t seq = 96;
  IndexedDatasetWriter writer(tmp("words"));
  BertVocab v;
  v.size = 4000;
  for (int32_t id = 2001; id < 4000; id += 2) v.continuations.push_back(id);
  for (int d = 0; d < 60; ++d) {
    std::vector<std::vector<int32_t>> doc;
    for (int s = 0; s < 10; ++s) {
      std::vector<int32_t> sentence;
      for (int w = 0; w < 6; ++w) {
        int pieces = 1 + (d + s + w) % 3;
        sentence.push_back(2000 + 2 * ((d * 7 + s * 3 + w) % 900));
        for (int p = 1; p < pieces; ++p) sentence.push_back(2001 + 2 * ((d + s + w + p) % 900));
      }
      doc.push_back(sentence);
    }
    writer.addSentences(doc);
  }
  ASSERT_TRUE(writer.finish().isOk());
  IndexedDataset ds;
  ASSERT_TRUE(IndexedDataset::open(tmp("words"), &ds).isOk());
  auto isContinuation = [](int32_t id) { return id >= 2000 && id % 2 == 1; };
  for (int ngrams : {1, 3}) {
    BertMasking m;
    m.maxNgrams = ngrams;
    BertDataset data(indexedSentences(ds), v, m, BertDataset::Split::kTrain, 0.05, seq, 9);
    int64_t masked = 0, budget = 0, runs = 0, longRuns = 0;
    for (int64_t k = 0; k < 2000; ++k) {
      BertSample s = data.build(k);
      checkLayout(s, v, seq);
      int64_t n = 0;
      for (int64_t i = 1; i < s.length; ++i) {
        n += s.masked[size_t(i)];
        // A "##" piece is masked exactly when the piece before it in its word is.
        if (isContinuation(s.original[size_t(i)]) && s.original[size_t(i - 1)] != v.cls &&
            s.original[size_t(i - 1)] != v.sep) {
          EXPECT_EQ(s.masked[size_t(i)], s.masked[size_t(i - 1)]) << "sample " << k << " position " << i;
        }
        // Runs of masked whole words.
        if (s.masked[size_t(i)] && !s.masked[size_t(i - 1)]) {
          int64_t words = 0, j = i;
          for (; j < s.length && s.masked[size_t(j)]; ++j) words += !isContinuation(s.original[size_t(j)]);
          ++runs, longRuns += words > 1;
        }
      }
      EXPECT_LE(n, s.numToPredict);
      masked += n, budget += s.numToPredict;
    }
    // Whole words rarely fit the budget exactly; nearly all of it is used.
    EXPECT_GT(double(masked) / double(budget), 0.9) << ngrams;
    // n-grams: runs of several words (1/k weights: P(k > 1) = 5/11, less where a run is cut to
    // the budget or by a segment's end: about a third measured); single words otherwise (where
    // two neighbours drawn apart touch: about 14%).
    std::printf("max_ngrams %d: %.3f of the masking budget used, %.3f of the masked runs several words\n", ngrams,
                double(masked) / double(budget), double(longRuns) / double(runs));
    if (ngrams == 3) {
      EXPECT_GT(double(longRuns) / double(runs), 0.27);
    } else {
      EXPECT_LT(double(longRuns) / double(runs), 0.2);
    }
  }
}

TEST(BertBaselineYardstick, MostFrequentMaskedToken) {
  // 60% of the tokens are 1500, the rest spread over 2000..2999: predicting 1500 is right about
  // 60% of the time.
  IndexedDatasetWriter writer(tmp("skewed"));
  for (int d = 0; d < 80; ++d) {
    std::vector<std::vector<int32_t>> doc;
    for (int s = 0; s < 8; ++s) {
      std::vector<int32_t> sentence;
      for (int i = 0; i < 20; ++i) {
        int x = (d * 131 + s * 17 + i * 7) % 10;
        sentence.push_back(x < 6 ? 1500 : 2000 + (d * 31 + s * 7 + i * 13) % 1000);
      }
      doc.push_back(sentence);
    }
    writer.addSentences(doc);
  }
  ASSERT_TRUE(writer.finish().isOk());
  IndexedDataset ds;
  ASSERT_TRUE(IndexedDataset::open(tmp("skewed"), &ds).isOk());
  BertMetadata meta;
  meta.vocab.size = 3000;
  BertBaseline b = bertBaseline(ds, meta, 0.1, 64, 1);
  EXPECT_EQ(b.token, 1500);
  EXPECT_GT(b.validMasked, 100);
  EXPECT_NEAR(b.accuracy, 0.6, 0.1);  // 158 masked positions: 2.5 standard deviations
}

}  // namespace
}  // namespace loom
