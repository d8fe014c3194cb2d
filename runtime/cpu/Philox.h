// Philox4x32-10 counter-based random numbers (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC'11). A value depends only on (key, counter), so dropout masks are
// the same whatever the thread count, the schedule, or whether the backward recomputes
// them.
#pragma once

#include <array>
#include <cstdint>

namespace loom::cpu {

inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(kMul0) * ctr[0];
    uint64_t p1 = uint64_t(kMul1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1],
           uint32_t(p0)};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return ctr;
}

// Uniform float in [0, 1) for element `index` of random stream (seed, stream).
inline float philoxUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  auto r = philox4x32({uint32_t(index), uint32_t(index >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                      {uint32_t(seed), uint32_t(seed >> 32)});
  return float(r[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace loom::cpu
