#include "fuzz/FuzzSupport.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace loom::fuzz {

std::string scratchPath(const std::string &name) {
  static const std::string dir = [] {
    std::string base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
    std::string d = base + "/loom-fuzz-" + std::to_string(getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir + "/" + name;
}

void writeScratch(const std::string &path, const uint8_t *data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(data), std::streamsize(size));
}

void writeScratch(const std::string &path, const std::string &bytes) {
  writeScratch(path, reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size());
}

std::pair<std::string, std::string> splitInput(const uint8_t *data, size_t size) {
  if (size < 2) return {std::string(reinterpret_cast<const char *>(data), size), ""};
  size_t rest = size - 2, first = (size_t(data[0]) | size_t(data[1]) << 8) % (rest + 1);
  const char *p = reinterpret_cast<const char *>(data + 2);
  return {std::string(p, first), std::string(p + first, rest - first)};
}

void invariantBroken(const std::string &what) {
  std::fprintf(stderr, "fuzz: invariant broken: %s\n", what.c_str());
  std::abort();
}

}  // namespace loom::fuzz
