// Scaled dot-product attention over dense [B, H, L, D] tensors with a key padding mask (boolean, or
// an additive float mask: its -inf keys are masked, its other values added to the logits), for the
// small head dims of graph transformers (GPSConv: D = channels / heads = 8), on the host.
// Torch-free.
//
//   s[i, j]  = scale * <q[b, h, i], k[b, h, j]> (+ mask[b, j] for a float mask) over the keys j kept
//   p[i, j]  = exp(s[i, j] - m_i) / l_i                   (m_i the row's max, l_i its sum of exps)
//   out[i]   = sum_j p[i, j] v[b, h, j]                   [B, H, L, D]
//   lse[i]   = m_i + log(l_i)                             [B, H, L], kept for the backward
//
// A row whose keys are all masked gets out = 0 and lse = -inf (torch's scaled_dot_product_attention
// gives 0 there too), and no gradient.
//
// The keys the mask keeps in batch b (ids[key_ptr[b] .. key_ptr[b + 1]), the caller's list) are
// gathered once per work unit into per-thread buffers, transposed ([Dp, np]: the scores vectorise
// over the keys) and as rows ([np, Dp]: the output vectorises over the channels); D is padded with
// zeros to Dp (4, 8, 16, 32 or 64, a template parameter: fixed trip counts the compiler unrolls)
// and the number of kept keys to np, a multiple of the key block, whose padding scores are -inf
// (exp gives 0). The masked keys are never read: a graph of 100 nodes in a batch padded to 260
// costs 100 keys, not 260.
//
// Forward (dense_attention_forward_unit): a unit is (b, h, a block of query rows); per row the
// scores in blocks of kKeyBlock keys (independent accumulators), max and sum in lanes, the exps
// (exp_approx, attention_core.h, as the graph attention's), then the output as four interleaved
// sums over the keys.
// Backward (dense_attention_backward_unit), g = dL/dout, Di = <out[i], g[i]>: a unit is (b, h),
// its query rows in order; per row s recomputed, p = exp(s - lse), dp[j] = <g[i], v[j]>,
// ds = scale * p (dp - Di); g_q[i] = sum_j ds[j] k[j]; g_k[j] += ds[j] q[i]; g_v[j] += p[j] g[i],
// g_k and g_v accumulated in the unit's buffers and written out once (masked keys: 0). Every
// output is written by one thread in a fixed order (deterministic); no atomics.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention_core.h"  // exp_approx

