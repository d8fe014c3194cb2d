#include "plan/Zero1Parts.h"

#include <algorithm>

namespace loom {
namespace {
int expertParallel(const plan::RankPlan &plan) {
  return std::max(1, int(plan.cluster().parallel().expert_parallel_size()));
}
}  // namespace

int zero1PartIndex(const plan::RankPlan &plan, const std::string &group) {
  int c = std::max(1, plan.c());
  if (group == "dp") return plan.dp_rank();
  if (group == "dpcp") return plan.dp_rank() * c + plan.cp_rank();
  if (group == "edp") return plan.dp_rank() / expertParallel(plan);  // plan/Layout.h: ep = e consecutive dp ranks
  return -1;
}

std::vector<Zero1Part> zero1Parts(const plan::RankPlan &plan) {
  std::vector<Zero1Part> out;
  int64_t bucketBegin = 0, stateBegin = 0;
  for (int b = 0; b < plan.zero1_buckets_size(); ++b) {
    int64_t elements = plan.zero1_buckets(b);
    std::string group = b < plan.zero1_bucket_groups_size() ? plan.zero1_bucket_groups(b) : "dp";
    int parts = group == "edp" ? std::max(1, plan.d() / expertParallel(plan))
                : group == "dpcp" ? plan.d() * std::max(1, plan.c())
                                  : plan.d();
    int index = parts > 1 ? zero1PartIndex(plan, group) : 0;
    int64_t part = elements / std::max(parts, 1);
    out.push_back({bucketBegin + int64_t(index) * part, part, stateBegin});
    bucketBegin += elements, stateBegin += part;
  }
  return out;
}

}  // namespace loom
