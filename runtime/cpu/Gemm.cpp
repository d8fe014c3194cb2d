#include "runtime/cpu/Gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "runtime/cpu/HalfPrecision.h"
#include "runtime/cpu/Parallel.h"

// OpenMP's runtime calls, declared here rather than through <omp.h>: GCC ships that header,
// clang only with libomp-dev, and the library that answers is libgomp either way (oneDNN's).
extern "C" int omp_get_max_threads(void);
extern "C" void omp_set_num_threads(int);

namespace loom::cpu {
namespace {

[[noreturn]] void internalError(const char *what, int64_t m, int64_t n, int64_t k, int status) {
  // Only a caller's wrong shapes or leading dimensions get here: a bug, not an input error.
  std::fprintf(stderr, "loom: internal error: oneDNN %s refused m=%lld n=%lld k=%lld (status %d)\n", what,
               (long long)m, (long long)n, (long long)k, status);
  std::abort();
}

// The bf16 product's tiles: C is cut at multiples of these (the last tile of a row or column
// takes the rest), whatever the thread count. GPT-2 small's seven GEMM shapes on 2 threads,
// this machine (a probe, best of 3 per shape, ~15% VM noise): 256 x 512 tiles 313-329 GFLOP/s
// over the shapes, 256 x 256 257-310, 512 x 256 284-326; oneDNN's own threading on the same
// shapes in the same run 321-335 against the tiles' 333-346.
constexpr int64_t kTileRows = 256, kTileCols = 512;

// One tile shape's single-threaded matmul, made once per shape and kept (oneDNN's own cache
// would be keyed by the creating thread's OpenMP count as well).
struct TileKey {
  int64_t m, n, k, lda, ldb, ldc;
  bool transposeA, transposeB, hasBias;
  GemmOut out;
  bool operator<(const TileKey &o) const {
    return std::tie(m, n, k, lda, ldb, ldc, transposeA, transposeB, hasBias, out) <
           std::tie(o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.transposeA, o.transposeB, o.hasBias, o.out);
  }
};

struct TileMatmul {
  dnnl::matmul primitive;
  dnnl::memory::desc a, b, bias, c;
  size_t scratchpadBytes = 0;
};

const dnnl::engine &cpuEngine() {
  static const dnnl::engine *engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

// Sets the calling thread's OpenMP count for a scope (oneDNN reads it when a primitive is made
// and when it runs).
class OmpThreads {
 public:
  explicit OmpThreads(int n) : saved_(omp_get_max_threads()) {
    if (saved_ != n) omp_set_num_threads(n);
  }
  ~OmpThreads() {
    if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
  }

 private:
  int saved_;
};

const TileMatmul &tileMatmul(const TileKey &key) {
  static std::mutex mutex;
  static auto *cache = new std::map<TileKey, std::unique_ptr<TileMatmul>>;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<TileMatmul> &slot = (*cache)[key];
  if (slot) return *slot;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  auto t = std::make_unique<TileMatmul>();
  // op(A) [m, k] and op(B) [k, n] as strided views of the row-major storage.
  t->a = dnnl::memory::desc(dims{key.m, key.k}, dt::bf16, key.transposeA ? dims{1, key.lda} : dims{key.lda, 1});
  t->b = dnnl::memory::desc(dims{key.k, key.n}, dt::bf16, key.transposeB ? dims{1, key.ldb} : dims{key.ldb, 1});
  t->c = dnnl::memory::desc(dims{key.m, key.n}, key.out == GemmOut::kBf16 ? dt::bf16 : dt::f32, dims{key.ldc, 1});
  if (key.hasBias) t->bias = dnnl::memory::desc(dims{1, key.n}, dt::bf16, dims{key.n, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // each thread's own (below)
  try {
    OmpThreads one(1);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(t->a, t->b, t->bias, t->c), attr, cpuEngine());
    t->scratchpadBytes = pd.scratchpad_desc().get_size();
    t->primitive = dnnl::matmul(pd);
  } catch (const dnnl::error &e) {
    internalError("bf16 matmul", key.m, key.n, key.k, int(e.status));
  }
  slot = std::move(t);
  return *slot;
}

// One tile C[i0 : i0 + rows, j0 : j0 + cols] on the calling thread.
void bf16Tile(bool transposeA, bool transposeB, int64_t i0, int64_t rows, int64_t j0, int64_t cols, int64_t k,
              const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, const uint16_t *bias, void *c,
              GemmOut out, int64_t ldc) {
  const TileMatmul &t = tileMatmul({rows, cols, k, lda, ldb, ldc, transposeA, transposeB, bias != nullptr, out});
  thread_local std::vector<uint8_t> scratchpad;
  if (scratchpad.size() < t.scratchpadBytes) scratchpad.resize(t.scratchpadBytes);
  thread_local dnnl::stream stream(cpuEngine());
  auto at = [](const void *p, int64_t elements, int64_t bytes) {
    return const_cast<void *>(static_cast<const void *>(static_cast<const char *>(p) + elements * bytes));
  };
  const uint16_t *aTile = a + (transposeA ? i0 : i0 * lda);
  const uint16_t *bTile = b + (transposeB ? j0 * ldb : j0);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(t.a, cpuEngine(), at(aTile, 0, 2))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(t.b, cpuEngine(), at(bTile, 0, 2))},
      {DNNL_ARG_DST, dnnl::memory(t.c, cpuEngine(), at(c, i0 * ldc + j0, out == GemmOut::kBf16 ? 2 : 4))},
      {DNNL_ARG_SCRATCHPAD,
       dnnl::memory(dnnl::memory::desc(dnnl::memory::dims{int64_t(t.scratchpadBytes)}, dnnl::memory::data_type::u8,
                                       dnnl::memory::dims{1}),
                    cpuEngine(), scratchpad.data())}};
  if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(t.bias, cpuEngine(), at(bias, j0, 2)));
  OmpThreads one(1);
  t.primitive.execute(stream, args);
}

// Without bf16 instructions: the operands widened (exactly) and the fp32 GEMM.
void bf16ByFp32(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                const uint16_t *b, int64_t ldb, const uint16_t *bias, void *c, GemmOut out, int64_t ldc) {
  thread_local std::vector<float> wa, wb, wc;
  // The stored matrices' extents: rows of ld elements, the last one only as long as needed.
  int64_t aCount = transposeA ? (k - 1) * lda + m : (m - 1) * lda + k;
  int64_t bCount = transposeB ? (n - 1) * ldb + k : (k - 1) * ldb + n;
  wa.resize(size_t(aCount)), wb.resize(size_t(bCount));
  widenBf16(a, wa.data(), aCount);
  widenBf16(b, wb.data(), bCount);
  float *result = out == GemmOut::kF32 ? static_cast<float *>(c) : (wc.resize(size_t(m * ldc)), wc.data());
  gemm(transposeA, transposeB, m, n, k, 1.0f, wa.data(), lda, wb.data(), ldb, 0.0f, result, ldc);
  for (int64_t i = 0; i < m; ++i) {
    float *row = result + i * ldc;
    if (bias)
      for (int64_t j = 0; j < n; ++j) row[j] += bf16ToFloat(bias[j]);
    if (out == GemmOut::kBf16) narrowToBf16(row, static_cast<uint16_t *>(c) + i * ldc, n);
  }
}

}  // namespace

