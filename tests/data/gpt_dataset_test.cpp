// The GPT dataset's train/validation split: validation documents spread evenly over the corpus
// (a corpus stored in genre order must not hold out only its last genre), disjoint from the
// training documents, together all of them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <string>

#include "data/GptDataset.h"
#include "data/IndexedDataset.h"

namespace loom {
namespace {

TEST(GptDatasetSplit, ValidationDocumentsAreSpreadOverTheCorpus) {
  // 40 documents; every token of document d is d, so a sample's tokens name its documents.
  std::string prefix = std::string(std::getenv("TEST_TMPDIR")) + "/docs";
  IndexedDatasetWriter writer(prefix);
  for (int d = 0; d < 40; ++d) writer.addDocument(std::vector<int32_t>(7, d));
  ASSERT_TRUE(writer.finish().isOk());
  IndexedDataset data;
  ASSERT_TRUE(IndexedDataset::open(prefix, &data).isOk());

  GptDataset train(data, GptDataset::Split::kTrain, 0.1, 4, 11), valid(data, GptDataset::Split::kValidation, 0.1, 4, 11);
  EXPECT_EQ(train.tokens() + valid.tokens(), 40 * 7);
  std::set<int32_t> seenTrain, seenValid;
  for (int64_t i = 0; i < train.samplesPerEpoch(); ++i)
    for (int32_t t : train.sample(i)) seenTrain.insert(t);
  for (int64_t i = 0; i < valid.samplesPerEpoch(); ++i)
    for (int32_t t : valid.sample(i)) seenValid.insert(t);
  // 4 validation documents, at (k + 1/2) * 40 / 4.
  EXPECT_EQ(seenValid, (std::set<int32_t>{5, 15, 25, 35}));
  for (int32_t d : seenValid) EXPECT_EQ(seenTrain.count(d), 0u) << "document " << d << " is in both splits";
  EXPECT_EQ(seenTrain.size(), 36u);
}

TEST(GptDatasetSplit, ReferenceLossesSeeWhatABigramPredicts) {
  // Each document alternates two tokens chosen by its index: a bigram count model from the
  // training documents predicts the held-out ones almost surely, a unigram cannot.
  std::string prefix = std::string(std::getenv("TEST_TMPDIR")) + "/pairs";
  IndexedDatasetWriter writer(prefix);
  for (int d = 0; d < 60; ++d) {
    std::vector<int32_t> doc;
    for (int i = 0; i < 50; ++i) doc.push_back(2 * (d % 7) + i % 2);
    writer.addDocument(doc);
  }
  ASSERT_TRUE(writer.finish().isOk());
  IndexedDataset data;
  ASSERT_TRUE(IndexedDataset::open(prefix, &data).isOk());
  ReferenceLosses r = referenceLosses(data, 0.1);
  EXPECT_EQ(r.trainTokens + r.validTokens, 60 * 50);
  EXPECT_EQ(r.validTokens, 6 * 50);
  EXPECT_NEAR(r.unigram, std::log(14.0), 0.15);  // 14 tokens, about equally frequent
  EXPECT_LT(r.bigram, 0.4);
}

}  // namespace
}  // namespace loom
