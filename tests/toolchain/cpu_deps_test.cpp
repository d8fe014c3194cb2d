// OpenBLAS computes a GEMM, Gloo all-reduces between two ranks over TCP on 127.0.0.1, and
// the gRPC library reports its version: the CPU backend's dependencies work on this machine.
#include <cblas.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "gloo/allreduce_ring.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/transport/tcp/device.h"

TEST(CpuDeps, OpenBlasSgemm) {
  // [1 2; 3 4] x [5 6; 7 8] = [19 22; 43 50]
  float a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8}, c[4] = {};
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
  EXPECT_EQ(std::vector<float>(c, c + 4), (std::vector<float>{19, 22, 43, 50}));
}

TEST(CpuDeps, GlooRingAllReduceOverTcp) {
  gloo::rendezvous::HashStore store;
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  constexpr int kWorld = 2;
  std::vector<std::vector<float>> data(kWorld);
  std::vector<std::thread> ranks;
  // Contexts outlive both threads: a context closed early cuts its peer's last read.
  std::vector<std::shared_ptr<gloo::rendezvous::Context>> contexts(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    data[r] = {float(r + 1), float(10 * (r + 1))};
    ranks.emplace_back([&, r] {
      auto ctx = contexts[r] = std::make_shared<gloo::rendezvous::Context>(r, kWorld);
      ctx->connectFullMesh(store, device);
      std::vector<float *> ptrs{data[r].data()};
      gloo::AllreduceRing<float>(ctx, ptrs, data[r].size()).run();
    });
  }
  for (auto &t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(data[r], (std::vector<float>{3, 30}));
}

TEST(CpuDeps, GrpcVersion) {
  std::string v = grpc::Version();
  EXPECT_EQ(v.rfind("1.", 0), 0u) << v;
}
