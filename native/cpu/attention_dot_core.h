// Dot-product (transformer) attention in one pass over a CSR-by-destination structure, on the
// host. Torch-free. TransformerConv's attention with its edge term folded in (lin_edge has no
// bias, so for the head-h block W_h of lin_edge's weight, q . (k + W_h e) = q . k + (W_h^T q) . e):
//
//   s[e, h]     = scale * (<q[dst_e, h], k[src_e, h]> + <qe[dst_e, h], ea[e]>)   (qe = W_h^T q; 0 without)
//   alpha[e, h] = exp(s - max_row) / (sum_row exp(s - max_row) + 1e-16)          (PyG's softmax)
//   w[e, h]     = alpha[e, h] * keep(e, h) / (1 - p)                              (attention dropout)
//   out[i, h]   = sum over the edges e into i of w[e, h] * v[src_e, h, :]        [M, H, C]
//   out_e[i, h] = sum over the edges e into i of w[e, h] * ea[e, :]               [M, H, De]
//
// (the layer's message (v + W_h ea) * alpha summed per destination is out + W_h out_e, which the
// caller computes with torch.) q [M, H, C], k and v [N, H, C], qe [M, H, De], ea [E, De] in edge
// order; De = 0 without edge features.
//
// Forward (attention_dot_rows): one destination row at a time: the H logits of each in-edge into a
// per-thread buffer (deg x H), max, exp, sum per head as attention_rows (attention_core.h, whose
// exp_approx, softmax rounding and dropout mask it shares), then one sweep over the rows v[src]
// (and ea[e]) accumulating the output rows. The row's max and 1 / (sum + 1e-16) per head are kept
// (stats, [M, 2, H]). Nothing per edge is stored.
//
// Backward, g = dL/dout, ge = dL/dout_e, D[i, h] = <out[i, h], g[i, h]> + <out_e[i, h], ge[i, h]>
// (= sum_e w g_a, the softmax backward's row sum, with or without dropout):
//   attention_dot_dst_rows, one pass over the CSR (a destination row at a time), each edge finished
//     as it is read: logits recomputed, alpha from the stats, g_a = <g[i, h], v[src, h]> + <ge[i, h], ea[e]>, ds = scale * alpha *
//     (keep * g_a - D[i, h]); g_q[i] = sum ds k[src]; g_qe[i] = sum ds ea[e]; g_ea[e] = sum_h (w
//     ge[i, h] + ds qe[i, h]) at the edge's id; and per edge (at its id) a record of ds and w per
//     head for the next pass.
//   attention_dot_source_rows, one pass over the CSC (a source row at a time, its out-edges):
//     g_k[j] = sum ds q[i], g_v[j] = sum w g[i], ds and w from the edge's record.
// No atomics; every output row is written by one thread in a fixed order (deterministic).
//
// Memory: every pass prefetches a.prefetch edges ahead (the prefetch-distance knob) across the
// end of its row (at a median in-degree of a few, stopping at the row's end left most edges
// unprefetched), the gathered rows of k and v with locality 3 (other rows read them again), and
// the per-edge lines in edge order (ea, g_ea, the record: random, as the edge ids are) too, which
// are 64-byte lines a miss each. The logits and g_a use dot_tree (edge_dot_core.h), whose tree sum
// replaced a chain of 16 dependent additions per dot product. Measured on one AMD EPYC core,
// 100k nodes / 1M edges, H = 4, C = 32, De = 16, huge pages: forward 2.3x, CSR pass 2.2x, CSC pass
// 1.25x the previous kernels.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "../common/counter_rng.h"
#include "../common/dtype.h"
#include "attention_core.h"
#include "edge_dot_core.h"
#include "edge_softmax_core.h"
#include "reduce_core.h"
#include "rows_core.h"

