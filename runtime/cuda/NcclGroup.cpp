#include "runtime/cuda/NcclGroup.h"

#include <cstring>

namespace loom::cuda {

Status shareNcclUniqueId(control::CoordinatorClient &client, const std::string &name, int groupRank,
                         int64_t timeoutMs, ncclUniqueId *id) {
  std::string key = "nccl/" + name;
  if (groupRank == 0) {
    ncclResult_t r = ncclGetUniqueId(id);
    if (r != ncclSuccess) return Status::error("NCCL unique id for group " + name + ": " + ncclGetErrorString(r));
    return client.kvSet(key, std::string(reinterpret_cast<const char *>(id), sizeof(*id)));
  }
  std::string value;
  LOOM_RETURN_IF_ERROR(client.kvGet(key, timeoutMs, &value));
  if (value.size() != sizeof(*id))
    return Status::error("coordinator key " + key + " holds " + std::to_string(value.size()) +
                         " bytes, not an ncclUniqueId (" + std::to_string(sizeof(*id)) + ")");
  std::memcpy(id, value.data(), sizeof(*id));
  return Status::ok();
}

Status NcclGroup::create(control::CoordinatorClient &client, const std::string &name, int groupRank, int groupSize,
                         int64_t timeoutMs, std::unique_ptr<NcclGroup> *out) {
  if (groupSize < 1 || groupRank < 0 || groupRank >= groupSize)
    return Status::error("NCCL group " + name + ": rank " + std::to_string(groupRank) + " is not in a group of " +
                         std::to_string(groupSize));
  ncclUniqueId id;
  LOOM_RETURN_IF_ERROR(shareNcclUniqueId(client, name, groupRank, timeoutMs, &id));
  return init(name, groupRank, groupSize, id, out);
}

Status NcclGroup::createAlone(const std::string &name, std::unique_ptr<NcclGroup> *out) {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return Status::error("NCCL unique id for group " + name + ": " + ncclGetErrorString(r));
  return init(name, 0, 1, id, out);
}

Status NcclGroup::init(const std::string &name, int groupRank, int groupSize, const ncclUniqueId &id,
                       std::unique_ptr<NcclGroup> *out) {
  std::unique_ptr<NcclGroup> group(new NcclGroup(name, groupRank, groupSize));
  LOOM_RETURN_IF_ERROR(group->check(ncclCommInitRank(&group->comm_, groupSize, id, groupRank), "init"));
  *out = std::move(group);
  return Status::ok();
}

NcclGroup::~NcclGroup() {
  if (comm_) ncclCommDestroy(comm_);
}

Status NcclGroup::check(ncclResult_t result, const char *what) const {
  if (result == ncclSuccess) return Status::ok();
  return Status::error("NCCL " + std::string(what) + " in group " + name_ + " (rank " + std::to_string(rank_) +
                       " of " + std::to_string(size_) + "): " + ncclGetErrorString(result));
}

Status NcclGroup::allReduceSum(float *buffer, int64_t count, cudaStream_t stream) {
  return check(ncclAllReduce(buffer, buffer, size_t(count), ncclFloat32, ncclSum, comm_, stream), "all-reduce");
}

namespace {
ncclDataType_t ncclTypeOf(ElementType t) {
  return t == ElementType::kF32 ? ncclFloat32 : t == ElementType::kBf16 ? ncclBfloat16 : ncclFloat16;
}
}  // namespace

Status NcclGroup::allReduce(const std::vector<Part> &parts, ReduceOp op, cudaStream_t stream) {
  ncclRedOp_t nccl = op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kMax ? ncclMax : ncclAvg;
  LOOM_RETURN_IF_ERROR(check(ncclGroupStart(), "group start"));
  Status first = Status::ok();
  for (const Part &p : parts) {
    ncclResult_t r = ncclAllReduce(p.in, p.out, size_t(p.count), ncclTypeOf(p.type), nccl, comm_, stream);
    if (r != ncclSuccess && first.isOk()) first = check(r, "all-reduce");
  }
  Status end = check(ncclGroupEnd(), "group end");  // always closed, even after a failed call
  return first.isOk() ? end : first;
}

Status NcclGroup::allGather(const void *in, void *out, int64_t count, cudaStream_t stream, ElementType type) {
  return check(ncclAllGather(in, out, size_t(count), ncclTypeOf(type), comm_, stream), "all-gather");
}

Status NcclGroup::reduceScatterSum(const void *in, void *out, int64_t count, cudaStream_t stream, ElementType type) {
  return check(ncclReduceScatter(in, out, size_t(count), ncclTypeOf(type), ncclSum, comm_, stream), "reduce-scatter");
}

Status NcclGroup::exchange(const std::vector<Transfer> &transfers, cudaStream_t stream) {
  for (const Transfer &t : transfers)
    if (t.peer < 0 || t.peer >= size_ || t.peer == rank_)
      return Status::error("NCCL group " + name_ + ": rank " + std::to_string(rank_) + " cannot exchange with peer " +
                           std::to_string(t.peer));
  LOOM_RETURN_IF_ERROR(check(ncclGroupStart(), "group start"));
  Status first = Status::ok();
  for (const Transfer &t : transfers) {
    ncclResult_t r = t.send ? ncclSend(t.buffer, size_t(t.count), ncclTypeOf(t.type), t.peer, comm_, stream)
                            : ncclRecv(t.buffer, size_t(t.count), ncclTypeOf(t.type), t.peer, comm_, stream);
    if (r != ncclSuccess && first.isOk()) first = check(r, t.send ? "send" : "receive");
  }
  Status end = check(ncclGroupEnd(), "group end");  // always closed, even after a failed call
  return first.isOk() ? end : first;
}

Status NcclGroups::create(control::CoordinatorClient *client, const plan::RankPlan &plan, int64_t timeoutMs,
                          std::unique_ptr<NcclGroups> *out) {
  std::unique_ptr<NcclGroups> groups(new NcclGroups());
  for (const plan::Group &g : plan.groups()) {
    const std::string &group = g.name();
    if (group == "pp") continue;  // pipeline messages: PipelineLinks
    std::vector<int> members(g.ranks().begin(), g.ranks().end());
    int position = g.position();
    if (position < 0 || position >= int(members.size()) || members[size_t(position)] != plan.rank())
      return Status::error("group " + group + " of rank " + std::to_string(plan.rank()) +
                           ": its position is not the rank's (corrupt plan)");
    // The name lists the members: unique in the job, the same on every member.
    std::string name = group;
    for (int m : members) name += "/" + std::to_string(m);
    std::unique_ptr<NcclGroup> comm;
    if (members.size() == 1)
      LOOM_RETURN_IF_ERROR(NcclGroup::createAlone(name, &comm));
    else if (!client)
      return Status::error("NCCL group " + name + " has " + std::to_string(members.size()) +
                           " members but no coordinator was given to exchange its id");
    else
      LOOM_RETURN_IF_ERROR(NcclGroup::create(*client, name, position, int(members.size()), timeoutMs, &comm));
    groups->groups_.emplace_back(group, std::move(comm));
  }
  *out = std::move(groups);
  return Status::ok();
}

Status NcclGroups::find(const std::string &group, NcclGroup **out) const {
  for (const auto &[name, comm] : groups_)
    if (name == group) return *out = comm.get(), Status::ok();
  return Status::error("no NCCL communicator for group '" + group + "' on this rank");
}

}  // namespace loom::cuda
