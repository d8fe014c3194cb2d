// A vectorisable expf (Cephes' single-precision algorithm): x = k ln2 + r with |r| <= ln2 / 2
// (ln2 split in two parts for an exact reduction), exp(r) by a degree-6 polynomial, then the
// exponent k put into the float's bits. Accurate to about 1 ulp; written without calls so that
// loops over it vectorise (with -fno-trapping-math, which the kernels are built with). Inputs
// below -87.3 give 0 (they underflow anyway).
#pragma once

#include <bit>
#include <cstdint>

namespace loom::cpu {

inline float fastExp(float x) {
  float in = x;
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  // Round to nearest by adding and removing 1.5 * 2^23 (vectorises without SSE4.1's roundps).
  float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = p * r * r + r + 1.0f;
  float scale = std::bit_cast<float>((int32_t(k) + 127) << 23);
  return in <= -87.3f ? 0.0f : e * scale;
}

// tanh(x) = sign(x) (1 - 2 / (exp(2 |x|) + 1)) through fastExp (vectorises likewise; |x| >= 9
// is +-1 in float). Absolute error about 1e-7 (relative error grows for |x| < 1e-3, where
// the GeLU that uses it multiplies it by x anyway).
inline float fastTanh(float x) {
  float a = x < 0 ? -x : x;
  a = a > 9.0f ? 9.0f : a;
  float t = 1.0f - 2.0f / (fastExp(2.0f * a) + 1.0f);
  return x < 0 ? -t : t;
}

}  // namespace loom::cpu
