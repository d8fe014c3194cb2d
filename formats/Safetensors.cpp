#include "formats/Safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "support/FileIO.h"

namespace loom {
namespace {

using nlohmann::json;

// A header string fit for a one-line message: JSON escapes, no quotes around it.
std::string shown(const std::string &s) {
  std::string q = json(s).dump(-1, ' ', false, json::error_handler_t::replace);
  return q.substr(1, q.size() - 2);
}

// Sizes and offsets: JSON integers from 0 to INT64_MAX.
bool toIndex(const json &v, int64_t *out) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t(INT64_MAX)) return false;
  *out = int64_t(v.get<uint64_t>());
  return true;
}

bool toIndices(const json &v, std::vector<int64_t> *out) {
  if (!v.is_array()) return false;
  out->resize(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    if (!toIndex(v[i], &(*out)[i])) return false;
  return true;
}

// One tensor entry {"dtype", "shape", "data_offsets"}, checked against the data's size.
Status readEntry(const std::string &path, const std::string &name, const json &entry, size_t dataSize,
                 SafetensorsIndex::Entry *out) {
  std::string tensor = "tensor '" + shown(name) + "'", where = path + ": " + tensor;
  auto corrupt = [&](const char *what) {
    return Status::error(path + ": corrupt safetensors header: " + tensor + " " + what);
  };
  if (!entry.is_object()) return corrupt("is not an object");
  auto dtype = entry.find("dtype"), shapeAt = entry.find("shape"), offsetsAt = entry.find("data_offsets");
  if (dtype == entry.end() || !dtype->is_string()) return corrupt("has no dtype string");
  std::vector<int64_t> shape, offsets;
  if (shapeAt == entry.end() || !toIndices(*shapeAt, &shape))
    return corrupt("has no shape of non-negative integers");
  if (offsetsAt == entry.end() || !toIndices(*offsetsAt, &offsets) || offsets.size() != 2)
    return corrupt("has no data_offsets of two non-negative integers");
  const std::string &type = dtype->get_ref<const std::string &>();
  if (type != "F32" && type != "I32") return Status::error(where + " has dtype " + shown(type) + " (Loom reads F32 and I32)");
  // Element count without overflow: every dimension bounded by the data it must fit in.
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d > 0 && numel > int64_t(dataSize) / 4 / d)
      return Status::error(where + " has a shape larger than the file (corrupt)");
    numel *= d;
  }
  int64_t bytesNeeded = numel * 4;
  if (offsets[0] > offsets[1] || offsets[1] > int64_t(dataSize) || offsets[1] - offsets[0] != bytesNeeded)
    return Status::error(where + " lies outside the file (truncated or corrupt)");
  *out = {std::move(shape), type == "I32", offsets[0], offsets[1]};
  return Status::ok();
}

// An empty tensor of the entry's shape and type; its bytes to fill.
char *allocate(const SafetensorsIndex::Entry &e, HostTensor *t) {
  *t = HostTensor{e.shape};
  t->isInt = e.isInt;
  size_t numel = size_t((e.end - e.begin) / 4);
  if (t->isInt) {
    t->ints.resize(numel);
    return reinterpret_cast<char *>(t->ints.data());
  }
  t->data.resize(numel);
  return reinterpret_cast<char *>(t->data.data());
}

Status readTensor(const std::string &path, const std::string &name, const json &entry, const char *data,
                  size_t dataSize, HostTensor *t) {
  SafetensorsIndex::Entry e;
  LOOM_RETURN_IF_ERROR(readEntry(path, name, entry, dataSize, &e));
  char *to = allocate(e, t);
  if (e.end > e.begin) std::memcpy(to, data + e.begin, size_t(e.end - e.begin));
  return Status::ok();
}

// The parsed header: `visit(name, entry)` for each tensor, metadata into `metadata`.
template <typename Visit>
Status parseHeader(const std::string &path, const char *begin, const char *end, std::map<std::string, std::string> *metadata,
                   Visit visit) {
  std::string corrupt = path + ": corrupt safetensors header";
  json header;
  try {
    header = json::parse(begin, end);
  } catch (const json::parse_error &e) {
    return Status::error(corrupt + ": not JSON (at byte " + std::to_string(e.byte) + ")");
  } catch (const json::exception &e) {  // a number too large for any C++ type (out_of_range 406)
    return Status::error(corrupt + ": " + e.what());
  }
  if (!header.is_object()) return Status::error(corrupt + ": not a JSON object");
  for (auto &[name, entry] : header.items()) {
    if (name == "__metadata__") {  // free-form text: string values only
      if (!entry.is_object()) return Status::error(corrupt + ": __metadata__ is not an object");
      for (auto &[k, v] : entry.items()) {
        if (!v.is_string()) return Status::error(corrupt + ": __metadata__ '" + shown(k) + "' is not a string");
        (*metadata)[k] = v.template get<std::string>();
      }
      continue;
    }
    LOOM_RETURN_IF_ERROR(visit(name, entry));
  }
  return Status::ok();
}

}  // namespace

Status writeFileAtomically(const std::string &path, const std::string &bytes) {
  return writeFileAtomically(path, std::vector<std::pair<const char *, size_t>>{{bytes.data(), bytes.size()}});
}

