// CUDA 13, cuBLAS and NCCL link; with a GPU, a cuBLAS SGEMM runs. Without one (CI), the
// device part is skipped with a message saying so.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <vector>

TEST(CudaDeps, NcclVersion) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_GE(version, 22000) << "NCCL 2.20 or newer expected";
}

TEST(CudaDeps, CublasSgemmOnDevice) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0)
    GTEST_SKIP() << "no CUDA device present (" << cudaGetErrorString(err)
                 << "): skipping the GPU part";
  float a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8}, c[4] = {};
  float *da, *db, *dc;
  ASSERT_EQ(cudaMalloc(&da, sizeof a), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, sizeof b), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dc, sizeof c), cudaSuccess);
  cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  float one = 1, zero = 0;
  // Column-major: C = A B with A = [1 3; 2 4], B = [5 7; 6 8].
  ASSERT_EQ(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, da, 2, db, 2, &zero, dc, 2),
            CUBLAS_STATUS_SUCCESS);
  cudaMemcpy(c, dc, sizeof c, cudaMemcpyDeviceToHost);
  EXPECT_EQ(std::vector<float>(c, c + 4), (std::vector<float>{23, 34, 31, 46}));
  cublasDestroy(h);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}
