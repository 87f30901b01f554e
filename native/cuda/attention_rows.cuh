// What the GATv2 and dot-product attention cores on the GPU (attention_v2_core.cuh,
// attention_dot_core.cuh) share. Torch-free. Both run one warp per destination row (forward,
// the backward's CSR pass) or per source row (the backward's CSC pass), rows grid-strided, with
// the layout of the CPU cores they follow (native/cpu/attention_v2_core.h, attention_dot_core.h):
//
//   * a head's dot product over its C channels: lanes over the channels (c = lane, lane + 32,
//     ...), then a butterfly sum, so every lane holds the same total;
//   * the row's logits, one per (in-edge, head), written to a scratch [E, H] in CSR slot order by
//     lane 0 and read back by the warp after __syncwarp (plain loads, not the read-only path);
//     attn_softmax_row turns them into the coefficients w in place and writes the row's stats
//     (max, 1 / (sum + 1e-16)) per head, as the CPU's attention_rows (attention_core.h);
//   * sums over a row's edges of w * (a gathered row), attn_row_sum: lanes over the flattened
//     features (f = f0 + lane + 32 s, kRowSlots values a lane per pass), each sum in slot order.
//
// exp is attn_exp: for float the CPU's exp_approx (attention_core.h) written with the same
// operations in the same order (fmaf is IEEE's fma on both sides; xc * log2(e) + 0.5 as the one
// fma GCC contracts it to with -march=native on an FMA host), so a logit's exp has the CPU's bits;
// for double, exp (within an ulp of glibc's). Sums run in a lane-parallel order, so results agree
// with the CPU within rounding, not bit for bit; they do not change from run to run (no atomics,
// every sum in a fixed order). Not tuned on a GPU: one head's dot at a time (a short C leaves
// lanes idle), a hub row is one warp's work.
#pragma once
#include "../common/counter_rng.h"
#include "attention_core.cuh"

