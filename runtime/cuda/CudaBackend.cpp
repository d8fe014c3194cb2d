#include "runtime/cuda/CudaBackend.h"

#include "plan/PlanAttributes.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/CudaStatus.h"
#include "runtime/cuda/PipelineLinks.h"

namespace loom::cuda {

Status CudaBackend::create(const CudaExecutorOptions &options, const plan::ProgramSet &programs,
                           std::unique_ptr<CudaBackend> *out) {
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  // A 16-bit plan's GEMMs run in its own type (--precision picks an fp32 plan's).
  CudaExecutorOptions o = options;
  plan::DType computes = planattr::computeDtype(programs.programs());
  if (computes == plan::BF16) o.precision = Precision::kBf16;
  if (computes == plan::F16) o.precision = Precision::kFp16;
  LOOM_RETURN_IF_ERROR(CudaExecutor::create(o, &b->executor_));
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

namespace {
ElementType elementTypeOf(plan::DType d) { return d == plan::F16 ? ElementType::kF16 : ElementType::kBf16; }
}  // namespace

// fp32 into 16-bit storage (rounded to nearest even) or back (widened). During run(), a 16-bit
// result comes as its device bytes (the executor does not widen it): copied as it is.
Status CudaBackend::cast(ArgumentView from, ArgumentView to, plan::DType dtype) {
  if (from.count != to.count)
    return Status::error("cast of " + std::to_string(from.count) + " elements into " + std::to_string(to.count));
  if (dtype != plan::BF16 && dtype != plan::F16) return Status::error("cast into " + plan::DType_Name(dtype));
  cudaStream_t s = current_ ? current_ : executor_->computeStream();
  ElementType half = elementTypeOf(dtype);
  if (from.f && to.h && resultType_ == half)
    return cudaStatus(cudaMemcpyAsync(to.h, from.f, size_t(from.count) * 2, cudaMemcpyDeviceToDevice, s), "copy");
  if (from.f && to.h)
    convertElements(In(from.f, resultType_), Out(to.h, half), from.count, s);
  else if (from.h && to.f)
    convertElements(In(from.h, half), to.f, from.count, s);
  else
    return Status::error("cast between storage that is not fp32 and 16-bit");
  return cudaStatus(cudaGetLastError(), "cast");
}

Status CudaBackend::storage(const std::string &key, int64_t count, plan::DType dtype, ArgumentView *out) {
  *out = {};
  bool isInt = dtype == plan::I32;
  int elementBytes = int(planattr::elementBytes(dtype));
  // A key names one storage per dtype (as the CPU backend's): the step driver keeps the fp32
  // master weights and their 16-bit copy both under "parameters".
  auto [it, fresh] = storage_.try_emplace(elementBytes == 2 ? key + "@" + plan::DType_Name(dtype) : key);
  Allocation &a = it->second;
  if (fresh) {
    a.count = count, a.isInt = isInt, a.elementBytes = elementBytes;
    size_t bytes = size_t(std::max<int64_t>(count, 1)) * size_t(elementBytes);
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMalloc(&a.data, bytes), "allocating '" + key + "' (" + std::to_string(bytes) + " bytes)"));
    LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemsetAsync(a.data, 0, bytes, executor_->computeStream()), "zeroing '" + key + "'"));
  }
  if (a.count != count || a.isInt != isInt || a.elementBytes != elementBytes)
    return Status::error("storage '" + key + "' holds " + std::to_string(a.count) + " elements, asked for " +
                         std::to_string(count));
  if (isInt)
    out->i = static_cast<int32_t *>(a.data);
  else if (elementBytes == 2)
    out->h = static_cast<uint16_t *>(a.data);
  else
    out->f = static_cast<float *>(a.data);
  out->count = count;
  return Status::ok();
}

// Host transfers go on the compute stream, which every program run starts after and ends on,
// and wait for it (the host memory is the caller's).
Status CudaBackend::upload(const HostTensor &from, ArgumentView to) {
  int64_t n = from.isInt ? int64_t(from.ints.size()) : int64_t(from.data.size());
  if (to.h) return Status::error("upload into 16-bit storage (upload fp32 and cast)");
  if (n != to.count || from.isInt != (to.i != nullptr))
    return Status::error("a tensor of " + std::to_string(n) + " elements for storage of " + std::to_string(to.count));
  void *dst = from.isInt ? static_cast<void *>(to.i) : static_cast<void *>(to.f);
  const void *src = from.isInt ? static_cast<const void *>(from.ints.data()) : static_cast<const void *>(from.data.data());
  cudaStream_t s = executor_->computeStream();
  LOOM_RETURN_IF_ERROR(cudaStatus(cudaMemcpyAsync(dst, src, size_t(n) * 4, cudaMemcpyHostToDevice, s), "upload"));
  return cudaStatus(cudaStreamSynchronize(s), "upload");
}

Status CudaBackend::download(ArgumentView from, std::vector<float> *to) {
  if (!from.f) return Status::error(from.h ? "download of 16-bit storage (cast it to fp32 first)" : "download of integer storage");
  to->resize(size_t(from.count));
  cudaStream_t s = executor_->computeStream();
  LOOM_RETURN_IF_ERROR(
      cudaStatus(cudaMemcpyAsync(to->data(), from.f, size_t(from.count) * 4, cudaMemcpyDeviceToHost, s), "download"));
  return cudaStatus(cudaStreamSynchronize(s), "download");
}

Status CudaBackend::run(const plan::Program &program, const std::vector<ArgumentView> &args,
                        const ResultConsumer &consume, const ExecutionContext &ctx) {
  std::vector<const void *> device;
  for (const ArgumentView &a : args)
    device.push_back(a.i ? static_cast<const void *>(a.i) : a.h ? static_cast<const void *>(a.h) : a.f);
  Status st = executor_->runOnDevice(
      program, device,
      [&](int i, In data, int64_t count, cudaStream_t s) {
        // A 16-bit result is handed on as its bytes: the driver copy()s or cast()s it (above).
        current_ = s, resultType_ = data.type;
        consume(i, static_cast<const float *>(data.data), count);
        current_ = nullptr, resultType_ = ElementType::kF32;
        return Status::ok();
      },
      ctx);
  current_ = nullptr, resultType_ = ElementType::kF32;
  return st;
}

Status CudaBackend::copy(const float *from, int64_t count, float *to) {
  if (from == to) return Status::ok();
  cudaStream_t s = current_ ? current_ : executor_->computeStream();
  if (resultType_ != ElementType::kF32) {  // a 16-bit result into fp32 storage: widened
    convertElements(In(from, resultType_), to, count, s);
    return cudaStatus(cudaGetLastError(), "copy");
  }
  return cudaStatus(cudaMemcpyAsync(to, from, size_t(count) * 4, cudaMemcpyDeviceToDevice, s), "copy");
}

int64_t CudaBackend::allocatedBytes() const {
  int64_t bytes = executor_->allocatedBytes();
  for (auto &[key, a] : storage_) bytes += std::max<int64_t>(a.count, 1) * a.elementBytes;
  return bytes;
}

void CudaBackend::beginStep() {
  if (links_) links_->startStep();
}

Status CudaBackend::synchronize() { return cudaStatus(cudaStreamSynchronize(executor_->computeStream()), "synchronize"); }

}  // namespace loom::cuda
