// Graph attention in one pass over a CSR-by-destination structure, on the host. Torch-free.
//
//   raw[e, h]   = a_src[src_e, h] + a_dst[dst_e, h] (+ a_edge[e, h])    (GATConv's logits)
//   s[e, h]     = leaky_relu(raw[e, h], slope)
//   alpha[e, h] = exp(s - max_row) / (sum_row exp(s - max_row) + 1e-16)  (PyG's softmax)
//   w[e, h]     = alpha[e, h] * keep(e, h) / (1 - p)                      (attention dropout)
//   out[i, h]   = sum over the edges e into i of w[e, h] * x[src_e, h, :]
//
// Forward (attention_rows): one destination row at a time, its scores computed once into a
// per-thread buffer (H values per edge, L1-resident), max and sum per head, then one sweep over
// the gathered rows x[src] that accumulates the whole output row; the row's max and 1 / (sum +
// 1e-16) per head are kept (stats, [M, 2, H]) for the backward. No E x H tensor is written, and
// the scores never leave the row: nothing is read through perm but a_edge and the dropout key.
//
// Backward, with g = dL/dout and D[i, h] = <out[i, h, :], g[i, h, :]> (= sum_e alpha w' <x, g>,
// the softmax backward's row sum; attention_row_records packs it with the row's statistics):
//   attention_source_rows, one pass over the CSC (one source row at a time, its out-edges):
//     alpha, w recomputed from the stats; dot = <x[j, h, :], g[i, h, :]>;
//     gx[j, h, :] += w * g[i, h, :];  ds = alpha * (dot * keep / (1 - p) - D[i, h]);
//     draw = ds * leaky_relu'(raw);   g_src[j, h] += draw;  d[e, h] = draw at the edge's id
//     (e = perm_t[k]: d in the original edge order, which is also a_edge's gradient);
//   attention_dst_rows: g_dst[i, h] = sum of d[perm[j], h] over the CSR row i.
// (Summing d in CSC order instead, one in-order read of the CSC, measured 1.19x on the
// backward, but equals the CSR's sums only when the CSC is the CSR's transpose, which the op
// cannot verify without a pass as costly as the saving, and its sums come in another order:
// other bits. Benchmarks HISTORY section 21.) The gradients of x, a_src, a_dst and a_edge come
// from three passes, no atomics, and in a fixed order whatever the number of threads
// (deterministic). The dropout mask is the dropout op's (../common/counter_rng.h) for
// the [E, H] tensor of coefficients, regenerated in the backward, never stored.
//
// Every index read is range-checked as it is read (rows_core.h), as in the other cores.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../common/counter_rng.h"
#include "../common/dtype.h"
#include "../common/macros.h"
#include "edge_dot_core.h"
#include "edge_softmax_core.h"
#include "reduce_core.h"
#include "rows_core.h"

