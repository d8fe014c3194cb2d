// BERT pre-training samples (Megatron-LM's BertDataset: megatron/data/dataset_utils.py and
// bert_dataset.py), from a sentence-split indexed dataset or from synthetic documents.
//
// Sample groups: each document of the split with at least two sentences (and none over 512
// tokens, Megatron's LONG_SENTENCE_LEN) is cut into runs of consecutive sentences: a run ends
// once its tokens reach the target length (max_seq - 3; with probability short_seq_prob 0.1 a
// random target in [2, max_seq - 3] instead) and at least two sentences hold it and at least
// two remain, or at the document's end. The groups are drawn once from the seed; each epoch
// visits them in a new shuffled order.
// A sample from a group (everything drawn from (seed, global sample index) with Philox, so sample
// k is the same in every run, on every rank, after a resume): the group split at a random
// sentence into A and B, swapped with probability 0.5 (the sentence-order label, 1 when
// swapped), truncated to the target (one token at a time from the longer, at a random end),
// laid out [CLS] A [SEP] B [SEP], then masked: num_to_predict = floor(min(0.15 target,
// max(1, round(0.15 len)))) of the non-special tokens (len counts [CLS] and the [SEP]s; target is
// the sample's max_num_tokens: Megatron's max_predictions_per_seq), each
// chosen one [MASK] 80% of the time, a random id in [0, vocab) 10%, kept 10%; with whole-word
// masking a "##" piece is masked with its word, and with max_ngrams n > 1 runs of up to n whole
// words are masked together (n-gram length k with probability proportional to 1/k, Megatron's
// default n = 3: the Megatron-LM paper's whole-word n-gram masking), a run that would exceed
// num_to_predict shortened or skipped. Then padding with [PAD] (id 0) to max_seq.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/DataSource.h"
#include "data/IndexedDataset.h"
#include "support/Status.h"

namespace loom {

// What the sample construction needs of the tokenizer.
struct BertVocab {
  int64_t size = 0;  // random replacements are drawn from [0, size)
  int32_t pad = 0, unk = 100, cls = 101, sep = 102, mask = 103;
  std::vector<int32_t> continuations;  // sorted ids of "##" pieces (whole-word masking)
};

struct BertMasking {
  double maskProb = 0.15;
  double shortSeqProb = 0.1;
  bool wholeWordMask = true;
  int maxNgrams = 3;
};

// PREFIX.bert.json, written by loom-preprocess beside PREFIX.bin/.idx (see loom_preprocess.cpp).
struct BertMetadata {
  std::string tokenizer;  // "wordpiece-uncased"
  std::string vocabPath;  // the vocab.txt it was tokenized with (absolute)
  BertVocab vocab;
  BertMasking masking;
  int64_t documents = 0, sentences = 0, tokens = 0;
};
std::string bertMetadataPath(const std::string &prefix);
Status writeBertMetadata(const std::string &prefix, const BertMetadata &meta);
// One-line errors: no such file ("PREFIX.bert.json: ... a GPT dataset?"), not JSON, a field missing.
Status readBertMetadata(const std::string &prefix, BertMetadata *meta);

// A corpus of documents of sentences.
class SentenceCorpus {
 public:
  virtual ~SentenceCorpus() = default;
  virtual int64_t documents() const = 0;
  virtual int64_t firstSentence(int64_t doc) const = 0;  // doc's sentences: [first(doc), first(doc + 1))
  virtual int64_t sentenceLength(int64_t s) const = 0;
  virtual int32_t token(int64_t s, int64_t i) const = 0;
};
// The sentence view of an indexed dataset (which must outlive it).
std::unique_ptr<SentenceCorpus> indexedSentences(const IndexedDataset &data);
// `documents` random documents of 1 to 8 sentences of 1 to max(2, seq / 2) ids in
// [104, vocab), from the seed: many are shorter than a sample, so samples are padded too.
std::unique_ptr<SentenceCorpus> syntheticSentences(int64_t documents, int64_t seq, int64_t vocab, uint64_t seed);

// One sample before it becomes tensors; every vector has max_seq entries.
struct BertSample {
  std::vector<int32_t> tokens;      // masked input, [PAD] after `length`
  std::vector<int32_t> tokenTypes;  // 0: [CLS] A [SEP] and padding; 1: B [SEP]
  std::vector<int32_t> labels;      // the original token at masked positions, else 0
  std::vector<uint8_t> masked;      // 1 at masked positions
  std::vector<int32_t> original;    // the tokens before masking (padding 0)
  int64_t length = 0;               // [CLS] A [SEP] B [SEP]
  int64_t lengthA = 0, lengthB = 0;
  int32_t sopLabel = 0;             // 1 when A and B were swapped
  int64_t numToPredict = 0;
  int64_t target = 0;  // the group's target: A and B's tokens at most (Megatron's max_num_tokens)
};

class BertDataset : public DataSource {
 public:
  enum class Split { kTrain, kValidation };
  // The split's documents as validationDocuments(corpus documents, validationFraction) says.
  BertDataset(std::shared_ptr<const SentenceCorpus> corpus, BertVocab vocab, BertMasking masking, Split split,
              double validationFraction, int64_t seq, uint64_t seed);

  // Tokens of sample `index`: the masked input, max_seq of them (BERT has no next-token view).
  std::vector<int32_t> sample(int64_t index) override;
  // tokens, token_types, labels, sop_labels (int32) and attention_mask, loss_mask, sop_mask
  // (float), each [count, seq]; sop_labels holds the label at position 0, sop_mask is 1 there.
  std::map<std::string, HostTensor> batch(int64_t first, int64_t count, int64_t seq) override;
  BertSample build(int64_t index);

  int64_t samplesPerEpoch() const { return int64_t(groups_.size()); }
  int64_t seq() const { return seq_; }
  const BertVocab &vocab() const { return vocab_; }

 private:
  struct Group {
    int64_t first, end;  // sentences [first, end)
    int64_t target;      // tokens of A and B together at most
  };
  int64_t groupOf(int64_t index);

  std::shared_ptr<const SentenceCorpus> corpus_;
  BertVocab vocab_;
  BertMasking masking_;
  int64_t seq_;
  uint64_t seed_;
  std::vector<Group> groups_;
  std::vector<bool> continuation_;  // by id
  int64_t cachedEpoch_ = -1;
  std::vector<int64_t> order_;
};

// The synthetic BERT source for runs without a dataset: syntheticSentences(512 documents)
// through the same construction, BERT's special ids, no word pieces (every id a whole word)
// and plain token masking (max_ngrams 1). Needs vocab > 104.
std::unique_ptr<BertDataset> syntheticBertData(int64_t seq, int64_t vocab, uint64_t seed);

// The MLM yardstick: the accuracy of always predicting the training split's most frequent
// masked label, on the validation split's masked positions (one epoch of samples of each).
struct BertBaseline {
  int32_t token = -1;
  int64_t trainMasked = 0, trainHits = 0, validMasked = 0, validHits = 0;
  int64_t trainSamples = 0, validSamples = 0;
  double accuracy = 0;
};
BertBaseline bertBaseline(const IndexedDataset &data, const BertMetadata &meta, double validationFraction, int64_t seq,
                          uint64_t seed);

}  // namespace loom
