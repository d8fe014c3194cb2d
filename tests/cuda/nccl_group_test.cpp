// NCCL communicators bootstrapped through a real coordinator (an in-process loom-coord
// service on a local port). The unique-id exchange needs no GPU and runs everywhere: four
// members of a group all get group rank 0's id, two groups get different ids, and a missing or
// malformed id is refused naming the key. Creating a communicator and reducing on it needs a
// GPU: that case skips, with a message saying so, where none is present.
#include <cuda_runtime.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/control/CoordinatorClient.h"
#include "runtime/control/CoordinatorService.h"
#include "runtime/cuda/CudaKernels.h"
#include "runtime/cuda/NcclGroup.h"

namespace loom {
namespace {

class NcclBootstrap : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<control::CoordinatorService>(control::CoordinatorOptions{"", kToken, 4});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ && port_ > 0) << "cannot start the coordinator service";
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }
  std::unique_ptr<control::CoordinatorClient> client() {
    return std::make_unique<control::CoordinatorClient>("127.0.0.1:" + std::to_string(port_), kToken);
  }
  static constexpr const char *kToken = "nccl-test-token";
  std::unique_ptr<control::CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(NcclBootstrap, EveryMemberGetsRankZerosId) {
  for (std::string group : {"dp0", "tp0"}) {
    std::vector<ncclUniqueId> ids(4);
    std::vector<Status> results(4);
    std::vector<std::thread> members;
    for (int r = 3; r >= 0; --r)  // the others ask before rank 0 publishes
      members.emplace_back([&, r] { results[r] = cuda::shareNcclUniqueId(*client(), group, r, 10000, &ids[r]); });
    for (auto &t : members) t.join();
    for (int r = 0; r < 4; ++r) {
      ASSERT_TRUE(results[r].isOk()) << results[r].message();
      EXPECT_EQ(std::memcmp(&ids[r], &ids[0], sizeof(ncclUniqueId)), 0) << group << " rank " << r;
    }
  }
  ncclUniqueId dp, tp;
  ASSERT_TRUE(cuda::shareNcclUniqueId(*client(), "dp0", 1, 1000, &dp).isOk());
  ASSERT_TRUE(cuda::shareNcclUniqueId(*client(), "tp0", 1, 1000, &tp).isOk());
  EXPECT_NE(std::memcmp(&dp, &tp, sizeof(ncclUniqueId)), 0) << "two groups must not share a communicator id";
}

TEST_F(NcclBootstrap, AMalformedIdIsRefusedNamingTheKey) {
  ASSERT_TRUE(client()->kvSet("nccl/pp3", "not an id").isOk());
  ncclUniqueId id;
  Status s = cuda::shareNcclUniqueId(*client(), "pp3", 2, 1000, &id);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("nccl/pp3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("9 bytes"), std::string::npos) << s.message();
}

TEST_F(NcclBootstrap, AnIdNeverPublishedTimesOutNamingTheKey) {
  ncclUniqueId id;
  Status s = cuda::shareNcclUniqueId(*client(), "dp7", 1, 300, &id);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("nccl/dp7"), std::string::npos) << s.message();
}

TEST_F(NcclBootstrap, AOneMemberGroupReducesOnTheDevice) {
  const char *why = "";
  if (!cuda::deviceAvailable(&why)) GTEST_SKIP() << "no CUDA device (" << why << "): skipping NCCL on the device";
  std::unique_ptr<cuda::NcclGroup> group;
  Status s = cuda::NcclGroup::create(*client(), "solo", 0, 1, 1000, &group);
  ASSERT_TRUE(s.isOk()) << s.message();
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i) * 0.5f;
  float *d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, host.size() * sizeof(float)), cudaSuccess);
  cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
  s = group->allReduceSum(d, int64_t(host.size()), nullptr);
  ASSERT_TRUE(s.isOk()) << s.message();
  std::vector<float> back(host.size());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaMemcpy(back.data(), d, back.size() * sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host) << "a sum over one member is the member's own buffer";
  float *other = nullptr;
  ASSERT_EQ(cudaMalloc(&other, host.size() * sizeof(float)), cudaSuccess);
  for (bool gather : {true, false}) {  // over one member both are copies
    cudaMemset(other, 0, host.size() * sizeof(float));
    s = gather ? group->allGather(d, other, int64_t(host.size()), nullptr)
               : group->reduceScatterSum(d, other, int64_t(host.size()), nullptr);
    ASSERT_TRUE(s.isOk()) << s.message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(back.data(), other, back.size() * sizeof(float), cudaMemcpyDeviceToHost);
    EXPECT_EQ(back, host) << (gather ? "all-gather" : "reduce-scatter");
  }
  cudaFree(other);
  cudaFree(d);
  s = group->exchange({{true, 0, nullptr, 1}}, nullptr);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("peer 0"), std::string::npos) << s.message();
}

TEST_F(NcclBootstrap, ARankOutsideTheGroupIsRefused) {
  std::unique_ptr<cuda::NcclGroup> group;
  Status s = cuda::NcclGroup::create(*client(), "tp1", 2, 2, 1000, &group);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("rank 2 is not in a group of 2"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace loom
