// GATv2's attention over a CSR-by-destination structure, on the GPU. Torch-free. Semantics as
// native/cpu/attention_v2_core.h (see there for the formulas):
//
//   z = x_l[src] + x_r[dst] (+ e_term[e]), s[e, h] = <att[h], leaky_relu(z[h])>, alpha = PyG's
//   softmax of s over the row, w = alpha * keep(e, h) / (1 - p), out[i] = sum of w * x_l[src]
//
// z is rounded to the features' dtype as the CPU core's v2_z (the chain's rounding), alpha and w
// as its stored<>; layout, exp and determinism: attention_rows.cuh.
//
// Forward (attention_v2_forward_kernel, a warp per destination row i): per in-edge and head the
// logit (z recomputed, never stored: lanes over the head's channels) into the scratch lg [E, H]
// (slot order); the row's softmax (attn_softmax_row: stats, w in lg); out[i] = sum of w * x_l[src]
// over flattened features.
// Backward, g = dL/dout, D[i, h] = <out[i, h], g[i, h]>:
//   attention_v2_dst_kernel (the CSR pass, a warp per destination row i): D into a scratch [M, H];
//     per in-edge and head the logit and <x_l[src, h], g[i, h]> in one sweep over the channels
//     (z's signs kept, a bit per channel: sg [E, H, ceil(C / 32)] words at the edge's id, from a
//     ballot), alpha from the stats, dlogit = alpha (dot keep - D), and the edge's record rec
//     [E, 2H] = (dlogit, w) at its id; then over flattened features, z recomputed: g_x_r[i] = sum
//     of dz (dz = dlogit att leaky_relu'(z)), the row's part of att's gradient part[i] = sum of
//     dlogit leaky_relu(z), g_e[e] = dz (with an edge term);
//   attention_v2_source_kernel (the CSC pass, a warp per source row j): g_x_l[j] = sum over its
//     out-edges of w g[i] + dlogit (att or att * slope by z's sign), from the records;
//   attention_v2_att_kernel: att's gradient = the rows' parts summed per fixed block of
//     kAttBlock rows, then over the blocks in order (a thread per feature each time).
// Records are written at perm[j] (the glue checks perm to be a permutation: one writer each).
// The structures are validated by the glue before launch (validate_once), so indices are not
// range-checked here.
#pragma once
#include "attention_rows.cuh"

