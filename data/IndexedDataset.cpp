#include "data/IndexedDataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "formats/Safetensors.h"
#include "support/FileIO.h"

namespace loom {
namespace {
const char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint8_t kUint16Code = 8;  // Megatron's dtype code for np.uint16

template <typename T>
void put(std::string &out, T v) {
  out.append(reinterpret_cast<const char *>(&v), sizeof v);
}
}  // namespace

void IndexedDatasetWriter::addDocument(const std::vector<int32_t> &tokens) {
  for (int32_t t : tokens) tokens_.push_back(uint16_t(t));
  sizes_.push_back(int32_t(tokens.size()));
}

Status IndexedDatasetWriter::finish() {
  std::string bin(reinterpret_cast<const char *>(tokens_.data()), tokens_.size() * 2);
  std::string idx(kMagic, 9);
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, kUint16Code);
  put<uint64_t>(idx, sizes_.size());
  put<uint64_t>(idx, sizes_.size() + 1);
  for (int32_t s : sizes_) put<int32_t>(idx, s);
  int64_t offset = 0;
  for (int32_t s : sizes_) put<int64_t>(idx, offset), offset += int64_t(s) * 2;
  for (size_t d = 0; d <= sizes_.size(); ++d) put<int64_t>(idx, int64_t(d));
  LOOM_RETURN_IF_ERROR(writeFileAtomically(prefix_ + ".bin", bin));
  return writeFileAtomically(prefix_ + ".idx", idx);
}

IndexedDataset::IndexedDataset(IndexedDataset &&o) noexcept { *this = std::move(o); }

IndexedDataset &IndexedDataset::operator=(IndexedDataset &&o) noexcept {
  release();
  tokens_ = o.tokens_, binBytes_ = o.binBytes_, binMap_ = o.binMap_;
  sizes_ = std::move(o.sizes_), pointers_ = std::move(o.pointers_);
  o.binMap_ = nullptr, o.tokens_ = nullptr;
  return *this;
}

IndexedDataset::~IndexedDataset() { release(); }

void IndexedDataset::release() {
  if (binMap_ && binMap_ != MAP_FAILED) munmap(binMap_, binBytes_);
  binMap_ = nullptr;
}

Status IndexedDataset::open(const std::string &prefix, IndexedDataset *out) {
  std::string idxPath = prefix + ".idx", binPath = prefix + ".bin";
  std::string idx;
  LOOM_RETURN_IF_ERROR(readWholeFile(idxPath, "the dataset index (written by loom-preprocess)", &idx));
  size_t header = 9 + 8 + 1 + 8 + 8;
  if (idx.size() < header || std::memcmp(idx.data(), kMagic, 9) != 0)
    return Status::error(idxPath + ": not a Megatron indexed dataset (bad magic)");
  uint64_t version, nseq, ndoc;
  uint8_t code;
  std::memcpy(&version, idx.data() + 9, 8);
  std::memcpy(&code, idx.data() + 17, 1);
  std::memcpy(&nseq, idx.data() + 18, 8);
  std::memcpy(&ndoc, idx.data() + 26, 8);
  if (version != 1) return Status::error(idxPath + ": unsupported version " + std::to_string(version));
  if (code != kUint16Code) return Status::error(idxPath + ": token dtype code " + std::to_string(code) + ", expected uint16 (8)");
  // Counts bounded by the file before any product: a corrupt header must not wrap the size
  // check around and then ask for an impossible allocation.
  if (nseq > idx.size() / 12 || ndoc > idx.size() / 8 || idx.size() != header + nseq * 4 + nseq * 8 + ndoc * 8)
    return Status::error(idxPath + ": truncated or corrupt (size does not match its header)");
  IndexedDataset ds;
  ds.sizes_.resize(nseq);
  ds.pointers_.resize(nseq);
  if (nseq > 0) {  // memcpy from or to an empty vector's null data() is undefined
    std::memcpy(ds.sizes_.data(), idx.data() + header, nseq * 4);
    std::memcpy(ds.pointers_.data(), idx.data() + header + nseq * 4, nseq * 8);
  }
  int fd = ::open(binPath.c_str(), O_RDONLY);
  if (fd < 0) return Status::error(binPath + ": cannot open");
  struct stat st;
  fstat(fd, &st);
  ds.binBytes_ = size_t(st.st_size);
  for (uint64_t s = 0; s < nseq; ++s)
    if (ds.sizes_[s] < 0 || ds.pointers_[s] < 0 || ds.pointers_[s] % 2 != 0 ||
        uint64_t(ds.pointers_[s]) + uint64_t(ds.sizes_[s]) * 2 > ds.binBytes_) {
      ::close(fd);
      return Status::error(binPath + ": truncated (document " + std::to_string(s) + " lies beyond the end)");
    }
  if (ds.binBytes_ > 0) {
    ds.binMap_ = mmap(nullptr, ds.binBytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (ds.binMap_ == MAP_FAILED) {
      ::close(fd);
      return Status::error(binPath + ": mmap failed");
    }
    ds.tokens_ = static_cast<const uint16_t *>(ds.binMap_);
  }
  ::close(fd);
  *out = std::move(ds);
  return Status::ok();
}

}  // namespace loom
