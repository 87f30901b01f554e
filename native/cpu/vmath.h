// Vectorizable float32 math for message programs (gnncompile/ops/program.py): exp, expm1, log,
// log1p, tanh, sigmoid and erf, written so that a loop over a tile of features that calls them
// vectorizes (inline, branch-free: range reduction, a polynomial, special values by selects, bit
// casts between float and int). Torch-free, and __host__ __device__ under nvcc.
//
// The message interpreter (message_core.h) and the generated kernels (gnncompile/codegen/emit.py)
// call these same functions, compiled with the same flags (-ffp-contract=off: every product is
// rounded before a sum, no multiply-add), so they agree bit for bit. The float64 overloads call
// libm (std::exp, ...): double programs keep glibc's scalar functions.
//
// Accuracy (float32, against the float64 value rounded to float; measured by
// tests/codegen/test_vmath.py over a dense sweep and special values, and reported by
// `python -m benchmarks vmath`): a few ulp for every function. Special values as torch gives
// them: exp(-inf) = 0, exp(x > 88.72...) = inf, log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf,
// log1p(-1) = -inf, tanh(+-inf) = +-1, sigmoid(-inf) = 0, erf(+-inf) = +-1, NaN in gives NaN out,
// -0.0 kept where the function is odd (expm1, log1p, tanh, erf), subnormal inputs and results
// handled (exp scales in two steps, log scales subnormal inputs up first).
//
// Polynomial coefficients: least-squares fits on Chebyshev nodes, reweighted towards the minimax
// error (relative), computed for this file in float64 against multiprecision values and rounded
// to float.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__CUDACC__)
#define GNN_VM_INLINE __host__ __device__ __forceinline__
#else
#define GNN_VM_INLINE inline __attribute__((always_inline))
#endif

namespace gnncompile {
namespace vm {

GNN_VM_INLINE uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(uint32_t, f);
#endif
}

GNN_VM_INLINE float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}

GNN_VM_INLINE float abs_of(float x) { return float_of(bits_of(x) & 0x7fffffffu); }

// |t| with the sign of s
GNN_VM_INLINE float with_sign_of(float t, float s) {
  return float_of((bits_of(t) & 0x7fffffffu) | (bits_of(s) & 0x80000000u));
}

// 2^n for n in [-126, 127]
GNN_VM_INLINE float pow2i(int32_t n) { return float_of(static_cast<uint32_t>(n + 127) << 23); }

// x rounded to the nearest integer (ties to even), |x| < 2^22
GNN_VM_INLINE float round_small(float x) { return (x + 0x1.8p23f) - 0x1.8p23f; }

constexpr float kLog2e = 0x1.715476p+0f;
constexpr float kLn2Hi = 0x1.62e400p-1f;   // ln 2's first 16 bits: n * kLn2Hi is exact for |n| < 256
constexpr float kLn2Lo = 0x1.7f7d1cp-20f;  // ln 2 - kLn2Hi

// (e^r - 1 - r) / r^2 on |r| <= ln2 / 2
GNN_VM_INLINE float exp_q(float r) {
  return 0x1.000000p-1f +
         r * (0x1.555556p-3f + r * (0x1.5554eap-5f + r * (0x1.11114cp-7f + r * (0x1.6d42d6p-10f + r * 0x1.a072acp-13f))));
}

// e^x. Reduced as x = n ln2 + r, |r| <= ln2 / 2; e^r = 1 + r + r^2 q(r); times 2^n in two
// steps (2^(n/2), then 2^(n - n/2)) so that results below 2^-126 round once, as subnormals.
GNN_VM_INLINE float exp(float x) {
  float xc = x > -104.0f ? x : -104.0f;  // NaN -> -104 (selected back below)
  xc = xc < 89.0f ? xc : 89.0f;          // e^89 overflows: n = 128 -> inf
  const float kf = round_small(xc * kLog2e);
  const int32_t n = static_cast<int32_t>(kf);
  const float r = (xc - kf * kLn2Hi) - kf * kLn2Lo;
  const float p = 1.0f + (r + (r * r) * exp_q(r));
  const int32_t n1 = n / 2;
  const float v = (p * pow2i(n1)) * pow2i(n - n1);
  return x != x ? x : v;
}

// e^x - 1. The reduction of exp; e^x - 1 = 2 (h - 1/2 + h m) with h = 2^(n-1) and
// m = e^r - 1 = r + r^2 q(r) (h - 1/2 is exact for the n that matter; h stays finite up to n = 128).
GNN_VM_INLINE float expm1(float x) {
  float xc = x > -18.0f ? x : -18.0f;  // e^x - 1 rounds to -1 below -17.33; NaN -> -18
  xc = xc < 89.0f ? xc : 89.0f;
  const float kf = round_small(xc * kLog2e);
  const int32_t n = static_cast<int32_t>(kf);
  const float r = (xc - kf * kLn2Hi) - kf * kLn2Lo;
  const float m = r + (r * r) * exp_q(r);
  const float h = pow2i(n - 1);
  const float v = 2.0f * ((h - 0.5f) + h * m);
  // |x| < 2^-25: x itself (the correctly rounded value; keeps -0.0 and subnormals)
  const float w = abs_of(x) < 0x1p-25f ? x : v;
  return x != x ? x : w;
}