namespace gnncompile {
namespace gpu {

constexpr int64_t kAttBlock = 64;  // rows per block of att's gradient partial sums

template <typename T, typename I>
struct AttentionV2Params : AttnBase<acc_t<T>, I> {
  const T* xl = nullptr;      // [N, H, C]
  const T* xr = nullptr;      // [M, H, C]
  const T* att = nullptr;     // [H, C]
  const T* e_term = nullptr;  // [E, H, C] in original edge order, or nullptr
  acc_t<T> slope = acc_t<T>(0.2);
};

// 32-bit words of one head's signs of z (a bit per channel).
__host__ __device__ __forceinline__ int64_t v2_sign_words(int64_t C) { return (C + 31) / 32; }

// z[f] of edge (src -> row, id e), as the CPU core's v2_z: (x_l + x_r) rounded, then + e_term.
template <typename T, typename I>
__device__ __forceinline__ acc_t<T> v2_z(const AttentionV2Params<T, I>& p, int64_t src, int64_t row, int64_t e,
                                         int64_t f) {
  const int64_t F = p.H * p.C;
  acc_t<T> v = attn_stored<T>(load_acc(p.xl + src * F + f) + load_acc(p.xr + row * F + f));
  if (p.e_term != nullptr) v = attn_stored<T>(v + load_acc(p.e_term + e * F + f));
  return v;
}

// ------------------------------------------------------------------------------ forward
template <typename T, typename I>
__global__ void __launch_bounds__(kAttnThreads) attention_v2_forward_kernel(const AttentionV2Params<T, I> p, T* out,
                                                                            acc_t<T>* stats, acc_t<T>* lg) {
  using A = acc_t<T>;
  const int lane = attn_lane();
  const int64_t H = p.H, C = p.C, F = H * C;
  const int64_t nw = attn_num_warps();
  for (int64_t row = attn_warp(); row < p.M; row += nw) {  // warp-uniform
    const int64_t begin = static_cast<int64_t>(p.rowptr[row]), end = static_cast<int64_t>(p.rowptr[row + 1]);
    const auto logit = [&](int64_t src, int64_t e, int64_t h) {  // <att[h], leaky_relu(z[h])>
      A part = A(0);
      for (int64_t c = lane; c < C; c += kWarpSize)
        part += load_acc(p.att + h * C + c) * attn_leaky(v2_z(p, src, row, e, h * C + c), p.slope);
      return warp_sum(part);
    };
    A* lr = attn_row_coefficients<T, I>(p, begin, end, lg, stats + row * 2 * H, logit);
    attn_row_sum<T>(  // out[i] = sum of w * x_l[src]
        begin, end, H, C, C, [&](int64_t j) { return lr + (j - begin) * H; },
        [&](int64_t j) { return p.xl + static_cast<int64_t>(__ldg(p.col + j)) * F; }, out + row * F);
    __syncwarp();  // the lanes leave the row together
  }
}

// ------------------------------------------------------------------------------ backward
// The CSR pass: D [M, H] scratch, rec [E, 2H], sg [E, H * words] at the edges' ids; g_xr [M, F],
// part [M, F] (att's gradient per row), g_e [E, F] (or nullptr).
template <typename T, typename I>
__global__ void __launch_bounds__(kAttnThreads) attention_v2_dst_kernel(const AttentionV2Params<T, I> p, const T* out,
                                                                        const T* grad, const acc_t<T>* stats,
                                                                        acc_t<T>* D, acc_t<T>* rec, uint32_t* sg,
                                                                        T* g_xr, acc_t<T>* part, T* g_e) {
  using A = acc_t<T>;
  const int lane = attn_lane();
  const int64_t H = p.H, C = p.C, F = H * C, W = v2_sign_words(C);
  const int64_t nw = attn_num_warps();
  for (int64_t row = attn_warp(); row < p.M; row += nw) {
    const int64_t begin = static_cast<int64_t>(p.rowptr[row]), end = static_cast<int64_t>(p.rowptr[row + 1]);
    const T* gr = grad + row * F;
    A* Dr = D + row * H;
    const A* st = stats + row * 2 * H;
    for (int64_t h = 0; h < H; ++h) {
      const A d = warp_dot(out + row * F + h * C, gr + h * C, C);
      if (lane == 0) Dr[h] = d;
    }
    __syncwarp();
    for (int64_t j = begin; j < end; ++j) {
      const int64_t src = static_cast<int64_t>(__ldg(p.col + j)), e = static_cast<int64_t>(__ldg(p.perm + j));
      A* re = rec + e * 2 * H;
      for (int64_t h = 0; h < H; ++h) {
        A s = A(0), dot = A(0);
        for (int64_t c0 = 0; c0 < C; c0 += kWarpSize) {  // warp-uniform: every lane reaches the ballot
          const int64_t c = c0 + lane;
          bool pos = false;
          if (c < C) {
            const int64_t f = h * C + c;
            const A z = v2_z(p, src, row, e, f);
            pos = z > A(0);
            s += load_acc(p.att + f) * attn_leaky(z, p.slope);
            dot += load_acc(p.xl + src * F + f) * load_acc(gr + f);
          }
          const unsigned bits = __ballot_sync(kFullMask, pos);
          if (lane == 0) sg[(e * H + h) * W + c0 / kWarpSize] = bits;
        }
        s = warp_sum(s);
        dot = warp_sum(dot);
        const A alpha = attn_alpha<T>(s, st[h], st[H + h]), kh = attn_keep(p, e, h);
        const A w = p.dropout ? attn_stored<T>(alpha * kh) : alpha;
        if (lane == 0) {
          re[h] = alpha * (dot * kh - Dr[h]);
          re[H + h] = w;
        }
      }
    }
    __syncwarp();  // the records of this row's edges, read back below
    for (int64_t f0 = 0; f0 < F; f0 += kRowSpan) {
      const RowSlots sl = row_slots(f0, F, C);
      A gx[kRowSlots], ga[kRowSlots], at[kRowSlots];
#pragma unroll
      for (int s = 0; s < kRowSlots; ++s) {
        gx[s] = A(0);
        ga[s] = A(0);
        at[s] = sl.f[s] >= 0 ? load_acc(p.att + sl.f[s]) : A(0);
      }
      for (int64_t j = begin; j < end; ++j) {
        const int64_t src = static_cast<int64_t>(__ldg(p.col + j)), e = static_cast<int64_t>(__ldg(p.perm + j));
        const A* re = rec + e * 2 * H;
#pragma unroll
        for (int s = 0; s < kRowSlots; ++s) {
          if (sl.f[s] < 0) continue;
          const A dl = re[sl.h[s]];
          const A z = v2_z(p, src, row, e, sl.f[s]);
          const bool pos = z > A(0);
          const A dz = dl * at[s] * (pos ? A(1) : p.slope);
          gx[s] += dz;
          ga[s] += dl * (pos ? z : z * p.slope);
          if (g_e != nullptr) g_e[e * F + sl.f[s]] = from_acc<T>(dz);
        }
      }
#pragma unroll
      for (int s = 0; s < kRowSlots; ++s)
        if (sl.f[s] >= 0) {
          g_xr[row * F + sl.f[s]] = from_acc<T>(gx[s]);
          part[row * F + sl.f[s]] = ga[s];
        }
    }
  }
}

// The CSC pass: g_xl [N, F] from the records.
template <typename T, typename I>
__global__ void __launch_bounds__(kAttnThreads) attention_v2_source_kernel(const AttentionV2Params<T, I> p,
                                                                           const T* grad, const acc_t<T>* rec,
                                                                           const uint32_t* sg, T* g_xl) {
  using A = acc_t<T>;
  const int64_t H = p.H, C = p.C, F = H * C, W = v2_sign_words(C);
  const int64_t nw = attn_num_warps();
  for (int64_t j = attn_warp(); j < p.N; j += nw) {
    const int64_t begin = static_cast<int64_t>(p.rowptr_t[j]), end = static_cast<int64_t>(p.rowptr_t[j + 1]);
    for (int64_t f0 = 0; f0 < F; f0 += kRowSpan) {
      const RowSlots sl = row_slots(f0, F, C);
      A acc[kRowSlots], at[kRowSlots], an[kRowSlots];
      int64_t word[kRowSlots];
      int bit[kRowSlots];
#pragma unroll
      for (int s = 0; s < kRowSlots; ++s) {
        acc[s] = A(0);
        at[s] = sl.f[s] >= 0 ? load_acc(p.att + sl.f[s]) : A(0);
        an[s] = at[s] * p.slope;
        const int64_t c = sl.f[s] >= 0 ? sl.f[s] - sl.h[s] * C : 0;
        word[s] = sl.h[s] * W + c / kWarpSize;
        bit[s] = static_cast<int>(c % kWarpSize);
      }
      for (int64_t k = begin; k < end; ++k) {
        const int64_t i = static_cast<int64_t>(__ldg(p.col_t + k)), e = static_cast<int64_t>(__ldg(p.perm_t + k));
        const A* re = rec + e * 2 * H;
        const uint32_t* se = sg + e * H * W;
        const T* gr = grad + i * F;
#pragma unroll
        for (int s = 0; s < kRowSlots; ++s) {
          if (sl.f[s] < 0) continue;
          const A dl = __ldg(re + sl.h[s]), w = __ldg(re + H + sl.h[s]);
          const A datt = (__ldg(se + word[s]) >> bit[s] & 1u) ? at[s] : an[s];
          acc[s] += w * load_acc(gr + sl.f[s]) + dl * datt;
        }
      }
#pragma unroll
      for (int s = 0; s < kRowSlots; ++s)
        if (sl.f[s] >= 0) g_xl[j * F + sl.f[s]] = from_acc<T>(acc[s]);
    }
  }
}

// att's gradient in two deterministic steps: blk [B, F] = part's rows summed per block of
// kAttBlock rows (a thread per (block, feature)); g_att [F] = blk summed over the blocks in order.
template <typename A>
__global__ void __launch_bounds__(kAttnThreads) attention_v2_att_blocks_kernel(const A* part, int64_t M, int64_t F,
                                                                               A* blk) {
  const int64_t B = ceil_div(M, kAttBlock), total = B * F;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t b = idx / F, f = idx - b * F;
    const int64_t r1 = (b + 1) * kAttBlock < M ? (b + 1) * kAttBlock : M;
    A s = A(0);
    for (int64_t r = b * kAttBlock; r < r1; ++r) s += part[r * F + f];
    blk[idx] = s;
  }
}

template <typename T>
__global__ void __launch_bounds__(kAttnThreads) attention_v2_att_total_kernel(const acc_t<T>* blk, int64_t B,
                                                                              int64_t F, T* g_att) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t f = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; f < F; f += stride) {
    acc_t<T> s = acc_t<T>(0);
    for (int64_t b = 0; b < B; ++b) s += blk[b * F + f];
    g_att[f] = from_acc<T>(s);
  }
}