namespace gnncompile {
namespace cpu {

constexpr int64_t kDenseMaxHeadDim = 64;   // the largest D a kernel is instantiated for
constexpr int64_t kDenseQueryBlock = 32;   // query rows per forward unit

template <typename T>
struct DenseAttentionArgs {
  const T* q = nullptr;  // [B, H, L, D] with strides qs
  const T* k = nullptr;  // [B, H, S, D] with strides ks
  const T* v = nullptr;  // [B, H, S, D] with strides vs
  int64_t B = 0, H = 0, L = 0, S = 0, D = 0;
  int64_t qs[4] = {0, 0, 0, 0}, ks[4] = {0, 0, 0, 0}, vs[4] = {0, 0, 0, 0};
  const int64_t* key_ptr = nullptr;  // [B + 1]: the kept keys of batch b are ids[key_ptr[b] .. key_ptr[b + 1])
  const int64_t* ids = nullptr;      // kept key positions, ascending within a batch
  const T* bias = nullptr;           // per kept key (ids' order): a float mask's value added to the logits, or nullptr
  T scale = T(1);
};

// Explicit short vectors (the compilers' vector extensions, GCC and Clang): 32 bytes, 8 float32 or 4
// float64 lanes; without AVX the compiler splits them in two. Left to the auto-vectoriser, the
// loops over [np, Dp] rows were vectorised across the keys with shuffles (backward 5x slower).
template <typename T> struct DenseVec;
template <> struct DenseVec<float> { typedef float type __attribute__((vector_size(32))); };
template <> struct DenseVec<double> { typedef double type __attribute__((vector_size(32))); };
template <typename T> constexpr int dense_lanes() { return 32 / static_cast<int>(sizeof(T)); }

template <typename T>
inline typename DenseVec<T>::type dense_load(const T* p) {
  typename DenseVec<T>::type v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <typename T>
inline void dense_store(T* p, typename DenseVec<T>::type v) { std::memcpy(p, &v, sizeof(v)); }
template <typename T>
inline typename DenseVec<T>::type dense_splat(T x) {
  typename DenseVec<T>::type v = {};
  return v + x;
}

// Keys per score block: 8 vectors in flight per channel step.
template <typename T> constexpr int64_t key_block() { return 8 * dense_lanes<T>(); }

template <typename T>
inline T* dense_buffer(std::vector<T>& buf, int64_t n) {
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

// The kept keys (or values) of (b, h): transposed into t [Dp, np] and/or as rows into r [np, Dp],
// zero-padded. Either pointer may be null.
template <typename T, int Dp>
inline void dense_gather(const T* base, const int64_t* st, const int64_t* ids, int64_t n, int64_t np, int64_t D,
                         T* t, T* r) {
  for (int64_t j = 0; j < np; ++j) {
    const T* row = j < n ? base + ids[j] * st[2] : nullptr;
    for (int d = 0; d < Dp; ++d) {
      const T x = (row != nullptr && d < D) ? row[d * st[3]] : T(0);
      if (t != nullptr) t[d * np + j] = x;
      if (r != nullptr) r[j * Dp + d] = x;
    }
  }
}

// out[j] = mul * <x, t[:, j]> for j < np (t: [Dp, np], np a multiple of the key block).
template <typename T, int Dp>
inline void dense_scores(const T* x, const T* t, int64_t np, T mul, T* out) {
  using V = typename DenseVec<T>::type;
  constexpr int W = dense_lanes<T>();
  constexpr int64_t JB = key_block<T>();
  for (int64_t j0 = 0; j0 < np; j0 += JB) {
    V acc[8];
    for (int u = 0; u < 8; ++u) acc[u] = V{};
    for (int d = 0; d < Dp; ++d) {
      const V xd = dense_splat(x[d]);
      const T* tp = t + d * np + j0;
      for (int u = 0; u < 8; ++u) acc[u] += xd * dense_load(tp + u * W);
    }
    const V m = dense_splat(mul);
    for (int u = 0; u < 8; ++u) dense_store(out + j0 + u * W, acc[u] * m);
  }
}

// out[d] = sum_j w[j] r[j, d] over j < np (r: [np, Dp], Dp a multiple of the lanes; four
// interleaved sums, added in one order).
template <typename T, int Dp>
inline void dense_weighted_rows(const T* w, const T* r, int64_t np, T* out) {
  using V = typename DenseVec<T>::type;
  constexpr int W = dense_lanes<T>(), NV = Dp / W;
  V acc[4][NV];
  for (int u = 0; u < 4; ++u)
    for (int c = 0; c < NV; ++c) acc[u][c] = V{};
  for (int64_t j = 0; j < np; j += 4)
    for (int u = 0; u < 4; ++u) {
      const V wj = dense_splat(w[j + u]);
      const T* rj = r + (j + u) * Dp;
      for (int c = 0; c < NV; ++c) acc[u][c] += wj * dense_load(rj + c * W);
    }
  for (int c = 0; c < NV; ++c) dense_store(out + c * W, (acc[0][c] + acc[1][c]) + (acc[2][c] + acc[3][c]));
}

// r[j, :] += w[j] x for j < n (r: [np, Dp]).
template <typename T, int Dp>
inline void dense_rank1(const T* w, const T* x, int64_t n, T* r) {
  using V = typename DenseVec<T>::type;
  constexpr int W = dense_lanes<T>(), NV = Dp / W;
  V xv[NV];
  for (int c = 0; c < NV; ++c) xv[c] = dense_load(x + c * W);
  for (int64_t j = 0; j < n; ++j) {
    const V wj = dense_splat(w[j]);
    T* rj = r + j * Dp;
    for (int c = 0; c < NV; ++c) dense_store(rj + c * W, dense_load(rj + c * W) + wj * xv[c]);
  }
}

// The max of x[0 .. np) (np a multiple of 8), in 8 lanes.
template <typename T>
inline T dense_max(const T* x, int64_t np) {
  T m[8];
  for (int l = 0; l < 8; ++l) m[l] = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < np; j += 8)
    for (int l = 0; l < 8; ++l) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  T r = m[0];
  for (int l = 1; l < 8; ++l) r = m[l] > r ? m[l] : r;
  return r;
}

// x[j] = exp(x[j] - shift) for j < np; returns their sum (8 lanes).
template <typename T>
inline T dense_exp_sum(T* x, int64_t np, T shift) {
  T s[8];
  for (int l = 0; l < 8; ++l) s[l] = T(0);
  for (int64_t j = 0; j < np; j += 8)
    for (int l = 0; l < 8; ++l) {
      const T e = exp_approx(x[j + l] - shift);
      x[j + l] = e;
      s[l] += e;
    }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

inline int64_t dense_padded(int64_t n, int64_t block) { return (n + block - 1) / block * block; }

// Forward of query rows [i0, i1) of (b, h): out [B, H, L, D] contiguous, lse [B, H, L].
template <typename T, int Dp>
void dense_attention_forward_unit(const DenseAttentionArgs<T>& a, int64_t b, int64_t h, int64_t i0, int64_t i1,
                                  T* out, T* lse) {
  const int64_t D = a.D;
  const int64_t* ids = a.ids + a.key_ptr[b];
  const int64_t n = a.key_ptr[b + 1] - a.key_ptr[b];
  const int64_t np = dense_padded(n, key_block<T>());
  const T* bias = a.bias != nullptr ? a.bias + a.key_ptr[b] : nullptr;
  T* o_bh = out + (b * a.H + h) * a.L * D;
  T* lse_bh = lse + (b * a.H + h) * a.L;
  if (n == 0) {
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t d = 0; d < D; ++d) o_bh[i * D + d] = T(0);
      lse_bh[i] = -std::numeric_limits<T>::infinity();
    }
    return;
  }
  thread_local std::vector<T> kt_buf, vr_buf, s_buf;
  T* kt = dense_buffer(kt_buf, Dp * np);
  T* vr = dense_buffer(vr_buf, np * Dp);
  T* s = dense_buffer(s_buf, np);
  dense_gather<T, Dp>(a.k + b * a.ks[0] + h * a.ks[1], a.ks, ids, n, np, D, kt, nullptr);
  dense_gather<T, Dp>(a.v + b * a.vs[0] + h * a.vs[1], a.vs, ids, n, np, D, nullptr, vr);
  const T* q_bh = a.q + b * a.qs[0] + h * a.qs[1];
  T qv[Dp], o[Dp];
  for (int64_t i = i0; i < i1; ++i) {
    const T* qi = q_bh + i * a.qs[2];
    for (int d = 0; d < Dp; ++d) qv[d] = d < D ? qi[d * a.qs[3]] : T(0);
    dense_scores<T, Dp>(qv, kt, np, a.scale, s);
    if (bias != nullptr)
      for (int64_t j = 0; j < n; ++j) s[j] += bias[j];
    for (int64_t j = n; j < np; ++j) s[j] = -std::numeric_limits<T>::infinity();
    const T m = dense_max(s, np);
    const T l = dense_exp_sum(s, np, m);
    dense_weighted_rows<T, Dp>(s, vr, np, o);
    const T inv = T(1) / l;
    for (int64_t d = 0; d < D; ++d) o_bh[i * D + d] = o[d] * inv;
    lse_bh[i] = m + std::log(l);
  }
}

// Backward of (b, h): g_q, g_k, g_v [B, H, *, D] contiguous; out, lse, g as the forward's.
template <typename T, int Dp>
void dense_attention_backward_unit(const DenseAttentionArgs<T>& a, int64_t b, int64_t h, const T* out, const T* lse,
                                   const T* grad, T* g_q, T* g_k, T* g_v) {
  const int64_t D = a.D, L = a.L, S = a.S;
  const int64_t* ids = a.ids + a.key_ptr[b];
  const int64_t n = a.key_ptr[b + 1] - a.key_ptr[b];
  const int64_t np = dense_padded(n, key_block<T>());
  const T* bias = a.bias != nullptr ? a.bias + a.key_ptr[b] : nullptr;
  const int64_t bh = b * a.H + h;
  T* gq_bh = g_q + bh * L * D;
  T* gk_bh = g_k + bh * S * D;
  T* gv_bh = g_v + bh * S * D;
  for (int64_t x = 0; x < S * D; ++x) gk_bh[x] = T(0);
  for (int64_t x = 0; x < S * D; ++x) gv_bh[x] = T(0);
  if (n == 0) {
    for (int64_t x = 0; x < L * D; ++x) gq_bh[x] = T(0);
    return;
  }
  thread_local std::vector<T> kt_buf, kr_buf, vt_buf, gk_buf, gv_buf, p_buf, ds_buf;
  T* kt = dense_buffer(kt_buf, Dp * np);
  T* kr = dense_buffer(kr_buf, np * Dp);
  T* vt = dense_buffer(vt_buf, Dp * np);
  T* gk = dense_buffer(gk_buf, np * Dp);
  T* gv = dense_buffer(gv_buf, np * Dp);
  T* p = dense_buffer(p_buf, np);
  T* ds = dense_buffer(ds_buf, np);
  dense_gather<T, Dp>(a.k + b * a.ks[0] + h * a.ks[1], a.ks, ids, n, np, D, kt, kr);
  dense_gather<T, Dp>(a.v + b * a.vs[0] + h * a.vs[1], a.vs, ids, n, np, D, vt, nullptr);
  for (int64_t x = 0; x < np * Dp; ++x) gk[x] = T(0);
  for (int64_t x = 0; x < np * Dp; ++x) gv[x] = T(0);
  const T* q_bh = a.q + b * a.qs[0] + h * a.qs[1];
  const T* o_bh = out + bh * L * D;
  const T* g_bh = grad + bh * L * D;
  const T* lse_bh = lse + bh * L;
  T qv[Dp], gi[Dp], gqi[Dp];
  for (int64_t i = 0; i < L; ++i) {
    const T* qi = q_bh + i * a.qs[2];
    T di = T(0);
    for (int d = 0; d < Dp; ++d) {
      qv[d] = d < D ? qi[d * a.qs[3]] : T(0);
      gi[d] = d < D ? g_bh[i * D + d] : T(0);
      di += d < D ? gi[d] * o_bh[i * D + d] : T(0);
    }
    dense_scores<T, Dp>(qv, kt, np, a.scale, p);
    if (bias != nullptr)
      for (int64_t j = 0; j < n; ++j) p[j] += bias[j];
    const T li = lse_bh[i];
    for (int64_t j = n; j < np; ++j) p[j] = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < np; ++j) p[j] = exp_approx(p[j] - li);
    dense_scores<T, Dp>(gi, vt, np, T(1), ds);  // dp
    for (int64_t j = 0; j < np; ++j) ds[j] = a.scale * p[j] * (ds[j] - di);
    dense_weighted_rows<T, Dp>(ds, kr, np, gqi);
    for (int64_t d = 0; d < D; ++d) gq_bh[i * D + d] = gqi[d];
    dense_rank1<T, Dp>(ds, qv, n, gk);
    dense_rank1<T, Dp>(p, gi, n, gv);
  }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < D; ++d) {
      gk_bh[ids[j] * D + d] = gk[j * Dp + d];
      gv_bh[ids[j] * D + d] = gv[j * Dp + d];
    }
}

// Calls fn(integral_constant<Dp>) with Dp the smallest of 4, 8, 16, 32, 64 that holds D and a vector
// (float32 pads 4 to 8: a row is at least one vector.)
template <typename T, typename Fn>
inline void dense_dispatch_dim(int64_t D, const Fn& fn) {
  if (D <= 4 && dense_lanes<T>() <= 4) fn(std::integral_constant<int, 4>());
  else if (D <= 8) fn(std::integral_constant<int, 8>());
  else if (D <= 16) fn(std::integral_constant<int, 16>());
  else if (D <= 32) fn(std::integral_constant<int, 32>());
  else fn(std::integral_constant<int, 64>());
}

}  // namespace cpu
}  // namespace gnncompile
