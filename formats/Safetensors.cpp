#include "formats/Safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace loom {
namespace {

std::string jsonEscape(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// A minimal reader of the safetensors header: objects, strings, integers, arrays.
class Json {
 public:
  explicit Json(const std::string &s) : s_(s) {}
  bool ok() const { return ok_; }

  void ws() {
    while (i_ < s_.size() && isspace((unsigned char)s_[i_])) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  std::string str() {
    ws();
    std::string out;
    if (!eat('"')) return ok_ = false, out;
    while (i_ < s_.size() && s_[i_] != '"') {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) ++i_;
      out += s_[i_++];
    }
    if (!eat('"')) ok_ = false;
    return out;
  }
  int64_t num() {
    ws();
    size_t start = i_;
    while (i_ < s_.size() && isdigit((unsigned char)s_[i_])) ++i_;  // sizes and offsets: no sign
    if (start == i_ || i_ - start > 18) return ok_ = false, 0;
    return std::strtoll(s_.substr(start, i_ - start).c_str(), nullptr, 10);
  }
  void fail() { ok_ = false; }
  std::vector<int64_t> nums() {
    std::vector<int64_t> out;
    if (!eat('[')) return ok_ = false, out;
    if (eat(']')) return out;
    do out.push_back(num());
    while (ok_ && eat(','));
    if (!eat(']')) ok_ = false;
    return out;
  }

 private:
  const std::string &s_;
  size_t i_ = 0;
  bool ok_ = true;
};

}  // namespace

Status writeFileAtomically(const std::string &path, const std::string &bytes) {
  return writeFileAtomically(path, std::vector<std::pair<const char *, size_t>>{{bytes.data(), bytes.size()}});
}

Status writeFileAtomically(const std::string &path, const std::vector<std::pair<const char *, size_t>> &chunks) {
  // Unique per process and call: writers of the same path never share a temporary file.
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::error(tmp + ": cannot create: " + std::strerror(errno));
  for (auto [data, size] : chunks) {
    size_t done = 0;
    while (done < size) {
      ssize_t w = ::write(fd, data + done, size - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        ::close(fd);
        ::unlink(tmp.c_str());
        return Status::error(tmp + ": write failed: " + std::strerror(errno));
      }
      done += size_t(w);
    }
  }
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
Status writeSafetensors(const std::string &path, const SafetensorsFile &file) {
  std::string header = "{";
  bool first = true;
  if (!file.metadata.empty()) {
    header += "\"__metadata__\":{";
    for (auto &[k, v] : file.metadata) {
      header += (first ? "" : ",") + std::string("\"") + jsonEscape(k) + "\":\"" + jsonEscape(v) + "\"";
      first = false;
    }
    header += "}";
  }
  std::vector<std::pair<const char *, size_t>> chunks(2);
  size_t offset = 0;
  for (auto &[name, t] : file.tensors) {
    const char *data = t.isInt ? reinterpret_cast<const char *>(t.ints.data()) : reinterpret_cast<const char *>(t.data.data());
    size_t size = (t.isInt ? t.ints.size() : t.data.size()) * 4;
    chunks.push_back({data, size});
    std::string shape;
    for (int64_t d : t.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    header += std::string(header.size() > 1 ? "," : "") + "\"" + jsonEscape(name) + "\":{\"dtype\":\"" +
              (t.isInt ? "I32" : "F32") + "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(offset) +
              "," + std::to_string(offset + size) + "]}";
    offset += size;
  }
  header += "}";
  while (header.size() % 8) header += ' ';
  uint64_t len = header.size();
  chunks[0] = {reinterpret_cast<const char *>(&len), 8};
  chunks[1] = {header.data(), header.size()};
  return writeFileAtomically(path, chunks);
}

Status readSafetensors(const std::string &path, SafetensorsFile *file) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string bytes = ss.str();
  if (bytes.size() < 8) return Status::error(path + ": truncated (no header)");
  uint64_t len;
  std::memcpy(&len, bytes.data(), 8);
  if (len > bytes.size() - 8) return Status::error(path + ": truncated or corrupt header length");
  std::string header = bytes.substr(8, len);
  const char *data = bytes.data() + 8 + len;
  size_t dataSize = bytes.size() - 8 - len;
  Json j(header);
  Status corrupt = Status::error(path + ": corrupt safetensors header");
  if (!j.eat('{')) return corrupt;
  if (j.eat('}')) return Status::ok();
  do {
    std::string name = j.str();
    if (!j.ok() || !j.eat(':')) return corrupt;
    if (name == "__metadata__") {
      if (!j.eat('{')) return corrupt;
      if (!j.eat('}')) {
        do {
          std::string k = j.str();
          if (!j.eat(':')) return corrupt;
          file->metadata[k] = j.str();
        } while (j.ok() && j.eat(','));
        if (!j.ok() || !j.eat('}')) return corrupt;
      }
      continue;
    }
    if (!j.eat('{')) return corrupt;
    std::string dtype;
    std::vector<int64_t> shape, offsets;
    do {
      std::string key = j.str();
      if (!j.eat(':')) return corrupt;
      if (key == "dtype") dtype = j.str();
      else if (key == "shape") shape = j.nums();
      else if (key == "data_offsets") offsets = j.nums();
      else j.str();
    } while (j.ok() && j.eat(','));
    if (!j.ok() || !j.eat('}') || offsets.size() != 2) return corrupt;
    if (dtype != "F32" && dtype != "I32")
      return Status::error(path + ": tensor '" + name + "' has dtype " + dtype + " (Loom reads F32 and I32)");
    // Element count without overflow: every dimension bounded by the data it must fit in.
    int64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0 || (d > 0 && numel > int64_t(dataSize) / 4 / d))
        return Status::error(path + ": tensor '" + name + "' has a shape larger than the file (corrupt)");
      numel *= d;
    }
    HostTensor t{shape};
    int64_t bytesNeeded = numel * 4;
    if (offsets[0] > offsets[1] || offsets[1] > int64_t(dataSize) || offsets[1] - offsets[0] != bytesNeeded)
      return Status::error(path + ": tensor '" + name + "' lies outside the file (truncated or corrupt)");
    t.isInt = dtype == "I32";
    if (t.isInt) {
      t.ints.resize(t.numel());
      if (bytesNeeded > 0) std::memcpy(t.ints.data(), data + offsets[0], bytesNeeded);
    } else {
      t.data.resize(t.numel());
      if (bytesNeeded > 0) std::memcpy(t.data.data(), data + offsets[0], bytesNeeded);
    }
    file->tensors[name] = std::move(t);
  } while (j.ok() && j.eat(','));
  if (!j.ok() || !j.eat('}')) return corrupt;
  return Status::ok();
}

}  // namespace loom