namespace gnncompile {
namespace cpu {

template <typename scalar_t, typename index_t>
struct AttentionDotArgs {
  using acc_t = typename acc_type<scalar_t>::type;
  const index_t* rowptr = nullptr;    // CSR by destination [M + 1]
  const index_t* col = nullptr;       // [E] source of CSR slot j
  const index_t* perm = nullptr;      // [E] original edge id of CSR slot j
  const index_t* rowptr_t = nullptr;  // CSC by source [N + 1] (backward)
  const index_t* col_t = nullptr;     // [E] destination of CSC slot k
  const index_t* perm_t = nullptr;    // [E] original edge id of CSC slot k
  const scalar_t* q = nullptr;        // [M, H, C]
  const scalar_t* k = nullptr;        // [N, H, C]
  const scalar_t* v = nullptr;        // [N, H, C]
  const scalar_t* qe = nullptr;       // [M, H, De], or nullptr (De == 0)
  const scalar_t* ea = nullptr;       // [E, De] in original edge order, or nullptr (De == 0)
  int64_t N = 0, M = 0, E = 0, H = 1, C = 1, De = 0;
  acc_t logit_scale = acc_t(1);  // multiplies the dot products (1 / sqrt(C) for TransformerConv)
  bool dropout = false;
  uint64_t key = 0;
  uint32_t threshold = 0;
  acc_t scale = acc_t(1);  // 1 / (1 - p)
  int64_t prefetch = kPrefetchDistance;  // edges ahead whose gathered rows are prefetched (knobs[1])
};


// The dropout factor of coefficient (e, h), as keep_scale (attention_core.h): the dropout op's mask
// of the [E, H] coefficients.
template <typename scalar_t, typename index_t>
inline typename acc_type<scalar_t>::type dot_keep(const AttentionDotArgs<scalar_t, index_t>& a, int64_t e,
                                                  int64_t h) {
  using acc_t = typename acc_type<scalar_t>::type;
  if (!a.dropout) return acc_t(1);
  return draw(a.key, e * a.H + h) >= a.threshold ? a.scale : acc_t(0);
}

// One edge's record from the CSR pass for the CSC pass: ds (H) then w (H), in the accumulator
// type. Its size in bytes: a power of two up to 64, else a multiple of 64 (no line shared needlessly).
template <typename acc_t>
inline int64_t dot_record_bytes(int64_t H) {
  const int64_t b = 2 * H * static_cast<int64_t>(sizeof(acc_t));
  if (b > 64) return (b + 63) / 64 * 64;
  int64_t p = 8;
  while (p < b) p *= 2;
  return p;
}

// Whether a float call takes the 8-wide paths below: C and De multiples of 8 (De = 0 included).
template <typename scalar_t, typename index_t>
inline bool dot_wide(const AttentionDotArgs<scalar_t, index_t>& a) {
#if defined(__AVX2__) && defined(__FMA__)
  return std::is_same<scalar_t, float>::value && ((a.C | a.De) & 7) == 0;
#else
  (void)a;
  return false;
#endif
}

// Per head h < H: s[h * stride] = scale * (<x[h], y[h]> + <xe[h], ye>), x and y [H, C], xe [H, De]
// (or nullptr), ye [De] shared by the heads. The generic form: dot_tree per term.
template <typename scalar_t, typename acc_t>
inline void head_dots(const scalar_t* __restrict__ x, const scalar_t* __restrict__ y, const scalar_t* __restrict__ xe,
                      const scalar_t* __restrict__ ye, int64_t H, int64_t C, int64_t De, acc_t scale, acc_t* s,
                      int64_t stride) {
  for (int64_t h = 0; h < H; ++h) {
    acc_t d = dot_tree<scalar_t, acc_t>(x + h * C, y + h * C, C);
    if (xe != nullptr) d += dot_tree<scalar_t, acc_t>(xe + h * De, ye, De);
    s[h * stride] = d * scale;
  }
}
#if defined(__AVX2__) && defined(__FMA__)
// The 8-wide form (C and De multiples of 8): one accumulator per head for both terms, and the
// horizontal sums of four heads at once (two rounds of hadd and one 128-bit add instead of four
// hsum8); with axpy's 8-wide row updates. Measured with benchmarks/native/attention_cores.cpp (one
// core of an AMD EPYC, Zen 2, best of 5, forward / CSR pass / CSC pass): the zoo's shape (2,000
// nodes, 16,000 edges, H 4, C 8, De 8) 1.3 / 2.2 / 0.6 -> 1.0 / 1.6 / 0.4 ms (CSR pass 1.3 without
// the edge features' gradient); issue 25's (100k / 1M, H 4, C 32, De 16) 172 / 276 / 124 -> 163 /
// 239 / 117 ms (CSR pass 198 without it).
inline __m256 head_acc8(const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ xe,
                        const float* __restrict__ ye, int64_t C, int64_t De) {
  __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(y));
  for (int64_t c = 8; c < C; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + c), _mm256_loadu_ps(y + c), acc);
  if (xe != nullptr)
    for (int64_t d = 0; d < De; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(xe + d), _mm256_loadu_ps(ye + d), acc);
  return acc;
}
inline void head_dots8(const float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ xe,
                       const float* __restrict__ ye, int64_t H, int64_t C, int64_t De, float scale, float* s,
                       int64_t stride) {
  int64_t h = 0;
  const __m128 sc = _mm_set1_ps(scale);
  for (; h + 4 <= H; h += 4) {
    const __m256 a0 = head_acc8(x + h * C, y + h * C, xe ? xe + h * De : nullptr, ye, C, De);
    const __m256 a1 = head_acc8(x + (h + 1) * C, y + (h + 1) * C, xe ? xe + (h + 1) * De : nullptr, ye, C, De);
    const __m256 a2 = head_acc8(x + (h + 2) * C, y + (h + 2) * C, xe ? xe + (h + 2) * De : nullptr, ye, C, De);
    const __m256 a3 = head_acc8(x + (h + 3) * C, y + (h + 3) * C, xe ? xe + (h + 3) * De : nullptr, ye, C, De);
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m128 r = _mm_mul_ps(_mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)), sc);
    if (stride == 1) {
      _mm_storeu_ps(s + h, r);
    } else {
      alignas(16) float b[4];
      _mm_store_ps(b, r);
      for (int i = 0; i < 4; ++i) s[(h + i) * stride] = b[i];
    }
  }
  for (; h < H; ++h) s[h * stride] = hsum8(head_acc8(x + h * C, y + h * C, xe ? xe + h * De : nullptr, ye, C, De)) * scale;
}
#endif

