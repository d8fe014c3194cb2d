// Reading a plan::Instruction's attributes and a plan::Buffer's shape: shared by the CPU and
// CUDA executors. A missing attribute reads as the default given.
#pragma once

#include <cstdint>
#include <string>

#include "protos/plan.pb.h"

namespace loom::planattr {

inline const plan::Attribute *find(const plan::Instruction &in, const char *name) {
  for (const plan::Attribute &a : in.attributes())
    if (a.name() == name) return &a;
  return nullptr;
}
inline int64_t i64(const plan::Instruction &in, const char *name, int64_t dflt = 0) {
  const plan::Attribute *a = find(in, name);
  return a ? a->i() : dflt;
}
inline double f64(const plan::Instruction &in, const char *name, double dflt = 0) {
  const plan::Attribute *a = find(in, name);
  return a ? a->f() : dflt;
}
inline std::string str(const plan::Instruction &in, const char *name) {
  const plan::Attribute *a = find(in, name);
  return a ? a->s() : "";
}
inline bool flag(const plan::Instruction &in, const char *name) { return find(in, name) != nullptr; }

inline int64_t numel(const plan::Buffer &b) {
  int64_t n = 1;
  for (int64_t d : b.shape()) n *= d;
  return n;
}
// Dimension k of b; negative k counts from the end.
inline int64_t dim(const plan::Buffer &b, int k) { return k < 0 ? b.shape(b.shape_size() + k) : b.shape(k); }

}  // namespace loom::planattr