// Blocks of att's gradient partial sums (the glue sizes blk [v2_att_blocks(M), F]).
inline int64_t v2_att_blocks(int64_t M) { return ceil_div(M, kAttBlock); }

// Forward on `stream`: out [M, H * C], stats [M, 2H], lg [E, H] scratch. The caller has
// validated the CSR and handled M = 0, E = 0, F = 0.
template <typename T, typename I>
cudaError_t attention_v2_forward_launch(const AttentionV2Params<T, I>& p, T* out, acc_t<T>* stats, acc_t<T>* lg,
                                        cudaStream_t stream) {
  if (p.M == 0) return cudaSuccess;
  attention_v2_forward_kernel<T, I>
      <<<attn_grid(p.M, kAttnWarps, p.max_blocks), kAttnThreads, 0, stream>>>(p, out, stats, lg);
  return cudaGetLastError();
}

// Backward on `stream`: the CSR pass, the CSC pass, att's gradient. Scratch: D [M, H], rec
// [E, 2H], part [M, F], blk [v2_att_blocks(M), F] (acc_t), sg [E, H * v2_sign_words(C)]. The
// caller has validated both structures and checked perm to be a permutation.
template <typename T, typename I>
cudaError_t attention_v2_backward_launch(const AttentionV2Params<T, I>& p, const T* out, const T* grad,
                                         const acc_t<T>* stats, acc_t<T>* D, acc_t<T>* rec, uint32_t* sg,
                                         acc_t<T>* part, acc_t<T>* blk, T* g_xl, T* g_xr, T* g_att, T* g_e,
                                         cudaStream_t stream) {
  const int64_t F = p.H * p.C;
  if (p.M > 0) {
    attention_v2_dst_kernel<T, I><<<attn_grid(p.M, kAttnWarps, p.max_blocks), kAttnThreads, 0, stream>>>(
        p, out, grad, stats, D, rec, sg, g_xr, part, g_e);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (p.N > 0) {
    attention_v2_source_kernel<T, I>
        <<<attn_grid(p.N, kAttnWarps, p.max_blocks), kAttnThreads, 0, stream>>>(p, grad, rec, sg, g_xl);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (F > 0) {
    const int64_t B = v2_att_blocks(p.M);
    if (B > 0) {
      attention_v2_att_blocks_kernel<acc_t<T>>
          <<<attn_grid(B * F, kAttnThreads, p.max_blocks), kAttnThreads, 0, stream>>>(part, p.M, F, blk);
      cudaError_t err = cudaGetLastError();
      if (err != cudaSuccess) return err;
    }
    attention_v2_att_total_kernel<T>
        <<<attn_grid(F, kAttnThreads, p.max_blocks), kAttnThreads, 0, stream>>>(blk, B, F, g_att);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace gpu
}  // namespace gnncompile
