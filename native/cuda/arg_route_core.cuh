// The max / min backward's fast form on the GPU, without a sort and without atomics. Torch-free.
// Semantics as native/cpu/arg_route_core.h:
//
//   arg_route     gx[s, f] += g[r, f] * w[e]   for every edge e = (s -> r) with arg[r, f] == slot(e)
//   arg_edge_dot  dw[e, h] += g[r, f] * x[s, f]   for every f of head h with arg[r, f] == slot(e)
//
// arg_route is a sum over the CSC (by source) and takes spmm's work split (spmm_core.cuh): a
// group of L lanes owns a run of K items of the merge of source ends and CSC slots, each lane V
// features; a source cut by group boundaries leaves partial sums in per-group scratch slots,
// which a second pass adds in group order. The message of CSC slot k (destination r, edge e) is
// g[r, f] (times w[e]) where the record arg[r, f] is e's CSR slot, else 0: the compare reads
// the records of r, 8 bytes a feature, next to its gradient. The partition depends only on
// (rowptr_t, K): the sums are the same on every run. Products are rounded as products
// (__fmul_rn: no FMA with the sum), as the CPU and torch's scatter path form them.
//
// arg_edge_dot: one thread per (row, head), its features in order; a row owns its slots, hence
// the edges it records, so no two threads write one output.
#pragma once
#include "common.cuh"

namespace gnncompile {
namespace gpu {

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

template <typename I>
__global__ void invert_perm_kernel(const I* perm, int64_t E, I* slot_of) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < E; j += stride)
    slot_of[static_cast<int64_t>(perm[j])] = static_cast<I>(j);
}

// slot_of[perm[j]] = j (the caller has checked that perm is a permutation of [0, E)).
template <typename I>
cudaError_t invert_perm_launch(const I* perm, int64_t E, I* slot_of, int sm_count, cudaStream_t stream) {
  if (E == 0) return cudaSuccess;
  const int64_t blocks = ceil_div(E, 256);
  const int64_t cap = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * 8;
  invert_perm_kernel<I><<<static_cast<unsigned>(blocks < cap ? blocks : cap), 256, 0, stream>>>(perm, E, slot_of);
  return cudaGetLastError();
}

template <typename T, typename I>
struct ArgRouteParams {
  const I* rowptr_t;     // [N + 1] CSC: the out-edges of every source
  const I* col_t;        // [E] destination row of CSC slot k
  const I* perm_t;       // [E] original edge id of CSC slot k
  const I* slot_of;      // [E] CSR slot of every edge id
  const T* weight;       // [E] or [E, H] in original edge order, or nullptr
  const int64_t* arg;    // [M, F] records of the forward pass
  const T* grad;         // [M, F]
  T* out;                // [N, F]
  acc_t<T>* part;        // [2 * groups, F] partial sums of sources cut by group boundaries
  int64_t* head_row;     // [groups] source whose head partial group g holds, or -1
  int64_t N, E, F;       // sources, edges, features per row
  int64_t H, C;          // weight columns, features per column (F = H * C)
  int64_t items, groups;  // K, ceil((N + E) / K)
  int lanes;             // L
};

// Destinations in flight per lane: 4, but 2 for 8-wide vectors (16-bit), whose 8 records a
// destination would otherwise spill (sm_90: 128 registers a thread at the launch bound).
constexpr int route_unroll(int V) { return V >= 8 ? 2 : 4; }

template <typename T, int V>
__device__ __forceinline__ void route_store(bool active, int64_t f, const acc_t<T> (&acc)[V], T* dst_row) {
  if (!active) return;
  Pack<T, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) o.v[k] = from_acc<T>(acc[k]);
  store_pack<T, V>(dst_row + f, o);
}

template <typename T, typename I, int V>
__device__ __forceinline__ void route_partial(const ArgRouteParams<T, I>& p, bool active, int64_t f, int64_t slot,
                                              const acc_t<T> (&acc)[V]) {
  if (!active) return;
  acc_t<T>* dst = p.part + slot * p.F + f;
#pragma unroll
  for (int k = 0; k < V; ++k) dst[k] = acc[k];
}

