#include "runtime/CpuBackend.h"

#include <algorithm>
#include <cstring>

#include "runtime/cpu/HalfStorage.h"

namespace loom {

namespace {

template <typename T>
Status keyed(std::map<std::string, std::vector<T>> &all, const std::string &key, int64_t count, T **data) {
  auto [it, fresh] = all.try_emplace(key);
  if (fresh) it->second.assign(size_t(count), T(0));
  if (int64_t(it->second.size()) != count)
    return Status::error("storage '" + key + "' holds " + std::to_string(it->second.size()) + " elements, asked for " +
                         std::to_string(count));
  *data = it->second.data();
  return Status::ok();
}

}  // namespace

Status CpuBackend::storage(const std::string &key, int64_t count, plan::DType dtype, ArgumentView *out) {
  *out = {};
  out->count = count;
  if (cpu::isHalf(dtype)) return keyed(halves_, key + "@" + plan::DType_Name(dtype), count, &out->h);
  if (dtype == plan::I32) return keyed(ints_, key, count, &out->i);
  return keyed(floats_, key, count, &out->f);
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

Status CpuBackend::cast(ArgumentView from, ArgumentView to, plan::DType dtype) {
  if (from.count != to.count) return Status::error("cast of " + std::to_string(from.count) + " elements into " + std::to_string(to.count));
  if (from.f && to.h)
    cpu::narrow(dtype, from.f, to.h, from.count);
  else if (from.h && to.f)
    cpu::widen(dtype, from.h, to.f, from.count);
  else
    return Status::error("cast between storage that is not fp32 and 16-bit");
  return Status::ok();
}

int64_t CpuBackend::allocatedBytes() const {
  int64_t bytes = int64_t(workspace_.size() + scratch_.size()) * 4;
  for (auto &[k, v] : floats_) bytes += int64_t(v.size()) * 4;
  for (auto &[k, v] : ints_) bytes += int64_t(v.size()) * 4;
  for (auto &[k, v] : halves_) bytes += int64_t(v.size()) * 2;
  return bytes;
}

}  // namespace loom