Status writeFileAtomically(const std::string &path, const std::vector<std::pair<const char *, size_t>> &chunks,
                           const ByteProgress &progress) {
  // Unique per process and call: writers of the same path never share a temporary file.
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::error(tmp + ": cannot create: " + std::strerror(errno));
  int64_t total = 0, written = 0;
  for (auto [data, size] : chunks) total += int64_t(size);
  constexpr size_t kPiece = size_t(64) << 20;  // progress at least every 64 MiB
  for (auto [data, size] : chunks) {
    size_t done = 0;
    while (done < size) {
      if (progress) progress(written, total);
      ssize_t w = ::write(fd, data + done, std::min(size - done, kPiece));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        ::close(fd);
        ::unlink(tmp.c_str());
        return Status::error(tmp + ": write failed: " + std::strerror(errno));
      }
      done += size_t(w);
      written += w;
    }
  }
  if (progress) progress(written, total);
  bool synced = ::fsync(fd) == 0;
  bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    ::unlink(tmp.c_str());
    return Status::error(tmp + ": fsync failed: " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return Status::error(path + ": rename failed: " + std::strerror(errno));
  }
  // The rename itself is durable once the directory is synced.
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  if (int dfd = ::open(dir.empty() ? "/" : dir.c_str(), O_RDONLY | O_DIRECTORY); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::ok();
}

// The header first (the offsets follow from the sizes), then each tensor's bytes straight from
// the tensor: no second copy of the data in memory (a checkpoint shard's peak memory would
// otherwise triple while it is written).
Status writeSafetensors(const std::string &path, const SafetensorsFile &file, const ByteProgress &progress) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();  // keys in the order written
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::vector<std::pair<const char *, size_t>> chunks(2);
  size_t offset = 0;
  for (auto &[name, t] : file.tensors) {
    if (name == "__metadata__") return Status::error(path + ": a tensor cannot be named __metadata__");
    const char *data = t.isInt ? reinterpret_cast<const char *>(t.ints.data()) : reinterpret_cast<const char *>(t.data.data());
    size_t size = (t.isInt ? t.ints.size() : t.data.size()) * 4;
    chunks.push_back({data, size});
    header[name] = {{"dtype", t.isInt ? "I32" : "F32"},
                    {"shape", t.shape},
                    {"data_offsets", nlohmann::ordered_json::array({offset, offset + size})}};
    offset += size;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::type_error &) {  // a name or value that is not UTF-8
    return Status::error(path + ": cannot write: a tensor name or metadata entry is not valid UTF-8");
  }
  while (text.size() % 8) text += ' ';
  uint64_t len = text.size();
  chunks[0] = {reinterpret_cast<const char *>(&len), 8};
  chunks[1] = {text.data(), text.size()};
  return writeFileAtomically(path, chunks, progress);
}

Status readSafetensors(const std::string &path, SafetensorsFile *file, const ByteProgress &progress) {
  std::string bytes;
  LOOM_RETURN_IF_ERROR(readWholeFile(path, "the safetensors file", &bytes, progress));
  if (bytes.size() < 8) return Status::error(path + ": truncated (no header)");
  uint64_t len;
  std::memcpy(&len, bytes.data(), 8);
  if (len > bytes.size() - 8) return Status::error(path + ": truncated or corrupt header length");
  const char *begin = bytes.data() + 8, *data = begin + len;
  size_t dataSize = bytes.size() - 8 - len;
  return parseHeader(path, begin, data, &file->metadata, [&](const std::string &name, const json &entry) {
    HostTensor t;
    LOOM_RETURN_IF_ERROR(readTensor(path, name, entry, data, dataSize, &t));
    file->tensors[name] = std::move(t);
    return Status::ok();
  });
}

namespace {
// pread of exactly `size` bytes at `offset`.
Status readAt(int fd, const std::string &path, int64_t offset, char *to, int64_t size) {
  while (size > 0) {
    ssize_t r = ::pread(fd, to, size_t(size), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Status::error(path + ": " + (r < 0 ? std::string(std::strerror(errno)) : "truncated"));
    to += r, offset += r, size -= r;
  }
  return Status::ok();
}

struct FileCloser {
  int fd;
  ~FileCloser() {
    if (fd >= 0) ::close(fd);
  }
};
}  // namespace

Status SafetensorsIndex::open(const std::string &path) {
  path_ = path, entries_.clear(), metadata_.clear();
  FileCloser f{::open(path.c_str(), O_RDONLY)};
  if (f.fd < 0) return Status::error(path + ": cannot open: " + std::strerror(errno));
  off_t size = ::lseek(f.fd, 0, SEEK_END);
  if (size < 8) return Status::error(path + ": truncated (no header)");
  uint64_t len;
  LOOM_RETURN_IF_ERROR(readAt(f.fd, path, 0, reinterpret_cast<char *>(&len), 8));
  if (len > uint64_t(size) - 8) return Status::error(path + ": truncated or corrupt header length");
  std::string header(size_t(len), '\0');
  LOOM_RETURN_IF_ERROR(readAt(f.fd, path, 8, header.data(), int64_t(len)));
  dataStart_ = 8 + int64_t(len);
  size_t dataSize = size_t(size) - size_t(dataStart_);
  return parseHeader(path, header.data(), header.data() + header.size(), &metadata_,
                     [&](const std::string &name, const json &entry) {
                       Entry e;
                       LOOM_RETURN_IF_ERROR(readEntry(path, name, entry, dataSize, &e));
                       entries_[name] = std::move(e);
                       return Status::ok();
                     });
}

Status SafetensorsIndex::read(const std::string &name, HostTensor *t) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return Status::error(path_ + ": no tensor '" + shown(name) + "'");
  FileCloser f{::open(path_.c_str(), O_RDONLY)};
  if (f.fd < 0) return Status::error(path_ + ": cannot open: " + std::strerror(errno));
  char *to = allocate(it->second, t);
  return readAt(f.fd, path_, dataStart_ + it->second.begin, to, it->second.end - it->second.begin);
}

}  // namespace loom
