// GPT training samples from an indexed dataset (Megatron's GPTDataset): documents are split
// into a training and a held-out validation set; each epoch concatenates its documents in a
// shuffled order and cuts the stream into samples of seq + 1 tokens (inputs and next-token
// labels), crossing document boundaries; sample order is shuffled too. Everything derives
// from the seed, so sample k is the same in every run and after every resume.
#pragma once

#include <memory>
#include <vector>

#include "data/DataSource.h"
#include "data/IndexedDataset.h"

namespace loom {

// Fisher-Yates with Philox draws: a permutation of 0..n-1 that depends only on (seed, stream).
std::vector<int64_t> philoxPermutation(int64_t n, uint64_t seed, uint64_t stream);

// Which of `documents` documents form the validation split for `validationFraction` (at
// least one): document k of them at (k + 1/2) n / count, evenly spread over the corpus.
std::vector<bool> validationDocuments(int64_t documents, double validationFraction);

// Held-out cross-entropies (nats per token) of two count models built from the training
// split's documents and scored on the validation split's: the unigram (add-0.1 smoothing over
// the ids the corpus uses) and the bigram with absolute discounting (D = 0.75) interpolated
// with that unigram (Ney, Essen and Kneser 1994). Yardsticks for a trained model's loss.
struct ReferenceLosses {
  double unigram = 0, bigram = 0;
  int64_t trainTokens = 0, validTokens = 0;
};
ReferenceLosses referenceLosses(const IndexedDataset &data, double validationFraction);

class GptDataset : public DataSource {
 public:
  enum class Split { kTrain, kValidation };
  // `validationFraction` of the documents (at least one) form the validation split, spread
  // evenly over the corpus (document k of them at (k + 1/2) n / count): a corpus stored in
  // genre or source order, as Brown's files are, would otherwise hold out its last genre.
  GptDataset(const IndexedDataset &data, Split split, double validationFraction, int64_t seq, uint64_t seed);

  std::vector<int32_t> sample(int64_t index) override;
  int64_t samplesPerEpoch() const { return samplesPerEpoch_; }
  int64_t tokens() const { return tokensPerEpoch_; }

 private:
  struct Epoch {
    int64_t number = -1;
    std::vector<int64_t> docs;        // document order
    std::vector<int64_t> docStart;    // offset of each document in the epoch's stream
    std::vector<int64_t> sampleOrder; // shuffled sample positions
  };
  const Epoch &epoch(int64_t e);

  const IndexedDataset &data_;
  std::vector<int64_t> docs_;
  int64_t seq_, tokensPerEpoch_ = 0, samplesPerEpoch_ = 0;
  uint64_t seed_;
  Epoch cached_;
};

}  // namespace loom
