#include "runtime/GlooCollectives.h"

#include <cstring>

#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace loom {

namespace {
using ReduceFn = void (*)(void *, const void *, const void *, size_t);
}

Status GlooCollectives::create(const plan::RankPlan &plan, gloo::rendezvous::Store &store,
                               const std::string &hostAddress, double timeoutSeconds,
                               std::unique_ptr<GlooCollectives> *out) {
  auto self = std::unique_ptr<GlooCollectives>(new GlooCollectives());
  self->timeoutSeconds_ = timeoutSeconds;
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostAddress;
    self->device_ = gloo::transport::tcp::CreateDevice(attr);
    for (const plan::Group &pg : plan.groups()) {
      Group g;
      g.ranks.assign(pg.ranks().begin(), pg.ranks().end());
      g.position = pg.position();
      if (g.ranks.size() > 1) {
        // One store namespace per group instance: its name and first member.
        gloo::rendezvous::PrefixStore prefixed(pg.name() + "/" + std::to_string(g.ranks[0]), store);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(g.position, int(g.ranks.size()));
        ctx->setTimeout(std::chrono::milliseconds(int64_t(timeoutSeconds * 1000)));
        ctx->connectFullMesh(prefixed, self->device_);
        g.context = ctx;
      }
      self->groups_[pg.name()] = std::move(g);
    }
  } catch (const std::exception &e) {
    return Status::error(std::string("cannot connect the communicators: ") + e.what());
  }
  *out = std::move(self);
  return Status::ok();
}

GlooCollectives::~GlooCollectives() = default;

Status GlooCollectives::groupOf(const std::string &name, Group **g) {
  auto it = groups_.find(name);
  if (it == groups_.end()) return Status::error("no communicator for group '" + name + "'");
  *g = &it->second;
  return Status::ok();
}

int GlooCollectives::rankIn(const std::string &group) const {
  auto it = groups_.find(group);
  return it == groups_.end() ? 0 : it->second.position;
}

int GlooCollectives::sizeOf(const std::string &group) const {
  auto it = groups_.find(group);
  return it == groups_.end() ? 1 : int(it->second.ranks.size());
}

namespace {
// Gloo's reduce functions over 16-bit values (reduceElements: pairs in fp32, rounded once).
template <plan::DType D, ReduceOp Op>
void reduceHalf(void *c, const void *a, const void *b, size_t n) {
  if (c != a) std::memcpy(c, a, n * 2);
  reduceElements(D, Op, c, b, int64_t(n));
}

ReduceFn reduceFunction(plan::DType dtype, ReduceOp op) {
  bool max = op == ReduceOp::kMax;
  switch (dtype) {
    case plan::BF16: return max ? &reduceHalf<plan::BF16, ReduceOp::kMax> : &reduceHalf<plan::BF16, ReduceOp::kSum>;
    case plan::F16: return max ? &reduceHalf<plan::F16, ReduceOp::kMax> : &reduceHalf<plan::F16, ReduceOp::kSum>;
    default: return max ? ReduceFn(&gloo::max<float>) : ReduceFn(&gloo::sum<float>);
  }
}

Status unsupported(const char *what, plan::DType dtype) {
  return Status::error(std::string(what) + ": elements of dtype " + plan::DType_Name(dtype) +
                       " (expected F32, BF16 or F16)");
}
}  // namespace

Status GlooCollectives::allReduce(const std::string &group, void *data, int64_t n, plan::DType dtype, ReduceOp op) {
  Group *g;
  LOOM_RETURN_IF_ERROR(groupOf(group, &g));
  if (elementBytes(dtype) == 0) return unsupported("all_reduce", dtype);
  if (!g->context) return Status::ok();
  try {
    gloo::AllreduceOptions opts(g->context);
    if (dtype == plan::F32)
      opts.setOutput(static_cast<float *>(data), size_t(n));
    else
      opts.setOutput(static_cast<uint16_t *>(data), size_t(n));
    opts.setReduceFunction(reduceFunction(dtype, op));
    opts.setTag(g->nextTag++);
    gloo::allreduce(opts);
  } catch (const std::exception &e) {
    return Status::error("all_reduce on group " + group + ": " + e.what());
  }
  if (op == ReduceOp::kAvg) divideElements(dtype, data, n, float(g->ranks.size()));
  return Status::ok();
}

Status GlooCollectives::allGather(const std::string &group, const void *in, void *out, int64_t n, plan::DType dtype) {
  Group *g;
  LOOM_RETURN_IF_ERROR(groupOf(group, &g));
  size_t bytes = elementBytes(dtype) * size_t(n);
  if (bytes == 0 && n > 0) return unsupported("all_gather", dtype);
  if (!g->context) {
    std::memcpy(out, in, bytes);
    return Status::ok();
  }
  try {
    // Gathered as bytes: no arithmetic, so the element type does not matter to Gloo.
    gloo::AllgatherOptions opts(g->context);
    opts.setInput(static_cast<uint8_t *>(const_cast<void *>(in)), bytes);
    opts.setOutput(static_cast<uint8_t *>(out), bytes * g->ranks.size());
    opts.setTag(g->nextTag++);
    gloo::allgather(opts);
  } catch (const std::exception &e) {
    return Status::error("all_gather on group " + group + ": " + e.what());
  }
  return Status::ok();
}

