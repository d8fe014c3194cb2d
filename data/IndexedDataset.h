// Megatron's memory-mapped indexed dataset: PREFIX.bin holds the token ids of every document
// back to back; PREFIX.idx holds the header ("MMIDIDX\0\0", version 1, dtype code), the
// number of sequences and documents, each sequence's length (int32) and byte offset (int64),
// and the index of the first sequence of each document (int64, n_docs + 1 entries).
// For GPT, Loom writes one sequence per document, ending with <|endoftext|>, as Megatron's
// preprocess_data.py does with --append-eod. For BERT it writes one sequence per sentence, the
// document index grouping a document's sentences, as preprocess_data.py does with
// --split-sentences (no end-of-document token).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/Status.h"

namespace loom {

class IndexedDatasetWriter {
 public:
  explicit IndexedDatasetWriter(std::string prefix) : prefix_(std::move(prefix)) {}
  // A document as one sequence (GPT).
  void addDocument(const std::vector<int32_t> &tokens);
  // A document as its sentences, one sequence each (BERT); empty sentences are left out, and
  // a document without any sentence is not added.
  void addSentences(const std::vector<std::vector<int32_t>> &sentences);
  // Writes PREFIX.bin and PREFIX.idx (each atomically). Token ids must fit uint16.
  Status finish();
  int64_t documents() const { return int64_t(docIdx_.size()) - 1; }
  int64_t sequences() const { return int64_t(sizes_.size()); }
  int64_t tokens() const { return int64_t(tokens_.size()); }

 private:
  std::string prefix_;
  std::vector<uint16_t> tokens_;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> docIdx_{0};  // the first sequence of each document, and the end
};

class IndexedDataset {
 public:
  static Status open(const std::string &prefix, IndexedDataset *out);
  IndexedDataset() = default;
  IndexedDataset(IndexedDataset &&o) noexcept;
  IndexedDataset &operator=(IndexedDataset &&o) noexcept;
  ~IndexedDataset();

  // The GPT view: sequences, each a document in the datasets Loom writes for GPT.
  int64_t documents() const { return int64_t(sizes_.size()); }
  int64_t documentLength(int64_t doc) const { return sizes_[doc]; }
  // Token `i` of document (sequence) `doc`.
  int32_t token(int64_t doc, int64_t i) const { return tokens_[pointers_[doc] / 2 + i]; }

  // The sentence view (BERT): documents of the document index, each sequences
  // [firstSentence(d), firstSentence(d + 1)), a sentence's tokens as documentLength / token.
  int64_t sequences() const { return int64_t(sizes_.size()); }
  int64_t sentenceDocuments() const { return int64_t(docIdx_.size()) - 1; }
  int64_t firstSentence(int64_t doc) const { return docIdx_[doc]; }
  std::vector<std::vector<int32_t>> documentSentences(int64_t doc) const;
  // Whether every document is one sequence (as in Loom's GPT datasets).
  bool oneSequencePerDocument() const { return sentenceDocuments() == sequences(); }

 private:
  void release();
  const uint16_t *tokens_ = nullptr;
  size_t binBytes_ = 0;
  void *binMap_ = nullptr;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> docIdx_;  // n_docs + 1 entries: 0, ..., sequences()
};

}  // namespace loom
