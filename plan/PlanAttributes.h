// Reading a plan::Instruction's attributes and a plan::Buffer's shape: shared by the CPU and
// CUDA executors. A missing attribute reads as the default given.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
// The dtype a stage's programs compute with: their PARAMETER arguments' (fp32, or in a 16-bit
// plan bf16 / fp16: copies of the fp32 master weights).
template <typename Programs>
plan::DType computeDtype(const Programs &programs) {
  for (const plan::Program &prog : programs)
    for (const plan::Binding &a : prog.arguments())
      if (a.role() == plan::Binding::PARAMETER && prog.buffers(a.buffer()).dtype() != plan::F32)
        return prog.buffers(a.buffer()).dtype();
  return plan::F32;
}

// Bytes of one element of `dtype` (bf16 and fp16: 2; fp32 and int32: 4).
inline int64_t elementBytes(plan::DType dtype) { return dtype == plan::BF16 || dtype == plan::F16 ? 2 : 4; }
// Dimension k of b; negative k counts from the end.
inline int64_t dim(const plan::Buffer &b, int k) { return k < 0 ? b.shape(b.shape_size() + k) : b.shape(k); }

// Ops matched by order on their group's communicator.
inline bool isCollective(const std::string &op) {
  return op == "all_reduce" || op == "all_gather" || op == "reduce_scatter";
}
// Collectives and pipeline messages: the ops that wait on other ranks.
inline bool isCommunication(const std::string &op) { return isCollective(op) || op == "send" || op == "recv"; }

}  // namespace loom::planattr

namespace loom::planattr {

// The optimizer program's view of the flat parameter/gradient buffer (the "segments"
// attribute of sum_squares and adamw): one segment per parameter in flat order, written
// "offset:count:flags;..." with the flags n (counted in the gradient norm on every rank),
// r (counted only at position 0 of sum_squares's replicated_group: a parameter replicated across tp) and d
// (AdamW decays it). Padding between segments is in no segment.
struct FlatSegment {
  int64_t offset = 0, count = 0;
  bool norm = false, normAtTp0 = false, decay = false;
};

inline std::string encodeSegments(const std::vector<FlatSegment> &segments) {
  std::string s;
  for (const FlatSegment &g : segments) {
    if (!s.empty()) s += ';';
    s += std::to_string(g.offset) + ":" + std::to_string(g.count) + ":" + (g.norm ? "n" : "") +
         (g.normAtTp0 ? "r" : "") + (g.decay ? "d" : "");
  }
  return s;
}

// False on a malformed list (a corrupt plan).
// Calls body(lo, hi, segment) for the part of each segment inside [begin, begin + count), with
// lo and hi relative to begin (a rank's shard of the flat buffer, or all of it).
template <typename Body>
void forEachSegmentIn(const std::vector<FlatSegment> &segments, int64_t begin, int64_t count, Body body) {
  int64_t end = begin + count;
  for (const FlatSegment &s : segments) {
    int64_t lo = s.offset > begin ? s.offset : begin, hi = s.offset + s.count < end ? s.offset + s.count : end;
    if (lo < hi) body(lo - begin, hi - begin, s);
  }
}

inline bool decodeSegments(const std::string &text, std::vector<FlatSegment> *out) {
  out->clear();
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(';', at);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(at, end - at);
    size_t c1 = item.find(':'), c2 = c1 == std::string::npos ? c1 : item.find(':', c1 + 1);
    if (c2 == std::string::npos) return false;
    FlatSegment g;
    try {
      g.offset = std::stoll(item.substr(0, c1));
      g.count = std::stoll(item.substr(c1 + 1, c2 - c1 - 1));
    } catch (...) {
      return false;
    }
    for (char f : item.substr(c2 + 1)) {
      if (f == 'n') g.norm = true;
      else if (f == 'r') g.normAtTp0 = true;
      else if (f == 'd') g.decay = true;
      else return false;
    }
    if (g.offset < 0 || g.count < 0 || (!out->empty() && g.offset < out->back().offset + out->back().count))
      return false;
    out->push_back(g);
    at = end + 1;
  }
  return true;
}

}  // namespace loom::planattr
