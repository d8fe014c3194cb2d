#include "data/WordPiece.h"

#include <utf8proc.h>

#include <algorithm>

#include "support/FileIO.h"

namespace loom {
namespace wordpiece {

bool isWhitespace(int32_t cp) {
  if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r') return true;
  return utf8proc_category(cp) == UTF8PROC_CATEGORY_ZS;
}

bool isControl(int32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  utf8proc_category_t c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF;
}

bool isPunctuation(int32_t cp) {
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126))
    return true;
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

bool isChineseChar(int32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
         (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

}  // namespace wordpiece

namespace {
using namespace wordpiece;
using CodePoints = std::vector<int32_t>;

CodePoints decodeUtf8(const std::string &s) {
  CodePoints out;
  out.reserve(s.size());
  const auto *p = reinterpret_cast<const utf8proc_uint8_t *>(s.data());
  utf8proc_ssize_t n = utf8proc_ssize_t(s.size()), i = 0;
  while (i < n) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t len = utf8proc_iterate(p + i, n - i, &cp);
    if (len <= 0) cp = 0xFFFD, len = 1;  // an invalid byte
    out.push_back(cp);
    i += len;
  }
  return out;
}

void appendUtf8(int32_t cp, std::string *out) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t n = utf8proc_encode_char(cp, buf);
  out->append(reinterpret_cast<const char *>(buf), size_t(n));
}

std::string encodeUtf8(const CodePoints &cps, size_t begin = 0, size_t end = std::string::npos) {
  std::string out;
  end = std::min(end, cps.size());
  for (size_t i = begin; i < end; ++i) appendUtf8(cps[i], &out);
  return out;
}

// Python's str.split() whitespace that cleaning leaves (the rest became spaces or was dropped):
// the line and paragraph separators.
bool splitsWords(int32_t cp) { return cp == ' ' || cp == 0x2028 || cp == 0x2029; }

// Python's Final_Sigma context (Unicode's Case_Ignorable and Cased properties, approximated
// from the general categories and the case mappings utf8proc has).
bool isCaseIgnorable(int32_t cp) {
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      break;
  }
  static const int32_t kMid[] = {0x27, 0x2E, 0x3A, 0xB7, 0x387, 0x55F, 0x5F4, 0x2018, 0x2019, 0x2024, 0x2027,
                                 0xFE13, 0xFE52, 0xFE55, 0xFF07, 0xFF0E, 0xFF1A};
  return std::find(std::begin(kMid), std::end(kMid), cp) != std::end(kMid);
}

bool isCased(int32_t cp) {
  utf8proc_category_t c = utf8proc_category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
         utf8proc_tolower(cp) != cp || utf8proc_toupper(cp) != cp;
}

// Python's str.lower() of one word: simple lower-case mappings (its one unconditional
// multi-character mapping, U+0130, differs only by a combining dot that stripping accents
// removes next), and capital sigma as final sigma at the end of a cased word.
CodePoints lower(const CodePoints &w) {
  CodePoints out(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] != 0x3A3) {
      out[i] = utf8proc_tolower(w[i]);
      continue;
    }
    ptrdiff_t j = ptrdiff_t(i) - 1;
    while (j >= 0 && isCaseIgnorable(w[size_t(j)])) --j;
    bool finalSigma = j >= 0 && isCased(w[size_t(j)]);
    if (finalSigma) {
      size_t k = i + 1;
      while (k < w.size() && isCaseIgnorable(w[k])) ++k;
      finalSigma = k == w.size() || !isCased(w[k]);
    }
    out[i] = finalSigma ? 0x3C2 : 0x3C3;
  }
  return out;
}

// NFD, then without the nonspacing marks (BERT's _run_strip_accents).
CodePoints stripAccents(const CodePoints &w) {
  std::string utf8 = encodeUtf8(w);
  std::vector<utf8proc_int32_t> buf(w.size() * 4 + 8);
  auto *p = reinterpret_cast<const utf8proc_uint8_t *>(utf8.data());
  utf8proc_option_t opts = utf8proc_option_t(UTF8PROC_DECOMPOSE | UTF8PROC_STABLE);
  utf8proc_ssize_t n = utf8proc_decompose(p, utf8proc_ssize_t(utf8.size()), buf.data(), utf8proc_ssize_t(buf.size()), opts);
  if (n > utf8proc_ssize_t(buf.size())) {
    buf.resize(size_t(n));
    n = utf8proc_decompose(p, utf8proc_ssize_t(utf8.size()), buf.data(), utf8proc_ssize_t(buf.size()), opts);
  }
  if (n < 0) return w;  // cannot happen: the input was encoded from code points
  CodePoints out;
  for (utf8proc_ssize_t i = 0; i < n; ++i)
    if (utf8proc_category(buf[size_t(i)]) != UTF8PROC_CATEGORY_MN) out.push_back(buf[size_t(i)]);
  return out;
}

}  // namespace

