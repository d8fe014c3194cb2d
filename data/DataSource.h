// Where a rank's micro-batches come from. A GPT sample is a sequence of seq + 1 tokens: the
// first seq are the inputs, the last seq the labels (next-token prediction). Other objectives
// (BERT's masked LM and sentence order) override batch() with their own inputs.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "runtime/Tensor.h"

namespace loom {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Tokens of global sample `index` (seq + 1 of them).
  virtual std::vector<int32_t> sample(int64_t index) = 0;
  // The inputs of a micro-batch of `count` samples starting at global sample `first`, keyed by
  // the IR's input roles, each [count, seq]. By default tokens, next-token labels, loss_mask
  // and attention_mask (all ones) from sample().
  virtual std::map<std::string, HostTensor> batch(int64_t first, int64_t count, int64_t seq);
};

// Deterministic pseudo-random tokens (for runtime tests that need no corpus).
class SyntheticData : public DataSource {
 public:
  SyntheticData(int64_t seq, int64_t vocab, uint64_t seed) : seq_(seq), vocab_(vocab), seed_(seed) {}
  std::vector<int32_t> sample(int64_t index) override;

 private:
  int64_t seq_, vocab_;
  uint64_t seed_;
};


}  // namespace loom
