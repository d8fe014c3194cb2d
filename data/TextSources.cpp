#include "data/TextSources.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

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

}  // namespace loom
