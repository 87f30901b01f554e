// Per-edge dot products over a CSR-by-destination structure, on the GPU. Torch-free.
//   edge_dot: out[e, h] = <x[src_e, h, :], g[dst_e, h, :]>   (the gradient of an spmm edge weight)
// out is written in original edge order through perm. Semantics match
// native/cpu/edge_dot_core.h; summation order differs (lane-parallel), within rounding.
//
// The merge of (row ends, edge slots) is split into equal runs of K items, one run per group
// (see common.cuh), so hubs of power-law graphs are shared by many groups. edge_dot needs no
// cross-edge reduction, so the split is all it needs.
#pragma once
#include "common.cuh"

namespace gnncompile {
namespace gpu {

template <typename T, typename I>
struct EdgeDotParams {
  const I* rowptr;  // [M + 1]
  const I* col;     // [E]
  const I* perm;    // [E]
  const T* x;       // [N, F]
  const T* g;       // [M, F]
  T* out;           // [E, H] in original edge order
  int64_t M, E, F, H, C;  // F = H * C
  int64_t items, groups;
  int lanes;       // L: lanes per group (power of two <= 32)
  int head_lanes;  // P: lanes per head dot (power of two <= L); L / P heads per pass
};

constexpr int kDotUnroll = 4;  // edges in flight per group

template <typename T, int V>
__device__ __forceinline__ acc_t<T> dot_pack(const Pack<T, V>& a, const Pack<T, V>& b) {
  acc_t<T> s = 0;
#pragma unroll
  for (int k = 0; k < V; ++k) s += to_acc(a.v[k]) * to_acc(b.v[k]);
  return s;
}

template <typename T, typename I, int V>
__global__ void __launch_bounds__(kMaxBlockThreads, 2) edge_dot_kernel(const EdgeDotParams<T, I> p) {
  using A = acc_t<T>;
  const int L = p.lanes;
  const int lane = static_cast<int>(threadIdx.x) & (L - 1);
  const int64_t grp = static_cast<int64_t>(blockIdx.x) * (blockDim.x / L) + threadIdx.x / L;
  if (grp >= p.groups) return;
  const unsigned mask = group_mask(L);
  const int P = p.head_lanes;
  const int heads_per_pass = L / P;
  const int head_off = lane / P;  // which head of the pass this lane works on
  const int sub = lane & (P - 1);  // its place among the head's P lanes

  const MergeRange mr = merge_range(grp, p.items, p.rowptr, p.M, p.E);
  if (mr.slot0 >= mr.slot1) return;  // only row ends in this run: nothing to write
  // The run's slots as one stream across rows (a row has no reduction here), so short rows
  // still leave kDotUnroll edges in flight; `row` follows the slots through rowptr.
  int64_t row = mr.row0;
  int64_t row_end = static_cast<int64_t>(p.rowptr[row + 1]);
  for (int64_t base = mr.slot0; base < mr.slot1; base += L) {
    const int n = static_cast<int>(mr.slot1 - base < L ? mr.slot1 - base : L);
    I my_col = 0, my_perm = 0;
    if (lane < n) {
      my_col = __ldg(p.col + base + lane);
      my_perm = __ldg(p.perm + base + lane);
    }
    for (int t = 0; t < n; t += kDotUnroll) {
      int64_t src[kDotUnroll], eid[kDotUnroll], dst_row[kDotUnroll];
#pragma unroll
      for (int u = 0; u < kDotUnroll; ++u) {
        src[u] = static_cast<int64_t>(__shfl_sync(mask, my_col, t + u, L));
        eid[u] = static_cast<int64_t>(__shfl_sync(mask, my_perm, t + u, L));
        if (t + u < n) {  // group-uniform; slots < E always lie in a row < M
          while (base + t + u >= row_end) row_end = static_cast<int64_t>(p.rowptr[++row + 1]);
        }
        dst_row[u] = row;
      }
      for (int64_t h0 = 0; h0 < p.H; h0 += heads_per_pass) {
        const int64_t h = h0 + head_off;
        A part[kDotUnroll];
#pragma unroll
        for (int u = 0; u < kDotUnroll; ++u) part[u] = 0;
        if (h < p.H) {
          for (int64_t cc = static_cast<int64_t>(sub) * V; cc < p.C; cc += static_cast<int64_t>(P) * V) {
            const int64_t off = h * p.C + cc;
            Pack<T, V> xv[kDotUnroll], gv[kDotUnroll];
#pragma unroll
            for (int u = 0; u < kDotUnroll; ++u) {
              if (t + u < n) {
                xv[u] = load_pack<T, V>(p.x + src[u] * p.F + off);
                gv[u] = load_pack<T, V>(p.g + dst_row[u] * p.F + off);  // same row: an L1 hit
              }
            }
#pragma unroll
            for (int u = 0; u < kDotUnroll; ++u)
              if (t + u < n) part[u] += dot_pack<T, V>(xv[u], gv[u]);
          }
        }
        // Butterfly over the P lanes of each head: every lane ends with the same sum.
        for (int o = P >> 1; o > 0; o >>= 1) {
#pragma unroll
          for (int u = 0; u < kDotUnroll; ++u) part[u] += __shfl_xor_sync(mask, part[u], o, L);
        }
        if (sub == 0 && h < p.H) {
#pragma unroll
          for (int u = 0; u < kDotUnroll; ++u)
            if (t + u < n) p.out[eid[u] * p.H + h] = from_acc<T>(part[u]);
        }
      }
    }
  }
}

template <typename T, typename I, int V>
cudaError_t edge_dot_launch_v(const EdgeDotParams<T, I>& p, const GroupConfig& cfg, cudaStream_t stream) {
  if (!group_block_ok(cfg)) return cudaErrorInvalidConfiguration;
  const dim3 block(static_cast<unsigned>(cfg.lanes * cfg.groups_per_block));
  const dim3 grid(static_cast<unsigned>(ceil_div(p.groups, cfg.groups_per_block)));
  edge_dot_kernel<T, I, V><<<grid, block, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, typename I>
cudaError_t edge_dot_launch(const EdgeDotParams<T, I>& p, const GroupConfig& cfg, cudaStream_t stream) {
  constexpr int V0 = VecSet<T>::w[0], V1 = VecSet<T>::w[1];
  if (cfg.vec == V0) return edge_dot_launch_v<T, I, V0>(p, cfg, stream);
  if (cfg.vec == V1) return edge_dot_launch_v<T, I, V1>(p, cfg, stream);
  return edge_dot_launch_v<T, I, 1>(p, cfg, stream);
}

}  // namespace gpu
}  // namespace gnncompile
