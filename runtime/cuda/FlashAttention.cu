// Per query row i of one (batch, head), with scale = 1/sqrt(hd) and s_ij = scale q_i.k_j:
//   forward:  a running max m, sum l and output o over key tiles:
//             m' = max(m, max_j s_ij), l = l e^(m - m') + sum_j e^(s_ij - m'),
//             o = o e^(m - m') + sum_j e^(s_ij - m') keep_ij / (1 - rate) v_j;  out_i = o / l;
//   backward: P_ij = e^(s_ij - m_i) / l_i from the saved m_i, l_i; Delta_i = g_i . out_i
//             (= rowsum(P dP)); dP_ij = (g_i . v_j) keep_ij / (1 - rate);
//             dS_ij = P_ij (dP_ij - Delta_i); dQ_i = scale sum_j dS_ij k_j (per query row),
//             dK_j = scale sum_i dS_ij q_i and dV_j = sum_i P_ij keep_ij / (1 - rate) g_i
//             (per key row).
// A block is 8 warps, one row each; the other side's rows stream through shared memory in
// tiles of 32 (one per lane), stored with a pitch of hd + 1 so lanes reading one row each do
// not collide on a bank. qkv, g, out and dqkv are typed (DeviceArray.h): read into the fp32
// tiles and registers with load(), written with store(), so the arithmetic is fp32 whatever
// the storage.
#include "runtime/cuda/FlashAttention.h"

#include <string>

#include "runtime/cuda/DeviceMath.cuh"

