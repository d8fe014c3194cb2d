#include "plan/Layout.h"

namespace loom {

std::vector<int> groupMembers(const ParallelLayout &l, const std::string &group, int rank) {
  int tp = l.tpOf(rank), cp = l.cpOf(rank), dp = l.dpOf(rank), pp = l.ppOf(rank);
  std::vector<int> out;
  if (group == "tp")
    for (int i = 0; i < l.t; ++i) out.push_back(l.rankOf(i, dp, pp, cp));
  else if (group == "cp")
    for (int i = 0; i < l.c; ++i) out.push_back(l.rankOf(tp, dp, pp, i));
  else if (group == "dp")
    for (int i = 0; i < l.d; ++i) out.push_back(l.rankOf(tp, i, pp, cp));
  else if (group == "dpcp")
    for (int i = 0; i < l.d; ++i)
      for (int j = 0; j < l.c; ++j) out.push_back(l.rankOf(tp, i, pp, j));
  else if (group == "ep")
    for (int i = 0; i < l.e; ++i) out.push_back(l.rankOf(tp, dp / l.e * l.e + i, pp, cp));
  else if (group == "edp")
    for (int j = 0; j < l.d / l.e; ++j) out.push_back(l.rankOf(tp, j * l.e + dp % l.e, pp, cp));
  else if (group == "pp")
    for (int i = 0; i < l.p; ++i) out.push_back(l.rankOf(tp, dp, i, cp));
  else if (group == "embedding") {  // first and last pipeline stage; a middle stage is alone
    if (pp != 0 && pp != l.p - 1) return {rank};
    out.push_back(l.rankOf(tp, dp, 0, cp));
    if (l.p > 1) out.push_back(l.rankOf(tp, dp, l.p - 1, cp));
  } else if (group == "world")
    for (int i = 0; i < l.world(); ++i) out.push_back(i);
  return out;
}

}  // namespace loom
