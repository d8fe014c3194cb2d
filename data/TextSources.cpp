#include "data/TextSources.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

namespace loom {
namespace {

bool isBrownFile(const std::string &name) {
  return name.size() == 4 && name[0] == 'c' && isalpha((unsigned char)name[1]) && isdigit((unsigned char)name[2]) &&
         isdigit((unsigned char)name[3]);
}

}  // namespace

Status listInputs(const std::vector<std::string> &paths, const std::string &format, std::vector<std::string> *files) {
  namespace fs = std::filesystem;
  for (const std::string &p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> found;
      for (auto &e : fs::recursive_directory_iterator(p, ec))
        if (e.is_regular_file() && (format != "brown" || isBrownFile(e.path().filename().string())))
          found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      files->insert(files->end(), found.begin(), found.end());
    } else if (fs::is_regular_file(p, ec)) {
      files->push_back(p);
    } else {
      return Status::error(p + ": no such file or directory");
    }
  }
  if (files->empty()) return Status::error("no input files found");
  return Status::ok();
}

std::string detokenizeBrownSentence(const std::string &line) {
  std::istringstream words(line);
  std::string tok, sentence;
  bool openQuote = false, glue = false;
  while (words >> tok) {
    size_t slash = tok.rfind('/');
    std::string w = slash == std::string::npos ? tok : tok.substr(0, slash);
    if (w == "``") w = "\"", openQuote = true;
    else if (w == "''") w = "\"";
    bool attachLeft = w == "." || w == "," || w == ";" || w == ":" || w == "?" || w == "!" || w == ")" ||
                      (w == "\"" && !openQuote) || w == "'" || w.rfind("'", 0) == 0;
    if (!sentence.empty() && !attachLeft && !glue) sentence += ' ';
    sentence += w;
    glue = w == "(" || (w == "\"" && openQuote);
    if (w == "\"") openQuote = false;
  }
  return sentence;
}

std::string detokenizeBrown(const std::string &tagged) {
  std::istringstream lines(tagged);
  std::string line, out, paragraph;
  auto flush = [&] {
    if (!paragraph.empty()) out += (out.empty() ? "" : "\n") + paragraph;
    paragraph.clear();
  };
  while (std::getline(lines, line)) {
    std::string sentence = detokenizeBrownSentence(line);
    if (sentence.empty()) {
      flush();
      continue;
    }
    paragraph += (paragraph.empty() ? "" : " ") + sentence;
  }
  flush();
  return out;
}

Status readDocuments(const std::string &path, const std::string &format, const std::string &jsonKey,
                     std::vector<std::string> *docs) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(path + ": cannot open");
  if (format == "jsonl") {
    std::string line;
    int64_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (record.is_discarded()) return Status::error(path + ":" + std::to_string(n) + ": not JSON");
      auto field = record.is_object() ? record.find(jsonKey) : record.end();
      if (!record.is_object() || field == record.end() || !field->is_string())
        return Status::error(path + ":" + std::to_string(n) + ": no string field \"" + jsonKey + "\"");
      docs->push_back(field->get<std::string>());
    }
    return Status::ok();
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (format == "text") docs->push_back(ss.str());
  else if (format == "brown") docs->push_back(detokenizeBrown(ss.str()));
  else return Status::error("--format must be text, jsonl or brown, got '" + format + "'");
  return Status::ok();
}