namespace loom::cuda {
namespace {

constexpr int kTile = 32;  // rows of the other side per tile: one per lane
constexpr int kRows = 8;   // rows per block: one per warp
constexpr int kMaxHeadDim = 128;
constexpr int kPerLane = kMaxHeadDim / 32;  // head dimensions a lane owns: d = lane + 32 t

// One past the block's last row.
__device__ int64_t blockEnd(int64_t S) {
  int64_t end = int64_t(blockIdx.x + 1) * kRows;
  return end < S ? end : S;
}

// One (batch, head) of the shape: blockIdx.y.
struct Head {
  In qkv;      // the whole qkv: this head's q of token 0 at element q0 (k at + hd, v at + 2 hd; tokens ld apart)
  In g;        // the whole output gradient: this head's of token 0 at element g0 (tokens `width` apart), or null
  int64_t q0, g0, ld, width, S, hd, b, h;
};

__device__ Head headOf(In qkv, In g, const cpu::AttentionShape &s) {
  int64_t b = blockIdx.y / s.heads, h = blockIdx.y % s.heads, hd = s.headDim, ld = 3 * s.heads * hd;
  int64_t width = s.heads * hd;
  return {qkv, g, b * s.seq * ld + h * 3 * hd, b * s.seq * width + h * hd, ld, width, s.seq, hd, b, h};
}

__device__ float keepFactor(const cpu::AttentionShape &s, const Head &x, int64_t i, int64_t j) {
  if (s.dropout <= 0) return 1.0f;
  uint64_t index = uint64_t(((x.b * s.heads + x.h) * x.S + i) * x.S + j);
  return philoxUniform(s.seed, s.stream, index) >= s.dropout ? 1.0f / (1.0f - s.dropout) : 0.0f;
}

__device__ bool maskedPair(const cpu::AttentionShape &s, const Head &x, const float *keyMask, int64_t i, int64_t j) {
  return i >= x.S || j >= x.S || (s.causal && j > i) || (keyMask && keyMask[x.b * x.S + j] == 0.0f);
}

__device__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ float warpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// tile[r][d] (pitch hd + 1) = scale * rows[first + r][d], zeros past S, where rows[row][d] is
// element base + row * stride + d of `a`; the whole block loads.
__device__ void loadTile(float *tile, In a, int64_t base, int64_t stride, int64_t first, int64_t S, int64_t hd,
                         float scale) {
  for (int e = threadIdx.x; e < kTile * int(hd); e += blockDim.x) {  // 32-bit: at most 32 x 128
    int r = e / int(hd), d = e % int(hd);
    int64_t row = first + r;
    tile[r * (hd + 1) + d] = row < S ? load(a, base + row * stride + d) * scale : 0.0f;
  }
}

// A warp's own row: mine[d] = scale * rows[row][d] (zeros past S), rows as loadTile's.
__device__ void loadRow(float *mine, In a, int64_t base, int64_t stride, int64_t row, int64_t S, int64_t hd,
                        float scale, int lane) {
  for (int64_t d = lane; d < hd; d += 32) mine[d] = row < S ? load(a, base + row * stride + d) * scale : 0.0f;
}

// a (broadcast to every lane) . b (this lane's tile row).
__device__ float dot(const float *a, const float *b, int64_t hd) {
  float s = 0;
  for (int64_t d = 0; d < hd; ++d) s += a[d] * b[d];
  return s;
}

// acc[t] += sum over the 32 lanes' weights w of w * tile[lane][d]: each lane's own d's.
__device__ void accumulateTile(float (&acc)[kPerLane], float w, const float *tile, int64_t hd, int lane) {
  for (int r = 0; r < kTile; ++r) {
    float wr = __shfl_sync(0xffffffffu, w, r);
    if (wr == 0.0f) continue;  // the same for every lane
    for (int t = 0; t < kPerLane; ++t) {
      int64_t d = lane + 32 * t;
      if (d < hd) acc[t] += wr * tile[r * (hd + 1) + d];
    }
  }
}

// The forward over query rows, with lse (nullable) each row's log-sum-exp m + log l at
// [b, h, i] (+inf when every key is masked). With `stats` (backward), writes m, l and
// Delta = g . out per row instead of out.
__global__ void forwardKernel(In qkv, const float *keyMask, In g, Out out, float *lse, float *stats,
                              cpu::AttentionShape s) {
  extern __shared__ float smem[];
  Head x = headOf(qkv, g, s);
  int64_t hd = x.hd, pitch = hd + 1;
  float *sK = smem, *sV = sK + kTile * pitch, *sQ = sV + kTile * pitch;  // sQ: [kRows][hd]
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t i = int64_t(blockIdx.x) * kRows + warp;
  float scale = 1.0f / sqrtf(float(hd));  // as the CPU rounds it
  float *q = sQ + warp * hd;
  loadRow(q, x.qkv, x.q0, x.ld, i, x.S, hd, scale, lane);
  float m = -INFINITY, l = 0, acc[kPerLane] = {};
  int64_t keyEnd = s.causal ? blockEnd(x.S) : x.S;
  for (int64_t j0 = 0; j0 < keyEnd; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and q written)
    loadTile(sK, x.qkv, x.q0 + hd, x.ld, j0, x.S, hd, 1.0f);
    loadTile(sV, x.qkv, x.q0 + 2 * hd, x.ld, j0, x.S, hd, 1.0f);
    __syncthreads();
    int64_t j = j0 + lane;
    float score = maskedPair(s, x, keyMask, i, j) ? -INFINITY : dot(q, sK + lane * pitch, hd);
    float mNew = fmaxf(m, warpMax(score));
    if (mNew == -INFINITY) continue;  // every key so far masked (uniform across the warp)
    float p = score == -INFINITY ? 0.0f : expf(score - mNew);
    float correction = m == -INFINITY ? 0.0f : expf(m - mNew);
    l = l * correction + warpSum(p);
    for (int t = 0; t < kPerLane; ++t) acc[t] *= correction;
    accumulateTile(acc, p == 0.0f ? 0.0f : p * keepFactor(s, x, i, j), sV, hd, lane);
    m = mNew;
  }
  if (i >= x.S) return;  // no barrier follows
  float inv = l > 0 ? 1.0f / l : 0.0f, delta = 0;
  for (int t = 0; t < kPerLane; ++t) {
    int64_t d = lane + 32 * t;
    if (d >= hd) continue;
    float o = acc[t] * inv;
    if (stats) {
      float gd = load(x.g, x.g0 + i * x.width + d);
      delta += o * gd;
    } else {
      store(out, (x.b * x.S + i) * x.width + x.h * hd + d, o);
    }
  }
  if (!stats) {
    if (lse && lane == 0) lse[int64_t(blockIdx.y) * x.S + i] = l > 0 ? m + logf(l) : INFINITY;
    return;
  }
  delta = warpSum(delta);
  if (lane == 0) {
    int64_t rowsAll = int64_t(gridDim.y) * x.S, r = int64_t(blockIdx.y) * x.S + i;
    stats[r] = m, stats[rowsAll + r] = l, stats[2 * rowsAll + r] = delta;
  }
}

struct RowStats {
  float m, l, delta;
};

__device__ RowStats statsOf(const float *stats, int64_t bh, int64_t S, int64_t rowsAll, int64_t i) {
  if (i >= S) return {-INFINITY, 0.0f, 0.0f};
  int64_t r = bh * S + i;
  return {stats[r], stats[rowsAll + r], stats[2 * rowsAll + r]};
}

// P_ij and dS_ij of one pair, 0 where masked or where the row attends to nothing.
__device__ void pairGradient(const cpu::AttentionShape &s, const Head &x, float score, float gv, RowStats st,
                             int64_t i, int64_t j, float *pDropped, float *dS) {
  if (!(st.l > 0)) {
    *pDropped = 0, *dS = 0;
    return;
  }
  float p = expf(score - st.m) / st.l, keep = keepFactor(s, x, i, j);
  *pDropped = p * keep;
  *dS = p * (gv * keep - st.delta);
}

// dQ over query rows: each warp's row against key tiles.
__global__ void queryGradKernel(In qkv, const float *keyMask, In g, const float *stats, Out dqkv,
                                cpu::AttentionShape s) {
  extern __shared__ float smem[];
  Head x = headOf(qkv, g, s);
  int64_t hd = x.hd, pitch = hd + 1;
  float *sK = smem, *sV = sK + kTile * pitch, *sQ = sV + kTile * pitch, *sG = sQ + kRows * hd;
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t i = int64_t(blockIdx.x) * kRows + warp;
  float scale = 1.0f / sqrtf(float(hd));  // as the CPU rounds it
  float *q = sQ + warp * hd, *gi = sG + warp * hd;
  loadRow(q, x.qkv, x.q0, x.ld, i, x.S, hd, scale, lane);
  loadRow(gi, x.g, x.g0, x.width, i, x.S, hd, 1.0f, lane);
  RowStats st = statsOf(stats, blockIdx.y, x.S, int64_t(gridDim.y) * x.S, i);
  float dq[kPerLane] = {};
  int64_t keyEnd = s.causal ? blockEnd(x.S) : x.S;
  for (int64_t j0 = 0; j0 < keyEnd; j0 += kTile) {
    __syncthreads();
    loadTile(sK, x.qkv, x.q0 + hd, x.ld, j0, x.S, hd, 1.0f);
    loadTile(sV, x.qkv, x.q0 + 2 * hd, x.ld, j0, x.S, hd, 1.0f);
    __syncthreads();
    int64_t j = j0 + lane;
    float pDropped = 0, dS = 0;
    if (!maskedPair(s, x, keyMask, i, j))
      pairGradient(s, x, dot(q, sK + lane * pitch, hd), dot(gi, sV + lane * pitch, hd), st, i, j, &pDropped, &dS);
    accumulateTile(dq, dS, sK, hd, lane);
  }
  if (i >= x.S) return;
  int64_t dqRow = x.q0 + i * x.ld;  // this head's q of token i
  for (int t = 0; t < kPerLane; ++t) {
    int64_t d = lane + 32 * t;
    if (d < hd) store(dqkv, dqRow + d, dq[t] * scale);
  }
}

// dK and dV over key rows: each warp's key row against query tiles.
__global__ void keyValueGradKernel(In qkv, const float *keyMask, In g, const float *stats, Out dqkv,
                                   cpu::AttentionShape s) {
  extern __shared__ float smem[];
  Head x = headOf(qkv, g, s);
  int64_t hd = x.hd, pitch = hd + 1, rowsAll = int64_t(gridDim.y) * x.S;
  float *sQ = smem, *sG = sQ + kTile * pitch, *sM = sG + kTile * pitch, *sL = sM + kTile, *sD = sL + kTile;
  float *sK = sD + kTile, *sV = sK + kRows * hd;  // this block's key rows: [kRows][hd] each
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t j = int64_t(blockIdx.x) * kRows + warp;
  float scale = 1.0f / sqrtf(float(hd));  // as the CPU rounds it
  float *k = sK + warp * hd, *v = sV + warp * hd;
  loadRow(k, x.qkv, x.q0 + hd, x.ld, j, x.S, hd, 1.0f, lane);
  loadRow(v, x.qkv, x.q0 + 2 * hd, x.ld, j, x.S, hd, 1.0f, lane);
  float dk[kPerLane] = {}, dv[kPerLane] = {};
  // Causal: queries before the block's first key row see none of its keys.
  int64_t firstQuery = s.causal ? int64_t(blockIdx.x) * kRows : 0;
  for (int64_t i0 = firstQuery; i0 < x.S; i0 += kTile) {
    __syncthreads();
    loadTile(sQ, x.qkv, x.q0, x.ld, i0, x.S, hd, scale);
    loadTile(sG, x.g, x.g0, x.width, i0, x.S, hd, 1.0f);
    for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
      RowStats st = statsOf(stats, blockIdx.y, x.S, rowsAll, i0 + r);
      sM[r] = st.m, sL[r] = st.l, sD[r] = st.delta;
    }
    __syncthreads();
    int64_t i = i0 + lane;
    float pDropped = 0, dS = 0;
    if (!maskedPair(s, x, keyMask, i, j))
      pairGradient(s, x, dot(k, sQ + lane * pitch, hd), dot(v, sG + lane * pitch, hd), {sM[lane], sL[lane], sD[lane]},
                   i, j, &pDropped, &dS);
    accumulateTile(dv, pDropped, sG, hd, lane);
    accumulateTile(dk, dS, sQ, hd, lane);  // sQ holds scale q: dK_j = scale sum_i dS_ij q_i
  }
  if (j >= x.S) return;
  int64_t dkRow = x.q0 + j * x.ld + hd, dvRow = dkRow + hd;  // this head's k and v of token j
  for (int t = 0; t < kPerLane; ++t) {
    int64_t d = lane + 32 * t;
    if (d < hd) store(dqkv, dkRow + d, dk[t]), store(dqkv, dvRow + d, dv[t]);
  }
}