// oneDNN's threaded sgemm gives the same bits at every thread count where it has AVX-512 (it
// splits C, never K); on AVX2-only processors (an AMD EPYC VM, 2026-12-06) 1 and 3 threads
// differ (tests/runtime/thread_count_test). There Loom cuts C into fixed tiles, each computed on
// one thread, so a result never depends on the thread count.
namespace {
constexpr int64_t kSgemmTileRows = 128, kSgemmTileCols = 256;
bool sgemmThreadInvariant() {
  static const bool invariant = [] {
    unsigned isa = unsigned(dnnl::get_effective_cpu_isa());
    unsigned avx512 = unsigned(dnnl::cpu_isa::avx512_core);
    return (isa & avx512) == avx512;
  }();
  return invariant;
}
}  // namespace

void gemm(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (!sgemmThreadInvariant()) {
    int64_t rowTiles = chunkCount(m, kSgemmTileRows), colTiles = chunkCount(n, kSgemmTileCols);
    parallelFor(rowTiles * colTiles, 1, [&](int64_t first, int64_t last) {
      OmpThreads one(1);
      for (int64_t t = first; t < last; ++t) {
        int64_t i0 = (t / colTiles) * kSgemmTileRows, j0 = (t % colTiles) * kSgemmTileCols;
        int64_t rows = std::min(kSgemmTileRows, m - i0), cols = std::min(kSgemmTileCols, n - j0);
        const float *aTile = transposeA ? a + i0 : a + i0 * lda, *bTile = transposeB ? b + j0 * ldb : b + j0;
        dnnl_status_t status = dnnl_sgemm(transposeA ? 'T' : 'N', transposeB ? 'T' : 'N', rows, cols, k, alpha, aTile,
                                          lda, bTile, ldb, beta, c + i0 * ldc + j0, ldc);
        if (status != dnnl_success) internalError("sgemm", rows, cols, k, int(status));
      }
    });
    return;
  }
  // oneDNN (built on OpenMP here) takes its thread count from the calling thread's OpenMP
  // setting; keep it equal to the rank's kernel threads (one inside a part of a parallelFor,
  // whose parts already occupy the threads).
  int threads = insideParallelPart() ? 1 : kernelThreads();
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  dnnl_status_t status =
      dnnl_sgemm(transposeA ? 'T' : 'N', transposeB ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) internalError("sgemm", m, n, k, int(status));
}

bool nativeBf16Gemm() {
  static const bool native = [] {
    unsigned isa = unsigned(dnnl::get_effective_cpu_isa());
    unsigned bf16 = unsigned(dnnl::cpu_isa::avx512_core_bf16);  // ISAs are bit sets that contain their subsets
    return (isa & bf16) == bf16;
  }();
  return native;
}

void gemmBf16(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
              const uint16_t *b, int64_t ldb, const uint16_t *bias, void *c, GemmOut out, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: the bias alone
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float v = bias ? bf16ToFloat(bias[j]) : 0.0f;
        if (out == GemmOut::kBf16)
          static_cast<uint16_t *>(c)[i * ldc + j] = floatToBf16(v);
        else
          static_cast<float *>(c)[i * ldc + j] = v;
      }
    return;
  }
  if (!nativeBf16Gemm()) return bf16ByFp32(transposeA, transposeB, m, n, k, a, lda, b, ldb, bias, c, out, ldc);
  int64_t rowTiles = chunkCount(m, kTileRows), colTiles = chunkCount(n, kTileCols);
  parallelFor(rowTiles * colTiles, 1, [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      int64_t i0 = (t / colTiles) * kTileRows, j0 = (t % colTiles) * kTileCols;
      bf16Tile(transposeA, transposeB, i0, std::min(kTileRows, m - i0), j0, std::min(kTileCols, n - j0), k, a, lda, b,
               ldb, bias, c, out, ldc);
    }
  });
}

}  // namespace loom::cpu
