#include "runtime/cuda/PipelineLinks.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <string>

#include "plan/PlanAttributes.h"
#include "runtime/Executor.h"
#include "runtime/cuda/CudaStatus.h"
#include "runtime/cuda/NcclGroup.h"

namespace loom::cuda {

struct PipelineLinks::Link {
  int peer = 0;  // pp position of the other end
  bool send = false;
  int source = 0, destination = 0;  // global ranks
  int64_t slotBytes = 0;
  std::unique_ptr<NcclGroup> comm;  // rank 0: the source
  cudaStream_t stream = nullptr;
  std::vector<char *> slots;
  std::vector<cudaEvent_t> filled, free;  // per slot: its message is in it / it may be reused
  size_t next = 0;                         // messages so far this step
  size_t messages = 0;                     // per step

  ~Link() {
    for (char *s : slots) cudaFree(s);
    for (cudaEvent_t e : filled) cudaEventDestroy(e);
    for (cudaEvent_t e : free) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
  }
  std::string name() const {
    return "pp-link " + std::to_string(source) + "->" + std::to_string(destination);
  }
};

Status PipelineLinks::create(control::CoordinatorClient *client, const std::vector<int> &members, int position,
                             const std::vector<Need> &needs, int64_t timeoutMs, std::unique_ptr<PipelineLinks> *out) {
  std::unique_ptr<PipelineLinks> links(new PipelineLinks());
  for (const Need &n : needs) {
    if (n.peer < 0 || n.peer >= int(members.size()) || n.peer == position)
      return Status::error("pipeline peer " + std::to_string(n.peer) + " is not another member of a group of " +
                           std::to_string(members.size()));
    if (n.messages < 1 || n.bytes < 1) continue;
    auto link = std::make_unique<Link>();
    link->peer = n.peer, link->send = n.send, link->slotBytes = n.bytes;  // the slots hold at least the warm-up's one float
    link->source = n.send ? members[position] : members[n.peer];
    link->destination = n.send ? members[n.peer] : members[position];
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamCreateWithFlags(&link->stream, cudaStreamNonBlocking), "stream"));
    link->messages = size_t(n.messages);
    int slots = n.slots > 0 ? std::min(n.slots, n.messages) : n.messages;
    for (int k = 0; k < slots; ++k) {
      char *slot = nullptr;
      cudaEvent_t filled, free;
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&slot, size_t(std::max<int64_t>(n.bytes, 4))),
                                      "allocating " + link->name() + " message slots"));
      link->slots.push_back(slot);
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming), "event"));
      link->filled.push_back(filled);
      LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventCreateWithFlags(&free, cudaEventDisableTiming), "event"));
      link->free.push_back(free);
    }
    links->links_.push_back(std::move(link));
  }
  // One global order of creation (each ncclCommInitRank waits for the other end).
  std::sort(links->links_.begin(), links->links_.end(), [](const auto &a, const auto &b) {
    return std::pair(a->source, a->destination) < std::pair(b->source, b->destination);
  });
  for (auto &link : links->links_) {
    if (!client) return Status::error(link->name() + ": no coordinator to exchange the NCCL id through");
    std::string name = "pp-link/" + std::to_string(link->source) + "/" + std::to_string(link->destination);
    LOOM_RETURN_IF_ERROR(NcclGroup::create(*client, name, link->send ? 0 : 1, 2, timeoutMs, &link->comm));
    // One float over the link now, in the same global order: NCCL connects point-to-point
    // peers lazily, with the host waiting for the other end, which must not happen mid-step.
    LOOM_RETURN_IF_ERROR(link->comm->exchange({{link->send, link->send ? 1 : 0, link->slots[0], 1}}, link->stream));
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamSynchronize(link->stream), link->name() + " warm-up"));
  }
  *out = std::move(links);
  return Status::ok();
}

PipelineLinks::~PipelineLinks() { cudaDeviceSynchronize(); }

void PipelineLinks::startStep() {
  for (auto &link : links_) link->next = 0;
}

Status PipelineLinks::find(int peer, bool send, Link **out) {
  for (auto &link : links_)
    if (link->peer == peer && link->send == send) return *out = link.get(), Status::ok();
  return Status::error(std::string("no pipeline link ") + (send ? "to" : "from") + " pp position " +
                       std::to_string(peer) + " (the plan's messages were not counted)");
}

Status PipelineLinks::send(int peer, In data, int64_t count, cudaStream_t stream) {
  Link *l;
  LOOM_RETURN_IF_ERROR(find(peer, true, &l));
  int64_t bytes = count * elementBytes(data.type);
  if (l->next >= l->messages || bytes > l->slotBytes)
    return Status::error(l->name() + ": more or larger messages in this step than the schedule announced");
  size_t k = l->next++ % l->slots.size();
  // The slot's last message has left; copy in; the link sends when the copy is done.
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamWaitEvent(stream, l->free[k], 0), "stream wait"));
  LOOM_RETURN_IF_ERROR(cudaStatus(
      cudaMemcpyAsync(l->slots[k], data.data, size_t(bytes), cudaMemcpyDeviceToDevice, stream), "copy"));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(l->filled[k], stream), "event"));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamWaitEvent(l->stream, l->filled[k], 0), "stream wait"));
  LOOM_RETURN_IF_ERROR(l->comm->exchange({{true, 1, l->slots[k], count, data.type}}, l->stream));
  return cudaStatus(cudaEventRecord(l->free[k], l->stream), "event");
}