// log(x). x = 2^k m with m in [sqrt(1/2), sqrt(2)) (subnormals scaled by 2^23 first), f = m - 1
// (exact), s = f / (2 + f): log(1 + f) = f - f^2/2 + s (f^2/2 + R(s^2)).
GNN_VM_INLINE float log(float x) {
  const bool sub = x < 0x1p-126f;
  const float xs = sub ? x * 0x1p23f : x;
  uint32_t ix = bits_of(xs) + (0x3f800000u - 0x3f3504f3u);
  const int32_t k = static_cast<int32_t>(ix >> 23) - 127 - (sub ? 23 : 0);
  ix = (ix & 0x007fffffu) + 0x3f3504f3u;
  const float f = float_of(ix) - 1.0f;
  const float s = f / (2.0f + f);
  const float z = s * s;
  const float R = z * (0x1.555556p-1f + z * (0x1.9999ecp-2f + z * (0x1.245c34p-2f + z * 0x1.ddd198p-3f)));
  const float hf = 0.5f * (f * f);
  const float kf = static_cast<float>(k);
  const float v = kf * kLn2Hi + (f + ((s * (hf + R) + kf * kLn2Lo) - hf));
  float w = x == std::numeric_limits<float>::infinity() ? x : v;
  w = x == 0.0f ? -std::numeric_limits<float>::infinity() : w;
  w = x < 0.0f ? std::numeric_limits<float>::quiet_NaN() : w;
  return x != x ? x : w;
}

// log(1 + x): log(u) for u = 1 + x rounded, plus the rounding error of u over u.
GNN_VM_INLINE float log1p(float x) {
  const float u = 1.0f + x;
  const float c = x - (u - 1.0f);
  const float lu = log(u);
  const bool plain = u == 0.0f || u == std::numeric_limits<float>::infinity();  // -inf / inf: log(u)
  const float v = plain ? lu : lu + c / (plain ? 1.0f : u);
  return abs_of(x) < 0x1p-24f ? x : v;  // the correctly rounded value; -0.0 and subnormals kept
}

// tanh(x) = m / (m + 2) with m = e^(2|x|) - 1, the sign of x put back; |x| > 9 saturates to 1.
GNN_VM_INLINE float tanh(float x) {
  float ax = abs_of(x);
  ax = ax < 10.0f ? ax : 10.0f;  // NaN -> 10 (selected back below)
  const float m = expm1(2.0f * ax);
  const float v = with_sign_of(m / (m + 2.0f), x);
  return x != x ? x : v;
}

// 1 / (1 + e^-x), as e / (1 + e) with e = e^x below 0 (no overflow of e^-x: tiny and subnormal
// results for x < -88 instead of 0).
GNN_VM_INLINE float sigmoid(float x) {
  const float e = exp(-abs_of(x));
  return (x < 0.0f ? e : 1.0f) / (1.0f + e);
}

// erf(x): x P(x^2) below |x| = 1; above, 1 - e^(-x^2) R(1 / |x|) (R: erfc(x) e^(x^2)); 1 from
// |x| = 4 (erf rounds to 1 above 3.92); the sign of x put back.
GNN_VM_INLINE float erf(float x) {
  float ax = abs_of(x);
  ax = ax < 4.0f ? ax : 4.0f;  // NaN -> 4 (selected back below)
  const float z = ax * ax;
  const float small =
      ax * (0x1.20dd74p+0f +
            z * (-0x1.81273ep-2f +
                 z * (0x1.ce2cf8p-4f + z * (-0x1.b7f90cp-6f + z * (0x1.5405b0p-8f + z * (-0x1.a3f6f0p-11f + z * 0x1.496a0ap-14f))))));
  const float u = 1.0f / (ax < 1.0f ? 1.0f : ax);
  const float R =
      0x1.fbe460p-14f +
      u * (0x1.1fa006p-1f +
           u * (0x1.507d66p-6f +
                u * (-0x1.80e474p-2f +
                     u * (0x1.d7e5bap-3f +
                          u * (0x1.e80554p-3f + u * (-0x1.12e46ap-1f + u * (0x1.c0b884p-2f + u * (-0x1.700556p-3f + u * 0x1.f72c4cp-6f))))))));
  const float big = 1.0f - exp(-z) * R;
  const float v = with_sign_of(ax < 1.0f ? small : big, x);
  return x != x ? x : v;
}

// float64: libm
GNN_VM_INLINE double exp(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}
GNN_VM_INLINE double expm1(double x) {
#if defined(__CUDA_ARCH__)
  return ::expm1(x);
#else
  return std::expm1(x);
#endif
}
GNN_VM_INLINE double log(double x) {
#if defined(__CUDA_ARCH__)
  return ::log(x);
#else
  return std::log(x);
#endif
}
GNN_VM_INLINE double log1p(double x) {
#if defined(__CUDA_ARCH__)
  return ::log1p(x);
#else
  return std::log1p(x);
#endif
}
GNN_VM_INLINE double tanh(double x) {
#if defined(__CUDA_ARCH__)
  return ::tanh(x);
#else
  return std::tanh(x);
#endif
}
GNN_VM_INLINE double erf(double x) {
#if defined(__CUDA_ARCH__)
  return ::erf(x);
#else
  return std::erf(x);
#endif
}
// float64 sigmoid: the formula the message programs used before this file (1 / (1 + e^-x))
GNN_VM_INLINE double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

}  // namespace vm
}  // namespace gnncompile
