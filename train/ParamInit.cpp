#include "train/ParamInit.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "support/Checksum.h"
#include "runtime/cpu/Philox.h"

namespace loom {

uint64_t streamOfName(const std::string &name) { return checksum64(name); }

HostTensor initParameter(const plan::Parameter &p, uint64_t seed) {
  HostTensor t{{p.shape().begin(), p.shape().end()}};
  int64_t n = t.numel();
  t.data.assign(n, 0.0f);
  if (p.init() == "zeros") return t;
  if (p.init() == "ones") {
    t.data.assign(n, 1.0f);
    return t;
  }
  uint64_t stream = streamOfName(p.tied_to().empty() ? p.name() : p.tied_to());
  // Local element -> global element: the shard holds block shard_index of shard_dim.
  int dim = p.shard_dim();
  int64_t inner = 1, local = 1, global = 1;
  if (dim >= 0) {
    for (int k = dim + 1; k < p.shape_size(); ++k) inner *= p.shape(k);
    local = p.shape(dim);
    global = p.global_shape(dim);
  }
  // Vocabulary padding: an element is numbered in the unpadded global tensor, so the real
  // entries get the same values whatever the padding (which t sets); the padding stays 0.
  bool padded = p.unpadded_size() > 0;
  int pd = p.padded_dim();
  int64_t padInner = 1;
  if (padded)
    for (int k = pd + 1; k < p.global_shape_size(); ++k) padInner *= p.global_shape(k);
  for (int64_t i = 0; i < n; ++i) {
    int64_t g = i;
    if (dim >= 0) {
      int64_t outer = i / (local * inner), j = (i / inner) % local, c = i % inner;
      g = (outer * global + p.shard_index() * local + j) * inner + c;
    }
    if (padded) {
      int64_t outer = g / (p.global_shape(pd) * padInner), j = (g / padInner) % p.global_shape(pd), c = g % padInner;
      if (j >= p.unpadded_size()) continue;  // padding
      g = (outer * p.unpadded_size() + j) * padInner + c;
    }
    auto r = cpu::philox4x32({uint32_t(g), uint32_t(uint64_t(g) >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                             {uint32_t(seed), uint32_t(seed >> 32)});
    double u1 = (double(r[0]) + 1.0) / 4294967297.0, u2 = double(r[1]) / 4294967296.0;
    t.data[i] = float(p.init_std() * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
  }
  return t;
}

std::vector<HostTensor> initParameters(const plan::RankPlan &plan, uint64_t seed) {
  const auto &params = plan.parameters();
  std::vector<HostTensor> out(size_t(params.size()));
  std::atomic<int> next{0};
  auto work = [&] {
    for (int i; (i = next++) < params.size();) out[size_t(i)] = initParameter(params[i], seed);
  };
  unsigned helpers = std::min<unsigned>(std::thread::hardware_concurrency(), unsigned(params.size()));
  std::vector<std::thread> threads;
  for (unsigned k = 1; k < helpers; ++k) threads.emplace_back(work);
  work();
  for (std::thread &t : threads) t.join();
  return out;
}

}  // namespace loom
