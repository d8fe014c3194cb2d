// What the GPU tests share: a fixture that skips, with a message naming why, where no CUDA
// device is present (CI), and helpers that move host vectors to and from device buffers it
// frees at the end of the test. `Base` is ::testing::Test or a TestWithParam.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "runtime/cuda/CudaKernels.h"

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
  std::mt19937 rng_{1};
  std::vector<void *> device_;
};

}  // namespace loom