// An all-reduce of the whole buffer, keeping this rank's block: simple and exact on CPUs.
Status GlooCollectives::reduceScatter(const std::string &group, const void *in, void *out, int64_t n,
                                      plan::DType dtype) {
  Group *g;
  LOOM_RETURN_IF_ERROR(groupOf(group, &g));
  size_t bytes = elementBytes(dtype) * size_t(n);
  if (bytes == 0 && n > 0) return unsupported("reduce_scatter", dtype);
  const char *begin = static_cast<const char *>(in);
  std::vector<char> all(begin, begin + bytes * g->ranks.size());
  LOOM_RETURN_IF_ERROR(allReduce(group, all.data(), n * int64_t(g->ranks.size()), dtype, ReduceOp::kSum));
  std::memcpy(out, all.data() + g->position * bytes, bytes);
  return Status::ok();
}

Status GlooCollectives::sendBytes(const std::string &group, int peer, const void *data, int64_t bytes, int tag) {
  Group *g;
  LOOM_RETURN_IF_ERROR(groupOf(group, &g));
  if (!g->context) return Status::error("send within a group of one (" + group + ")");
  if (peer < 0 || peer >= int(g->ranks.size())) return Status::error("send: peer " + std::to_string(peer) + " outside group " + group);
  try {
    auto p = std::make_unique<PendingSend>();
    const char *begin = static_cast<const char *>(data);
    p->data.assign(begin, begin + bytes);
    p->group = group;
    p->buffer = g->context->createUnboundBuffer(p->data.data(), p->data.size());
    p->buffer->send(peer, uint64_t(tag));
    pending_.push_back(std::move(p));
  } catch (const std::exception &e) {
    return Status::error("send on group " + group + ": " + e.what());
  }
  return Status::ok();
}

Status GlooCollectives::recvBytes(const std::string &group, int peer, void *data, int64_t bytes, int tag) {
  Group *g;
  LOOM_RETURN_IF_ERROR(groupOf(group, &g));
  if (!g->context) return Status::error("recv within a group of one (" + group + ")");
  if (peer < 0 || peer >= int(g->ranks.size())) return Status::error("recv: peer " + std::to_string(peer) + " outside group " + group);
  try {
    auto buffer = g->context->createUnboundBuffer(data, size_t(bytes));
    buffer->recv(peer, uint64_t(tag));
    buffer->waitRecv(std::chrono::milliseconds(int64_t(timeoutSeconds_ * 1000)));
  } catch (const std::exception &e) {
    return Status::error("recv from rank " + std::to_string(g->ranks[peer]) + " on group " + group + ": " + e.what());
  }
  return Status::ok();
}

// Both directions posted before either is awaited (the ring's members all send and receive at
// once), and the send awaited too: unlike sendBytes, nothing is copied or left pending.
Status GlooCollectives::exchangeBytes(const std::string &group, int sendPeer, const void *send, int recvPeer,
                                     void *recv, int64_t bytes, int tag) {
  Group *g;
  LOOM_RETURN_IF_ERROR(groupOf(group, &g));
  if (!g->context) return Status::error("ring exchange within a group of one (" + group + ")");
  int n = int(g->ranks.size());
  if (sendPeer < 0 || sendPeer >= n || recvPeer < 0 || recvPeer >= n)
    return Status::error("ring exchange: peers " + std::to_string(sendPeer) + ", " + std::to_string(recvPeer) +
                         " outside group " + group);
  try {
    auto in = g->context->createUnboundBuffer(recv, size_t(bytes));
    auto out = g->context->createUnboundBuffer(const_cast<void *>(send), size_t(bytes));
    in->recv(recvPeer, uint64_t(tag));
    out->send(sendPeer, uint64_t(tag));
    auto timeout = std::chrono::milliseconds(int64_t(timeoutSeconds_ * 1000));
    in->waitRecv(timeout);
    out->waitSend(timeout);
  } catch (const std::exception &e) {
    return Status::error("ring exchange with ranks " + std::to_string(g->ranks[size_t(sendPeer)]) + " and " +
                         std::to_string(g->ranks[size_t(recvPeer)]) + " on group " + group + ": " + e.what());
  }
  return Status::ok();
}

Status GlooCollectives::flush() {
  try {
    for (auto &p : pending_) p->buffer->waitSend(std::chrono::milliseconds(int64_t(timeoutSeconds_ * 1000)));
  } catch (const std::exception &e) {
    return Status::error(std::string("pipeline send: ") + e.what());
  }
  pending_.clear();
  return Status::ok();
}

}  // namespace loom
