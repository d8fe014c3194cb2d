#include "train/ParamInit.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "support/Checksum.h"
#include "runtime/cpu/Philox.h"

namespace loom {

uint64_t streamOfName(const std::string &name) { return checksum64(name); }

namespace {

// Where a parameter's local elements sit in its global (unpadded) tensor, read once from the
// plan so the per-element loop does no protobuf access.
struct ElementMap {
  uint64_t stream = 0;
  double std = 0;
  int64_t inner = 1, local = 1, global = 1, shardIndex = 0;  // shard_dim, if any
  bool sharded = false, padded = false;
  int64_t padInner = 1, paddedRows = 0, unpaddedRows = 0;  // padded_dim, if any

  explicit ElementMap(const plan::Parameter &p)
      : stream(streamOfName(p.tied_to().empty() ? p.name() : p.tied_to())), std(p.init_std()) {
    int dim = p.shard_dim();
    if (dim >= 0) {
      sharded = true;
      for (int k = dim + 1; k < p.shape_size(); ++k) inner *= p.shape(k);
      local = p.shape(dim);
      global = p.global_shape(dim);
      shardIndex = p.shard_index();
    }
    padded = p.unpadded_size() > 0;
    if (padded) {
      int pd = p.padded_dim();
      for (int k = pd + 1; k < p.global_shape_size(); ++k) padInner *= p.global_shape(k);
      paddedRows = p.global_shape(pd);
      unpaddedRows = p.unpadded_size();
    }
  }

  // Local element i -> its number in the unpadded global tensor, or -1 for vocabulary padding.
  int64_t globalIndex(int64_t i) const {
    int64_t g = i;
    if (sharded) {  // the shard holds block shard_index of shard_dim
      int64_t outer = i / (local * inner), j = (i / inner) % local, c = i % inner;
      g = (outer * global + shardIndex * local + j) * inner + c;
    }
    if (padded) {  // numbered in the unpadded tensor, so the real entries ignore the padding
      int64_t outer = g / (paddedRows * padInner), j = (g / padInner) % paddedRows, c = g % padInner;
      if (j >= unpaddedRows) return -1;
      g = (outer * unpaddedRows + j) * padInner + c;
    }
    return g;
  }
};

bool drawn(const plan::Parameter &p) { return p.init() != "zeros" && p.init() != "ones"; }

// Elements [begin, end) of a drawn parameter (t already sized and zeroed).
void drawElements(const ElementMap &m, uint64_t seed, HostTensor &t, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    int64_t g = m.globalIndex(i);
    if (g < 0) continue;  // padding stays 0
    auto r = cpu::philox4x32({uint32_t(g), uint32_t(uint64_t(g) >> 32), uint32_t(m.stream), uint32_t(m.stream >> 32)},
                             {uint32_t(seed), uint32_t(seed >> 32)});
    double u1 = (double(r[0]) + 1.0) / 4294967297.0, u2 = double(r[1]) / 4294967296.0;
    t.data[size_t(i)] = float(m.std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
  }
}

HostTensor filledTensor(const plan::Parameter &p) {
  HostTensor t{{p.shape().begin(), p.shape().end()}};
  t.data.assign(size_t(t.numel()), p.init() == "ones" ? 1.0f : 0.0f);
  return t;
}

}  // namespace

HostTensor initParameter(const plan::Parameter &p, uint64_t seed) {
  HostTensor t = filledTensor(p);
  if (drawn(p)) drawElements(ElementMap(p), seed, t, 0, t.numel());
  return t;
}

std::vector<HostTensor> initParameters(const plan::RankPlan &plan, uint64_t seed) {
  const auto &params = plan.parameters();
  std::vector<HostTensor> out;
  std::vector<ElementMap> maps;
  // Work items of at most kChunk elements, so one large tensor (the embedding) is drawn on
  // every core too; each element's value depends on nothing but its own index.
  constexpr int64_t kChunk = int64_t(1) << 20;
  struct Item {
    int param;
    int64_t begin, end;
  };
  std::vector<Item> items;
  for (int i = 0; i < params.size(); ++i) {
    out.push_back(filledTensor(params[i]));
    maps.emplace_back(params[i]);
    if (!drawn(params[i])) continue;
    for (int64_t b = 0, n = out.back().numel(); b < n; b += kChunk)
      items.push_back({i, b, std::min(n, b + kChunk)});
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next++) < items.size();)
      drawElements(maps[size_t(items[k].param)], seed, out[size_t(items[k].param)], items[k].begin, items[k].end);
  };
  unsigned helpers = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), unsigned(items.size()));
  std::vector<std::thread> threads;
  for (unsigned k = 1; k < helpers; ++k) threads.emplace_back(work);
  work();
  for (std::thread &t : threads) t.join();
  return out;
}

}  // namespace loom
