// Where the training loop's scalars go besides the log line: TensorBoard event files
// (--tensorboard-dir) and JSON lines (--metrics-file), both with Megatron-LM's scalar names
// ("lm loss", "learning-rate", "grad-norm", "iteration-time", "throughput", "mem-peak",
// "loss-scale", "lm loss validation", "lm loss validation ppl").
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "support/Status.h"

namespace loom {

// TensorBoard's event file: TFRecord framing (length, masked CRC-32C of the length, the
// serialized Event, masked CRC-32C of it), a file_version record first, then one Event with
// a Summary of simple values per step.
class TensorBoardWriter {
 public:
  static Status open(const std::string &dir, std::unique_ptr<TensorBoardWriter> *out);
  ~TensorBoardWriter();
  Status scalars(int64_t step, const std::map<std::string, double> &values);
  const std::string &path() const { return path_; }

 private:
  Status record(const std::string &bytes);
  std::string path_;
  FILE *file_ = nullptr;
};

// One JSON object per line: {"iteration": N, "<scalar name>": value, ...}.
class MetricsFileWriter {
 public:
  static Status open(const std::string &path, std::unique_ptr<MetricsFileWriter> *out);
  ~MetricsFileWriter();
  Status scalars(int64_t step, const std::map<std::string, double> &values);

 private:
  std::string path_;
  FILE *file_ = nullptr;
};

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) and TFRecord's mask of it:
// ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c(const void *data, size_t size);
uint32_t maskedCrc32c(const void *data, size_t size);

}  // namespace loom
