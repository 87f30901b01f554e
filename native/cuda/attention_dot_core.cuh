// Dot-product (TransformerConv) attention over a CSR-by-destination structure, on the GPU.
// Torch-free. Semantics as native/cpu/attention_dot_core.h (see there for the formulas and the
// folded edge term):
//
//   s[e, h] = scale * (<q[dst, h], k[src, h]> + <qe[dst, h], ea[e]>), alpha = PyG's softmax of s
//   over the row, w = alpha * keep(e, h) / (1 - p), out[i, h] = sum of w v[src, h],
//   out_e[i, h] = sum of w ea[e]
//
// alpha and w rounded as the CPU core's stored<>; layout, exp and determinism: attention_rows.cuh.
//
// Forward (attention_dot_forward_kernel, a warp per destination row i): per in-edge and head the
// logit (lanes over the head's channels, then over ea's) into the scratch lg [E, H] (slot order);
// the row's softmax (attn_softmax_row); out[i] and out_e[i] over flattened features.
// Backward, g = dL/dout, ge = dL/dout_e, D[i, h] = <out[i, h], g[i, h]> + <out_e[i, h], ge[i, h]>:
//   attention_dot_dst_kernel (the CSR pass, a warp per destination row i): D into a scratch [M, H];
//     per in-edge: per head the logit and g_a = <g[i, h], v[src, h]> + <ge[i, h], ea[e]>, alpha
//     from the stats, ds = scale alpha (g_a keep - D), the edge's record rec [E, 2H] = (ds, w) at
//     its id; g_ea[e] = sum over the heads of w ge[i, h] + ds qe[i, h] (lanes over edge_dim); then
//     over flattened features g_q[i] = sum of ds k[src], g_qe[i] = sum of ds ea[e];
//   attention_dot_source_kernel (the CSC pass, a warp per source row j): g_k[j] = sum of ds q[i],
//     g_v[j] = sum of w g[i] over its out-edges, from the records.
// Records and g_ea are written at perm[j] (the glue checks perm to be a permutation). The
// structures are validated by the glue before launch, so indices are not range-checked here.
#pragma once
#include "attention_rows.cuh"

