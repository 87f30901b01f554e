// Storage types for 16-bit floats on the host, with conversions to and from float.
// The kernels load 16-bit values, accumulate in float32 and round once on the way out.
#pragma once
#include <cstdint>
#include <cstring>

namespace gnncompile {

struct bf16_t { uint16_t bits; };
struct half_t { uint16_t bits; };

inline float to_float(float v) { return v; }
inline double to_float(double v) { return v; }

inline float to_float(bf16_t v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float to_float(half_t v) {
#if defined(__FLT16_MAX__)
  _Float16 h;
  std::memcpy(&h, &v.bits, sizeof(h));
  return static_cast<float>(h);
#else
  // IEEE binary16 -> binary32 by hand.
  uint32_t sign = (v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t man = v.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) { man <<= 1; --exp; }
      man &= 0x3ffu;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// Accumulator type: float for 16-bit and 32-bit storage, double for double.
template <typename T> struct acc_type { using type = float; };
template <> struct acc_type<double> { using type = double; };

template <typename T> inline T from_acc(typename acc_type<T>::type v);
template <> inline float from_acc<float>(float v) { return v; }
template <> inline double from_acc<double>(double v) { return v; }
template <> inline bf16_t from_acc<bf16_t>(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}
template <> inline half_t from_acc<half_t>(float v) {
#if defined(__FLT16_MAX__)
  _Float16 h = static_cast<_Float16>(v);
  half_t r;
  std::memcpy(&r.bits, &h, sizeof(h));
  return r;
#else
  // float -> half, round to nearest even, with overflow to inf and subnormals.
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return half_t{static_cast<uint16_t>(sign | 0x7e00u)};
  if (absu >= 0x477ff000u) return half_t{static_cast<uint16_t>(sign | 0x7c00u)};
  if (absu < 0x38800000u) {  // subnormal or zero in half
    float a;
    std::memcpy(&a, &absu, sizeof(a));
    float scaled = a * 16777216.0f;  // 2^24
    uint32_t m = static_cast<uint32_t>(scaled);
    float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return half_t{static_cast<uint16_t>(sign | m)};
  }
  uint32_t r = absu - 0x38000000u;  // rebias exponent
  r += 0xfffu + ((r >> 13) & 1u);
  return half_t{static_cast<uint16_t>(sign | (r >> 13))};
#endif
}

}  // namespace gnncompile
