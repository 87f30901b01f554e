// GATv2 attention in one pass over a CSR-by-destination structure, on the host. Torch-free.
//
//   z[e, h, :]  = x_l[src_e, h, :] + x_r[dst_e, h, :] (+ e_term[e, h, :])   (GATv2Conv, F = H * C wide)
//   s[e, h]     = sum_c att[h, c] * leaky_relu(z[e, h, c], slope)
//   alpha[e, h] = exp(s - max_row) / (sum_row exp(s - max_row) + 1e-16)     (PyG's softmax)
//   w[e, h]     = alpha[e, h] * keep(e, h) / (1 - p)                         (attention dropout)
//   out[i, h]   = sum over the edges e into i of w[e, h] * x_l[src_e, h, :]
//
// Forward (attention_v2_rows): one destination row at a time, x_r's row read once; per in-edge the
// F-wide z is recomputed in registers (never stored) and reduced to H logits; max, exp, sum per head
// as attention_rows (attention_core.h, whose exp_approx, softmax rounding and dropout mask it
// shares); a second sweep over the (cache-hot) rows x_l[src] accumulates the output row. The row's
// max and 1 / (sum + 1e-16) per head are kept (stats, [M, 2, H]).
//
// Backward, g = dL/dout, D[i, h] = <out[i, h, :], g[i, h, :]>:
//   attention_v2_dst_rows, one pass over the CSR (a destination row at a time): z and the logits
//     recomputed (z kept for the row only, deg x F in a per-thread buffer), alpha from the stats,
//     d_alpha = <g[i, h], x_l[src, h]>, dlogit = alpha * (d_alpha * keep / (1 - p) - D[i, h]),
//     dz = dlogit * att[h] * leaky_relu'(z):  g_x_r[i] = sum of dz over the row; g_att's partial
//     sum of dlogit * leaky_relu(z) per fixed block of rows (summed in block order afterwards: the
//     bits do not depend on the thread count); g_e[e] = dz (with an edge term); and per edge (in
//     edge order, one record of a cache line for 4 heads of 32 floats) dlogit and w and the signs
//     of z (a bit per feature) for the next pass.
//   attention_v2_source_rows, one pass over the CSC (a source row at a time, its out-edges):
//     g_x_l[j] = sum of w * g[i] + dz, dz from the edge's records (x_r is not read again).
// No atomics; every output row is written by one thread in a fixed order (deterministic).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

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
struct AttentionV2Args {
  using acc_t = typename acc_type<scalar_t>::type;
  const index_t* rowptr = nullptr;    // CSR by destination [M + 1]
  const index_t* col = nullptr;       // [E] source of CSR slot j
  const index_t* perm = nullptr;      // [E] original edge id of CSR slot j
  const index_t* rowptr_t = nullptr;  // CSC by source [N + 1] (backward)
  const index_t* col_t = nullptr;     // [E] destination of CSC slot k
  const index_t* perm_t = nullptr;    // [E] original edge id of CSC slot k
  const scalar_t* xl = nullptr;       // [N, H, C]
  const scalar_t* xr = nullptr;       // [M, H, C]
  const scalar_t* att = nullptr;      // [H, C]
  const scalar_t* e_term = nullptr;   // [E, H, C] in original edge order, or nullptr
  int64_t N = 0, M = 0, E = 0, H = 1, C = 1;
  acc_t slope = acc_t(0.2);
  bool dropout = false;
  uint64_t key = 0;
  uint32_t threshold = 0;
  acc_t scale = acc_t(1);
  int64_t prefetch = kPrefetchDistance;  // edges ahead whose gathered rows are prefetched (knobs[1])
};

// The dropout factor of coefficient (e, h), as keep_scale (attention_core.h): the dropout op's mask
// of the [E, H] coefficients.
template <typename scalar_t, typename index_t>
inline typename acc_type<scalar_t>::type v2_keep(const AttentionV2Args<scalar_t, index_t>& a, int64_t e, int64_t h) {
  using acc_t = typename acc_type<scalar_t>::type;
  if (!a.dropout) return acc_t(1);
  return draw(a.key, e * a.H + h) >= a.threshold ? a.scale : acc_t(0);
}

// 32-bit words of one edge's signs of z (a bit per feature).
inline int64_t sign_words(int64_t F) { return (F + 31) / 32; }

