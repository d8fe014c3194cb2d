// BERT's uncased WordPiece tokenizer (Devlin et al. 2019; google-research/bert's tokenization.py),
// over a vocab.txt (one token per line, id = line number, continuation pieces as "##ing").
//
// Basic tokenization, in BERT's order: clean the text (drop NUL, U+FFFD and control characters,
// categories Cc and Cf but tab, newline and carriage return; every other whitespace, those three
// and category Zs, becomes a space), put spaces around CJK ideographs (BERT's _is_chinese_char
// blocks), split on whitespace (what Python's str.split() splits on), then each word: lower
// case (Unicode simple mappings, Greek final sigma as Python's str.lower()), strip accents (NFD,
// then drop category Mn), and split off every punctuation character (ASCII 33-47, 58-64, 91-96,
// 123-126 and the Unicode P* categories) as a word of its own. Then WordPiece: each word greedily
// longest-match-first into pieces, "##" before every piece but the first; a word longer than
// 100 characters, or one with a part no piece matches, becomes [UNK]. Unicode data from
// utf8proc. Invalid UTF-8 bytes read as U+FFFD (and so are dropped).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "support/Status.h"

namespace loom {

class WordPieceTokenizer {
 public:
  // Reads vocab.txt. Errors, one line each naming the file: unreadable, empty, not UTF-8, a
  // blank or whitespace-padded line, a duplicate token, a missing special token ([PAD], [UNK],
  // [CLS], [SEP], [MASK]), more than 65,536 tokens (datasets store ids as uint16).
  static Status load(const std::string &vocabPath, std::unique_ptr<WordPieceTokenizer> *out);
  // The same from the tokens themselves (`origin` names them in errors).
  static Status fromTokens(std::vector<std::string> tokens, const std::string &origin,
                           std::unique_ptr<WordPieceTokenizer> *out);

  std::vector<int32_t> encode(const std::string &text) const;
  // Pieces joined by spaces, a "##" piece glued to the one before (Hugging Face's
  // convert_tokens_to_string); ids outside the vocabulary read as [UNK].
  std::string decode(const std::vector<int32_t> &ids) const;
  // The basic tokenizer's words (UTF-8), before WordPiece.
  std::vector<std::string> basicTokenize(const std::string &text) const;
  // One word's pieces (ids); [UNK] alone when it cannot be split or is over 100 characters.
  std::vector<int32_t> wordPieces(const std::string &word) const;

  int64_t vocabSize() const { return int64_t(tokens_.size()); }
  const std::string &token(int32_t id) const { return tokens_[size_t(id)]; }
  // The id of a token, or -1.
  int32_t id(const std::string &token) const;
  // Whether the piece continues a word ("##ing"): whole-word masking masks it with its word.
  bool isContinuation(int32_t id) const { return id >= 0 && id < vocabSize() && tokens_[size_t(id)].rfind("##", 0) == 0; }
  int32_t padId() const { return pad_; }
  int32_t unkId() const { return unk_; }
  int32_t clsId() const { return cls_; }
  int32_t sepId() const { return sep_; }
  int32_t maskId() const { return mask_; }

  static constexpr int kMaxWordChars = 100;  // BERT's max_input_chars_per_word

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  int32_t pad_ = 0, unk_ = 0, cls_ = 0, sep_ = 0, mask_ = 0;
};

// Unicode classes of BERT's basic tokenizer (code points), exposed for the tests.
namespace wordpiece {
bool isWhitespace(int32_t cp);
bool isControl(int32_t cp);
bool isPunctuation(int32_t cp);
bool isChineseChar(int32_t cp);
}  // namespace wordpiece

}  // namespace loom