// y[0, n) += a x[0, n), as a fused multiply-add per element where the compiler contracts (the
// 8-wide form below is that, bit for bit).
template <typename scalar_t, typename acc_t>
inline void axpy_row(acc_t a, const scalar_t* __restrict__ x, acc_t* __restrict__ y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * to_float(x[i]);
}
#if defined(__AVX2__) && defined(__FMA__)
inline void axpy_row8(float a, const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  for (int64_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
}
#endif

// head_dots, 8 wide where wide (dot_wide) and the types are float.
template <typename scalar_t, typename acc_t>
inline void pair_dots(const scalar_t* __restrict__ x, const scalar_t* __restrict__ y, const scalar_t* __restrict__ xe,
                      const scalar_t* __restrict__ ye, int64_t H, int64_t C, int64_t De, acc_t scale, acc_t* s,
                      int64_t stride, bool wide) {
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same<scalar_t, float>::value && std::is_same<acc_t, float>::value) {
    if (wide) {
      head_dots8(x, y, xe, ye, H, C, De, scale, s, stride);
      return;
    }
  }
#endif
  (void)wide;
  head_dots<scalar_t, acc_t>(x, y, xe, ye, H, C, De, scale, s, stride);
}

// axpy_row, 8 wide where wide (n a multiple of 8) and the types are float.
template <typename scalar_t, typename acc_t>
inline void axpy(acc_t a, const scalar_t* __restrict__ x, acc_t* __restrict__ y, int64_t n, bool wide) {
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same<scalar_t, float>::value && std::is_same<acc_t, float>::value) {
    if (wide) {
      axpy_row8(a, x, y, n);
      return;
    }
  }
