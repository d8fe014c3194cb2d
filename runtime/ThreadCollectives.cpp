#include "runtime/ThreadCollectives.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

namespace loom {

ThreadWorld::ThreadWorld(ParallelLayout layout, double timeoutSeconds)
    : layout_(layout), timeout_(timeoutSeconds) {}

std::vector<int> ThreadWorld::members(const std::string &group, int rank) const {
  return groupMembers(layout_, group, rank);
}

class ThreadCollectives : public Collectives {
 public:
  ThreadCollectives(ThreadWorld &world, int rank) : world_(world), rank_(rank) {}

  int rankIn(const std::string &group) const override {
    auto m = world_.members(group, rank_);
    return int(std::find(m.begin(), m.end(), rank_) - m.begin());
  }
  int sizeOf(const std::string &group) const override { return int(world_.members(group, rank_).size()); }
  using Collectives::allGather;
  using Collectives::allReduce;
  using Collectives::reduceScatter;

  Status allReduce(const std::string &group, void *data, int64_t n, plan::DType dtype, ReduceOp op) override {
    size_t bytes = elementBytes(dtype) * size_t(n);
    return world_.collective(group, rank_, data, data, [&](std::vector<ThreadWorld::Slot> &slots) {
      std::vector<char> acc(static_cast<const char *>(slots[0].in), static_cast<const char *>(slots[0].in) + bytes);
      for (size_t r = 1; r < slots.size(); ++r) reduceElements(dtype, op, acc.data(), slots[r].in, n);
      if (op == ReduceOp::kAvg) divideElements(dtype, acc.data(), n, float(slots.size()));
      for (auto &s : slots) std::memcpy(s.out, acc.data(), bytes);
    });
  }

  Status allGather(const std::string &group, const void *in, void *out, int64_t n, plan::DType dtype) override {
    size_t bytes = elementBytes(dtype) * size_t(n);
    return world_.collective(group, rank_, in, out, [&](std::vector<ThreadWorld::Slot> &slots) {
      std::vector<char> all(slots.size() * bytes);
      for (size_t r = 0; r < slots.size(); ++r) std::memcpy(&all[r * bytes], slots[r].in, bytes);
      for (auto &s : slots) std::memcpy(s.out, all.data(), all.size());
    });
  }

  Status reduceScatter(const std::string &group, const void *in, void *out, int64_t n, plan::DType dtype) override {
    size_t bytes = elementBytes(dtype) * size_t(n);
    return world_.collective(group, rank_, in, out, [&](std::vector<ThreadWorld::Slot> &slots) {
      // Block dst of every member, summed in member order starting from member 0's.
      for (size_t dst = 0; dst < slots.size(); ++dst) {
        auto block = [&](size_t src) { return static_cast<const char *>(slots[src].in) + dst * bytes; };
        std::vector<char> sum(block(0), block(0) + bytes);
        for (size_t src = 1; src < slots.size(); ++src) reduceElements(dtype, ReduceOp::kSum, sum.data(), block(src), n);
        std::memcpy(slots[dst].out, sum.data(), bytes);
      }
    });
  }

  Status sendBytes(const std::string &group, int peer, const void *data, int64_t bytes, int tag) override {
    auto m = world_.members(group, rank_);
    if (peer < 0 || peer >= int(m.size())) return Status::error("send: peer out of range in " + group);
    const char *begin = static_cast<const char *>(data);
    return world_.post(group, rank_, m[peer], tag, std::vector<char>(begin, begin + bytes));
  }

  Status recvBytes(const std::string &group, int peer, void *data, int64_t bytes, int tag) override {
    auto m = world_.members(group, rank_);
    if (peer < 0 || peer >= int(m.size())) return Status::error("recv: peer out of range in " + group);
    return world_.take(group, m[peer], rank_, tag, data, bytes);
  }

 private:
  ThreadWorld &world_;
  int rank_;
};

std::unique_ptr<Collectives> ThreadWorld::forRank(int rank) {
  return std::make_unique<ThreadCollectives>(*this, rank);
}

// The last member to arrive combines everyone's buffers while the others wait, so every
// buffer stays valid during the combine.
Status ThreadWorld::collective(const std::string &group, int rank, const void *in, void *out,
                               const std::function<void(std::vector<Slot> &)> &combine) {
  std::vector<int> m = members(group, rank);
  if (m.empty()) return Status::error("unknown group '" + group + "'");
  int pos = int(std::find(m.begin(), m.end(), rank) - m.begin());
  std::unique_lock<std::mutex> lock(mu_);
  Rendezvous &rv = rendezvous_[{group, m[0]}];
  if (rv.slots.empty()) rv.slots.resize(m.size());
  rv.slots[pos] = {in, out};
  uint64_t gen = rv.generation;
  if (++rv.arrived == int(m.size())) {
    combine(rv.slots);
    rv.arrived = 0;
    ++rv.generation;
    cv_.notify_all();
    return Status::ok();
  }
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_), [&] { return rv.generation != gen; }))
    return Status::error("collective on group '" + group + "' timed out at rank " + std::to_string(rank));
  return Status::ok();
}

Status ThreadWorld::post(const std::string &group, int from, int to, int tag, std::vector<char> data) {
  std::lock_guard<std::mutex> lock(mu_);
  mailboxes_[{group, from, to, tag}].push_back(std::move(data));
  cv_.notify_all();
  return Status::ok();
}

Status ThreadWorld::take(const std::string &group, int from, int to, int tag, void *data, int64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  auto &box = mailboxes_[{group, from, to, tag}];
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_), [&] { return !box.empty(); }))
    return Status::error("recv from rank " + std::to_string(from) + " timed out at rank " + std::to_string(to));
  if (int64_t(box.front().size()) != bytes)
    return Status::error("recv: expected " + std::to_string(bytes) + " bytes, got " +
                         std::to_string(box.front().size()));
  std::memcpy(data, box.front().data(), size_t(bytes));
  box.pop_front();
  return Status::ok();
}

}  // namespace loom