Status PipelineLinks::recv(int peer, Out data, int64_t count, cudaStream_t stream) {
  Link *l;
  LOOM_RETURN_IF_ERROR(find(peer, false, &l));
  int64_t bytes = count * elementBytes(data.type);
  if (l->next >= l->messages || bytes > l->slotBytes)
    return Status::error(l->name() + ": more or larger messages in this step than the schedule announced");
  size_t k = l->next++ % l->slots.size();
  // Posted once the slot's last message was copied out; `stream`
  // copies the message out when it has arrived.
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamWaitEvent(l->stream, l->free[k], 0), "stream wait"));
  LOOM_RETURN_IF_ERROR(l->comm->exchange({{false, 0, l->slots[k], count, data.type}}, l->stream));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaEventRecord(l->filled[k], l->stream), "event"));
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaStreamWaitEvent(stream, l->filled[k], 0), "stream wait"));
  LOOM_RETURN_IF_ERROR(cudaStatus(
      cudaMemcpyAsync(data.data, l->slots[k], size_t(bytes), cudaMemcpyDeviceToDevice, stream), "copy"));
  return cudaStatus(cudaEventRecord(l->free[k], stream), "event");
}

namespace {

// Calls visit(program, instruction, send?, peer) for every send and receive of the step, in
// schedule order.
template <typename Visit>
void forEachMessage(const plan::RankPlan &plan, const plan::ProgramSet &programs, Visit visit) {
  std::map<std::string, const plan::Program *> byName;
  for (const plan::Program &p : programs.programs()) byName[p.name()] = &p;
  for (const plan::ScheduleEntry &e : plan.schedule()) {
    auto it = byName.find(e.program());
    if (it == byName.end()) continue;  // the trainer reports it
    for (const plan::Instruction &in : it->second->instructions()) {
      bool send = in.op() == "send";
      if (!send && in.op() != "recv") continue;
      int64_t peer = -1, tag = 0;
      for (const plan::Attribute &a : in.attributes()) {
        if (a.name() == "peer") peer = a.i();
        if (a.name() == "tag") tag = a.i();
      }
      visit(*it->second, e, in, send, int(peer), tag);
    }
  }
}

}  // namespace

Status pipelineNeeds(const plan::RankPlan &plan, const plan::ProgramSet &programs,
                     std::vector<PipelineLinks::Need> *out) {
  std::map<std::pair<int, bool>, PipelineLinks::Need> needs;
  std::map<std::tuple<const plan::Program *, int, int, bool>, int> perProgram;  // (program, mb, peer, send)
  Status status = Status::ok();
  forEachMessage(plan, programs, [&](const plan::Program &p, const plan::ScheduleEntry &e, const plan::Instruction &in,
                                     bool send, int peer, int64_t) {
    if (++perProgram[{&p, e.micro_batch(), peer, send}] == 2 && status.isOk())
      status = Status::error(p.name() + ": two messages " + (send ? "to" : "from") + " pp position " +
                             std::to_string(peer) + " in one program (NCCL matches by order only; not supported)");
    const plan::Buffer &b = p.buffers(send ? in.inputs(0) : in.outputs(0));
    int64_t bytes = planattr::elementBytes(b.dtype());
    for (int64_t d : b.shape()) bytes *= d;
    PipelineLinks::Need &n = needs[{peer, send}];
    n.peer = peer, n.send = send, n.bytes = std::max(n.bytes, bytes);
    ++n.messages;
  });
  for (const plan::PipelineLink &l : plan.pipeline_links()) {  // the slots loomc check measured
    auto it = needs.find({l.peer(), l.send()});
    if (it != needs.end()) it->second.slots = l.slots();
  }
  out->clear();
  for (auto &[key, n] : needs) out->push_back(n);
  return status;
}

std::map<std::pair<int, bool>, std::vector<int64_t>> linkMessageOrder(const plan::RankPlan &plan,
                                                                      const plan::ProgramSet &programs) {
  std::map<std::pair<int, bool>, std::vector<int64_t>> order;
  forEachMessage(plan, programs, [&](const plan::Program &, const plan::ScheduleEntry &e, const plan::Instruction &,
                                     bool send, int peer, int64_t tag) {
    order[{peer, send}].push_back(tag + (e.micro_batch() < 0 ? 0 : e.micro_batch() * kTagsPerMicroBatch));
  });
  return order;
}

}  // namespace loom::cuda
