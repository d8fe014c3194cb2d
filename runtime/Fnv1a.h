// FNV-1a, 64 bits: the checksum of plan, program and checkpoint files, and a stable id for
// names (parameter random streams).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

inline uint64_t fnv1a(const void *data, size_t size, uint64_t h = kFnv1aOffset) {
  const unsigned char *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

inline uint64_t fnv1a(const std::string &bytes) { return fnv1a(bytes.data(), bytes.size()); }

}  // namespace loom
