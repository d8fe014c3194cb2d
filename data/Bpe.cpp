#include "data/Bpe.h"

#include <climits>
#include <sstream>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "support/FileIO.h"

namespace loom {
namespace {

void appendUtf8(std::string &out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
  }
}

// Code points of a UTF-8 string (the byte-encoded alphabet is valid UTF-8).
std::vector<uint32_t> codePoints(const std::string &s, std::vector<std::string> *chars = nullptr) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
    for (int k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
    out.push_back(cp);
    if (chars) chars->push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

// encoder.json: one flat object of token (a JSON string: escapes and surrogate pairs decoded
// to UTF-8) -> id.
Status parseEncoder(const std::string &path, const std::string &json, std::unordered_map<std::string, int32_t> *out) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error(path + ": corrupt (not JSON)");
  if (!j.is_object()) return Status::error(path + ": not a JSON object of token -> id");
  for (auto &[token, id] : j.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      return Status::error(path + ": the id of token '" + token + "' is not a non-negative 32-bit integer");
    (*out)[token] = int32_t(id.get<int64_t>());
  }
  return Status::ok();
}

}  // namespace

uint32_t byteLevelCodePoint(uint8_t byte) {
  static const std::array<uint32_t, 256> codePoint = [] {
    std::array<uint32_t, 256> c;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      c[b] = printable ? uint32_t(b) : next++;
    }
    return c;
  }();
  return codePoint[byte];
}

const std::array<std::string, 256> &byteLevelAlphabet() {
  static const std::array<std::string, 256> alphabet = [] {
    std::array<std::string, 256> a;
    for (int b = 0; b < 256; ++b) appendUtf8(a[b], byteLevelCodePoint(uint8_t(b)));
    return a;
  }();
  return alphabet;
}

Status Gpt2PreTokenizer::create(std::unique_ptr<Gpt2PreTokenizer> *out) {
  auto t = std::unique_ptr<Gpt2PreTokenizer>(new Gpt2PreTokenizer());
  const char *pat = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
  int err;
  PCRE2_SIZE offset;
  t->pattern_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err,
                              &offset, nullptr);
  if (!t->pattern_) return Status::error("cannot compile GPT-2's pre-tokenizer pattern");
  *out = std::move(t);
  return Status::ok();
}

Gpt2PreTokenizer::~Gpt2PreTokenizer() {
  if (pattern_) pcre2_code_free(static_cast<pcre2_code *>(pattern_));
}

BpeTokenizer::~BpeTokenizer() = default;

Status BpeTokenizer::load(const std::string &encoderPath, const std::string &vocabPath,
                          std::unique_ptr<BpeTokenizer> *out) {
  auto t = std::unique_ptr<BpeTokenizer>(new BpeTokenizer());
  std::string json, merges;
  LOOM_RETURN_IF_ERROR(readWholeFile(encoderPath, "the BPE encoder (encoder.json)", &json));
  LOOM_RETURN_IF_ERROR(readWholeFile(vocabPath, "the BPE merges (vocab.bpe)", &merges));
  LOOM_RETURN_IF_ERROR(parseEncoder(encoderPath, json, &t->tokenToId_));
  t->idToToken_.resize(t->tokenToId_.size());
  for (auto &[tok, id] : t->tokenToId_) {
    if (id < 0 || id >= int32_t(t->idToToken_.size()) || !t->idToToken_[id].empty())
      return Status::error(encoderPath + ": ids are not 0..n-1, each once");
    t->idToToken_[id] = tok;
  }
  auto eot = t->tokenToId_.find("<|endoftext|>");
  t->eot_ = eot == t->tokenToId_.end() ? -1 : eot->second;
  std::istringstream lines(merges);
  std::string line;
  int rank = 0;
  while (std::getline(lines, line)) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    size_t sp = line.find(' ');
    if (sp == std::string::npos) return Status::error(vocabPath + ": malformed merge line '" + line + "'");
    t->ranks_[{line.substr(0, sp), line.substr(sp + 1)}] = rank++;
  }
  for (int b = 0; b < 256; ++b) t->unicodeToByte_[byteLevelCodePoint(uint8_t(b))] = uint8_t(b);
  LOOM_RETURN_IF_ERROR(Gpt2PreTokenizer::create(&t->preTokenizer_));
  *out = std::move(t);
  return Status::ok();
}

