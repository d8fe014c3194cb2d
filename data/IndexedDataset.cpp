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
  docIdx_.push_back(int64_t(sizes_.size()));
}

void IndexedDatasetWriter::addSentences(const std::vector<std::vector<int32_t>> &sentences) {
  size_t before = sizes_.size();
  for (const std::vector<int32_t> &s : sentences) {
    if (s.empty()) continue;
    for (int32_t t : s) tokens_.push_back(uint16_t(t));
    sizes_.push_back(int32_t(s.size()));
  }
  if (sizes_.size() > before) docIdx_.push_back(int64_t(sizes_.size()));
}

Status IndexedDatasetWriter::finish() {
  std::string bin(reinterpret_cast<const char *>(tokens_.data()), tokens_.size() * 2);
  std::string idx(kMagic, 9);
  put<uint64_t>(idx, 1);
  put<uint8_t>(idx, kUint16Code);
  put<uint64_t>(idx, sizes_.size());
  put<uint64_t>(idx, docIdx_.size());
  for (int32_t s : sizes_) put<int32_t>(idx, s);
  int64_t offset = 0;
  for (int32_t s : sizes_) put<int64_t>(idx, offset), offset += int64_t(s) * 2;
  for (int64_t d : docIdx_) put<int64_t>(idx, d);
  LOOM_RETURN_IF_ERROR(writeFileAtomically(prefix_ + ".bin", bin));
  return writeFileAtomically(prefix_ + ".idx", idx);
}

IndexedDataset::IndexedDataset(IndexedDataset &&o) noexcept { *this = std::move(o); }

IndexedDataset &IndexedDataset::operator=(IndexedDataset &&o) noexcept {
  release();
  tokens_ = o.tokens_, binBytes_ = o.binBytes_, binMap_ = o.binMap_;
  sizes_ = std::move(o.sizes_), pointers_ = std::move(o.pointers_), docIdx_ = std::move(o.docIdx_);
  o.binMap_ = nullptr, o.tokens_ = nullptr;
  return *this;
}

IndexedDataset::~IndexedDataset() { release(); }

std::vector<std::vector<int32_t>> IndexedDataset::documentSentences(int64_t doc) const {
  std::vector<std::vector<int32_t>> out;
  for (int64_t s = docIdx_[doc]; s < docIdx_[doc + 1]; ++s) {
    const uint16_t *p = tokens_ + pointers_[s] / 2;
    out.emplace_back(p, p + sizes_[s]);
  }
  return out;
}

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
  ds.docIdx_.resize(ndoc);
  if (ndoc > 0) std::memcpy(ds.docIdx_.data(), idx.data() + header + nseq * 12, ndoc * 8);
  // The document index: from 0 to the last sequence, never decreasing.
  bool docsOk = ndoc >= 1 && ds.docIdx_.front() == 0 && uint64_t(ds.docIdx_.back()) == nseq;
  for (uint64_t d = 1; docsOk && d < ndoc; ++d) docsOk = ds.docIdx_[d] >= ds.docIdx_[d - 1];
  if (!docsOk) return Status::error(idxPath + ": corrupt document index (not 0 .. sequences, increasing)");
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
