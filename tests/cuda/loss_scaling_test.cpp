// fp16 loss scaling end to end on the device: clean gradients are unscaled exactly (the scale
// is a power of two) and the step goes ahead; one inf or NaN anywhere flags the step, which the
// LossScaler then skips, halving the scale. Skipped, with a message saying so, where no GPU is
// present (CI); run by the GPU check script when one is lent.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "runtime/LossScaler.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/GradUnscale.h"
#include "tests/cuda/DeviceTest.h"

namespace loom {
namespace {

class LossScalingOnDevice : public DeviceTest<> {
 protected:
  // Unscales `host` on the device with the scaler's factor; returns whether the step is skipped.
  bool step(LossScaler &scaler, std::vector<float> &host) {
    float *grads = up(host);
    int32_t *flag = up(std::vector<int32_t>{0});
    cuda::unscaleGradients(grads, int64_t(host.size()), float(scaler.unscaleFactor()), flag, nullptr);
    int32_t found = 0;
    host = down(grads, host.size());
    cudaMemcpy(&found, flag, sizeof(found), cudaMemcpyDeviceToHost);
    return scaler.update(found != 0);
  }
};

TEST_F(LossScalingOnDevice, CleanGradientsAreUnscaledExactly) {
  LossScaler scaler(LossScalerConfig{});
  std::vector<float> g(100000), want(g.size());
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(float(i)) * 65536.0f, want[i] = g[i] / 65536.0f;
  EXPECT_FALSE(step(scaler, g));
  EXPECT_EQ(g, want);
  EXPECT_EQ(scaler.scale(), 65536.0);
}

TEST_F(LossScalingOnDevice, OneNonFiniteGradientSkipsTheStep) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    LossScaler scaler(LossScalerConfig{});
    std::vector<float> g(70001, 1.0f);
    g[69999] = bad;
    EXPECT_TRUE(step(scaler, g)) << bad;
    EXPECT_EQ(scaler.scale(), 32768.0);
  }
}

}  // namespace
}  // namespace loom
