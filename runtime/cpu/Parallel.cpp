#include "runtime/cpu/Parallel.h"

#include <cblas.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace loom::cpu {
namespace {

// Set while a thread runs a part: a parallelFor inside a part runs on that thread alone (the
// pool serves one job at a time).
thread_local bool insidePart = false;

// Workers wait on a condition variable for a job (a generation number and a part count);
// worker w runs part w + 1, the caller part 0, and the caller waits until every part is done.
// Jobs come from one thread at a time (a rank's compute stream), so one job is in flight.
class Pool {
 public:
  static Pool &get() {
    static Pool *pool = new Pool;  // never destroyed: workers may outlive static destructors
    return *pool;
  }

  void run(int parts, const std::function<void(int)> &part) {
    std::lock_guard<std::mutex> serial(runMutex_);
    insidePart = true;
    grow(parts - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &part, parts_ = parts, pending_ = parts - 1, ++generation_;
    }
    wake_.notify_all();
    part(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    insidePart = false;
  }

 private:
  void grow(int workers) {
    while (int(workers_.size()) < workers) {
      int index = int(workers_.size());
      workers_.emplace_back([this, index] { loop(index); });
      workers_.back().detach();
    }
  }

  void loop(int index) {
    insidePart = true;
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (index + 1 >= parts_) continue;
      const std::function<void(int)> *job = job_;
      lock.unlock();
      (*job)(index + 1);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex runMutex_, mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int)> *job_ = nullptr;
  int parts_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace

int kernelThreads() { return std::max(1, openblas_get_num_threads()); }

bool insideParallelPart() { return insidePart; }

void parallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)> &body) {
  int parts = int(std::max<int64_t>(1, std::min<int64_t>(kernelThreads(), n / std::max<int64_t>(1, grain))));
  if (parts == 1 || insidePart) return body(0, n);
  Pool::get().run(parts, [&](int p) { body(n * p / parts, n * (p + 1) / parts); });
}

void parallelChunks(int64_t n, int64_t chunk, const std::function<void(int64_t, int64_t, int64_t)> &body,
                    int64_t elementsPerItem) {
  parallelFor(chunkCount(n, chunk), grainFor(chunk * elementsPerItem), [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) body(c, c * chunk, std::min(n, (c + 1) * chunk));
  });
}

}  // namespace loom::cpu