// One edge's record from the CSR pass for the CSC pass, in one block (one cache line for 4 heads
// of 32 floats): dlogit (H), w (H) in the accumulator type, then the sign words of z. Its size in
// bytes: a power of two up to 64, else a multiple of 64, so that a record shares no line it need not.
template <typename acc_t>
inline int64_t record_bytes(int64_t H, int64_t F) {
  const int64_t b = 2 * H * static_cast<int64_t>(sizeof(acc_t)) + 4 * sign_words(F);
  if (b > 64) return (b + 63) / 64 * 64;
  int64_t p = 8;
  while (p < b) p *= 2;
  return p;
}

// 32 sign bits (z > 0) of n <= 32 values.
inline uint32_t sign_bits(const float* z, int64_t n) {
  uint32_t bits = 0;
#if defined(__AVX2__)
  if (n == 32) {
    const __m256 zero = _mm256_setzero_ps();
    for (int q = 0; q < 4; ++q)
      bits |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(z + 8 * q), zero, _CMP_GT_OQ)))
              << (8 * q);
    return bits;
  }
#endif
  for (int64_t b = 0; b < n; ++b) bits |= static_cast<uint32_t>(z[b] > 0.0f) << b;
  return bits;
}
inline uint32_t sign_bits(const double* z, int64_t n) {
  uint32_t bits = 0;
  for (int64_t b = 0; b < n; ++b) bits |= static_cast<uint32_t>(z[b] > 0.0) << b;
  return bits;
}

// z = x_l[src] + x_r[dst] (+ e_term[e]) over F values, rounded as the chain stores them (x_r's row
// already in the accumulator type): the one formula every pass uses, so the signs agree.
template <typename scalar_t, typename acc_t>
inline acc_t v2_z(const scalar_t* xl, acc_t xr, const scalar_t* ee, int64_t f) {
  acc_t v = stored<scalar_t>(acc_t(to_float(xl[f])) + xr);
  if (ee != nullptr) v = stored<scalar_t>(v + acc_t(to_float(ee[f])));
  return v;
}

// The H logits of one edge into s[h * stride] (and z into zrow when kStoreZ), each a sum over C
// channels in kLanes independent partial sums (edge_dot_core.h's dot: the loop vectorises); every
// pass computes the logits through this one function, so the forward's and the backward's agree
// bit for bit.
template <bool kStoreZ, typename scalar_t, typename index_t>
inline void v2_logits(const AttentionV2Args<scalar_t, index_t>& a, const scalar_t* __restrict__ xl,
                      const typename acc_type<scalar_t>::type* __restrict__ xr, const scalar_t* __restrict__ ee,
                      const typename acc_type<scalar_t>::type* __restrict__ att,
                      typename acc_type<scalar_t>::type* s, int64_t stride,
                      typename acc_type<scalar_t>::type* __restrict__ zrow) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t H = a.H, C = a.C;
  const acc_t slope = a.slope;
  for (int64_t h = 0; h < H; ++h) {
    const int64_t o = h * C;
    acc_t lane[kLanes] = {};
    int64_t c = 0;
    for (; c + kLanes <= C; c += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const acc_t v = v2_z<scalar_t, acc_t>(xl, xr[o + c + l], ee, o + c + l);
        if (kStoreZ) zrow[o + c + l] = v;
        lane[l] += att[o + c + l] * (v > acc_t(0) ? v : v * slope);
      }
    acc_t sum = 0;
    for (; c < C; ++c) {
      const acc_t v = v2_z<scalar_t, acc_t>(xl, xr[o + c], ee, o + c);
      if (kStoreZ) zrow[o + c] = v;
      sum += att[o + c] * (v > acc_t(0) ? v : v * slope);
    }
    s[h * stride] = sum + lanes_total(lane);
  }
}

template <typename scalar_t, typename acc_t>
inline void to_acc_row(const scalar_t* src, acc_t* dst, int64_t n) {
  for (int64_t f = 0; f < n; ++f) dst[f] = acc_t(to_float(src[f]));
}

