// float32 -> bfloat16 on the CPU: the software rounding (round to nearest even, NaN quieted:
// native/common/dtype.h's from_acc<bf16_t>; torch's x.to(torch.bfloat16) rounds every non-NaN the
// same way, subnormals included, and writes NaN as 0xffff) against the
// avx512_bf16 instruction vcvtneps2bf16 (_mm512_cvtneps_pbh), chosen at run time
// (__builtin_cpu_supports: no -mavx512bf16 needed to build, the hardware path is skipped where the
// CPU lacks it). Torch-free, one thread. Two questions for the opt-in bf16 gathering
// (passes/precision.py casts x with x.to(torch.bfloat16) before each gnncompile::spmm_bf16):
//
//   1. Are the two bit-exact? Every one of the 2^32 float32 bit patterns is converted both ways;
//      the mismatches are counted by class (zero, subnormal, normal, inf, NaN).
//   2. Is the instruction faster? Both over arrays of normal floats (N x F of the benchmarks: 50k x
//      64, 50k x 128, 100k x 128), output preallocated, medians of 20 passes, GB/s counting 6 bytes
//      per element (4 read, 2 written).
//
//   g++ -O2 -std=gnu++17 benchmarks/native/bf16_cast.cpp -o /tmp/bf16_cast && /tmp/bf16_cast
//
// Measured on a 2-core AMD EPYC (family 25 model 17, Zen 4, avx512_bf16), GCC 12, 2026-12-05
// (exclusive lock; benchmarks/results/bf16_cast_zen4_s59.txt, and the results README):
// not bit-exact: vcvtneps2bf16 flushes float32 subnormal inputs to zero (DAZ / FTZ whatever
// MXCSR says): 16,711,678 of the 16,777,214 subnormal patterns differ (the rest round to zero
// either way); all 4,261,412,864 normal patterns, the zeros, infinities and NaNs agree. Speed,
// medians, three repeats: 50k x 64 (12.8 MB, in the 32 MiB L3) 49-51 GB/s against 39-41 for the
// software rounding; 50k x 128 21-25 against 25-26; 100k x 128 (memory) 17-18 against 22-23: out
// of the cache the instruction was slower. torch's x.to(torch.bfloat16) (2 threads, an exploratory run) ran at 36-43
// GB/s at these sizes. So the opt-in path keeps torch's cast: the instruction would change
// subnormals' bits, and where the cast's time matters (x out of the cache) it is no faster.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static inline uint16_t soft_one(float v) {  // dtype.h's from_acc<bf16_t>
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__attribute__((target("avx512f,avx512bw"))) void soft(const float* x, uint16_t* o, int64_t n) {
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x400000);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(x + i);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), inf);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
  for (; i < n; ++i) o[i] = soft_one(x[i]);
}

__attribute__((target("avx512f,avx512bf16,avx512vl"))) void hard(const float* x, uint16_t* o, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh r = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    std::memcpy(o + i, &r, 32);
  }
  for (; i < n; ++i) o[i] = soft_one(x[i]);
}

// 0 zero, 1 subnormal, 2 normal, 3 inf, 4 NaN
static int kind(uint32_t u) {
  const uint32_t e = (u >> 23) & 0xffu, m = u & 0x7fffffu;
  if (e == 0) return m == 0 ? 0 : 1;
  if (e == 0xffu) return m == 0 ? 3 : 4;
  return 2;
}

int main() {
  __builtin_cpu_init();
  const bool has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  const bool has_bf16 = has_avx512 && __builtin_cpu_supports("avx512bf16");
  std::printf("avx512f/bw: %d, avx512bf16: %d\n", has_avx512, has_bf16);
  if (!has_bf16) {
    std::printf("no avx512_bf16: only the software conversion exists here; nothing to compare\n");
    return 0;
  }
  // 1. every float32 bit pattern, in chunks
  const int64_t chunk = 1 << 24;
  std::vector<uint32_t> in(chunk);
  std::vector<uint16_t> a(chunk), b(chunk);
  int64_t diff[5] = {0, 0, 0, 0, 0}, total[5] = {0, 0, 0, 0, 0};
  const char* names[5] = {"zero", "subnormal", "normal", "inf", "nan"};
  for (uint64_t base = 0; base < (1ull << 32); base += chunk) {
    for (int64_t i = 0; i < chunk; ++i) in[i] = static_cast<uint32_t>(base + i);
    soft(reinterpret_cast<const float*>(in.data()), a.data(), chunk);
    hard(reinterpret_cast<const float*>(in.data()), b.data(), chunk);
    for (int64_t i = 0; i < chunk; ++i) {
      const int c = kind(in[i]);
      ++total[c];
      if (a[i] != b[i]) ++diff[c];
    }
  }
  for (int c = 0; c < 5; ++c)
    std::printf("%-9s patterns %11lld  differ %11lld\n", names[c], static_cast<long long>(total[c]),
                static_cast<long long>(diff[c]));
  // 2. speed over normal floats
  for (int64_t n : {50000LL * 64, 50000LL * 128, 100000LL * 128}) {
    std::vector<float> x(n);
    std::mt19937 g(0);
    std::normal_distribution<float> d;
    for (auto& v : x) v = d(g);
    std::vector<uint16_t> o(n);
    for (int rep = 0; rep < 3; ++rep) {
      for (int which = 0; which < 2; ++which) {
        std::vector<double> t;
        for (int r = 0; r < 20; ++r) {
          const auto s = std::chrono::steady_clock::now();
          (which ? hard : soft)(x.data(), o.data(), n);
          t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
        }
        std::sort(t.begin(), t.end());
        std::printf("n=%9lld %-8s %.3f ms  %.1f GB/s\n", static_cast<long long>(n), which ? "vcvtne" : "software",
                    t[10] * 1e3, n * 6 / t[10] / 1e9);
      }
    }
  }
  return 0;
}
