#include "runtime/cuda/CudaBackend.h"

#include "runtime/cuda/CudaStatus.h"
#include "runtime/cuda/PipelineLinks.h"

namespace loom::cuda {

Status CudaBackend::create(const CudaExecutorOptions &options, const plan::ProgramSet &programs,
                           std::unique_ptr<CudaBackend> *out) {
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  LOOM_RETURN_IF_ERROR(CudaExecutor::create(options, &b->executor_));
  b->links_ = options.links;
  LOOM_RETURN_IF_ERROR(b->executor_->prepare(programs));
  *out = std::move(b);
  return Status::ok();
}

CudaBackend::~CudaBackend() {
  cudaDeviceSynchronize();
  executor_.reset();
  for (auto &[key, a] : storage_) cudaFree(a.data);
}

// 16-bit plans are not executed on CUDA yet (issue 34 item 3): the executor refuses their
// buffers at prepare, and the step driver's 16-bit storage here.
Status CudaBackend::cast(ArgumentView, ArgumentView, plan::DType dtype) {
  return Status::error("the CUDA backend does not execute " + plan::DType_Name(dtype) + " plans yet (it runs fp32 plans with "
                       "16-bit GEMM operands: --precision)");
}

Status CudaBackend::storage(const std::string &key, int64_t count, plan::DType dtype, ArgumentView *out) {
  *out = {};
  if (dtype != plan::F32 && dtype != plan::I32)
    return Status::error("storage '" + key + "': the CUDA backend does not execute " + plan::DType_Name(dtype) +
                         " plans yet (it runs fp32 plans with 16-bit GEMM operands: --precision)");
  bool isInt = dtype == plan::I32;
  auto [it, fresh] = storage_.try_emplace(key);
  Allocation &a = it->second;
  if (fresh) {
    a.count = count, a.isInt = isInt;
    size_t bytes = size_t(std::max<int64_t>(count, 1)) * 4;
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&a.data, bytes), "allocating '" + key + "' (" + std::to_string(bytes) + " bytes)"));
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(a.data, 0, bytes, executor_->computeStream()), "zeroing '" + key + "'"));
  }
  if (a.count != count || a.isInt != isInt)
    return Status::error("storage '" + key + "' holds " + std::to_string(a.count) + " elements, asked for " +
                         std::to_string(count));
  if (isInt)
    out->i = static_cast<int32_t *>(a.data);
  else
    out->f = static_cast<float *>(a.data);
  out->count = count;
  return Status::ok();
}

// Host transfers go on the compute stream, which every program run starts after and ends on,
// and wait for it (the host memory is the caller's).
Status CudaBackend::upload(const HostTensor &from, ArgumentView to) {
  int64_t n = from.isInt ? int64_t(from.ints.size()) : int64_t(from.data.size());
  if (n != to.count || from.isInt != (to.i != nullptr))
    return Status::error("a tensor of " + std::to_string(n) + " elements for storage of " + std::to_string(to.count));
  void *dst = from.isInt ? static_cast<void *>(to.i) : static_cast<void *>(to.f);
  const void *src = from.isInt ? static_cast<const void *>(from.ints.data()) : static_cast<const void *>(from.data.data());
  cudaStream_t s = executor_->computeStream();
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(dst, src, size_t(n) * 4, cudaMemcpyHostToDevice, s), "upload"));
  return cudaStatus(cudaStreamSynchronize(s), "upload");
}

Status CudaBackend::download(ArgumentView from, std::vector<float> *to) {
  if (!from.f) return Status::error("download of integer storage");
  to->resize(size_t(from.count));
  cudaStream_t s = executor_->computeStream();
  LOOM_RETURN_IF_ERROR(
      cudaStatus(cudaMemcpyAsync(to->data(), from.f, size_t(from.count) * 4, cudaMemcpyDeviceToHost, s), "download"));
  return cudaStatus(cudaStreamSynchronize(s), "download");
}

Status CudaBackend::run(const plan::Program &program, const std::vector<ArgumentView> &args,
                        const ResultConsumer &consume, const ExecutionContext &ctx) {
  std::vector<const void *> device;
  for (const ArgumentView &a : args) device.push_back(a.i ? static_cast<const void *>(a.i) : a.f);
  Status st = executor_->runOnDevice(
      program, device,
      [&](int i, const float *data, int64_t count, cudaStream_t s) {
        current_ = s;
        consume(i, data, count);
        current_ = nullptr;
        return Status::ok();
      },
      ctx);
  current_ = nullptr;
  return st;
}

Status CudaBackend::copy(const float *from, int64_t count, float *to) {
  if (from == to) return Status::ok();
  cudaStream_t s = current_ ? current_ : executor_->computeStream();
  return cudaStatus(cudaMemcpyAsync(to, from, size_t(count) * 4, cudaMemcpyDeviceToDevice, s), "copy");
}

int64_t CudaBackend::allocatedBytes() const {
  int64_t bytes = executor_->allocatedBytes();
  for (auto &[key, a] : storage_) bytes += std::max<int64_t>(a.count, 1) * 4;
  return bytes;
}

void CudaBackend::beginStep() {
  if (links_) links_->startStep();
}

Status CudaBackend::synchronize() { return cudaStatus(cudaStreamSynchronize(executor_->computeStream()), "synchronize"); }

}  // namespace loom::cuda
