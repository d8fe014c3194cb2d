// Row-major to cuBLASLt's column-major: row-major y[M,N] is column-major y^T[N,M], and
// y^T = W^T x^T, so cuBLASLt's A is W (as stored: column-major [N,K] with no transpose, or
// [K,N] transposed when transposeW) and its B is x (column-major [K,M]). The bias epilogue adds
// a vector along D's rows, which are y's columns: one bias per output feature, as wanted.
#include "runtime/cuda/LtLinear.h"

#include <string>

namespace loom::cuda {
namespace {

std::string ltError(const char *what, cublasStatus_t status) {
  return std::string("cuBLASLt ") + what + ": " + cublasLtGetStatusName(status);
}

#define LOOM_LT_CHECK(what, expr)                                       \
  do {                                                                  \
    cublasStatus_t _s = (expr);                                         \
    if (_s != CUBLAS_STATUS_SUCCESS) return Status::error(ltError(what, _s)); \
  } while (0)

cudaDataType_t dataType(HalfType type) { return type == HalfType::kBf16 ? CUDA_R_16BF : CUDA_R_16F; }

cublasLtEpilogue_t epilogueOf(LinearEpilogue e) {
  switch (e) {
    case LinearEpilogue::kBias: return CUBLASLT_EPILOGUE_BIAS;
    case LinearEpilogue::kBiasGelu: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case LinearEpilogue::kNone: break;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// The descriptors of one call, released whatever path the call leaves by.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~Descriptors() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

Status LtLinear::create(size_t workspaceBytes, std::unique_ptr<LtLinear> *out) {
  std::unique_ptr<LtLinear> lt(new LtLinear());
  LOOM_LT_CHECK("create", cublasLtCreate(&lt->handle_));
  if (workspaceBytes > 0) {
    cudaError_t err = cudaMalloc(&lt->workspace_, workspaceBytes);
    if (err != cudaSuccess)
      return Status::error("cuBLASLt workspace of " + std::to_string(workspaceBytes) +
                           " bytes: " + cudaGetErrorString(err));
    lt->workspaceBytes_ = workspaceBytes;
  }
  *out = std::move(lt);
  return Status::ok();
}

LtLinear::~LtLinear() {
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

Status LtLinear::forward(const LinearShape &shape, const void *x, const void *w, const float *bias, float *y,
                         cudaStream_t stream) {
  if (shape.m <= 0 || shape.k <= 0 || shape.n <= 0)
    return Status::error("linear: empty shape m=" + std::to_string(shape.m) + " k=" + std::to_string(shape.k) +
                         " n=" + std::to_string(shape.n));
  if (shape.epilogue != LinearEpilogue::kNone && bias == nullptr)
    return Status::error("linear: a bias epilogue needs a bias vector");
  Descriptors desc;
  LOOM_LT_CHECK("matmul descriptor", cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opA = shape.transposeW ? CUBLAS_OP_T : CUBLAS_OP_N, opB = CUBLAS_OP_N;
  LOOM_LT_CHECK("transa", cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
  LOOM_LT_CHECK("transb", cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
  cublasLtEpilogue_t epilogue = epilogueOf(shape.epilogue);
  LOOM_LT_CHECK("epilogue", cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                           sizeof(epilogue)));
  if (shape.epilogue != LinearEpilogue::kNone)
    LOOM_LT_CHECK("bias pointer", cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                                 sizeof(bias)));

  cudaDataType_t half = dataType(shape.type);
  uint64_t aRows = shape.transposeW ? shape.k : shape.n, aCols = shape.transposeW ? shape.n : shape.k;
  LOOM_LT_CHECK("layout W", cublasLtMatrixLayoutCreate(&desc.a, half, aRows, aCols, int64_t(aRows)));
  LOOM_LT_CHECK("layout x", cublasLtMatrixLayoutCreate(&desc.b, half, shape.k, shape.m, shape.k));
  LOOM_LT_CHECK("layout y", cublasLtMatrixLayoutCreate(&desc.d, CUDA_R_32F, shape.n, shape.m, shape.n));

  LOOM_LT_CHECK("preference", cublasLtMatmulPreferenceCreate(&desc.preference));
  uint64_t workspace = workspaceBytes_;
  LOOM_LT_CHECK("workspace preference",
                cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace, sizeof(workspace)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  LOOM_LT_CHECK("algorithm search", cublasLtMatmulAlgoGetHeuristic(handle_, desc.op, desc.a, desc.b, desc.d, desc.d,
                                                                   desc.preference, 1, &heuristic, &found));
  if (found == 0)
    return Status::error(std::string("cuBLASLt has no algorithm for a ") + halfTypeName(shape.type) +
                         " linear of m=" + std::to_string(shape.m) + " k=" + std::to_string(shape.k) +
                         " n=" + std::to_string(shape.n));
  float alpha = 1.0f, beta = 0.0f;
  LOOM_LT_CHECK("matmul", cublasLtMatmul(handle_, desc.op, &alpha, w, desc.a, x, desc.b, &beta, y, desc.d, y, desc.d,
                                         &heuristic.algo, workspace_, workspaceBytes_, stream));
  return Status::ok();
}

}  // namespace loom::cuda