Status WordPieceTokenizer::load(const std::string &vocabPath, std::unique_ptr<WordPieceTokenizer> *out) {
  std::string bytes;
  LOOM_RETURN_IF_ERROR(readWholeFile(vocabPath, "the WordPiece vocabulary (vocab.txt)", &bytes));
  std::vector<std::string> tokens;
  size_t start = 0;
  while (start < bytes.size()) {
    size_t nl = bytes.find('\n', start);
    std::string line = bytes.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    tokens.push_back(std::move(line));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return fromTokens(std::move(tokens), vocabPath, out);
}

Status WordPieceTokenizer::fromTokens(std::vector<std::string> tokens, const std::string &origin,
                                      std::unique_ptr<WordPieceTokenizer> *out) {
  auto bad = [&](size_t line, const std::string &why) {
    return Status::error(origin + ":" + std::to_string(line + 1) + ": not a WordPiece vocab.txt (one token per line): " + why);
  };
  if (tokens.empty()) return Status::error(origin + ": not a WordPiece vocab.txt: empty");
  if (tokens.size() > 65536)
    return Status::error(origin + ": " + std::to_string(tokens.size()) + " tokens, more than the 65,536 a dataset's uint16 ids hold");
  auto tok = std::unique_ptr<WordPieceTokenizer>(new WordPieceTokenizer());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string &t = tokens[i];
    if (t.empty()) return bad(i, "a blank line");
    if (t.find_first_of(" \t\v\f\r") != std::string::npos) return bad(i, "a token with whitespace");
    CodePoints cps = decodeUtf8(t);
    if (std::find(cps.begin(), cps.end(), 0xFFFD) != cps.end() && t.find("\xEF\xBF\xBD") == std::string::npos)
      return bad(i, "not UTF-8");
    auto [it, fresh] = tok->ids_.emplace(t, int32_t(i));
    if (!fresh) return bad(i, "\"" + t + "\" again (first on line " + std::to_string(it->second + 1) + ")");
  }
  tok->tokens_ = std::move(tokens);
  struct Special { const char *name; int32_t *id; };
  for (Special s : {Special{"[PAD]", &tok->pad_}, Special{"[UNK]", &tok->unk_}, Special{"[CLS]", &tok->cls_},
                    Special{"[SEP]", &tok->sep_}, Special{"[MASK]", &tok->mask_}}) {
    *s.id = tok->id(s.name);
    if (*s.id < 0) return Status::error(origin + ": not a BERT vocab.txt: no " + s.name + " token");
  }
  *out = std::move(tok);
  return Status::ok();
}

int32_t WordPieceTokenizer::id(const std::string &token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<std::string> WordPieceTokenizer::basicTokenize(const std::string &text) const {
  // Clean, and space out CJK ideographs.
  CodePoints clean;
  for (int32_t cp : decodeUtf8(text)) {
    if (cp == 0 || cp == 0xFFFD || isControl(cp)) continue;
    if (isWhitespace(cp)) {
      clean.push_back(' ');
    } else if (isChineseChar(cp)) {
      clean.push_back(' '), clean.push_back(cp), clean.push_back(' ');
    } else {
      clean.push_back(cp);
    }
  }
  std::vector<std::string> words;
  size_t i = 0;
  while (i < clean.size()) {
    while (i < clean.size() && splitsWords(clean[i])) ++i;
    size_t j = i;
    while (j < clean.size() && !splitsWords(clean[j])) ++j;
    if (j == i) break;
    CodePoints w = stripAccents(lower(CodePoints(clean.begin() + ptrdiff_t(i), clean.begin() + ptrdiff_t(j))));
    // Every punctuation character a word of its own.
    size_t k = 0;
    while (k < w.size()) {
      if (isPunctuation(w[k])) {
        words.push_back(encodeUtf8(w, k, k + 1));
        ++k;
        continue;
      }
      size_t e = k;
      while (e < w.size() && !isPunctuation(w[e])) ++e;
      words.push_back(encodeUtf8(w, k, e));
      k = e;
    }
    i = j;
  }
  return words;
}

std::vector<int32_t> WordPieceTokenizer::wordPieces(const std::string &word) const {
  CodePoints cps = decodeUtf8(word);
  if (cps.size() > size_t(kMaxWordChars)) return {unk_};
  // Byte offsets of the code points, to look substrings up without re-encoding.
  std::vector<size_t> at(cps.size() + 1, 0);
  for (size_t i = 0; i < cps.size(); ++i) {
    std::string one;
    appendUtf8(cps[i], &one);
    at[i + 1] = at[i] + one.size();
  }
  std::string bytes = encodeUtf8(cps);
  std::vector<int32_t> pieces;
  size_t start = 0;
  std::string candidate;
  while (start < cps.size()) {
    int32_t found = -1;
    size_t end = cps.size();
    for (; end > start; --end) {
      candidate.assign(start > 0 ? "##" : "");
      candidate.append(bytes, at[start], at[end] - at[start]);
      auto it = ids_.find(candidate);
      if (it != ids_.end()) {
        found = it->second;
        break;
      }
    }
    if (found < 0) return {unk_};
    pieces.push_back(found);
    start = end;
  }
  return pieces;
}

std::vector<int32_t> WordPieceTokenizer::encode(const std::string &text) const {
  std::vector<int32_t> ids;
  for (const std::string &w : basicTokenize(text)) {
    std::vector<int32_t> p = wordPieces(w);
    ids.insert(ids.end(), p.begin(), p.end());
  }
  return ids;
}

std::string WordPieceTokenizer::decode(const std::vector<int32_t> &ids) const {
  std::string out;
  for (int32_t id : ids) {
    const std::string &t = id >= 0 && id < vocabSize() ? tokens_[size_t(id)] : tokens_[size_t(unk_)];
    if (t.rfind("##", 0) == 0 && !out.empty()) {
      out += t.substr(2);
    } else {
      if (!out.empty()) out += ' ';
      out += t;
    }
  }
  return out;
}

}  // namespace loom
