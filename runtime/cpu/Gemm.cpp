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
  if (key.out == GemmOut::kF32Add) {  // C = C + the product
    dnnl::post_ops sum;
    sum.append_sum(1.0f);
    attr.set_post_ops(sum);
  }
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

// A thread's memory objects for one tile shape's matmul, made once and pointed at each call's
// operands (set_data_handle): making them per call (four oneDNN objects, a map) cost about
// 2 us a tile, which attention's 64-row products pay thousands of times a step.
struct TileArguments {
  const TileMatmul *matmul = nullptr;
  dnnl::memory a, b, c, bias, scratchpad;
  std::unordered_map<int, dnnl::memory> args;
};

TileArguments &tileArguments(const TileKey &key) {
  thread_local std::map<TileKey, TileArguments> mine;
  TileArguments &t = mine[key];
  if (t.matmul) return t;
  t.matmul = &tileMatmul(key);
  const dnnl::engine &engine = cpuEngine();
  t.a = dnnl::memory(t.matmul->a, engine, DNNL_MEMORY_NONE);
  t.b = dnnl::memory(t.matmul->b, engine, DNNL_MEMORY_NONE);
  t.c = dnnl::memory(t.matmul->c, engine, DNNL_MEMORY_NONE);
  t.scratchpad = dnnl::memory(dnnl::memory::desc(dnnl::memory::dims{int64_t(t.matmul->scratchpadBytes)},
                                                 dnnl::memory::data_type::u8, dnnl::memory::dims{1}),
                              engine, DNNL_MEMORY_NONE);
  t.args = {{DNNL_ARG_SRC, t.a}, {DNNL_ARG_WEIGHTS, t.b}, {DNNL_ARG_DST, t.c}, {DNNL_ARG_SCRATCHPAD, t.scratchpad}};
  if (key.hasBias) {
    t.bias = dnnl::memory(t.matmul->bias, engine, DNNL_MEMORY_NONE);
    t.args.emplace(DNNL_ARG_BIAS, t.bias);
  }
  return t;
}

// One tile C[i0 : i0 + rows, j0 : j0 + cols] on the calling thread.
void bf16Tile(bool transposeA, bool transposeB, int64_t i0, int64_t rows, int64_t j0, int64_t cols, int64_t k,
              const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, const uint16_t *bias, void *c,
              GemmOut out, int64_t ldc) {
  TileArguments &t = tileArguments({rows, cols, k, lda, ldb, ldc, transposeA, transposeB, bias != nullptr, out});
  thread_local std::vector<uint8_t> scratchpad;
  if (scratchpad.size() < t.matmul->scratchpadBytes) scratchpad.resize(t.matmul->scratchpadBytes);
  thread_local dnnl::stream stream(cpuEngine());
  auto at = [](const void *p, int64_t elements, int64_t bytes) {
    return const_cast<void *>(static_cast<const void *>(static_cast<const char *>(p) + elements * bytes));
  };
  t.a.set_data_handle(at(a + (transposeA ? i0 : i0 * lda), 0, 2));
  t.b.set_data_handle(at(b + (transposeB ? j0 * ldb : j0), 0, 2));
  t.c.set_data_handle(at(c, i0 * ldc + j0, out == GemmOut::kBf16 ? 2 : 4));
  t.scratchpad.set_data_handle(scratchpad.data());
  if (bias) t.bias.set_data_handle(at(bias, j0, 2));
  OmpThreads one(1);
  t.matmul->primitive.execute(stream, t.args);
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
  float *result = out != GemmOut::kBf16 ? static_cast<float *>(c) : (wc.resize(size_t(m * ldc)), wc.data());
  gemm(transposeA, transposeB, m, n, k, 1.0f, wa.data(), lda, wb.data(), ldb, out == GemmOut::kF32Add ? 1.0f : 0.0f,
       result, ldc);
  for (int64_t i = 0; i < m; ++i) {
    float *row = result + i * ldc;
    if (bias)
      for (int64_t j = 0; j < n; ++j) row[j] += bf16ToFloat(bias[j]);
    if (out == GemmOut::kBf16) narrowToBf16(row, static_cast<uint16_t *>(c) + i * ldc, n);
  }
}

}  // namespace

