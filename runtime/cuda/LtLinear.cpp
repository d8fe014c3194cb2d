// Row-major to cuBLASLt's column-major: row-major c[M,N] is column-major c^T[N,M], and
// c^T = op(b)^T op(a)^T, so cuBLASLt's A is our b and its B is our a, each read as stored (a
// row-major [R,C] buffer is a column-major [C,R] one) and transposed by cuBLASLt exactly when
// we would transpose it. The bias epilogue adds a vector along D's rows, which are c's
// columns: one bias per output feature, as wanted.
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
cudaDataType_t dataType(ElementType type) {
  return type == ElementType::kF32 ? CUDA_R_32F : type == ElementType::kBf16 ? CUDA_R_16BF : CUDA_R_16F;
}
ElementType elementTypeOf(HalfType type) { return type == HalfType::kBf16 ? ElementType::kBf16 : ElementType::kF16; }

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

// The largest power of two (up to 256) the address is a multiple of.
uint32_t alignmentOf(const void *pointer) {
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

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

Status LtLinear::forward(const LinearShape &s, const void *x, const void *w, In bias, Out y, cudaStream_t stream) {
  return gemm({s.m, s.k, s.n, false, s.transposeW, s.type, s.epilogue, false}, x, w, bias, y, stream);
}

// dx[M,K] = g[M,N] W^T: W stored [K,N] is W^T stored transposed; W stored [N,K] is W^T as is.
Status LtLinear::inputGrad(const LinearShape &s, const void *g, const void *w, Out dx, cudaStream_t stream) {
  return gemm({s.m, s.n, s.k, false, !s.transposeW, s.type, LinearEpilogue::kNone, false}, g, w, nullptr, dx,
              stream);
}

// dW[K,N] = x^T g, or with transposeW dW[N,K] = g^T x: the left operand is stored [M, rows].
Status LtLinear::weightGrad(const LinearShape &s, const void *x, const void *g, Out dw, bool accumulate,
                            cudaStream_t stream) {
  if (s.transposeW)
    return gemm({s.n, s.m, s.k, true, false, s.type, LinearEpilogue::kNone, accumulate}, g, x, nullptr, dw, stream);
  return gemm({s.k, s.m, s.n, true, false, s.type, LinearEpilogue::kNone, accumulate}, x, g, nullptr, dw, stream);
}

Status LtLinear::gemm(const Gemm &p, const void *a, const void *b, In biasIn, Out cOut, cudaStream_t stream) {
  if (p.m <= 0 || p.k <= 0 || p.n <= 0)
    return Status::error("linear: empty GEMM m=" + std::to_string(p.m) + " k=" + std::to_string(p.k) +
                         " n=" + std::to_string(p.n));
  const void *bias = biasIn.data;
  void *c = cOut.data;
  if (p.epilogue != LinearEpilogue::kNone && bias == nullptr)
    return Status::error("linear: a bias epilogue needs a bias vector");
  if (cOut.type != ElementType::kF32 && cOut.type != elementTypeOf(p.type))
    return Status::error(std::string("linear: a ") + elementTypeName(cOut.type) + " output of " + halfTypeName(p.type) +
                         " operands");
  // cuBLASLt's bias is of D's type (fp32 for an fp32 output, else D's 16-bit type).
  if (p.epilogue != LinearEpilogue::kNone && biasIn.type != cOut.type)
    return Status::error(std::string("linear: a ") + elementTypeName(biasIn.type) + " bias for a " +
                         elementTypeName(cOut.type) + " output");
  Descriptors desc;
  LOOM_LT_CHECK("matmul descriptor", cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opA = p.transposeB ? CUBLAS_OP_T : CUBLAS_OP_N, opB = p.transposeA ? CUBLAS_OP_T : CUBLAS_OP_N;
  LOOM_LT_CHECK("transa", cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &opA, sizeof(opA)));
  LOOM_LT_CHECK("transb", cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &opB, sizeof(opB)));
  cublasLtEpilogue_t epilogue = epilogueOf(p.epilogue);
  LOOM_LT_CHECK("epilogue", cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                           sizeof(epilogue)));
  if (p.epilogue != LinearEpilogue::kNone) {
    LOOM_LT_CHECK("bias pointer", cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                                 sizeof(bias)));
    cudaDataType_t biasType = dataType(biasIn.type);
    LOOM_LT_CHECK("bias type", cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType,
                                                              sizeof(biasType)));
  }

  // Column-major views of the stored buffers: b is [N,K] (or [K,N] when transposeB), a is
  // [K,M] (or [M,K] when transposeA), c is [N,M].
  cudaDataType_t half = dataType(p.type);
  uint64_t bRows = p.transposeB ? p.k : p.n, bCols = p.transposeB ? p.n : p.k;
  uint64_t aRows = p.transposeA ? p.m : p.k, aCols = p.transposeA ? p.k : p.m;
  LOOM_LT_CHECK("layout of b", cublasLtMatrixLayoutCreate(&desc.a, half, bRows, bCols, int64_t(bRows)));
  LOOM_LT_CHECK("layout of a", cublasLtMatrixLayoutCreate(&desc.b, half, aRows, aCols, int64_t(aRows)));
  LOOM_LT_CHECK("layout of c", cublasLtMatrixLayoutCreate(&desc.d, dataType(cOut.type), p.n, p.m, p.n));

  LOOM_LT_CHECK("preference", cublasLtMatmulPreferenceCreate(&desc.preference));
  uint64_t workspace = workspaceBytes_;
  LOOM_LT_CHECK("workspace preference",
                cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace, sizeof(workspace)));
  // The heuristic assumes 256-byte aligned buffers unless told otherwise, and may pick a kernel
  // that needs it; arena buffers are only 64-byte aligned (the memory plan's unit). So: each
  // buffer's actual alignment (cuBLASLt's A is our b, its B our a).
  for (auto [attribute, pointer] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, b},
                                    std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, a},
                                    std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<const void *>(c)},
                                    std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<const void *>(c)}}) {
    uint32_t alignment = alignmentOf(pointer);
    LOOM_LT_CHECK("alignment preference",
                  cublasLtMatmulPreferenceSetAttribute(desc.preference, attribute, &alignment, sizeof(alignment)));
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  LOOM_LT_CHECK("algorithm search", cublasLtMatmulAlgoGetHeuristic(handle_, desc.op, desc.a, desc.b, desc.d, desc.d,
                                                                   desc.preference, 1, &heuristic, &found));
  if (found == 0)
    return Status::error(std::string("cuBLASLt has no algorithm for a ") + halfTypeName(p.type) +
                         " GEMM of m=" + std::to_string(p.m) + " k=" + std::to_string(p.k) +
                         " n=" + std::to_string(p.n));
  float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  LOOM_LT_CHECK("matmul", cublasLtMatmul(handle_, desc.op, &alpha, b, desc.a, a, desc.b, &beta, c, desc.d, c, desc.d,
                                         &heuristic.algo, workspace_, workspaceBytes_, stream));
  return Status::ok();
}

}  // namespace loom::cuda
