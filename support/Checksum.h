// The checksum of plan, program and checkpoint files, and a stable id for names (parameter
// random streams): XXH3, 64 bits (the xxHash library), many gigabytes a second where the
// byte-at-a-time FNV-1a it replaced managed about one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace loom {

uint64_t checksum64(const void *data, size_t size);
inline uint64_t checksum64(const std::string &bytes) { return checksum64(bytes.data(), bytes.size()); }

// The same checksum over bytes that arrive in pieces (a file read in blocks).
class StreamingChecksum {
 public:
  StreamingChecksum();
  ~StreamingChecksum();
  void update(const void *data, size_t size);
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The checksum as the 16 lower-case hex digits the manifests and logs carry.
std::string checksumHex(uint64_t sum);

}  // namespace loom
