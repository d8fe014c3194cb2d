// The collectives a rank's program uses, over named groups ("tp", "pp", "dp", "embedding").
// Implementations: Gloo over TCP between processes (the CPU backend), NCCL (CUDA), and an
// in-process one over threads (tests and the compiler's reference interpreter).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/Layout.h"
#include "support/Status.h"

namespace loom {

enum class ReduceOp { kSum, kMax, kAvg };

class Collectives {
 public:
  virtual ~Collectives() = default;
  // This rank's position in `group`, and the group's size.
  virtual int rankIn(const std::string &group) const = 0;
  virtual int sizeOf(const std::string &group) const = 0;
  // In place over n floats.
  virtual Status allReduce(const std::string &group, float *data, int64_t n, ReduceOp op) = 0;
  // out holds size * n floats: member r's n floats at offset r * n.
  virtual Status allGather(const std::string &group, const float *in, float *out, int64_t n) = 0;
  // in holds size * n floats; out receives the sum of every member's block `rankIn`.
  virtual Status reduceScatter(const std::string &group, const float *in, float *out, int64_t n) = 0;
  // Point to point with the member at position `peer` of `group`.
  virtual Status send(const std::string &group, int peer, const float *data, int64_t n, int tag) = 0;
  virtual Status recv(const std::string &group, int peer, float *data, int64_t n, int tag) = 0;
  // Waits until this rank's sends were delivered (at the end of a step).
  virtual Status flush() { return Status::ok(); }
};

}  // namespace loom
