#include "train/MetricsWriters.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "protos/tensorboard.pb.h"

namespace loom {

uint32_t crc32c(const void *data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  const unsigned char *p = static_cast<const unsigned char *>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t maskedCrc32c(const void *data, size_t size) {
  uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {

double wallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

Status TensorBoardWriter::open(const std::string &dir, std::unique_ptr<TensorBoardWriter> *out) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::error(dir + ": cannot create the TensorBoard directory: " + ec.message());
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  auto w = std::unique_ptr<TensorBoardWriter>(new TensorBoardWriter());
  // TensorBoard's name pattern: events.out.tfevents.<seconds>.<host>
  w->path_ = dir + "/events.out.tfevents." + std::to_string(int64_t(wallTime())) + "." + host + "." +
             std::to_string(getpid());
  w->file_ = std::fopen(w->path_.c_str(), "wb");
  if (!w->file_) return Status::error(w->path_ + ": cannot create");
  tensorboard::Event version;
  version.set_wall_time(wallTime());
  version.set_file_version("brain.Event:2");
  LOOM_RETURN_IF_ERROR(w->record(version.SerializeAsString()));
  *out = std::move(w);
  return Status::ok();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

Status TensorBoardWriter::record(const std::string &bytes) {
  uint64_t length = bytes.size();  // little-endian on every machine Loom builds for (x86-64)
  uint32_t lengthCrc = maskedCrc32c(&length, sizeof length), dataCrc = maskedCrc32c(bytes.data(), bytes.size());
  bool ok = std::fwrite(&length, sizeof length, 1, file_) == 1 && std::fwrite(&lengthCrc, 4, 1, file_) == 1 &&
            std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size() && std::fwrite(&dataCrc, 4, 1, file_) == 1;
  // Flushed per record: TensorBoard reads the file while training runs.
  if (!ok || std::fflush(file_) != 0) return Status::error(path_ + ": cannot write");
  return Status::ok();
}

Status TensorBoardWriter::scalars(int64_t step, const std::map<std::string, double> &values) {
  tensorboard::Event e;
  e.set_wall_time(wallTime());
  e.set_step(step);
  for (auto &[tag, value] : values) {
    tensorboard::Summary::Value *v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(float(value));
  }
  return record(e.SerializeAsString());
}

Status MetricsFileWriter::open(const std::string &path, std::unique_ptr<MetricsFileWriter> *out) {
  auto w = std::unique_ptr<MetricsFileWriter>(new MetricsFileWriter());
  w->path_ = path;
  w->file_ = std::fopen(path.c_str(), "a");  // a resumed run continues the same file
  if (!w->file_) return Status::error(path + ": cannot open the metrics file");
  *out = std::move(w);
  return Status::ok();
}

MetricsFileWriter::~MetricsFileWriter() {
  if (file_) std::fclose(file_);
}

Status MetricsFileWriter::scalars(int64_t step, const std::map<std::string, double> &values) {
  nlohmann::json line = {{"iteration", step}};
  for (auto &[name, value] : values) line[name] = value;
  std::string text = line.dump() + "\n";
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0)
    return Status::error(path_ + ": cannot write");
  return Status::ok();
}

}  // namespace loom