std::vector<std::string> BpeTokenizer::bpe(const std::string &piece) {
  std::vector<std::string> word;
  codePoints(piece, &word);
  while (word.size() > 1) {
    int best = INT_MAX;
    size_t at = 0;
    for (size_t k = 0; k + 1 < word.size(); ++k) {
      auto it = ranks_.find({word[k], word[k + 1]});
      if (it != ranks_.end() && it->second < best) best = it->second, at = k;
    }
    if (best == INT_MAX) break;
    // Merge every occurrence of the best pair, left to right.
    std::string a = word[at], b = word[at + 1];
    std::vector<std::string> merged;
    for (size_t k = 0; k < word.size();) {
      if (k + 1 < word.size() && word[k] == a && word[k + 1] == b) {
        merged.push_back(a + b);
        k += 2;
      } else {
        merged.push_back(word[k++]);
      }
    }
    word = std::move(merged);
  }
  return word;
}

namespace {

// The length of the valid UTF-8 sequence at text[i] (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 if the byte there does not start one.
size_t utf8SequenceLength(const std::string &text, size_t i) {
  auto byte = [&](size_t k) { return k < text.size() ? (unsigned char)text[k] : 0u; };
  auto continuation = [&](size_t k) { return (byte(k) & 0xC0) == 0x80; };
  unsigned c = byte(i);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return continuation(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    unsigned c1 = byte(i + 1);
    bool ok = (c == 0xE0 ? c1 >= 0xA0 : true) && (c == 0xED ? c1 < 0xA0 : true);
    return ok && continuation(i + 1) && continuation(i + 2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    unsigned c1 = byte(i + 1);
    bool ok = (c == 0xF0 ? c1 >= 0x90 : true) && (c == 0xF4 ? c1 < 0x90 : true);
    return ok && continuation(i + 1) && continuation(i + 2) && continuation(i + 3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

const std::vector<int32_t> &BpeTokenizer::encodePiece(const std::string &piece) {
  auto cached = cache_.find(piece);
  if (cached == cache_.end()) {
    if (cache_.size() >= kMaxCachedPieces) cache_.clear();  // bounded memory on any input
    std::string encoded;
    for (unsigned char c : piece) encoded += byteLevelAlphabet()[c];
    std::vector<int32_t> pieceIds;
    for (const std::string &sym : bpe(encoded)) {
      auto it = tokenToId_.find(sym);
      if (it != tokenToId_.end()) pieceIds.push_back(it->second);
    }
    cached = cache_.emplace(piece, std::move(pieceIds)).first;
  }
  return cached->second;
}

// Valid UTF-8 runs are split with GPT-2's pattern; a byte that is not valid UTF-8 (which the
// pattern cannot match) is a piece of its own, so byte-level BPE keeps every byte:
// decode(encode(bytes)) == bytes for any input, where OpenAI's Python encoder, reading str,
// would have refused the file.
void Gpt2PreTokenizer::split(const std::string &text, const std::function<void(const std::string &)> &append) const {
  auto *code = static_cast<pcre2_code *>(pattern_);
  pcre2_match_data *match = pcre2_match_data_create_from_pattern(code, nullptr);
  for (size_t runStart = 0; runStart < text.size();) {
    size_t runEnd = runStart;
    while (runEnd < text.size()) {
      size_t n = utf8SequenceLength(text, runEnd);
      if (n == 0) break;
      runEnd += n;
    }
    // The run [runStart, runEnd) is valid UTF-8: matched without PCRE2's own check, and as a
    // subject of its own (the pattern's lookahead never sees past an invalid byte).
    PCRE2_SPTR subject = reinterpret_cast<PCRE2_SPTR>(text.data() + runStart);
    PCRE2_SIZE length = runEnd - runStart, start = 0;
    while (start < length) {
      int rc = pcre2_match(code, subject, length, start, PCRE2_NO_UTF_CHECK, match, nullptr);
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(match);
      // The pattern matches every character (\s+ or one of the classes); rc < 0 or an empty
      // match cannot happen, but must never drop text: the rest goes as single characters.
      if (rc < 0 || ov[1] <= ov[0] || ov[0] != start) {
        size_t n = utf8SequenceLength(text, runStart + start);
        append(text.substr(runStart + start, n));
        start += n;
        continue;
      }
      append(text.substr(runStart + ov[0], ov[1] - ov[0]));
      start = ov[1];
    }
    if (runEnd < text.size()) append(text.substr(runEnd, 1));  // one byte that is not UTF-8
    runStart = runEnd + (runEnd < text.size() ? 1 : 0);
  }
  pcre2_match_data_free(match);
}

std::vector<int32_t> BpeTokenizer::encode(const std::string &text) {
  std::vector<int32_t> ids;
  preTokenizer_->split(text, [&](const std::string &piece) {
    const std::vector<int32_t> &p = encodePiece(piece);
    ids.insert(ids.end(), p.begin(), p.end());
  });
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int32_t> &ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= int32_t(idToToken_.size())) continue;
    for (uint32_t cp : codePoints(idToToken_[id])) {
      auto it = unicodeToByte_.find(cp);
      if (it != unicodeToByte_.end()) out += char(it->second);
    }
  }
  return out;
}

}  // namespace loom