#endif
  (void)wide;
  axpy_row<scalar_t, acc_t>(a, x, y, n);
}

// The H logits of one edge into s[h * stride]: the one formula every pass uses (the forward's and
// the backward's agree bit for bit). qi: q's row [H * C]; qei: qe's row [H * De] or nullptr.
// wide: dot_wide(a).
template <typename scalar_t, typename index_t>
inline void dot_logits(const AttentionDotArgs<scalar_t, index_t>& a, const scalar_t* __restrict__ qi,
                       const scalar_t* __restrict__ kj, const scalar_t* __restrict__ qei,
                       const scalar_t* __restrict__ ee, typename acc_type<scalar_t>::type* s, int64_t stride,
                       bool wide) {
  pair_dots(qi, kj, qei, ee, a.H, a.C, a.De, a.logit_scale, s, stride, wide);
}

// Forward, rows [row_begin, row_end): out [M, H * C], out_e [M, H * De] (or nullptr), stats
// [M, 2 * H] (max, then 1 / (sum + eps)).
template <typename scalar_t, typename index_t>
Status attention_dot_rows(const AttentionDotArgs<scalar_t, index_t>& a, scalar_t* out, scalar_t* out_e,
                          typename acc_type<scalar_t>::type* stats, int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t H = a.H, C = a.C, F = H * C, De = a.De, FE = H * De;
  const int64_t FB = F * static_cast<int64_t>(sizeof(scalar_t)), EB = De * static_cast<int64_t>(sizeof(scalar_t));
  const bool edge = a.ea != nullptr, wide = dot_wide(a);
  thread_local std::vector<acc_t> wbuf, accbuf;
  acc_t* acc = row_buffer(accbuf, F + FE);  // output row, then out_e's row
  acc_t* acce = acc + F;
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.E)) return Status::BadRowptr;
    const int64_t begin = a.rowptr[row], end = a.rowptr[row + 1], deg = end - begin;
    acc_t* st = stats + row * 2 * H;
    scalar_t* o = out + row * F;
    scalar_t* oe = edge ? out_e + row * FE : nullptr;
    if (deg == 0) {
      for (int64_t f = 0; f < F; ++f) o[f] = from_acc<scalar_t>(acc_t(0));
      for (int64_t f = 0; f < FE; ++f) oe[f] = from_acc<scalar_t>(acc_t(0));
      for (int64_t h = 0; h < 2 * H; ++h) st[h] = acc_t(0);
      continue;
    }
    const scalar_t* qi = a.q + row * F;
    const scalar_t* qei = edge ? a.qe + row * FE : nullptr;
    acc_t* w = row_buffer(wbuf, deg * H);
    for (int64_t kk = 0; kk < deg; ++kk) {
      const int64_t j = begin + kk;
      if (j + a.prefetch < a.E) {  // across the row's end: short rows are prefetched too
        prefetch_bytes<0, 3>(a.k + static_cast<int64_t>(a.col[j + a.prefetch]) * F, FB);
        if (edge) prefetch_bytes<0, 3>(a.ea + static_cast<int64_t>(a.perm[j + a.prefetch]) * De, EB);
      }
      // the rows the second sweep starts with (v, and ea where the row is longer than the distance)
      const int64_t t = kk - std::max<int64_t>(0, deg - a.prefetch);
      if (t >= 0) {
        prefetch_bytes<0, 0>(a.v + static_cast<int64_t>(a.col[begin + t]) * F, FB);
        if (edge && deg > a.prefetch) prefetch_bytes<0, 3>(a.ea + static_cast<int64_t>(a.perm[begin + t]) * De, EB);
      }
      const int64_t src = static_cast<int64_t>(a.col[j]);
      if (!in_range(src, a.N)) return Status::BadCol;
      const int64_t e = static_cast<int64_t>(a.perm[j]);
      if (!in_range(e, a.E)) return Status::BadPerm;
      dot_logits(a, qi, a.k + src * F, qei, edge ? a.ea + e * De : nullptr, w + kk, deg, wide);
    }
    acc_t* m = st;
    acc_t* inv = st + H;
    for (int64_t h = 0; h < H; ++h) {  // as attention_rows
      acc_t* wh = w + h * deg;
      acc_t mh = -std::numeric_limits<acc_t>::infinity();
      for (int64_t kk = 0; kk < deg; ++kk) mh = std::max<acc_t>(mh, wh[kk]);
      if (std::isinf(mh) && mh < 0) mh = 0;
      m[h] = mh;
      acc_t sum = 0;
      for (int64_t kk = 0; kk < deg; ++kk) {
        const acc_t ex = exp_approx(wh[kk] - mh);
        wh[kk] = ex;
        sum += ex;
      }
      inv[h] = acc_t(1) / (sum + acc_t(1e-16));
      for (int64_t kk = 0; kk < deg; ++kk) wh[kk] = stored<scalar_t>(wh[kk] * inv[h]);
    }
    if (a.dropout)
      for (int64_t kk = 0; kk < deg; ++kk) {
        const int64_t e = static_cast<int64_t>(a.perm[begin + kk]);
        for (int64_t h = 0; h < H; ++h) w[h * deg + kk] = stored<scalar_t>(w[h * deg + kk] * dot_keep(a, e, h));
      }
    for (int64_t f = 0; f < F + FE; ++f) acc[f] = acc_t(0);
    for (int64_t kk = 0; kk < deg; ++kk) {
      const int64_t j = begin + kk;
      if (kk + a.prefetch < deg) {
        prefetch_bytes<0, 3>(a.v + static_cast<int64_t>(a.col[j + a.prefetch]) * F, FB);
        if (edge) prefetch_bytes<0, 3>(a.ea + static_cast<int64_t>(a.perm[j + a.prefetch]) * De, EB);
      }
      const scalar_t* vrow = a.v + static_cast<int64_t>(a.col[j]) * F;
      const scalar_t* ee = edge ? a.ea + static_cast<int64_t>(a.perm[j]) * De : nullptr;
      for (int64_t h = 0; h < H; ++h) {
        const acc_t wh = w[h * deg + kk];
        axpy<scalar_t, acc_t>(wh, vrow + h * C, acc + h * C, C, wide);
        if (edge) axpy<scalar_t, acc_t>(wh, ee, acce + h * De, De, wide);
      }
    }
    for (int64_t f = 0; f < F; ++f) o[f] = from_acc<scalar_t>(acc[f]);
    for (int64_t f = 0; f < FE; ++f) oe[f] = from_acc<scalar_t>(acce[f]);
  }
  return Status::Ok;
}