namespace gnncompile {
namespace cpu {

template <typename scalar_t, typename index_t>
struct AttentionArgs {
  using acc_t = typename acc_type<scalar_t>::type;
  const index_t* rowptr = nullptr;  // CSR by destination [M + 1]
  const index_t* col = nullptr;     // [E] source of CSR slot j
  const index_t* perm = nullptr;    // [E] original edge id of CSR slot j
  const index_t* rowptr_t = nullptr;  // CSC by source [N + 1] (backward)
  const index_t* col_t = nullptr;     // [E] destination of CSC slot k
  const index_t* perm_t = nullptr;    // [E] original edge id of CSC slot k
  const scalar_t* x = nullptr;       // [N, H, C]
  const scalar_t* a_src = nullptr;   // [N, H]
  const scalar_t* a_dst = nullptr;   // [M, H]
  const scalar_t* a_edge = nullptr;  // [E, H] in original edge order, or nullptr
  int64_t N = 0, M = 0, E = 0, H = 1, C = 1;
  acc_t slope = acc_t(0.2);
  bool dropout = false;
  uint64_t key = 0;        // splitmix64(seed)
  uint32_t threshold = 0;  // keep when the draw is >= threshold
  acc_t scale = acc_t(1);  // 1 / (1 - p)
  int64_t prefetch = kPrefetchDistance;  // edges ahead whose gathered rows are prefetched (knobs[1])
};

template <typename acc_t>
inline acc_t leaky(acc_t raw, acc_t slope) { return raw > acc_t(0) ? raw : raw * slope; }

// The dropout factor of coefficient (e, h): 1 / (1 - p) kept, 0 dropped, 1 without dropout.
template <typename scalar_t, typename index_t>
inline typename acc_type<scalar_t>::type keep_scale(const AttentionArgs<scalar_t, index_t>& a, int64_t e,
                                                     int64_t h) {
  using acc_t = typename acc_type<scalar_t>::type;
  if (!a.dropout) return acc_t(1);
  return draw(a.key, e * a.H + h) >= a.threshold ? a.scale : acc_t(0);
}

// alpha and w as the unfused chain rounds them (softmax output, then dropout output, each stored
// in the features' dtype): the fused kernels compute the same coefficients bit for bit.
template <typename scalar_t, typename acc_t>
inline acc_t stored(acc_t v) { return acc_t(to_float(from_acc<scalar_t>(v))); }

template <typename scalar_t, typename index_t>
inline typename acc_type<scalar_t>::type raw_score(const AttentionArgs<scalar_t, index_t>& a, int64_t src,
                                                    int64_t dst, int64_t e, int64_t h) {
  using acc_t = typename acc_type<scalar_t>::type;
  // the unfused chain adds in the features' dtype: (a_src + a_dst) rounded, then + a_edge
  acc_t raw = stored<scalar_t>(acc_t(to_float(a.a_src[src * a.H + h])) + acc_t(to_float(a.a_dst[dst * a.H + h])));
  if (a.a_edge != nullptr) raw = stored<scalar_t>(raw + acc_t(to_float(a.a_edge[e * a.H + h])));
  return raw;
}

// exp on the host, in a form the compiler vectorises: 2^n exp(r) with n = round(x / ln 2), |r| <=
// ln 2 / 2, a degree-7 Taylor polynomial (truncation error below 1e-8 relative) and 2^n built in
// the exponent bits; within 2 ulp of std::exp (tests/ops/test_attention.py), 0 below the smallest
// normal float's logarithm (where std::exp returns a subnormal: nothing a softmax row can tell
// from 0 next to its maximum's exp(0) = 1), NaN for NaN. Its loops vectorise only without
// trapping math (CMakeLists.txt compiles attention.cpp with -fno-trapping-math). float64 keeps
// std::exp.
inline float exp_approx(float x) {
  constexpr float lo = -87.33654f, hi = 88.72283f;  // exp(lo) = the smallest normal float
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = std::fma(n, -0.693359375f, xc);  // ln 2 in two parts: the first exact in float
  r = std::fma(n, 2.12194440e-4f, r);
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  float y = p * scale;
  y = x != x ? x : y;
  return x < lo ? 0.0f : y;
}
inline double exp_approx(double x) { return std::exp(x); }

// Forward, rows [row_begin, row_end): out [M, H * C], stats [M, 2 * H] (max, then 1 / (sum + eps)).
// The row's scores are kept head-major (w[h * deg + k]) so that the exp loop runs over contiguous
// values.
template <typename scalar_t, typename index_t>
Status attention_rows(const AttentionArgs<scalar_t, index_t>& a, scalar_t* out,
                      typename acc_type<scalar_t>::type* stats, int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t H = a.H, C = a.C, F = H * C;
  thread_local std::vector<acc_t> wbuf, accbuf;
  acc_t* acc = row_buffer(accbuf, F);
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
    acc_t* w = row_buffer(wbuf, deg * H);
    for (int64_t k = 0; k < deg; ++k) {  // scores, checking every index as it is read
      const int64_t j = begin + k;
      if (j + kSoftmaxPrefetch < a.E)  // across the row's end: short rows are prefetched too
        __builtin_prefetch(a.a_src + static_cast<int64_t>(a.col[j + kSoftmaxPrefetch]) * H, 0, 0);
      const int64_t src = static_cast<int64_t>(a.col[j]);
      if (!in_range(src, a.N)) return Status::BadCol;
      const int64_t e = static_cast<int64_t>(a.perm[j]);
      if (!in_range(e, a.E)) return Status::BadPerm;
      for (int64_t h = 0; h < H; ++h) w[h * deg + k] = leaky(raw_score(a, src, row, e, h), a.slope);
    }
    acc_t* m = st;
    acc_t* inv = st + H;
    for (int64_t h = 0; h < H; ++h) {  // as edge_softmax_rows: max, exp, sum, 1 / (sum + 1e-16)
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
        for (int64_t h = 0; h < H; ++h) w[h * deg + k] = stored<scalar_t>(w[h * deg + k] * keep_scale(a, e, h));
      }
    for (int64_t f = 0; f < F; ++f) acc[f] = acc_t(0);
    for (int64_t k = 0; k < deg; ++k) {  // the one sweep over the gathered rows
      const int64_t j = begin + k;
      if (j + a.prefetch < a.E) {  // across the row's end
        const char* p = reinterpret_cast<const char*>(a.x + static_cast<int64_t>(a.col[j + a.prefetch]) * F);
        for (int64_t b = 0; b < F * static_cast<int64_t>(sizeof(scalar_t)); b += 64) __builtin_prefetch(p + b, 0, 0);
      }
      const scalar_t* xr = a.x + static_cast<int64_t>(a.col[j]) * F;
      for (int64_t h = 0; h < H; ++h) {
        const acc_t wh = w[h * deg + k];
        acc_t* ah = acc + h * C;
        const scalar_t* xh = xr + h * C;
        for (int64_t c = 0; c < C; ++c) ah[c] += wh * to_float(xh[c]);
      }
    }
    for (int64_t f = 0; f < F; ++f) o[f] = from_acc<scalar_t>(acc[f]);
  }
  return Status::Ok;
}

// What the backward reads per destination row, packed (one 64-byte line for 4 heads in float):
// rec[i] = [max (H), 1 / (sum + eps) (H), D (H), a_dst (H)], D[i, h] = <out[i, h, :], g[i, h, :]>.
// Rows [row_begin, row_end).
template <typename scalar_t>
void attention_row_records(const scalar_t* out, const scalar_t* g, const typename acc_type<scalar_t>::type* stats,
                           const scalar_t* a_dst, typename acc_type<scalar_t>::type* rec, int64_t H, int64_t C,
                           int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  for (int64_t row = row_begin; row < row_end; ++row) {
    acc_t* r = rec + row * 4 * H;
    for (int64_t h = 0; h < 2 * H; ++h) r[h] = stats[row * 2 * H + h];
    for (int64_t h = 0; h < H; ++h) {
      r[2 * H + h] = dot<scalar_t, acc_t>(out + (row * H + h) * C, g + (row * H + h) * C, C);
      r[3 * H + h] = acc_t(to_float(a_dst[row * H + h]));
    }
  }
}

// Backward over the CSC, source rows [row_begin, row_end): gx [N, H * C], g_src [N, H] (each
// written whole for its rows), d_edge [E, H]: at every out-edge's CSC slot, or with an edge term
// at its id (the edge term's gradient, in edge order). Per source row, a
// first sweep over its out-edges recomputes their coefficients (head-major buffers, the exps in
// one contiguous loop), a second reads the destinations' gradient rows once for both the dot
// product and the accumulation of gx.
template <typename scalar_t, typename index_t>
Status attention_source_rows(const AttentionArgs<scalar_t, index_t>& a, const typename acc_type<scalar_t>::type* rec,
                             const scalar_t* g, scalar_t* gx, scalar_t* g_src, typename acc_type<scalar_t>::type* d_edge,
                             int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t H = a.H, C = a.C, F = H * C;
  thread_local std::vector<acc_t> accbuf, ebuf;
  acc_t* acc = row_buffer(accbuf, F + H);  // gx row, then g_src row
  acc_t* gs = acc + F;
  for (int64_t j = row_begin; j < row_end; ++j) {
    if (!row_ok(a.rowptr_t, j, a.E)) return Status::BadRowptr;
    const int64_t begin = a.rowptr_t[j], end = a.rowptr_t[j + 1], deg = end - begin;
    for (int64_t f = 0; f < F + H; ++f) acc[f] = acc_t(0);
    if (deg > 0) {
      // per out-edge and head (head-major): t = exponent, then alpha; raw; keep factor; D
      acc_t* buf = row_buffer(ebuf, 4 * deg * H);
      acc_t* al = buf;
      acc_t* rw = buf + deg * H;
      acc_t* ks = buf + 2 * deg * H;
      acc_t* dd = buf + 3 * deg * H;
      const scalar_t* asj = a.a_src + j * H;
      for (int64_t k = 0; k < deg; ++k) {
        if (begin + k + kSoftmaxPrefetch < a.E) {  // the record (and d_edge's line) ahead, past the row's end
          __builtin_prefetch(rec + static_cast<int64_t>(a.col_t[begin + k + kSoftmaxPrefetch]) * 4 * H, 0, 0);
          __builtin_prefetch(d_edge + static_cast<int64_t>(a.perm_t[begin + k + kSoftmaxPrefetch]) * H, 1, 0);
        }
        const int64_t i = static_cast<int64_t>(a.col_t[begin + k]);
        if (!in_range(i, a.M)) return Status::BadCol;
        const int64_t e = static_cast<int64_t>(a.perm_t[begin + k]);
        if (!in_range(e, a.E)) return Status::BadPerm;
        const acc_t* r = rec + i * 4 * H;
        for (int64_t h = 0; h < H; ++h) {
          acc_t raw = stored<scalar_t>(acc_t(to_float(asj[h])) + r[3 * H + h]);
          if (a.a_edge != nullptr) raw = stored<scalar_t>(raw + acc_t(to_float(a.a_edge[e * H + h])));
          rw[h * deg + k] = raw;
          al[h * deg + k] = leaky(raw, a.slope) - r[h];
          ks[h * deg + k] = r[H + h];  // (1 / sum, until the exps are taken)
          dd[h * deg + k] = r[2 * H + h];
        }
      }
      for (int64_t t = 0; t < deg * H; ++t) al[t] = stored<scalar_t>(exp_approx(al[t]) * ks[t]);
      for (int64_t k = 0; k < deg; ++k) {
        const int64_t e = static_cast<int64_t>(a.perm_t[begin + k]);
        for (int64_t h = 0; h < H; ++h) ks[h * deg + k] = keep_scale(a, e, h);
      }
      const scalar_t* xr = a.x + j * F;
      for (int64_t k = 0; k < deg; ++k) {
        if (begin + k + a.prefetch < a.E) {  // the destination's gradient row, ahead, past the row's end
          const char* p = reinterpret_cast<const char*>(g + static_cast<int64_t>(a.col_t[begin + k + a.prefetch]) * F);
          for (int64_t b = 0; b < F * static_cast<int64_t>(sizeof(scalar_t)); b += 64) __builtin_prefetch(p + b, 0, 0);
        }
        const int64_t i = static_cast<int64_t>(a.col_t[begin + k]);
        const int64_t e = static_cast<int64_t>(a.perm_t[begin + k]);
        const scalar_t* gr = g + i * F;
        for (int64_t h = 0; h < H; ++h) {
          const int64_t t = h * deg + k;
          const acc_t alpha = al[t], kh = ks[t];
          const acc_t w = a.dropout ? stored<scalar_t>(alpha * kh) : alpha;
          const scalar_t* gh = gr + h * C;
          acc_t* ah = acc + h * C;
          for (int64_t c = 0; c < C; ++c) ah[c] += w * to_float(gh[c]);
          const acc_t ds = alpha * (dot<scalar_t, acc_t>(xr + h * C, gh, C) * kh - dd[t]);
          const acc_t dr = rw[t] > acc_t(0) ? ds : ds * a.slope;
          gs[h] += dr;
          d_edge[e * H + h] = dr;
        }
      }
    }
    for (int64_t f = 0; f < F; ++f) gx[j * F + f] = from_acc<scalar_t>(acc[f]);
    for (int64_t h = 0; h < H; ++h) g_src[j * H + h] = from_acc<scalar_t>(gs[h]);
  }
  return Status::Ok;
}

// g_dst[i, h] = sum over the CSR row i of d_edge[perm[j], h], rows [row_begin, row_end) (with an
// edge term: d_edge in edge order).
template <typename scalar_t, typename index_t>
Status attention_dst_rows(const AttentionArgs<scalar_t, index_t>& a, const typename acc_type<scalar_t>::type* d_edge,
                          scalar_t* g_dst, int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t H = a.H;
  thread_local std::vector<acc_t> sbuf;
  acc_t* s = row_buffer(sbuf, H);
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.E)) return Status::BadRowptr;
    const int64_t end = a.rowptr[row + 1];
    for (int64_t h = 0; h < H; ++h) s[h] = acc_t(0);
    for (int64_t j = a.rowptr[row]; j < end; ++j) {
      if (j + kSoftmaxPrefetch < end)
        __builtin_prefetch(d_edge + static_cast<int64_t>(a.perm[j + kSoftmaxPrefetch]) * H, 0, 0);
      const int64_t e = static_cast<int64_t>(a.perm[j]);
      if (!in_range(e, a.E)) return Status::BadPerm;
      for (int64_t h = 0; h < H; ++h) s[h] += d_edge[e * H + h];
    }
    for (int64_t h = 0; h < H; ++h) g_dst[row * H + h] = from_acc<scalar_t>(s[h]);
  }
  return Status::Ok;
}

}  // namespace cpu
}  // namespace gnncompile