// oneDNN's threaded sgemm does not give the same bits at every thread count: on AVX2-only
// processors (an AMD EPYC VM, 2026-12-06) 1 and 3 threads differ, and with AVX-512 too where C
// has few rows (m = 40, n = 2048, k = 1024 on an AVX512-BF16 EPYC, 2026-12-07:
// tests/runtime/thread_count_test GemmOperandsWithFourKibStrides). So Loom cuts C into fixed
// tiles, each computed on one thread: a result never depends on the thread count. 256 x 256
// tiles ran GPT-2 small's twelve linear-layer products at 0.9-1.6x oneDNN's own threading on
// that machine's AVX-512 and on its AVX2 path (bench/gemm_shapes, 2 threads; docs/progress.md).
namespace {
constexpr int64_t kSgemmTileRows = 256, kSgemmTileCols = 256;

// A row stride of a multiple of 4 KiB maps the rows of a tile's panel to the same cache sets (one
// set per 4 KiB of address in an 8-way 32 KiB L1), and the single-threaded tiles ran such
// operands at about half the rate (GPT-2's 3072-float MLP rows: bench/gemm_shapes with
// ONEDNN_MAX_CPU_ISA=AVX2, docs/progress.md). Such a panel is copied into rows of another stride
// before its tiles use it; the products are the same, only their operands' addresses differ.
constexpr int64_t kConflictStride = 1024;            // floats: 4 KiB
constexpr int64_t kMaxPackedPanel = int64_t(1) << 20;  // floats per panel copy (4 MiB a thread)
int64_t packedStride(int64_t cols) {
  int64_t ld = (cols + 15) / 16 * 16 + 16;
  return ld % kConflictStride == 0 ? ld + 16 : ld;
}

// Whether panels of `panelFloats` floats with rows `ld` floats apart are copied (PanelPack).
bool copiesPanel(int64_t ld, int64_t panelFloats) { return ld % kConflictStride == 0 && panelFloats <= kMaxPackedPanel; }

// One operand's panel for a tile: `rows` rows of `cols` floats from `from` (stride `ld`), copied
// into `buffer` (the calling thread's, one per operand) when the stride conflicts; reused while
// the next tile wants the same.
class PanelPack {
 public:
  PanelPack(int64_t ld, int64_t panelFloats, std::vector<float> *buffer)
      : pack_(copiesPanel(ld, panelFloats)), buffer_(buffer) {}
  void get(const float *from, int64_t ld, int64_t rows, int64_t cols, const float **data, int64_t *stride) {
    if (!pack_) {
      *data = from, *stride = ld;
      return;
    }
    int64_t to = packedStride(cols);
    if (from != packedFrom_ || rows != packedRows_ || cols != packedCols_) {
      std::vector<float> &buffer = *buffer_;
      if (buffer.size() < size_t(rows * to)) buffer.resize(size_t(rows * to));
      for (int64_t r = 0; r < rows; ++r) std::copy(from + r * ld, from + r * ld + cols, buffer.data() + r * to);
      packedFrom_ = from, packedRows_ = rows, packedCols_ = cols, packed_ = buffer.data();
    }
    *data = packed_, *stride = to;
  }

 private:
  bool pack_;
  std::vector<float> *buffer_;
  const float *packedFrom_ = nullptr;
  const float *packed_ = nullptr;
  int64_t packedRows_ = 0, packedCols_ = 0;
};
}  // namespace

void gemm(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  int64_t rowTiles = chunkCount(m, kSgemmTileRows), colTiles = chunkCount(n, kSgemmTileCols);
  // Tiles in a part go along a row of tiles (sharing A's panel), or down a column when only
  // B's panels are copied (sharing B's); each tile's product is the same either way.
  bool downColumns = copiesPanel(ldb, k * kSgemmTileCols) && !copiesPanel(lda, k * kSgemmTileRows);
  parallelFor(rowTiles * colTiles, 1, [&](int64_t first, int64_t last) {
    OmpThreads one(1);
    thread_local std::vector<float> aBuffer, bBuffer;
    PanelPack aPanel(lda, k * kSgemmTileRows, &aBuffer), bPanel(ldb, k * kSgemmTileCols, &bBuffer);
    for (int64_t t = first; t < last; ++t) {
      int64_t ti = downColumns ? t % rowTiles : t / colTiles, tj = downColumns ? t / rowTiles : t % colTiles;
      int64_t i0 = ti * kSgemmTileRows, j0 = tj * kSgemmTileCols;
      int64_t rows = std::min(kSgemmTileRows, m - i0), cols = std::min(kSgemmTileCols, n - j0);
      const float *aTile, *bTile;
      int64_t aLd, bLd;
      // A's panel: k rows of the tile's columns of A^T, or the tile's rows of A; B's alike.
      aPanel.get(transposeA ? a + i0 : a + i0 * lda, lda, transposeA ? k : rows, transposeA ? rows : k, &aTile, &aLd);
      bPanel.get(transposeB ? b + j0 * ldb : b + j0, ldb, transposeB ? cols : k, transposeB ? k : cols, &bTile, &bLd);
      dnnl_status_t status = dnnl_sgemm(transposeA ? 'T' : 'N', transposeB ? 'T' : 'N', rows, cols, k, alpha, aTile,
                                        aLd, bTile, bLd, beta, c + i0 * ldc + j0, ldc);
      if (status != dnnl_success) internalError("sgemm", rows, cols, k, int(status));
    }
  });
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
        else if (out == GemmOut::kF32Add)
          static_cast<float *>(c)[i * ldc + j] += v;
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