// Backward over the CSR, rows [row_begin, row_end): g_q [M, F], g_qe [M, FE] (whole rows), g_ea
// [E, De] at each edge's id (with edge features), and each edge's record (ds, w per head) at its id.
template <typename scalar_t, typename index_t>
Status attention_dot_dst_rows(const AttentionDotArgs<scalar_t, index_t>& a, const scalar_t* out,
                              const scalar_t* out_e, const scalar_t* g, const scalar_t* ge,
                              const typename acc_type<scalar_t>::type* stats, scalar_t* g_q, scalar_t* g_qe,
                              scalar_t* g_ea, char* rec, int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t H = a.H, C = a.C, F = H * C, De = a.De, FE = H * De, RB = dot_record_bytes<acc_t>(H);
  const int64_t FB = F * static_cast<int64_t>(sizeof(scalar_t)), EB = De * static_cast<int64_t>(sizeof(scalar_t));
  const bool edge = a.ea != nullptr, wide = dot_wide(a);
  thread_local std::vector<acc_t> rowbuf, sbuf;
  acc_t* gq = row_buffer(rowbuf, F + FE + H + De);  // g_q's row, g_qe's row, D, the edge's g_ea
  acc_t* gqe = gq + F;
  acc_t* D = gq + F + FE;
  acc_t* __restrict__ gee = D + H;
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.E)) return Status::BadRowptr;
    const int64_t begin = a.rowptr[row], end = a.rowptr[row + 1], deg = end - begin;
    for (int64_t f = 0; f < F + FE; ++f) gq[f] = acc_t(0);
    if (deg > 0) {
      const scalar_t* qi = a.q + row * F;
      const scalar_t* qei = edge ? a.qe + row * FE : nullptr;
      const scalar_t* gr = g + row * F;
      const scalar_t* ger = edge ? ge + row * FE : nullptr;
      for (int64_t h = 0; h < H; ++h) {
        D[h] = dot<scalar_t, acc_t>(out + row * F + h * C, gr + h * C, C);
        if (edge) D[h] += dot<scalar_t, acc_t>(out_e + row * FE + h * De, ger + h * De, De);
      }
      // one sweep: alpha comes from the forward's statistics, so each edge is finished as it is
      // read (its rows of k and v read once, still in L1 for g_q's update)
      const acc_t* st = stats + row * 2 * H;
      acc_t* al = row_buffer(sbuf, 2 * H);  // the edge's logits -> alpha, then g_a
      acc_t* ga = al + H;
      for (int64_t kk = 0; kk < deg; ++kk) {
        const int64_t j = begin + kk;
        if (j + a.prefetch < a.E) {  // across the row's end
          const int64_t s2 = static_cast<int64_t>(a.col[j + a.prefetch]);
          prefetch_bytes<0, 3>(a.k + s2 * F, FB);
          prefetch_bytes<0, 3>(a.v + s2 * F, FB);
        }
        if (j + kSoftmaxPrefetch < a.E) {  // the edge's lines in edge order: its record, ea, g_ea
          const int64_t e2 = static_cast<int64_t>(a.perm[j + kSoftmaxPrefetch]);
          if (in_range(e2, a.E)) {
            __builtin_prefetch(rec + e2 * RB, 1, 0);
            if (edge) {
              prefetch_bytes<0, 3>(a.ea + e2 * De, EB);
              if (g_ea != nullptr) prefetch_bytes<1, 3>(g_ea + e2 * De, EB);
            }
          }
        }
        const int64_t src = static_cast<int64_t>(a.col[j]);
        if (!in_range(src, a.N)) return Status::BadCol;
        const int64_t e = static_cast<int64_t>(a.perm[j]);
        if (!in_range(e, a.E)) return Status::BadPerm;
        const scalar_t* ee = edge ? a.ea + e * De : nullptr;
        const scalar_t* krow = a.k + src * F;
        const scalar_t* vrow = a.v + src * F;
        dot_logits(a, qi, krow, qei, ee, al, 1, wide);
        pair_dots<scalar_t, acc_t>(gr, vrow, ger, ee, H, C, De, acc_t(1), ga, 1, wide);  // g_a
        for (int64_t h = 0; h < H; ++h)
          al[h] = stored<scalar_t>(exp_approx(al[h] - st[h]) * st[H + h]);  // as the forward's alpha
        acc_t* rece = reinterpret_cast<acc_t*>(rec + e * RB);
        if (edge && g_ea != nullptr)
          for (int64_t d = 0; d < De; ++d) gee[d] = acc_t(0);
        for (int64_t h = 0; h < H; ++h) {
          const acc_t alpha = al[h], kh = dot_keep(a, e, h);
          const acc_t w = a.dropout ? stored<scalar_t>(alpha * kh) : alpha;
          const acc_t ds = a.logit_scale * alpha * (ga[h] * kh - D[h]);
          rece[h] = ds;
          rece[H + h] = w;
          axpy<scalar_t, acc_t>(ds, krow + h * C, gq + h * C, C, wide);
          if (edge) {
            axpy<scalar_t, acc_t>(ds, ee, gqe + h * De, De, wide);
            if (g_ea != nullptr) {  // g_ea += w ge[i, h] + ds qe[i, h]
              axpy<scalar_t, acc_t>(w, ger + h * De, gee, De, wide);
              axpy<scalar_t, acc_t>(ds, qei + h * De, gee, De, wide);
            }
          }
        }
        if (edge && g_ea != nullptr)
          for (int64_t d = 0; d < De; ++d) g_ea[e * De + d] = from_acc<scalar_t>(gee[d]);
      }
    }
    for (int64_t f = 0; f < F; ++f) g_q[row * F + f] = from_acc<scalar_t>(gq[f]);
    for (int64_t f = 0; f < FE; ++f) g_qe[row * FE + f] = from_acc<scalar_t>(gqe[f]);
  }
  return Status::Ok;
}