// Pass 1. Block = (blockDim.x / L) groups; gridDim.y = feature tiles of L * V features.
template <typename T, typename I, bool W, int V>
__global__ void __launch_bounds__(kMaxBlockThreads, 2) arg_route_kernel(const ArgRouteParams<T, I> p) {
  using A = acc_t<T>;
  const int L = p.lanes;
  const int lane = static_cast<int>(threadIdx.x) & (L - 1);
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / L) + threadIdx.x / L;
  if (g >= p.groups) return;  // whole groups leave together: shuffles stay within a group
  const unsigned mask = group_mask(L);
  const int64_t f = (static_cast<int64_t>(blockIdx.y) * L + lane) * V;
  const bool active = f < p.F;
  const int64_t h = (W && active) ? f / p.C : 0;

  const MergeRange mr = merge_range(g, p.items, p.rowptr_t, p.N, p.E);
  int64_t row = mr.row0;  // a source; < N: a non-empty run never starts at the end of the merge
  int64_t row_begin = static_cast<int64_t>(p.rowptr_t[row]);
  int64_t row_end = static_cast<int64_t>(p.rowptr_t[row + 1]);
  const bool first_started_here = mr.slot0 == row_begin;
  if (blockIdx.y == 0 && lane == 0) p.head_row[g] = (mr.row1 > mr.row0 && !first_started_here) ? mr.row0 : -1;

  constexpr int U = route_unroll(V);
  A acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = A(0);
  auto finish_row = [&]() {
    if (row > mr.row0 || first_started_here)
      route_store<T, V>(active, f, acc, p.out + row * p.F);
    else
      route_partial<T, I, V>(p, active, f, head_slot(g), acc);
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = A(0);
    ++row;
    row_begin = row_end;
    if (row < p.N) row_end = static_cast<int64_t>(p.rowptr_t[row + 1]);
  };

  // The run's CSC slots as one stream across sources: L destinations, edge ids and CSR slots
  // read with coalesced loads and broadcast by shuffle; each lane issues U gathers of
  // a destination's gradient and records before consuming any.
  for (int64_t base = mr.slot0; base < mr.slot1; base += L) {
    const int n = static_cast<int>(mr.slot1 - base < L ? mr.slot1 - base : L);
    I my_dst = 0, my_eid = 0, my_slot = 0;
    if (lane < n) {
      my_dst = __ldg(p.col_t + base + lane);
      my_eid = __ldg(p.perm_t + base + lane);
      my_slot = __ldg(p.slot_of + my_eid);
    }
    for (int t = 0; t < n; t += U) {
      Pack<T, V> gv[U];
      int64_t av[U][V];
      int64_t sv[U];
      A wv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t r = static_cast<int64_t>(__shfl_sync(mask, my_dst, t + u, L));
        const int64_t eid = static_cast<int64_t>(__shfl_sync(mask, my_eid, t + u, L));
        sv[u] = static_cast<int64_t>(__shfl_sync(mask, my_slot, t + u, L));
        wv[u] = A(1);
        if (active && t + u < n) {
          gv[u] = load_pack<T, V>(p.grad + r * p.F + f);
          const int64_t* ar = p.arg + r * p.F + f;
#pragma unroll
          for (int k = 0; k < V; ++k) av[u][k] = __ldg(reinterpret_cast<const long long*>(ar) + k);
          if (W) wv[u] = load_acc(p.weight + eid * p.H + h);
        }
      }
      // Consume in slot order, the operands always from index 0, shifting the others down:
      // constant indices only, so the gathered vectors stay in registers.
#pragma unroll 1
      for (int u = 0; u < U && t + u < n; ++u) {  // group-uniform bounds
        const int64_t slot = base + t + u;
        while (slot >= row_end) finish_row();  // also steps over sources with no edge
        if (active) {
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const A v = W ? mul_rn(to_acc(gv[0].v[k]), wv[0]) : to_acc(gv[0].v[k]);
            acc[k] += av[0][k] == sv[0] ? v : A(0);
          }
        }
#pragma unroll
        for (int q = 0; q + 1 < U; ++q) {
          gv[q] = gv[q + 1];
          wv[q] = wv[q + 1];
          sv[q] = sv[q + 1];
#pragma unroll
          for (int k = 0; k < V; ++k) av[q][k] = av[q + 1][k];
        }
      }
    }
  }
  while (row < mr.row1) finish_row();  // sources whose end (or emptiness) closes the run
  const int64_t tail_begin = row_begin > mr.slot0 ? row_begin : mr.slot0;
  if (mr.row1 < p.N && mr.slot1 > tail_begin)  // row1 continues in the next group(s)
    route_partial<T, I, V>(p, active, f, tail_slot(g), acc);
}

// Pass 2. One warp per (group, 32 features); only groups that finish a cut source do work: its
// partial sums (the tail slots of groups ga..g-1, then g's head slot) added in group order.
template <typename T, typename I>
__global__ void __launch_bounds__(256) arg_route_fixup_kernel(const ArgRouteParams<T, I> p) {
  using A = acc_t<T>;
  const int lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (g >= p.groups) return;
  const int64_t r = p.head_row[g];
  if (r < 0) return;
  const int64_t f = static_cast<int64_t>(blockIdx.y) * kWarpSize + lane;
  if (f >= p.F) return;
  const int64_t ga = group_of_first_edge(r, static_cast<int64_t>(p.rowptr_t[r]), p.items);
  A acc = A(0);
  for (int64_t q = ga; q <= g; ++q) acc += p.part[(q < g ? tail_slot(q) : head_slot(g)) * p.F + f];
  p.out[r * p.F + f] = from_acc<T>(acc);
}

