// A small --name value / --name=value command-line parser for the runtime's binaries (which
// link neither LLVM nor absl). Unknown flags are a one-line error.
#pragma once

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace loom {

class Flags {
 public:
  Flags(int argc, char **argv, std::string tool, std::set<std::string> known, std::set<std::string> switches = {})
      : tool_(std::move(tool)) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--") {
        for (++i; i < argc; ++i) rest_.push_back(argv[i]);
        break;
      }
      if (a.rfind("--", 0) != 0) {
        rest_.push_back(a);
        continue;
      }
      std::string name = a.substr(2), value;
      size_t eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (switches.count(name)) {
        value = "1";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        error_ = "flag --" + name + " needs a value";
      }
      if (!known.count(name) && !switches.count(name)) error_ = "unknown flag --" + name;
      values_[name] = value;
      if (!error_.empty()) break;
    }
    if (!error_.empty()) std::fprintf(stderr, "%s: error: %s\n", tool_.c_str(), error_.c_str());
  }
  bool ok() const { return error_.empty(); }
  bool has(const std::string &name) const { return values_.count(name) > 0; }
  std::string get(const std::string &name, const std::string &dflt = "") const {
    auto it = values_.find(name);
    return it == values_.end() ? dflt : it->second;
  }
  const std::vector<std::string> &rest() const { return rest_; }
  int fail(const std::string &msg) const {
    std::fprintf(stderr, "%s: error: %s\n", tool_.c_str(), msg.c_str());
    return 1;
  }

 private:
  std::string tool_, error_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> rest_;
};

}  // namespace loom
