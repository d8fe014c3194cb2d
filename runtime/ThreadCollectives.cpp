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

  Status allReduce(const std::string &group, float *data, int64_t n, ReduceOp op) override {
    return world_.collective(group, rank_, data, data, [&](std::vector<ThreadWorld::Slot> &slots) {
      std::vector<float> acc(slots[0].in, slots[0].in + n);
      for (size_t r = 1; r < slots.size(); ++r)
        for (int64_t i = 0; i < n; ++i)
          acc[i] = op == ReduceOp::kMax ? std::max(acc[i], slots[r].in[i]) : acc[i] + slots[r].in[i];
      if (op == ReduceOp::kAvg)
        for (float &v : acc) v /= float(slots.size());
      for (auto &s : slots) std::memcpy(s.out, acc.data(), n * sizeof(float));
    });
  }

  Status allGather(const std::string &group, const float *in, float *out, int64_t n) override {
    return world_.collective(group, rank_, in, out, [&](std::vector<ThreadWorld::Slot> &slots) {
      std::vector<float> all(slots.size() * n);
      for (size_t r = 0; r < slots.size(); ++r) std::memcpy(&all[r * n], slots[r].in, n * sizeof(float));
      for (auto &s : slots) std::memcpy(s.out, all.data(), all.size() * sizeof(float));
    });
  }

  Status reduceScatter(const std::string &group, const float *in, float *out, int64_t n) override {
    return world_.collective(group, rank_, in, out, [&](std::vector<ThreadWorld::Slot> &slots) {
      std::vector<std::vector<float>> result(slots.size(), std::vector<float>(n, 0.0f));
      for (size_t dst = 0; dst < slots.size(); ++dst)
        for (size_t src = 0; src < slots.size(); ++src)
          for (int64_t i = 0; i < n; ++i) result[dst][i] += slots[src].in[dst * n + i];
      for (size_t dst = 0; dst < slots.size(); ++dst)
        std::memcpy(slots[dst].out, result[dst].data(), n * sizeof(float));
    });
  }

  Status send(const std::string &group, int peer, const float *data, int64_t n, int tag) override {
    auto m = world_.members(group, rank_);
    if (peer < 0 || peer >= int(m.size())) return Status::error("send: peer out of range in " + group);
    return world_.post(group, rank_, m[peer], tag, std::vector<float>(data, data + n));
  }

  Status recv(const std::string &group, int peer, float *data, int64_t n, int tag) override {
    auto m = world_.members(group, rank_);
    if (peer < 0 || peer >= int(m.size())) return Status::error("recv: peer out of range in " + group);
    return world_.take(group, m[peer], rank_, tag, data, n);
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
Status ThreadWorld::collective(const std::string &group, int rank, const float *in, float *out,
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

Status ThreadWorld::post(const std::string &group, int from, int to, int tag, std::vector<float> data) {
  std::lock_guard<std::mutex> lock(mu_);
  mailboxes_[{group, from, to, tag}].push_back(std::move(data));
  cv_.notify_all();
  return Status::ok();
}

Status ThreadWorld::take(const std::string &group, int from, int to, int tag, float *data, int64_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  auto &box = mailboxes_[{group, from, to, tag}];
  if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_), [&] { return !box.empty(); }))
    return Status::error("recv from rank " + std::to_string(from) + " timed out at rank " + std::to_string(to));
  if (int64_t(box.front().size()) != n)
    return Status::error("recv: expected " + std::to_string(n) + " floats, got " +
                         std::to_string(box.front().size()));
  std::memcpy(data, box.front().data(), n * sizeof(float));
  box.pop_front();
  return Status::ok();
}

}  // namespace loom
