#include "runtime/CpuBackend.h"

#include <algorithm>
#include <cstring>

namespace loom {

Status CpuBackend::storage(const std::string &key, int64_t count, bool isInt, ArgumentView *out) {
  *out = {};
  if (isInt) {
    auto [it, fresh] = ints_.try_emplace(key);
    if (fresh) it->second.assign(size_t(count), 0);
    if (int64_t(it->second.size()) != count)
      return Status::error("storage '" + key + "' holds " + std::to_string(it->second.size()) + " elements, asked for " +
                           std::to_string(count));
    out->i = it->second.data(), out->count = count;
    return Status::ok();
  }
  auto [it, fresh] = floats_.try_emplace(key);
  if (fresh) it->second.assign(size_t(count), 0.0f);
  if (int64_t(it->second.size()) != count)
    return Status::error("storage '" + key + "' holds " + std::to_string(it->second.size()) + " elements, asked for " +
                         std::to_string(count));
  out->f = it->second.data(), out->count = count;
  return Status::ok();
}

Status CpuBackend::upload(const HostTensor &from, ArgumentView to) {
  int64_t n = from.isInt ? int64_t(from.ints.size()) : int64_t(from.data.size());
  if (n != to.count || from.isInt != (to.i != nullptr))
    return Status::error("a tensor of " + std::to_string(n) + " elements for storage of " + std::to_string(to.count));
  if (from.isInt)
    std::copy(from.ints.begin(), from.ints.end(), to.i);
  else
    std::copy(from.data.begin(), from.data.end(), to.f);
  return Status::ok();
}

Status CpuBackend::download(ArgumentView from, std::vector<float> *to) {
  if (!from.f) return Status::error("download of integer storage");
  to->assign(from.f, from.f + from.count);
  return Status::ok();
}

Status CpuBackend::run(const plan::Program &program, const std::vector<ArgumentView> &args,
                       const ResultConsumer &consume, const ExecutionContext &ctx) {
  ExecutionContext c = ctx;
  c.workspace = &workspace_;
  c.scratch = &scratch_;
  c.computeOnCallingThread = true;
  return executeProgram(program, args, consume, c);
}

Status CpuBackend::copy(const float *from, int64_t count, float *to) {
  if (from != to) std::memcpy(to, from, size_t(count) * sizeof(float));
  return Status::ok();
}

int64_t CpuBackend::allocatedBytes() const {
  int64_t bytes = int64_t(workspace_.size() + scratch_.size()) * 4;
  for (auto &[k, v] : floats_) bytes += int64_t(v.size()) * 4;
  for (auto &[k, v] : ints_) bytes += int64_t(v.size()) * 4;
  return bytes;
}

}  // namespace loom
