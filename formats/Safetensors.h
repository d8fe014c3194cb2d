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

// Writes bytes to path through path.tmp, fsync and rename: a reader never sees half a file.
Status writeFileAtomically(const std::string &path, const std::string &bytes);
// The same for data in pieces (written in order, none copied).
Status writeFileAtomically(const std::string &path, const std::vector<std::pair<const char *, size_t>> &chunks,
                           const ByteProgress &progress = {});

}  // namespace loom