namespace {

bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Abbreviations whose period does not end a sentence (lower case, without the final period).
bool isAbbreviation(std::string word) {
  static const std::unordered_set<std::string> kAbbrev = {
      "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "vs", "etc", "e.g", "i.e", "cf", "al", "no",
      "nos", "vol", "fig", "figs", "p", "pp", "ch", "sec", "ed", "eds", "gen", "gov", "sen", "rep", "rev", "col",
      "capt", "lt", "sgt", "maj", "inc", "ltd", "co", "corp", "bros", "dept", "univ", "approx", "a.m", "p.m",
      "u.s", "u.k", "u.n", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec"};
  while (!word.empty() && std::string("\"'([{").find(word.front()) != std::string::npos) word.erase(0, 1);
  for (char &c : word) c = char(std::tolower((unsigned char)c));
  if (word.size() == 1 && std::isalpha((unsigned char)word[0])) return true;  // an initial: "J. Smith"
  return kAbbrev.count(word) > 0;
}

// Whether `text` at `i` starts with one of the UTF-8 sequences.
bool startsWithAny(const std::string &text, size_t i, std::initializer_list<const char *> seqs, size_t *len) {
  for (const char *q : seqs) {
    size_t n = std::strlen(q);
    if (text.compare(i, n, q) == 0) return *len = n, true;
  }
  return false;
}

}  // namespace

std::vector<std::string> splitSentences(const std::string &text) {
  std::vector<std::string> out;
  // Paragraphs end at blank lines; inside one, line breaks are spaces.
  std::vector<std::string> paragraphs(1);
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r\f\v") == std::string::npos) {
      if (!paragraphs.back().empty()) paragraphs.emplace_back();
      continue;
    }
    paragraphs.back() += (paragraphs.back().empty() ? "" : " ") + line;
  }
  auto emit = [&](const std::string &s) {
    size_t b = 0, e = s.size();
    while (b < e && isSpace(s[b])) ++b;
    while (e > b && isSpace(s[e - 1])) --e;
    if (e > b) out.push_back(s.substr(b, e - b));
  };
  static const std::initializer_list<const char *> kClosers = {"\"", "'", ")", "]", "}", "\xE2\x80\x99", "\xE2\x80\x9D",
                                                               "\xC2\xBB"};  // ’ ” »
  for (const std::string &p : paragraphs) {
    size_t start = 0, i = 0;
    while (i < p.size()) {
      size_t n = 0;
      // Ideographic full stop, full-width ! and ?: a sentence ends there, spaces or not.
      if (startsWithAny(p, i, {"\xE3\x80\x82", "\xEF\xBC\x81", "\xEF\xBC\x9F"}, &n)) {
        i += n;
        while (startsWithAny(p, i, kClosers, &n)) i += n;
        emit(p.substr(start, i - start));
        start = i;
        continue;
      }
      char c = p[i];
      if (c != '.' && c != '!' && c != '?') {
        ++i;
        continue;
      }
      size_t end = i;
      while (end < p.size() && (p[end] == '.' || p[end] == '!' || p[end] == '?')) ++end;
      bool single = end == i + 1 && c == '.';
      while (startsWithAny(p, end, kClosers, &n)) end += n;
      if (end < p.size() && !isSpace(p[end])) {  // "3.14", "e.g.x", "U.S.A"
        i = end;
        continue;
      }
      size_t next = end;
      while (next < p.size() && isSpace(p[next])) ++next;
      size_t wordStart = i;
      while (wordStart > start && !isSpace(p[wordStart - 1])) --wordStart;
      bool abbreviation = single && isAbbreviation(p.substr(wordStart, i - wordStart));
      bool lowerNext = next < p.size() && std::islower((unsigned char)p[next]);
      if (next < p.size() && (abbreviation || lowerNext)) {
        i = end;
        continue;
      }
      emit(p.substr(start, end - start));
      start = i = end;
    }
    emit(p.substr(start));
  }
  return out;
}

Status readDocumentSentences(const std::string &path, const std::string &format, const std::string &jsonKey,
                             std::vector<std::vector<std::string>> *docs) {
  if (format == "brown") {
    std::ifstream in(path, std::ios::binary);
    if (!in) return Status::error(path + ": cannot open");
    std::vector<std::string> sentences;
    for (std::string line; std::getline(in, line);) {
      std::string s = detokenizeBrownSentence(line);
      if (!s.empty()) sentences.push_back(std::move(s));
    }
    docs->push_back(std::move(sentences));
    return Status::ok();
  }
  std::vector<std::string> texts;
  LOOM_RETURN_IF_ERROR(readDocuments(path, format, jsonKey, &texts));
  for (const std::string &t : texts) docs->push_back(splitSentences(t));
  return Status::ok();
}

}  // namespace loom