namespace gnncompile {
namespace gpu {

constexpr int kRowSlots = 4;  // features a lane accumulates per pass over a row's edges
constexpr unsigned kFullMask = 0xffffffffu;

// The CPU's exp_approx (float) / std::exp (double), see above.
__device__ __forceinline__ float attn_exp(float x) {
  constexpr float lo = -87.33654f, hi = 88.72283f;
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const float n = floorf(fmaf(xc, 1.44269504088896341f, 0.5f));
  float r = fmaf(n, -0.693359375f, xc);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.0f / 5040.0f;
  p = fmaf(p, r, 1.0f / 720.0f);
  p = fmaf(p, r, 1.0f / 120.0f);
  p = fmaf(p, r, 1.0f / 24.0f);
  p = fmaf(p, r, 1.0f / 6.0f);
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  const float scale = __int_as_float((static_cast<int>(n) + 127) << 23);
  float y = __fmul_rn(p, scale);
  y = x != x ? x : y;
  return x < lo ? 0.0f : y;
}
__device__ __forceinline__ double attn_exp(double x) { return exp(x); }

// Butterfly reductions over the warp: every lane ends with the same value.
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = kWarpSize >> 1; o >= 1; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
template <typename A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int o = kWarpSize >> 1; o >= 1; o >>= 1) v = max_keep(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// <a[0..n), b[0..n)> over the warp (lanes over the elements); every lane gets the total.
template <typename T>
__device__ __forceinline__ acc_t<T> warp_dot(const T* a, const T* b, int64_t n) {
  acc_t<T> d = acc_t<T>(0);
  for (int64_t c = attn_lane(); c < n; c += kWarpSize) d += load_acc(a + c) * load_acc(b + c);
  return warp_sum(d);
}

// A coefficient from its logit and the row's stats, rounded as the chain rounds the softmax's
// output (the CPU cores' stored<>).
template <typename T>
__device__ __forceinline__ acc_t<T> attn_alpha(acc_t<T> s, acc_t<T> max, acc_t<T> inv) {
  return attn_stored<T>(attn_exp(s - max) * inv);
}

// The row's softmax, one warp: lg [deg, H] holds the logits of the row's slots (written by this
// warp, visible after its __syncwarp) and gets the coefficients w (alpha, rounded, times the
// dropout factor, rounded again); st [2H] gets max (an all -inf row shifted by 0) and 1 / (sum +
// 1e-16) per head, both 0 for a row with no edge. perm: the row's slots' edge ids; p: H and the
// dropout.
template <typename T, typename I>
__device__ void attn_softmax_row(acc_t<T>* lg, int64_t deg, const AttnBase<acc_t<T>, I>& p, acc_t<T>* st,
                                 const I* perm) {
  using A = acc_t<T>;
  const int lane = attn_lane();
  const int64_t H = p.H;
  for (int64_t h = 0; h < H; ++h) {
    A m = neg_inf<A>();
    for (int64_t k = lane; k < deg; k += kWarpSize) m = max_keep(m, lg[k * H + h]);
    m = attn_guard(warp_max(m));
    A sum = A(0);
    for (int64_t k = lane; k < deg; k += kWarpSize) sum += attn_exp(lg[k * H + h] - m);
    sum = warp_sum(sum);
    const A inv = A(1) / (sum + A(1e-16));
    if (lane == 0) {
      st[h] = deg > 0 ? m : A(0);
      st[H + h] = deg > 0 ? inv : A(0);
    }
    for (int64_t k = lane; k < deg; k += kWarpSize) {  // each lane its own slots: no hazard
      A w = attn_alpha<T>(lg[k * H + h], m, inv);
      if (p.dropout) w = attn_stored<T>(w * attn_keep(p, static_cast<int64_t>(__ldg(perm + k)), h));
      lg[k * H + h] = w;
    }
  }
  __syncwarp();
}

// One destination row's coefficients, one warp: per slot j in [begin, end) and head h the logit
// logit(src, e, h) (a warp-wide value, every lane calling it) into lg's slots (written by lane 0),
// then the row's softmax (attn_softmax_row, the stats into st). Returns the row's coefficients w
// [end - begin, H] (lg's slots of the row).
template <typename T, typename I, typename Logit>
__device__ acc_t<T>* attn_row_coefficients(const AttnBase<acc_t<T>, I>& p, int64_t begin, int64_t end,
                                           acc_t<T>* lg, acc_t<T>* st, const Logit& logit) {
  const int64_t H = p.H;
  acc_t<T>* lr = lg + begin * H;
  for (int64_t j = begin; j < end; ++j) {
    const int64_t src = static_cast<int64_t>(__ldg(p.col + j)), e = static_cast<int64_t>(__ldg(p.perm + j));
    for (int64_t h = 0; h < H; ++h) {
      const acc_t<T> s = logit(src, e, h);
      if (attn_lane() == 0) lr[(j - begin) * H + h] = s;
    }
  }
  __syncwarp();
  attn_softmax_row<T, I>(lr, end - begin, p, st, p.perm + begin);
  return lr;
}

// The slots of one pass over flattened features [f0, f0 + 32 * kRowSlots) for the calling lane:
// the feature (-1 past F) and its head (f / C).
struct RowSlots {
  int64_t f[kRowSlots];
  int64_t h[kRowSlots];
};

__device__ __forceinline__ RowSlots row_slots(int64_t f0, int64_t F, int64_t C) {
  RowSlots r;
  const int lane = attn_lane();
#pragma unroll
  for (int s = 0; s < kRowSlots; ++s) {
    const int64_t f = f0 + lane + static_cast<int64_t>(kWarpSize) * s;
    r.f[s] = f < F ? f : -1;
    r.h[s] = f < F && C > 0 ? f / C : 0;
  }
  return r;
}

constexpr int64_t kRowSpan = static_cast<int64_t>(kWarpSize) * kRowSlots;  // features per pass

// out[f] = sum over the slots j in [begin, end) of coef(j)[h] * row(j)[h * hs + c], f = h * W + c
// for f < H * W, one warp, lanes over the flattened features, each sum in slot order. coef(j):
// the slot's H coefficients (acc_t, plain loads: the caller's warp may have written them);
// row(j): its gathered row, whose head h starts at h * hs (hs = W: an [H, W] row; 0: one [W] row
// shared by the heads, as edge features are).
template <typename T, typename Coef, typename Row>
__device__ void attn_row_sum(int64_t begin, int64_t end, int64_t H, int64_t W, int64_t hs, const Coef& coef,
                             const Row& row, T* out) {
  using A = acc_t<T>;
  const int64_t F = H * W;
  for (int64_t f0 = 0; f0 < F; f0 += kRowSpan) {
    const RowSlots sl = row_slots(f0, F, W);
    int64_t off[kRowSlots];
    A acc[kRowSlots];
#pragma unroll
    for (int s = 0; s < kRowSlots; ++s) {
      acc[s] = A(0);
      off[s] = sl.h[s] * hs + (sl.f[s] - sl.h[s] * W);
    }
    for (int64_t j = begin; j < end; ++j) {
      const A* cj = coef(j);
      const T* rj = row(j);
#pragma unroll
      for (int s = 0; s < kRowSlots; ++s)
        if (sl.f[s] >= 0) acc[s] += cj[sl.h[s]] * load_acc(rj + off[s]);
    }
#pragma unroll
    for (int s = 0; s < kRowSlots; ++s)
      if (sl.f[s] >= 0) out[sl.f[s]] = from_acc<T>(acc[s]);
  }
}

}  // namespace gpu
}  // namespace gnncompile
