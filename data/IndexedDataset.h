// Megatron's memory-mapped indexed dataset: PREFIX.bin holds the token ids of every document
// back to back; PREFIX.idx holds the header ("MMIDIDX\0\0", version 1, dtype code), the
// number of sequences and documents, each sequence's length (int32) and byte offset (int64),
// and the index of the first sequence of each document (int64, n_docs + 1 entries).
// Loom writes one sequence per document, ending with <|endoftext|>, as Megatron's
// preprocess_data.py does with --append-eod.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/Status.h"

namespace loom {

class IndexedDatasetWriter {
 public:
  explicit IndexedDatasetWriter(std::string prefix) : prefix_(std::move(prefix)) {}
  void addDocument(const std::vector<int32_t> &tokens);
  // Writes PREFIX.bin and PREFIX.idx (each atomically). Token ids must fit uint16.
  Status finish();
  int64_t documents() const { return int64_t(sizes_.size()); }
  int64_t tokens() const { return int64_t(tokens_.size()); }

 private:
  std::string prefix_;
  std::vector<uint16_t> tokens_;
  std::vector<int32_t> sizes_;
};

class IndexedDataset {
 public:
  static Status open(const std::string &prefix, IndexedDataset *out);
  IndexedDataset() = default;
  IndexedDataset(IndexedDataset &&o) noexcept;
  IndexedDataset &operator=(IndexedDataset &&o) noexcept;
  ~IndexedDataset();

  int64_t documents() const { return int64_t(sizes_.size()); }
  int64_t documentLength(int64_t doc) const { return sizes_[doc]; }
  // Token `i` of document `doc`.
  int32_t token(int64_t doc, int64_t i) const { return tokens_[pointers_[doc] / 2 + i]; }

 private:
  void release();
  const uint16_t *tokens_ = nullptr;
  size_t binBytes_ = 0;
  void *binMap_ = nullptr;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
};

}  // namespace loom