template <typename T, typename I, bool W, int V>
cudaError_t arg_route_launch_v(const ArgRouteParams<T, I>& p, const GroupConfig& cfg, cudaStream_t stream) {
  if (!group_block_ok(cfg)) return cudaErrorInvalidConfiguration;
  const int64_t tile = static_cast<int64_t>(cfg.lanes) * V;
  const dim3 block(static_cast<unsigned>(cfg.lanes * cfg.groups_per_block));
  const dim3 grid(static_cast<unsigned>(ceil_div(p.groups, cfg.groups_per_block)),
                  static_cast<unsigned>(ceil_div(p.F, tile)));
  arg_route_kernel<T, I, W, V><<<grid, block, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  constexpr int kFixWarps = 8;
  const dim3 fgrid(static_cast<unsigned>(ceil_div(p.groups, kFixWarps)),
                   static_cast<unsigned>(ceil_div(p.F, kWarpSize)));
  arg_route_fixup_kernel<T, I><<<fgrid, dim3(kFixWarps * kWarpSize), 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, typename I, bool W>
cudaError_t arg_route_launch_w(const ArgRouteParams<T, I>& p, const GroupConfig& cfg, cudaStream_t stream) {
  constexpr int V0 = VecSet<T>::w[0], V1 = VecSet<T>::w[1];
  if (cfg.vec == V0) return arg_route_launch_v<T, I, W, V0>(p, cfg, stream);
  if (cfg.vec == V1) return arg_route_launch_v<T, I, W, V1>(p, cfg, stream);
  return arg_route_launch_v<T, I, W, 1>(p, cfg, stream);
}

// Launches both passes on `stream`. The caller has validated both structures, filled slot_of
// (invert_perm_launch), sized the scratch (part: 2 * groups * F accumulators, head_row: groups)
// and chosen cfg (spmm's rule for a sum over the CSC) with cfg.vec dividing C and grad / out
// aligned to it.
template <typename T, typename I>
cudaError_t arg_route_launch(const ArgRouteParams<T, I>& p, const GroupConfig& cfg, cudaStream_t stream) {
  return p.weight != nullptr ? arg_route_launch_w<T, I, true>(p, cfg, stream)
                             : arg_route_launch_w<T, I, false>(p, cfg, stream);
}

template <typename T, typename I>
struct ArgEdgeDotParams {
  const I* rowptr;      // [M + 1] CSR
  const I* col;         // [E] source of CSR slot j
  const I* perm;        // [E] original edge id of CSR slot j
  const T* x;           // [N, F]
  const int64_t* arg;   // [M, F]
  const T* grad;        // [M, F]
  acc_t<T>* out;        // [E, H] in original edge order, zeroed by the caller
  int64_t M, F, H, C;   // F = H * C
};

template <typename T, typename I>
__global__ void __launch_bounds__(256) arg_edge_dot_kernel(const ArgEdgeDotParams<T, I> p) {
  using A = acc_t<T>;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.M * p.H) return;
  const int64_t r = idx / p.H, h = idx - r * p.H;
  const int64_t begin = static_cast<int64_t>(p.rowptr[r]), end = static_cast<int64_t>(p.rowptr[r + 1]);
  if (begin == end) return;
  const int64_t* ar = p.arg + r * p.F + h * p.C;
  const T* gr = p.grad + r * p.F + h * p.C;
  for (int64_t c = 0; c < p.C; ++c) {
    const int64_t j = static_cast<int64_t>(__ldg(reinterpret_cast<const long long*>(ar) + c));
    if (j < begin || j >= end) continue;
    const int64_t s = static_cast<int64_t>(p.col[j]), e = static_cast<int64_t>(p.perm[j]);
    const int64_t f = h * p.C + c;
    p.out[e * p.H + h] += mul_rn(load_acc(p.x + s * p.F + f), to_acc(gr[c]));
  }
}

// The caller has validated the structure (col < N, perm a permutation) and zeroed out.
template <typename T, typename I>
cudaError_t arg_edge_dot_launch(const ArgEdgeDotParams<T, I>& p, cudaStream_t stream) {
  const int64_t threads = p.M * p.H;
  if (threads == 0) return cudaSuccess;
  arg_edge_dot_kernel<T, I><<<static_cast<unsigned>(ceil_div(threads, 256)), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace gnncompile
