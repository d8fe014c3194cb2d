#include "support/Checksum.h"

#include <cstdio>

#include <xxhash.h>

namespace loom {

uint64_t checksum64(const void *data, size_t size) { return XXH3_64bits(data, size); }

struct StreamingChecksum::State {
  XXH3_state_t *xxh = XXH3_createState();
  ~State() { XXH3_freeState(xxh); }
};

StreamingChecksum::StreamingChecksum() : state_(std::make_unique<State>()) { XXH3_64bits_reset(state_->xxh); }
StreamingChecksum::~StreamingChecksum() = default;

void StreamingChecksum::update(const void *data, size_t size) { XXH3_64bits_update(state_->xxh, data, size); }
uint64_t StreamingChecksum::digest() const { return XXH3_64bits_digest(state_->xxh); }

std::string checksumHex(uint64_t sum) {
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sum);
  return hex;
}

}  // namespace loom
