// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header
// {"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}, then raw data. Writing
// is atomic (temporary file, fsync, rename, fsync of the directory). Reading checks every
// offset and shape against the file: a corrupt file is an error, never a crash.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "support/FileIO.h"
#include "support/Status.h"
#include "runtime/Tensor.h"

namespace loom {

struct SafetensorsFile {
  std::map<std::string, HostTensor> tensors;  // F32 or I32
  std::map<std::string, std::string> metadata;
};

// `progress` (optional): bytes written or read so far, of the file's size (a large
// checkpoint's progress line).
Status writeSafetensors(const std::string &path, const SafetensorsFile &file, const ByteProgress &progress = {});
Status readSafetensors(const std::string &path, SafetensorsFile *file, const ByteProgress &progress = {});

// A safetensors file's header only, its tensors read one at a time from the file (a resharding
// checkpoint reader takes the few pieces it needs from another rank's file). The header is
// checked as readSafetensors checks it.
class SafetensorsIndex {
 public:
  Status open(const std::string &path);
  const std::map<std::string, std::string> &metadata() const { return metadata_; }
  bool has(const std::string &name) const { return entries_.count(name) > 0; }
  Status read(const std::string &name, HostTensor *t) const;

  struct Entry {
    std::vector<int64_t> shape;
    bool isInt = false;
    int64_t begin = 0, end = 0;  // bytes, from the start of the data
  };

 private:
  std::string path_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
  int64_t dataStart_ = 0;
};

// Writes bytes to path through path.tmp, fsync and rename: a reader never sees half a file.
Status writeFileAtomically(const std::string &path, const std::string &bytes);
// The same for data in pieces (written in order, none copied).
Status writeFileAtomically(const std::string &path, const std::vector<std::pair<const char *, size_t>> &chunks,
                           const ByteProgress &progress = {});

}  // namespace loom