// Backward over the CSC, source rows [row_begin, row_end): g_k and g_v [N, F], whole rows. Per
// out-edge it reads the destination's rows of q and of the gradient, and the edge's record.
template <typename scalar_t, typename index_t>
Status attention_dot_source_rows(const AttentionDotArgs<scalar_t, index_t>& a, const scalar_t* g,
                                 const char* rec, scalar_t* g_k, scalar_t* g_v, int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t H = a.H, C = a.C, F = H * C, RB = dot_record_bytes<acc_t>(H);
  const int64_t FB = F * static_cast<int64_t>(sizeof(scalar_t));
  const bool wide = dot_wide(a);
  thread_local std::vector<acc_t> rowbuf;
  acc_t* acck = row_buffer(rowbuf, 2 * F);  // g_k's row, g_v's row
  acc_t* accv = acck + F;
  for (int64_t j = row_begin; j < row_end; ++j) {
    if (!row_ok(a.rowptr_t, j, a.E)) return Status::BadRowptr;
    const int64_t begin = a.rowptr_t[j], end = a.rowptr_t[j + 1], deg = end - begin;
    for (int64_t f = 0; f < 2 * F; ++f) acck[f] = acc_t(0);
    for (int64_t kk = 0; kk < deg; ++kk) {
      if (begin + kk + a.prefetch < a.E) {  // the destination's rows, ahead, past the row's end
        const int64_t i2 = static_cast<int64_t>(a.col_t[begin + kk + a.prefetch]);
        if (in_range(i2, a.M)) {
          prefetch_bytes<0, 3>(g + i2 * F, FB);
          prefetch_bytes<0, 3>(a.q + i2 * F, FB);
        }
      }
      if (begin + kk + kSoftmaxPrefetch < a.E) {  // the edge's record, further ahead
        const int64_t e2 = static_cast<int64_t>(a.perm_t[begin + kk + kSoftmaxPrefetch]);
        if (in_range(e2, a.E))
          for (int64_t b = 0; b < RB; b += 64) __builtin_prefetch(rec + e2 * RB + b, 0, 0);
      }
      const int64_t i = static_cast<int64_t>(a.col_t[begin + kk]);
      if (!in_range(i, a.M)) return Status::BadCol;
      const int64_t e = static_cast<int64_t>(a.perm_t[begin + kk]);
      if (!in_range(e, a.E)) return Status::BadPerm;
      const scalar_t* __restrict__ gr = g + i * F;
      const scalar_t* __restrict__ qr = a.q + i * F;
      const acc_t* rece = reinterpret_cast<const acc_t*>(rec + e * RB);
      for (int64_t h = 0; h < H; ++h) {
        const acc_t ds = rece[h], w = rece[H + h];
        const int64_t o = h * C;
        axpy<scalar_t, acc_t>(ds, qr + o, acck + o, C, wide);
        axpy<scalar_t, acc_t>(w, gr + o, accv + o, C, wide);
      }
    }
    for (int64_t f = 0; f < F; ++f) {
      g_k[j * F + f] = from_acc<scalar_t>(acck[f]);
      g_v[j * F + f] = from_acc<scalar_t>(accv[f]);
    }
  }
  return Status::Ok;
}

}  // namespace cpu
}  // namespace gnncompile
