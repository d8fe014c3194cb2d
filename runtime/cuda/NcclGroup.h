// One NCCL communicator per parallel group (tp, pp or dp), bootstrapped through the control
// plane: the group's rank 0 creates the ncclUniqueId and publishes it in the coordinator's
// key-value store; the others wait for it there; then every member calls ncclCommInitRank.
#pragma once

#include "protos/plan.pb.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/Collectives.h"
#include "runtime/cuda/DeviceArray.h"
#include "support/Status.h"
#include "runtime/control/CoordinatorClient.h"

namespace loom::cuda {

// `name` must be unique in the job and not reused within it (e.g. "tp/3" for the fourth tensor-
// parallel group): its id stays in the coordinator's store for the job's life.
// The unique id of communicator `name` (key "nccl/<name>"): created and published by group
// rank 0, fetched (waiting up to timeoutMs) by the others. Needs no GPU.
Status shareNcclUniqueId(control::CoordinatorClient &client, const std::string &name, int groupRank,
                         int64_t timeoutMs, ncclUniqueId *id);

class NcclGroup {
 public:
  // Uses the current CUDA device (cudaSetDevice first).
  static Status create(control::CoordinatorClient &client, const std::string &name, int groupRank, int groupSize,
                       int64_t timeoutMs, std::unique_ptr<NcclGroup> *out);
  // A group of one member: its id needs no exchange.
  static Status createAlone(const std::string &name, std::unique_ptr<NcclGroup> *out);
  ~NcclGroup();
  NcclGroup(const NcclGroup &) = delete;
  NcclGroup &operator=(const NcclGroup &) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // In-place fp32 sum over the group (tensor-parallel f/g and data-parallel gradient buckets).
  Status allReduceSum(float *buffer, int64_t count, cudaStream_t stream);
  // out = reduce(in) over the group for every part (in may equal out), as one grouped NCCL
  // call: a data-parallel bucket's gradients need no packing copy. Each part in its own
  // element type (a 16-bit plan's tensor-parallel all-reduces are bf16 or fp16 on the wire).
  struct Part {
    const void *in;
    void *out;
    int64_t count;
    ElementType type = ElementType::kF32;
  };
  Status allReduce(const std::vector<Part> &parts, ReduceOp op, cudaStream_t stream);
  // Sequence parallelism: out [size * count] gathers every member's in [count] in rank order;
  // reduceScatterSum is its transpose, out [count] = this member's slice of the sum of in.
  Status allGather(const void *in, void *out, int64_t count, cudaStream_t stream,
                   ElementType type = ElementType::kF32);
  Status reduceScatterSum(const void *in, void *out, int64_t count, cudaStream_t stream,
                          ElementType type = ElementType::kF32);

  // The pipeline sends and receives of one schedule step, issued as one grouped NCCL call so
  // that a send to the next stage and a receive from it cannot deadlock each other.
  struct Transfer {
    bool send;
    int peer;  // group rank
    void *buffer;
    int64_t count;
    ElementType type = ElementType::kF32;
  };
  Status exchange(const std::vector<Transfer> &transfers, cudaStream_t stream);

 private:
  NcclGroup(std::string name, int rank, int size) : name_(std::move(name)), rank_(rank), size_(size) {}
  static Status init(const std::string &name, int groupRank, int groupSize, const ncclUniqueId &id,
                     std::unique_ptr<NcclGroup> *out);
  Status check(ncclResult_t result, const char *what) const;
  std::string name_;
  int rank_, size_;
  ncclComm_t comm_ = nullptr;
};

// The communicators of one rank: one per collective group of its plan (RankPlan.groups: "tp",
// "dp", "embedding"; pipeline messages use PipelineLinks), created together in the plan's
// order (every rank's plan lists its groups in the same order, so no two ranks wait on each
// other's second group). A group of one member gets a
// communicator too (NCCL's all-reduce over one rank is a copy), so programs need no special case.
class NcclGroups {
 public:
  // `client` exchanges the ids of groups with more than one member (null: a world of one).
  static Status create(control::CoordinatorClient *client, const plan::RankPlan &plan, int64_t timeoutMs,
                       std::unique_ptr<NcclGroups> *out);
  // The communicator of `group`, or an error naming it.
  Status find(const std::string &group, NcclGroup **out) const;

 private:
  NcclGroups() = default;
  std::vector<std::pair<std::string, std::unique_ptr<NcclGroup>>> groups_;
};

}  // namespace loom::cuda
