// A small --name value / --name=value command-line parser for the runtime's binaries (which
// link neither LLVM nor absl). Unknown flags are a one-line error; --help (or -h) prints the
// tool's usage and every flag it knows (see help()).
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace loom {

class Flags {
 public:
  Flags(int argc, char **argv, std::string tool, std::set<std::string> known, std::set<std::string> switches = {})
      : tool_(std::move(tool)), known_(known), switches_(switches) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        help_ = true;
        error_.clear();
        return;
      }
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
  // With --help: prints `usage` and the flags on stdout and returns true (the tool exits 0).
  bool help(const char *usage) const {
    if (!help_) return false;
    std::printf("%s\n\nflags of %s:\n", usage, tool_.c_str());
    for (const std::string &f : known_) std::printf("  --%s VALUE\n", f.c_str());
    for (const std::string &f : switches_) std::printf("  --%s\n", f.c_str());
    std::printf("  --help\n");
    return true;
  }
  bool has(const std::string &name) const { return values_.count(name) > 0; }
  std::string get(const std::string &name, const std::string &dflt = "") const {
    auto it = values_.find(name);
    return it == values_.end() ? dflt : it->second;
  }
  const std::vector<std::string> &rest() const { return rest_; }
  // A numeric flag; a value that is not a number becomes an error (ok() turns false).
  double number(const std::string &name, double dflt) {
    if (!has(name)) return dflt;
    const std::string &v = values_[name];
    char *end = nullptr;
    errno = 0;
    double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno == ERANGE) return invalid(name, v, "a number"), dflt;
    return d;
  }
  int64_t integer(const std::string &name, int64_t dflt) {
    if (!has(name)) return dflt;
    const std::string &v = values_[name];
    char *end = nullptr;
    errno = 0;
    long long i = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno == ERANGE) return invalid(name, v, "an integer"), dflt;
    return i;
  }
  int fail(const std::string &msg) const {
    std::fprintf(stderr, "%s: error: %s\n", tool_.c_str(), msg.c_str());
    return 1;
  }

 private:
  void invalid(const std::string &name, const std::string &value, const char *what) {
    if (error_.empty()) {
      error_ = "--" + name + " must be " + what + ", got '" + value + "'";
      std::fprintf(stderr, "%s: error: %s\n", tool_.c_str(), error_.c_str());
    }
  }

  std::string tool_, error_;
  std::set<std::string> known_, switches_;
  bool help_ = false;
  std::map<std::string, std::string> values_;
  std::vector<std::string> rest_;
};

}  // namespace loom
