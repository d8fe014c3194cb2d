// What the GPU tests share: a fixture that skips, with a message naming why, where no CUDA
// device is present (CI), and helpers that move host vectors to and from device buffers it
// frees at the end of the test. `Base` is ::testing::Test or a TestWithParam. For 16-bit
// storage (bf16, fp16): host rounding (runtime/cpu/HalfPrecision.h), random 16-bit operands,
// and a check that 16-bit results are an fp32 run's rounded once.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/HalfPrecision.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/DeviceArray.h"

namespace loom {

template <typename Base = ::testing::Test>
class DeviceTest : public Base {
 protected:
  void SetUp() override {
    const char *why = "";
    if (!cuda::deviceAvailable(&why)) GTEST_SKIP() << "no CUDA device (" << why << "): skipping this GPU check";
  }
  void TearDown() override {
    for (void *p : device_) cudaFree(p);
  }
  void *alloc(size_t bytes) {
    void *d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, bytes + 4), cudaSuccess);
    device_.push_back(d);
    return d;
  }
  template <typename T>
  T *up(const std::vector<T> &host) {
    T *d = static_cast<T *>(alloc(host.size() * sizeof(T)));
    cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
  }
  float *zeros(size_t n) { return up(std::vector<float>(n, 0.0f)); }
  std::vector<float> down(const float *d, size_t n) {
    std::vector<float> h(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
  }
  std::vector<float> random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float &x : v) x = dist(rng_);
    return v;
  }
  // Relative L2 error of `got` against `want`.
  static double relErr(const std::vector<float> &got, const std::vector<float> &want) {
    double d = 0, n = 0;
    for (size_t i = 0; i < got.size(); ++i) d += std::pow(got[i] - want[i], 2), n += std::pow(want[i], 2);
    return std::sqrt(d) / std::max(std::sqrt(n), 1e-30);
  }

  // fp32 values rounded to the 16-bit type t (to nearest even), and 16-bit values widened.
  static std::vector<uint16_t> narrow(const std::vector<float> &v, cuda::ElementType t) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      h[i] = t == cuda::ElementType::kBf16 ? cpu::floatToBf16(v[i]) : cpu::floatToF16(v[i]);
    return h;
  }
  static std::vector<float> widen(const std::vector<uint16_t> &h, cuda::ElementType t) {
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); ++i)
      v[i] = t == cuda::ElementType::kBf16 ? cpu::bf16ToFloat(h[i]) : cpu::f16ToFloat(h[i]);
    return v;
  }
  std::vector<uint16_t> downBits(const void *d, size_t n) {
    std::vector<uint16_t> h(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(h.data(), d, n * sizeof(uint16_t), cudaMemcpyDeviceToHost);
    return h;
  }
  // A random operand stored in the 16-bit type t: on the device, and its values (exact in fp32).
  struct HalfOperand {
    cuda::In in;
    std::vector<uint16_t> bits;
    std::vector<float> values;
  };
  HalfOperand randomHalf(size_t n, cuda::ElementType t, float scale = 1.0f) {
    HalfOperand o;
    o.bits = narrow(random(n, scale), t);
    o.values = widen(o.bits, t);
    o.in = cuda::In(up(o.bits), t);
    return o;
  }
  cuda::Out halves(size_t n, cuda::ElementType t) { return cuda::Out(up(std::vector<uint16_t>(n, 0)), t); }
  // Apart by how many steps of the 16-bit grid (+0 and -0 are the same point).
  static int ulps(uint16_t a, uint16_t b) {
    auto ordered = [](uint16_t h) { return h & 0x8000 ? -int(h & 0x7fff) : int(h); };
    return std::abs(ordered(a) - ordered(b));
  }
  // The 16-bit result `got` (n elements of its type) is the fp32 result `fp32` rounded to that
  // type: bit for bit (maxUlps 0), or within maxUlps steps.
  void expectRoundedOnce(cuda::Out got, const float *fp32, size_t n, int maxUlps, const std::string &what) {
    std::vector<uint16_t> have = downBits(got.data, n), want = narrow(down(fp32, n), got.type);
    size_t off = 0, first = n;
    for (size_t i = 0; i < n; ++i)
      if (ulps(have[i], want[i]) > maxUlps) off += 1, first = std::min(first, i);
    EXPECT_EQ(off, 0u) << what << " (" << cuda::elementTypeName(got.type) << "): " << off << " of " << n
                       << " elements more than " << maxUlps << " ulp from the fp32 result rounded, the first at "
                       << first << ": 0x" << std::hex << (first < n ? have[first] : 0) << " vs 0x"
                       << (first < n ? want[first] : 0);
  }

  std::mt19937 rng_{1};
  std::vector<void *> device_;
};

}  // namespace loom