Status checkShape(const cpu::AttentionShape &s) {
  if (s.batch <= 0 || s.seq <= 0 || s.heads <= 0 || s.headDim <= 0)
    return Status::error("flash attention: empty shape (batch, seq, heads or head size is 0)");
  if (s.headDim > kMaxHeadDim)
    return Status::error("flash attention: head size " + std::to_string(s.headDim) + " above " +
                         std::to_string(kMaxHeadDim));
  if (s.batch * s.heads > 65535) return Status::error("flash attention: batch x heads above 65535");
  return Status::ok();
}

dim3 gridOf(const cpu::AttentionShape &s) {
  return dim3(unsigned((s.seq + kRows - 1) / kRows), unsigned(s.batch * s.heads));
}

size_t sharedBytes(const cpu::AttentionShape &s, int tiles, int tileVectors, int rowVectors) {
  return size_t(tiles * kTile * (s.headDim + 1) + tileVectors * kTile + rowVectors * kRows * s.headDim) * sizeof(float);
}

Status launched(const char *what) {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return Status::ok();
  return Status::error(std::string("flash attention ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

Status flashAttentionForward(In qkv, const float *keyMask, Out out, float *lse, const cpu::AttentionShape &shape,
                             cudaStream_t s) {
  LOOM_RETURN_IF_ERROR(checkShape(shape));
  forwardKernel<<<gridOf(shape), kRows * 32, sharedBytes(shape, 2, 0, 1), s>>>(qkv, keyMask, In(), out, lse, nullptr,
                                                                               shape);
  return launched("forward");
}

Status flashAttentionBackward(In qkv, const float *keyMask, In g, Out dqkv, const cpu::AttentionShape &shape,
                              void *scratch, cudaStream_t s) {
  LOOM_RETURN_IF_ERROR(checkShape(shape));
  float *stats = static_cast<float *>(scratch);
  forwardKernel<<<gridOf(shape), kRows * 32, sharedBytes(shape, 2, 0, 1), s>>>(qkv, keyMask, g, Out(), nullptr, stats,
                                                                               shape);
  LOOM_RETURN_IF_ERROR(launched("backward statistics"));
  queryGradKernel<<<gridOf(shape), kRows * 32, sharedBytes(shape, 2, 0, 2), s>>>(qkv, keyMask, g, stats, dqkv, shape);
  LOOM_RETURN_IF_ERROR(launched("backward (queries)"));
  keyValueGradKernel<<<gridOf(shape), kRows * 32, sharedBytes(shape, 2, 3, 2), s>>>(qkv, keyMask, g, stats, dqkv,
                                                                                     shape);
  return launched("backward (keys and values)");
}

}  // namespace loom::cuda