// Forward, rows [row_begin, row_end): out [M, H * C], stats [M, 2 * H] (max, then 1 / (sum + eps)).
template <typename scalar_t, typename index_t>
Status attention_v2_rows(const AttentionV2Args<scalar_t, index_t>& a, scalar_t* out,
                         typename acc_type<scalar_t>::type* stats, int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t H = a.H, C = a.C, F = H * C, FB = F * static_cast<int64_t>(sizeof(scalar_t));
  thread_local std::vector<acc_t> wbuf, accbuf;
  acc_t* acc = row_buffer(accbuf, 3 * F);  // output row, x_r's row, att
  acc_t* xr = acc + F;
  acc_t* att = acc + 2 * F;
  to_acc_row(a.att, att, F);
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.E)) return Status::BadRowptr;
    const int64_t begin = a.rowptr[row], end = a.rowptr[row + 1], deg = end - begin;
    acc_t* st = stats + row * 2 * H;
    scalar_t* o = out + row * F;
    if (deg == 0) {
      for (int64_t f = 0; f < F; ++f) o[f] = from_acc<scalar_t>(acc_t(0));
      for (int64_t h = 0; h < 2 * H; ++h) st[h] = acc_t(0);
      continue;
    }
    to_acc_row(a.xr + row * F, xr, F);
    acc_t* w = row_buffer(wbuf, deg * H);
    for (int64_t k = 0; k < deg; ++k) {
      const int64_t j = begin + k;
      if (j + a.prefetch < a.E) {  // across the row's end: short rows are prefetched too
        prefetch_bytes<0, 3>(a.xl + static_cast<int64_t>(a.col[j + a.prefetch]) * F, FB);
        if (a.e_term != nullptr) prefetch_bytes<0, 0>(a.e_term + static_cast<int64_t>(a.perm[j + a.prefetch]) * F, FB);
      }
      // the rows the second sweep starts with, where the row is longer than the distance
      const int64_t t = k - (deg - a.prefetch);
      if (t >= 0 && deg > a.prefetch) prefetch_bytes<0, 3>(a.xl + static_cast<int64_t>(a.col[begin + t]) * F, FB);
      const int64_t src = static_cast<int64_t>(a.col[j]);
      if (!in_range(src, a.N)) return Status::BadCol;
      const int64_t e = static_cast<int64_t>(a.perm[j]);
      if (!in_range(e, a.E)) return Status::BadPerm;
      v2_logits<false>(a, a.xl + src * F, xr, a.e_term != nullptr ? a.e_term + e * F : nullptr, att, w + k, deg, nullptr);
    }
    acc_t* m = st;
    acc_t* inv = st + H;
    for (int64_t h = 0; h < H; ++h) {  // as attention_rows
      acc_t* wh = w + h * deg;
      acc_t mh = -std::numeric_limits<acc_t>::infinity();
      for (int64_t k = 0; k < deg; ++k) mh = std::max<acc_t>(mh, wh[k]);
      if (std::isinf(mh) && mh < 0) mh = 0;
      m[h] = mh;
      acc_t sum = 0;
      for (int64_t k = 0; k < deg; ++k) {
        const acc_t ex = exp_approx(wh[k] - mh);
        wh[k] = ex;
        sum += ex;
      }
      inv[h] = acc_t(1) / (sum + acc_t(1e-16));
      for (int64_t k = 0; k < deg; ++k) wh[k] = stored<scalar_t>(wh[k] * inv[h]);
    }
    if (a.dropout)
      for (int64_t k = 0; k < deg; ++k) {
        const int64_t e = static_cast<int64_t>(a.perm[begin + k]);
        for (int64_t h = 0; h < H; ++h) w[h * deg + k] = stored<scalar_t>(w[h * deg + k] * v2_keep(a, e, h));
      }
    for (int64_t f = 0; f < F; ++f) acc[f] = acc_t(0);
    for (int64_t k = 0; k < deg; ++k) {
      if (k + a.prefetch < deg) prefetch_bytes<0, 3>(a.xl + static_cast<int64_t>(a.col[begin + k + a.prefetch]) * F, FB);
      const scalar_t* xrow = a.xl + static_cast<int64_t>(a.col[begin + k]) * F;
      for (int64_t h = 0; h < H; ++h) {
        const acc_t wh = w[h * deg + k];
        acc_t* ah = acc + h * C;
        const scalar_t* xh = xrow + h * C;
        for (int64_t c = 0; c < C; ++c) ah[c] += wh * to_float(xh[c]);
      }
    }
    for (int64_t f = 0; f < F; ++f) o[f] = from_acc<scalar_t>(acc[f]);
  }
  return Status::Ok;
}

