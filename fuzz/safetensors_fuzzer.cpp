// safetensors files (checkpoint shards, --init-from weights, exports): header JSON, dtypes,
// shapes and offsets against the file's size. What reads back must write and read again alike.
#include <cstring>

#include "formats/Safetensors.h"
#include "fuzz/FuzzSupport.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string path = loom::fuzz::scratchPath("input.safetensors");
  loom::fuzz::writeScratch(path, data, size);
  loom::SafetensorsFile f;
  if (!loom::readSafetensors(path, &f).isOk()) return 0;
  std::string again = loom::fuzz::scratchPath("again.safetensors");
  if (!loom::writeSafetensors(again, f).isOk()) loom::fuzz::invariantBroken("a file that reads does not write");
  loom::SafetensorsFile g;
  if (!loom::readSafetensors(again, &g).isOk()) loom::fuzz::invariantBroken("a written file does not read back");
  if (g.metadata != f.metadata || g.tensors.size() != f.tensors.size())
    loom::fuzz::invariantBroken("the file changed on a write and read");
  for (auto &[name, t] : f.tensors) {
    const loom::HostTensor &u = g.tensors.at(name);
    // Bit for bit (NaN payloads included), so memcmp rather than ==.
    bool sameData = u.data.size() == t.data.size() &&
                    (t.data.empty() || std::memcmp(u.data.data(), t.data.data(), t.data.size() * sizeof(float)) == 0);
    if (u.shape != t.shape || u.isInt != t.isInt || u.ints != t.ints || !sameData)
      loom::fuzz::invariantBroken("tensor '" + name + "' changed on a write and read");
  }
  return 0;
}