namespace gnncompile {
namespace gpu {

template <typename T, typename I>
struct AttentionDotParams : AttnBase<acc_t<T>, I> {
  const T* q = nullptr;   // [M, H, C]
  const T* k = nullptr;   // [N, H, C]
  const T* v = nullptr;   // [N, H, C]
  const T* qe = nullptr;  // [M, H, De], or nullptr (no edge features)
  const T* ea = nullptr;  // [E, De] in original edge order, or nullptr
  int64_t De = 0;
  acc_t<T> logit_scale = acc_t<T>(1);
};

// The logit of (row i, edge e from src, head h), as the CPU core's dot_logits: (<q, k> + <qe,
// ea>) * scale.
template <typename T, typename I>
__device__ __forceinline__ acc_t<T> dot_logit(const AttentionDotParams<T, I>& p, int64_t row, int64_t src, int64_t e,
                                              int64_t h) {
  const int64_t C = p.C, F = p.H * C, De = p.De;
  acc_t<T> d = warp_dot(p.q + row * F + h * C, p.k + src * F + h * C, C);
  if (p.ea != nullptr) d += warp_dot(p.qe + (row * p.H + h) * De, p.ea + e * De, De);
  return d * p.logit_scale;
}

// ------------------------------------------------------------------------------ forward
template <typename T, typename I>
__global__ void __launch_bounds__(kAttnThreads) attention_dot_forward_kernel(const AttentionDotParams<T, I> p, T* out,
                                                                             T* out_e, acc_t<T>* stats,
                                                                             acc_t<T>* lg) {
  using A = acc_t<T>;
  const int64_t H = p.H, C = p.C, F = H * C, De = p.De, FE = H * De;
  const bool edge = p.ea != nullptr;
  const int64_t nw = attn_num_warps();
  for (int64_t row = attn_warp(); row < p.M; row += nw) {  // warp-uniform
    const int64_t begin = static_cast<int64_t>(p.rowptr[row]), end = static_cast<int64_t>(p.rowptr[row + 1]);
    const auto logit = [&](int64_t src, int64_t e, int64_t h) { return dot_logit(p, row, src, e, h); };
    A* lr = attn_row_coefficients<T, I>(p, begin, end, lg, stats + row * 2 * H, logit);
    const auto w = [&](int64_t j) { return lr + (j - begin) * H; };
    attn_row_sum<T>(  // out[i, h] = sum of w v[src, h]
        begin, end, H, C, C, w, [&](int64_t j) { return p.v + static_cast<int64_t>(__ldg(p.col + j)) * F; },
        out + row * F);
    if (edge)  // out_e[i, h] = sum of w ea[e]
      attn_row_sum<T>(begin, end, H, De, 0, w,
                      [&](int64_t j) { return p.ea + static_cast<int64_t>(__ldg(p.perm + j)) * De; },
                      out_e + row * FE);
    __syncwarp();
  }
}

// ------------------------------------------------------------------------------ backward
// The CSR pass: D [M, H] scratch, rec [E, 2H] at the edges' ids; g_q [M, F], g_qe [M, FE] (or
// nullptr), g_ea [E, De] at the edges' ids (or nullptr).
template <typename T, typename I>
__global__ void __launch_bounds__(kAttnThreads) attention_dot_dst_kernel(const AttentionDotParams<T, I> p,
                                                                         const T* out, const T* out_e, const T* grad,
                                                                         const T* grad_e, const acc_t<T>* stats,
                                                                         acc_t<T>* D, acc_t<T>* rec, T* g_q, T* g_qe,
                                                                         T* g_ea) {
  using A = acc_t<T>;
  const int lane = attn_lane();
  const int64_t H = p.H, C = p.C, F = H * C, De = p.De, FE = H * De;
  const bool edge = p.ea != nullptr;
  const int64_t nw = attn_num_warps();
  for (int64_t row = attn_warp(); row < p.M; row += nw) {
    const int64_t begin = static_cast<int64_t>(p.rowptr[row]), end = static_cast<int64_t>(p.rowptr[row + 1]);
    const T* gr = grad + row * F;
    const T* ger = edge ? grad_e + row * FE : nullptr;
    A* Dr = D + row * H;
    const A* st = stats + row * 2 * H;
    for (int64_t h = 0; h < H; ++h) {
      A d = warp_dot(out + row * F + h * C, gr + h * C, C);
      if (edge) d += warp_dot(out_e + row * FE + h * De, ger + h * De, De);
      if (lane == 0) Dr[h] = d;
    }
    __syncwarp();
    for (int64_t j = begin; j < end; ++j) {
      const int64_t src = static_cast<int64_t>(__ldg(p.col + j)), e = static_cast<int64_t>(__ldg(p.perm + j));
      A* re = rec + e * 2 * H;
      for (int64_t h = 0; h < H; ++h) {
        const A s = dot_logit(p, row, src, e, h);
        A ga = warp_dot(gr + h * C, p.v + src * F + h * C, C);
        if (edge) ga += warp_dot(ger + h * De, p.ea + e * De, De);
        const A alpha = attn_alpha<T>(s, st[h], st[H + h]), kh = attn_keep(p, e, h);
        const A w = p.dropout ? attn_stored<T>(alpha * kh) : alpha;
        if (lane == 0) {
          re[h] = p.logit_scale * alpha * (ga * kh - Dr[h]);
          re[H + h] = w;
        }
      }
      __syncwarp();  // the edge's record, read back by every lane
      if (edge)
        for (int64_t d = lane; d < De; d += kWarpSize) {  // g_ea[e] in the CPU's order (heads in turn)
          A gee = A(0);
          for (int64_t h = 0; h < H; ++h)
            gee += re[H + h] * load_acc(ger + h * De + d) + re[h] * load_acc(p.qe + (row * H + h) * De + d);
          g_ea[e * De + d] = from_acc<T>(gee);
        }
    }
    __syncwarp();
    const auto ds = [&](int64_t j) { return rec + static_cast<int64_t>(__ldg(p.perm + j)) * 2 * H; };
    attn_row_sum<T>(  // g_q[i, h] = sum of ds k[src, h]
        begin, end, H, C, C, ds, [&](int64_t j) { return p.k + static_cast<int64_t>(__ldg(p.col + j)) * F; },
        g_q + row * F);
    if (edge)  // g_qe[i, h] = sum of ds ea[e]
      attn_row_sum<T>(begin, end, H, De, 0, ds,
                      [&](int64_t j) { return p.ea + static_cast<int64_t>(__ldg(p.perm + j)) * De; },
                      g_qe + row * FE);
  }
}

// The CSC pass: g_k, g_v [N, F] from the records.
template <typename T, typename I>
__global__ void __launch_bounds__(kAttnThreads) attention_dot_source_kernel(const AttentionDotParams<T, I> p,
                                                                            const T* grad, const acc_t<T>* rec,
                                                                            T* g_k, T* g_v) {
  using A = acc_t<T>;
  const int64_t H = p.H, C = p.C, F = H * C;
  const int64_t nw = attn_num_warps();
  for (int64_t j = attn_warp(); j < p.N; j += nw) {
    const int64_t begin = static_cast<int64_t>(p.rowptr_t[j]), end = static_cast<int64_t>(p.rowptr_t[j + 1]);
    for (int64_t f0 = 0; f0 < F; f0 += kRowSpan) {
      const RowSlots sl = row_slots(f0, F, C);
      A ak[kRowSlots], av[kRowSlots];
#pragma unroll
      for (int s = 0; s < kRowSlots; ++s) ak[s] = av[s] = A(0);
      for (int64_t k = begin; k < end; ++k) {
        const int64_t i = static_cast<int64_t>(__ldg(p.col_t + k)), e = static_cast<int64_t>(__ldg(p.perm_t + k));
        const A* re = rec + e * 2 * H;
#pragma unroll
        for (int s = 0; s < kRowSlots; ++s) {
          if (sl.f[s] < 0) continue;
          ak[s] += __ldg(re + sl.h[s]) * load_acc(p.q + i * F + sl.f[s]);
          av[s] += __ldg(re + H + sl.h[s]) * load_acc(grad + i * F + sl.f[s]);
        }
      }
#pragma unroll
      for (int s = 0; s < kRowSlots; ++s)
        if (sl.f[s] >= 0) {
          g_k[j * F + sl.f[s]] = from_acc<T>(ak[s]);
          g_v[j * F + sl.f[s]] = from_acc<T>(av[s]);
        }
    }
  }
}

// Forward on `stream`: out [M, H * C], out_e [M, H * De] (or nullptr without edge features),
// stats [M, 2H], lg [E, H] scratch (acc_t). The caller has validated the CSR and handled M = 0,
// E = 0, H = 0.
template <typename T, typename I>
cudaError_t attention_dot_forward_launch(const AttentionDotParams<T, I>& p, T* out, T* out_e, acc_t<T>* stats,
                                         acc_t<T>* lg, cudaStream_t stream) {
  if (p.M == 0) return cudaSuccess;
  attention_dot_forward_kernel<T, I>
      <<<attn_grid(p.M, kAttnWarps, p.max_blocks), kAttnThreads, 0, stream>>>(p, out, out_e, stats, lg);
  return cudaGetLastError();
}

// Backward on `stream`: the CSR pass then the CSC pass. Scratch: D [M, H], rec [E, 2H] (acc_t).
// The caller has validated both structures and checked perm to be a permutation.
template <typename T, typename I>
cudaError_t attention_dot_backward_launch(const AttentionDotParams<T, I>& p, const T* out, const T* out_e,
                                          const T* grad, const T* grad_e, const acc_t<T>* stats, acc_t<T>* D,
                                          acc_t<T>* rec, T* g_q, T* g_k, T* g_v, T* g_qe, T* g_ea,
                                          cudaStream_t stream) {
  if (p.M > 0) {
    attention_dot_dst_kernel<T, I><<<attn_grid(p.M, kAttnWarps, p.max_blocks), kAttnThreads, 0, stream>>>(
        p, out, out_e, grad, grad_e, stats, D, rec, g_q, g_qe, g_ea);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (p.N > 0) {
    attention_dot_source_kernel<T, I>
        <<<attn_grid(p.N, kAttnWarps, p.max_blocks), kAttnThreads, 0, stream>>>(p, grad, rec, g_k, g_v);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace gpu
}  // namespace gnncompile
