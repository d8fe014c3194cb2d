// The collectives a rank's program uses, over named groups ("tp", "pp", "dp", "embedding").
// Implementations: Gloo over TCP between processes (the CPU backend), NCCL (CUDA), and an
// in-process one over threads (tests and the compiler's reference interpreter).
//
// Buffers are fp32 or 16-bit (bf16 / fp16: a 16-bit plan's activations and their gradients
// travel in their own dtype, half the bytes). A 16-bit reduction adds each pair of values in
// fp32 and rounds the sum once (what NCCL does at each step of its ring for bf16): with two
// members the result is the fp32 sum rounded once; with more, the partial sums are rounded
// along the way in an order that depends on the implementation, identical on every member.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/Layout.h"
#include "protos/plan.pb.h"
#include "support/Status.h"

namespace loom {

enum class ReduceOp { kSum, kMax, kAvg };

// Bytes of one element of a collective's dtype: 4 (F32), 2 (BF16, F16); 0 for any other.
size_t elementBytes(plan::DType dtype);
// acc[i] = acc[i] op x[i] (op: kSum or kMax; kAvg sums) over n elements of `dtype`.
void reduceElements(plan::DType dtype, ReduceOp op, void *acc, const void *x, int64_t n);
// data[i] /= divisor (the average after a sum), rounded once for 16-bit values.
void divideElements(plan::DType dtype, void *data, int64_t n, float divisor);

class Collectives {
 public:
  virtual ~Collectives() = default;
  // This rank's position in `group`, and the group's size.
  virtual int rankIn(const std::string &group) const = 0;
  virtual int sizeOf(const std::string &group) const = 0;
  // In place over n elements of `dtype` (F32, BF16 or F16).
  virtual Status allReduce(const std::string &group, void *data, int64_t n, plan::DType dtype, ReduceOp op) = 0;
  // out holds size * n elements: member r's n elements at offset r * n.
  virtual Status allGather(const std::string &group, const void *in, void *out, int64_t n, plan::DType dtype) = 0;
  // in holds size * n elements; out receives the sum of every member's block `rankIn`.
  virtual Status reduceScatter(const std::string &group, const void *in, void *out, int64_t n,
                               plan::DType dtype) = 0;
  // Point to point with the member at position `peer` of `group`: `bytes` bytes.
  virtual Status sendBytes(const std::string &group, int peer, const void *data, int64_t bytes, int tag) = 0;
  virtual Status recvBytes(const std::string &group, int peer, void *data, int64_t bytes, int tag) = 0;
  // Waits until this rank's sends were delivered (at the end of a step).
  virtual Status flush() { return Status::ok(); }
  // One step of a ring: `bytes` from `send` to the member at position `sendPeer` and as many
  // from `recvPeer` into `recv`, both done on return (`send` is not kept). Context
  // parallelism's ring attention runs it beside its blocks' computation.
  virtual Status exchangeBytes(const std::string &group, int sendPeer, const void *send, int recvPeer, void *recv,
                               int64_t bytes, int tag) {
    LOOM_RETURN_IF_ERROR(sendBytes(group, sendPeer, send, bytes, tag));
    return recvBytes(group, recvPeer, recv, bytes, tag);
  }

  // The fp32 forms.
  Status allReduce(const std::string &group, float *data, int64_t n, ReduceOp op) {
    return allReduce(group, data, n, plan::F32, op);
  }
  Status allGather(const std::string &group, const float *in, float *out, int64_t n) {
    return allGather(group, in, out, n, plan::F32);
  }
  Status reduceScatter(const std::string &group, const float *in, float *out, int64_t n) {
    return reduceScatter(group, in, out, n, plan::F32);
  }
  Status send(const std::string &group, int peer, const float *data, int64_t n, int tag) {
    return sendBytes(group, peer, data, n * int64_t(sizeof(float)), tag);
  }
  Status recv(const std::string &group, int peer, float *data, int64_t n, int tag) {
    return recvBytes(group, peer, data, n * int64_t(sizeof(float)), tag);
  }
};

}  // namespace loom