// Backward over the CSR, rows [row_begin, row_end): g_xr [M, F] (whole rows), g_att_part [F] (the
// rows' sum of dlogit * leaky_relu(z), accumulated onto), ew [E, 2H] (dlogit then w, at each edge's
// id), g_e [E, F] at each edge's id (with an edge term; else nullptr).
template <typename scalar_t, typename index_t>
Status attention_v2_dst_rows(const AttentionV2Args<scalar_t, index_t>& a, const scalar_t* out, const scalar_t* g,
                             const typename acc_type<scalar_t>::type* stats, scalar_t* g_xr,
                             typename acc_type<scalar_t>::type* g_att_part, char* rec, scalar_t* g_e,
                             int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t H = a.H, C = a.C, F = H * C, W = sign_words(F), RB = record_bytes<acc_t>(H, F);
  const int64_t FB = F * static_cast<int64_t>(sizeof(scalar_t));
  const acc_t slope = a.slope;
  thread_local std::vector<acc_t> rowbuf, zbuf, sbuf;
  acc_t* gxr = row_buffer(rowbuf, 4 * F + H);  // g_x_r row, x_r row, att, att's gradient, D
  acc_t* xr = gxr + F;
  acc_t* att = gxr + 2 * F;
  acc_t* __restrict__ gat = gxr + 3 * F;
  acc_t* D = gxr + 4 * F;
  for (int64_t f = 0; f < F; ++f) gat[f] = acc_t(0);
  to_acc_row(a.att, att, F);
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.E)) return Status::BadRowptr;
    const int64_t begin = a.rowptr[row], end = a.rowptr[row + 1], deg = end - begin;
    for (int64_t f = 0; f < F; ++f) gxr[f] = acc_t(0);
    if (deg > 0) {
      to_acc_row(a.xr + row * F, xr, F);
      const scalar_t* gr = g + row * F;
      for (int64_t h = 0; h < H; ++h) D[h] = dot<scalar_t, acc_t>(out + row * F + h * C, gr + h * C, C);
      acc_t* z = row_buffer(zbuf, deg * F);
      acc_t* al = row_buffer(sbuf, deg * H);
      for (int64_t k = 0; k < deg; ++k) {
        const int64_t j = begin + k;
        if (j + a.prefetch < a.E) {  // across the row's end
          prefetch_bytes<0, 3>(a.xl + static_cast<int64_t>(a.col[j + a.prefetch]) * F, FB);
          if (a.e_term != nullptr) prefetch_bytes<0, 0>(a.e_term + static_cast<int64_t>(a.perm[j + a.prefetch]) * F, FB);
        }
        if (j + kSoftmaxPrefetch < a.E) {  // the edge's lines in edge order: its record, g_e
          const int64_t e2 = static_cast<int64_t>(a.perm[j + kSoftmaxPrefetch]);
          if (in_range(e2, a.E)) {
            prefetch_bytes<1, 0>(rec + e2 * RB, RB);
            if (g_e != nullptr) prefetch_bytes<1, 0>(g_e + e2 * F, FB);
          }
        }
        const int64_t src = static_cast<int64_t>(a.col[j]);
        if (!in_range(src, a.N)) return Status::BadCol;
        const int64_t e = static_cast<int64_t>(a.perm[j]);
        if (!in_range(e, a.E)) return Status::BadPerm;
        v2_logits<true>(a, a.xl + src * F, xr, a.e_term != nullptr ? a.e_term + e * F : nullptr, att, al + k, deg, z + k * F);
      }
      const acc_t* st = stats + row * 2 * H;
      for (int64_t h = 0; h < H; ++h) {
        acc_t* alh = al + h * deg;
        for (int64_t k = 0; k < deg; ++k) alh[k] = exp_approx(alh[k] - st[h]);
        for (int64_t k = 0; k < deg; ++k) alh[k] = stored<scalar_t>(alh[k] * st[H + h]);
      }
      for (int64_t k = 0; k < deg; ++k) {
        const int64_t j = begin + k;
        const int64_t e = static_cast<int64_t>(a.perm[j]);
        const scalar_t* xrow = a.xl + static_cast<int64_t>(a.col[j]) * F;
        const acc_t* __restrict__ zk = z + k * F;
        acc_t* ewe = reinterpret_cast<acc_t*>(rec + e * RB);
        uint32_t* sg = reinterpret_cast<uint32_t*>(ewe + 2 * H);
        for (int64_t wd = 0; wd < W; ++wd)  // z > 0, a bit per feature, for the CSC pass
          sg[wd] = sign_bits(zk + wd * 32, std::min<int64_t>(32, F - wd * 32));
        scalar_t* ge = g_e != nullptr ? g_e + e * F : nullptr;
        for (int64_t h = 0; h < H; ++h) {
          const acc_t alpha = al[h * deg + k], kh = v2_keep(a, e, h);
          const acc_t w = a.dropout ? stored<scalar_t>(alpha * kh) : alpha;
          const int64_t o = h * C;
          const acc_t dl = alpha * (dot_tree<scalar_t, acc_t>(xrow + o, gr + o, C) * kh - D[h]);
          ewe[h] = dl;
          ewe[H + h] = w;
          acc_t* __restrict__ gxh = gxr + o;
          acc_t* __restrict__ gah = gat + o;
          const acc_t* __restrict__ ath = att + o;
          const acc_t* __restrict__ zh = zk + o;
          for (int64_t c = 0; c < C; ++c) {
            const acc_t v = zh[c];
            const bool pos = v > acc_t(0);
            gxh[c] += dl * ath[c] * (pos ? acc_t(1) : slope);
            gah[c] += dl * (pos ? v : v * slope);
          }
          if (ge != nullptr)
            for (int64_t c = 0; c < C; ++c)
              ge[o + c] = from_acc<scalar_t>(dl * att[o + c] * (zk[o + c] > acc_t(0) ? acc_t(1) : slope));
        }
      }
    }
    for (int64_t f = 0; f < F; ++f) g_xr[row * F + f] = from_acc<scalar_t>(gxr[f]);
  }
  for (int64_t f = 0; f < F; ++f) g_att_part[f] += gat[f];
  return Status::Ok;
}

