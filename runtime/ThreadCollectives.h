// Collectives between threads of one process, one thread per rank: the reference world in
// which the compiler's interpreter checks that partitioned programs compute what the single
// device program computes. Every wait has a timeout, so a wrong program fails, never hangs.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/Collectives.h"

namespace loom {

class ThreadWorld {
 public:
  explicit ThreadWorld(ParallelLayout layout, double timeoutSeconds = 60);
  // The collectives as seen by `rank`; valid while the world lives.
  std::unique_ptr<Collectives> forRank(int rank);
  const ParallelLayout &layout() const { return layout_; }

  // Members (global ranks, in group order) of `group` containing `rank`.
  std::vector<int> members(const std::string &group, int rank) const;

  struct Slot {
    const void *in = nullptr;
    void *out = nullptr;
  };

 private:
  friend class ThreadCollectives;
  struct Rendezvous {
    std::vector<Slot> slots;
    int arrived = 0;
    uint64_t generation = 0;
  };
  using Key = std::pair<std::string, int>;  // (group, first member)
  Status collective(const std::string &group, int rank, const void *in, void *out,
                    const std::function<void(std::vector<Slot> &)> &combine);
  Status post(const std::string &group, int from, int to, int tag, std::vector<char> data);
  Status take(const std::string &group, int from, int to, int tag, void *data, int64_t bytes);

  ParallelLayout layout_;
  double timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, Rendezvous> rendezvous_;
  std::map<std::tuple<std::string, int, int, int>, std::deque<std::vector<char>>> mailboxes_;
};

}  // namespace loom
