// Per-edge dot products over a CSR-by-destination structure, on the host. Torch-free.
//   out[e, h] = <x[src_e, h, :], g[dst_e, h, :]>   (the gradient of an edge weight)
// Edges are written in their original order through perm, so callers never permute.
#pragma once
#include <cstdint>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "../common/dtype.h"
#include "../common/macros.h"
#include "rows_core.h"

namespace gnncompile {
namespace cpu {

constexpr int kLanes = 16;  // independent partial sums: lets the compiler vectorise a dot product
constexpr int kDotPrefetchDistance = 4;  // edges ahead whose source row is prefetched (as in spmm)

template <typename scalar_t, typename acc_t>
inline acc_t dot(const scalar_t* a, const scalar_t* b, int64_t n) {
  acc_t lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += acc_t(to_float(a[i + l])) * acc_t(to_float(b[i + l]));
  acc_t s = 0;
  for (; i < n; ++i) s += acc_t(to_float(a[i])) * acc_t(to_float(b[i]));
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  return s;
}

// A dot product whose partial sums are added as a tree, not one after another: dot's final sum of
// its kLanes partial sums is a chain of dependent additions (about 64 cycles of latency per call),
// which dominated attention_dot's per-edge work (8-16 short dot products per edge). Float with AVX2
// and FMA: two 8-wide accumulators, then a horizontal sum; elsewhere dot itself. Its rounding
// differs from dot's, so a kernel uses one or the other in all of its passes.
template <typename scalar_t, typename acc_t>
inline acc_t dot_tree(const scalar_t* __restrict__ a, const scalar_t* __restrict__ b, int64_t n) {
  return dot<scalar_t, acc_t>(a, b, n);
}
#if defined(__AVX2__) && defined(__FMA__)
inline float hsum8(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 sh = _mm_movehdup_ps(lo);
  lo = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, lo);
  return _mm_cvtss_f32(_mm_add_ss(lo, sh));
}
template <>
inline float dot_tree<float, float>(const float* __restrict__ a, const float* __restrict__ b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  if (i + 8 <= n) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    i += 8;
  }
  float s = hsum8(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
#endif

// The sum of kLanes partial sums (a dot product's lanes), as a tree where AVX2 allows (as dot_tree).
template <typename acc_t>
inline acc_t lanes_total(const acc_t* lane) {
  acc_t s = 0;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  return s;
}
#if defined(__AVX2__) && defined(__FMA__)
static_assert(kLanes == 16, "lanes_total<float> adds two 8-wide halves");
template <>
inline float lanes_total<float>(const float* lane) {
  return hsum8(_mm256_add_ps(_mm256_loadu_ps(lane), _mm256_loadu_ps(lane + 8)));
}
#endif

// x: [N, H*C], g: [M, H*C], out: [E, H] in original edge order.
template <typename scalar_t, typename index_t>
Status edge_dot_rows(const index_t* rowptr, const index_t* col, const index_t* perm,
                     const scalar_t* x, const scalar_t* g, scalar_t* out, int64_t H, int64_t C,
                     int64_t num_src, int64_t num_edges, int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t F = H * C;
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(rowptr, row, num_edges)) return Status::BadRowptr;
    const scalar_t* gr = g + row * F;
    const int64_t end = rowptr[row + 1];
    for (int64_t j = rowptr[row]; j < end; ++j) {
      if (j + kDotPrefetchDistance < end) {  // the gathered row and the scattered output, ahead
        const char* p = reinterpret_cast<const char*>(x + static_cast<int64_t>(col[j + kDotPrefetchDistance]) * F);
        for (int64_t b = 0; b < F * static_cast<int64_t>(sizeof(scalar_t)); b += 64) __builtin_prefetch(p + b, 0, 0);
        __builtin_prefetch(out + static_cast<int64_t>(perm[j + kDotPrefetchDistance]) * H, 1, 0);
      }
      const int64_t s = static_cast<int64_t>(col[j]), e = static_cast<int64_t>(perm[j]);
      if (!in_range(s, num_src)) return Status::BadCol;
      if (!in_range(e, num_edges)) return Status::BadPerm;
      const scalar_t* xr = x + s * F;
      scalar_t* o = out + e * H;
      for (int64_t h = 0; h < H; ++h)
        o[h] = from_acc<scalar_t>(dot<scalar_t, acc_t>(xr + h * C, gr + h * C, C));
    }
  }
  return Status::Ok;
}

}  // namespace cpu
}  // namespace gnncompile
