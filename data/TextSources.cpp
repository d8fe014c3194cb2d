#include "data/TextSources.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace loom {
namespace {

bool isBrownFile(const std::string &name) {
  return name.size() == 4 && name[0] == 'c' && isalpha((unsigned char)name[1]) && isdigit((unsigned char)name[2]) &&
         isdigit((unsigned char)name[3]);
}

// The string value of `key` in a one-line JSON object (escapes decoded, \uXXXX as UTF-8).
bool jsonField(const std::string &line, const std::string &key, std::string *out) {
  size_t k = line.find("\"" + key + "\"");
  if (k == std::string::npos) return false;
  size_t i = line.find(':', k + key.size() + 2);
  if (i == std::string::npos) return false;
  i = line.find('"', i);
  if (i == std::string::npos) return false;
  out->clear();
  for (++i; i < line.size() && line[i] != '"'; ++i) {
    if (line[i] != '\\') {
      *out += line[i];
      continue;
    }
    char e = line[++i];
    if (e == 'n') *out += '\n';
    else if (e == 't') *out += '\t';
    else if (e == 'r') *out += '\r';
    else if (e == 'u' && i + 4 < line.size()) {
      uint32_t cp = std::stoul(line.substr(i + 1, 4), nullptr, 16);
      i += 4;
      if (cp >= 0xD800 && cp < 0xDC00 && line.compare(i + 1, 2, "\\u") == 0) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (std::stoul(line.substr(i + 3, 4), nullptr, 16) - 0xDC00);
        i += 6;
      }
      if (cp < 0x80) *out += char(cp);
      else if (cp < 0x800) *out += char(0xC0 | (cp >> 6)), *out += char(0x80 | (cp & 0x3F));
      else if (cp < 0x10000)
        *out += char(0xE0 | (cp >> 12)), *out += char(0x80 | ((cp >> 6) & 0x3F)), *out += char(0x80 | (cp & 0x3F));
      else
        *out += char(0xF0 | (cp >> 18)), *out += char(0x80 | ((cp >> 12) & 0x3F)),
            *out += char(0x80 | ((cp >> 6) & 0x3F)), *out += char(0x80 | (cp & 0x3F));
    } else *out += e;
  }
  return i < line.size();
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

std::string detokenizeBrown(const std::string &tagged) {
  std::istringstream lines(tagged);
  std::string line, out, paragraph;
  auto flush = [&] {
    if (!paragraph.empty()) out += (out.empty() ? "" : "\n") + paragraph;
    paragraph.clear();
  };
  while (std::getline(lines, line)) {
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
    std::string line, text;
    int64_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      if (!jsonField(line, jsonKey, &text))
        return Status::error(path + ":" + std::to_string(n) + ": no string field \"" + jsonKey + "\"");
      docs->push_back(text);
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

}  // namespace loom