// Backward over the CSC, source rows [row_begin, row_end): g_xl [N, F], whole rows. Per out-edge
// it reads the destination's gradient row, the edge's dlogit and w and its signs of z (the CSR
// pass's records): neither x_r nor the edge term is read again.
template <typename scalar_t, typename index_t>
Status attention_v2_source_rows(const AttentionV2Args<scalar_t, index_t>& a, const scalar_t* g,
                                const char* rec, scalar_t* g_xl, int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t H = a.H, C = a.C, F = H * C, W = sign_words(F), RB = record_bytes<acc_t>(H, F);
  const int64_t FB = F * static_cast<int64_t>(sizeof(scalar_t));
  const acc_t slope = a.slope;
  thread_local std::vector<acc_t> rowbuf;
  acc_t* acc = row_buffer(rowbuf, 4 * F);  // g_x_l row, att, att * slope, the edge's att * leaky_relu'(z)
  acc_t* __restrict__ att = acc + F;
  acc_t* __restrict__ att_neg = acc + 2 * F;
  acc_t* __restrict__ datt = acc + 3 * F;
  to_acc_row(a.att, att, F);
  for (int64_t f = 0; f < F; ++f) att_neg[f] = att[f] * slope;
  for (int64_t j = row_begin; j < row_end; ++j) {
    if (!row_ok(a.rowptr_t, j, a.E)) return Status::BadRowptr;
    const int64_t begin = a.rowptr_t[j], end = a.rowptr_t[j + 1], deg = end - begin;
    acc_t* __restrict__ ac = acc;
    for (int64_t f = 0; f < F; ++f) ac[f] = acc_t(0);
    for (int64_t k = 0; k < deg; ++k) {
      if (begin + k + a.prefetch < a.E)  // the destination's gradient row, ahead, past the row's end
        prefetch_bytes<0, 3>(g + static_cast<int64_t>(a.col_t[begin + k + a.prefetch]) * F, FB);
      if (begin + k + kSoftmaxPrefetch < a.E) {  // the edge's record, further ahead (one line)
        const int64_t e2 = static_cast<int64_t>(a.perm_t[begin + k + kSoftmaxPrefetch]);
        if (in_range(e2, a.E))
          for (int64_t b = 0; b < RB; b += 64) __builtin_prefetch(rec + e2 * RB + b, 0, 0);
      }
      const int64_t i = static_cast<int64_t>(a.col_t[begin + k]);
      if (!in_range(i, a.M)) return Status::BadCol;
      const int64_t e = static_cast<int64_t>(a.perm_t[begin + k]);
      if (!in_range(e, a.E)) return Status::BadPerm;
      const scalar_t* __restrict__ gr = g + i * F;
      const acc_t* ewe = reinterpret_cast<const acc_t*>(rec + e * RB);
      const uint32_t* sg = reinterpret_cast<const uint32_t*>(ewe + 2 * H);
      for (int64_t wd = 0; wd < W; ++wd) {  // leaky_relu'(z) * att, from the sign bits
        const uint32_t bits = sg[wd];
        const int64_t f0 = wd * 32, n = std::min<int64_t>(32, F - f0);
        for (int64_t b = 0; b < n; ++b) datt[f0 + b] = ((bits >> b) & 1u) ? att[f0 + b] : att_neg[f0 + b];
      }
      for (int64_t h = 0; h < H; ++h) {
        const acc_t dl = ewe[h], w = ewe[H + h];
        const int64_t o = h * C;
        for (int64_t c = 0; c < C; ++c) ac[o + c] += w * to_float(gr[o + c]) + dl * datt[o + c];
      }
    }
    for (int64_t f = 0; f < F; ++f) g_xl[j * F + f] = from_acc<scalar_t>(ac[f]);
  }
  return Status::Ok;
}

}  // namespace cpu
}  // namespace gnncompile
