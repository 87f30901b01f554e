// Softmax of per-edge scores over a CSR-by-destination structure, on the GPU. Torch-free.
//   edge_softmax:          softmax of scores[e, h] over the edges that share a destination,
//                          max-shifted, divided by (sum + 1e-16), an all -inf row shifted by 0
//   edge_softmax_backward: grad[e, h] = y[e, h] * (g[e, h] - sum_row(g * y))
// Per-edge tensors are read and written in original edge order through perm. Semantics match
// native/cpu/edge_softmax_core.h; summation order differs (lane-parallel), within rounding.
//
// Both split the merge of (row ends, edge slots) into equal runs of K items, one run per group
// (see common.cuh), so hubs of power-law graphs are shared by many groups, and reduce per row:
// a row inside one run is finished in one pass; a row cut by runs is reduced in three passes
// over a fixed partition, deterministic and without atomics:
//   1. each group writes its rows' outputs, and per-head partial statistics of cut rows
//      (softmax: running max and the sum of exp(s - max); backward: sum of y * g) into its
//      head/tail scratch slots;
//   2. the group that finishes a cut row folds the slots in group order into its head slot;
//   3. every group that holds part of a cut row writes that part's outputs.
#pragma once
#include "common.cuh"

namespace gnncompile {
namespace gpu {

template <typename T, typename I>
struct EdgeSegParams {
  const I* rowptr;     // [M + 1]
  const I* perm;       // [E]
  const T* a;          // softmax: scores [E, H]; backward: out (y) [E, H]
  const T* b;          // backward: grad [E, H]; softmax: unused
  T* out;              // [E, H]
  acc_t<T>* stat;      // [2 * groups, H, 2] partial statistics of cut rows
  int64_t* head_row;   // [groups]
  int64_t M, E, H;
  int64_t items, groups;
  int head_lanes;      // Hp = min(32, next_pow2(H)); 32 / Hp edges per pass
};

// Statistics of a run of one row's edges for one head. Softmax: m = max (raw, -inf when every
// score is -inf or NaN), s = sum exp(score - guard(m)); backward: s = sum y * g.
template <typename A>
struct SegStat {
  A m, s;
};

template <typename A>
__device__ __forceinline__ A guard_max(A m) {
  return m == neg_inf<A>() ? A(0) : m;  // CPU: an all -inf row is shifted by 0, not by -inf
}

// Folds statistics of a later run `q` into `acc` (softmax: rescale both sums to the new max).
template <bool BWD, typename A>
__device__ __forceinline__ SegStat<A> seg_merge(SegStat<A> acc, SegStat<A> q) {
  if (BWD) return {A(0), acc.s + q.s};
  const A m = max_keep(acc.m, q.m);
  const A mg = guard_max(m);
  // A run whose max is -inf has s = 0 (or NaN from a NaN score): it contributes s * 0.
  const A fa = acc.m == neg_inf<A>() ? A(0) : acc_exp(acc.m - mg);
  const A fq = q.m == neg_inf<A>() ? A(0) : acc_exp(q.m - mg);
  return {m, acc.s * fa + q.s * fq};
}

// Lane layout: one warp per group; lane = e * Hp + hl works on head h0 + hl of every
// (32 / Hp)-th edge of the run. Reductions run over the lanes of one head (xor >= Hp).
struct SegLane {
  int lane, hp, pe, e, hl;
};

template <bool BWD, typename T, typename I>
__device__ __forceinline__ SegStat<acc_t<T>> seg_stats(const EdgeSegParams<T, I>& p, const SegLane& c,
                                                       int64_t jb, int64_t je, int64_t h) {
  using A = acc_t<T>;
  const bool hv = h < p.H;
  SegStat<A> st{neg_inf<A>(), A(0)};
  if (!BWD) {
    A m = neg_inf<A>();
    if (hv)
      for (int64_t j = jb + c.e; j < je; j += c.pe)
        m = max_keep(m, load_acc(p.a + static_cast<int64_t>(__ldg(p.perm + j)) * p.H + h));
    for (int o = kWarpSize >> 1; o >= c.hp; o >>= 1) m = max_keep(m, __shfl_xor_sync(0xffffffffu, m, o));
    st.m = m;
  }
  const A mg = guard_max(st.m);
  A s = 0;
  if (hv) {
    for (int64_t j = jb + c.e; j < je; j += c.pe) {
      const int64_t idx = static_cast<int64_t>(__ldg(p.perm + j)) * p.H + h;
      if (BWD) s += load_acc(p.a + idx) * load_acc(p.b + idx);
      else s += acc_exp(load_acc(p.a + idx) - mg);
    }
  }
  for (int o = kWarpSize >> 1; o >= c.hp; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  st.s = s;
  return st;
}

template <bool BWD, typename T, typename I>
__device__ __forceinline__ void seg_write(const EdgeSegParams<T, I>& p, const SegLane& c, int64_t jb,
                                          int64_t je, int64_t h, SegStat<acc_t<T>> st) {
  using A = acc_t<T>;
  if (h >= p.H) return;
  const A mg = guard_max(st.m);
  const A inv = A(1) / (st.s + A(1e-16));
  for (int64_t j = jb + c.e; j < je; j += c.pe) {
    const int64_t idx = static_cast<int64_t>(__ldg(p.perm + j)) * p.H + h;
    const A a = load_acc(p.a + idx);
    A r;
    if (BWD) r = a * (load_acc(p.b + idx) - st.s);
    else r = acc_exp(a - mg) * inv;
    p.out[idx] = from_acc<T>(r);
  }
}

template <typename T>
__device__ __forceinline__ void seg_store(acc_t<T>* stat, int64_t slot, int64_t H, int64_t h,
                                          SegStat<acc_t<T>> st) {
  acc_t<T>* d = stat + (slot * H + h) * 2;
  d[0] = st.m;
  d[1] = st.s;
}

template <typename T>
__device__ __forceinline__ SegStat<acc_t<T>> seg_load(const acc_t<T>* stat, int64_t slot, int64_t H,
                                                      int64_t h) {
  const acc_t<T>* d = stat + (slot * H + h) * 2;
  return {d[0], d[1]};
}

__device__ __forceinline__ SegLane seg_lane(int head_lanes) {
  SegLane c;
  c.lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
  c.hp = head_lanes;
  c.pe = kWarpSize / head_lanes;
  c.e = c.lane / head_lanes;
  c.hl = c.lane & (head_lanes - 1);
  return c;
}

// Pass 1: rows that lie inside the group's run are finished; cut rows leave statistics.
template <bool BWD, typename T, typename I>
__global__ void __launch_bounds__(256) edge_seg_kernel(const EdgeSegParams<T, I> p) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (g >= p.groups) return;
  const SegLane c = seg_lane(p.head_lanes);
  const MergeRange mr = merge_range(g, p.items, p.rowptr, p.M, p.E);
  const bool first_started_here = mr.slot0 == static_cast<int64_t>(p.rowptr[mr.row0]);
  if (c.lane == 0) p.head_row[g] = (mr.row1 > mr.row0 && !first_started_here) ? mr.row0 : -1;

  int64_t j = mr.slot0;
  for (int64_t row = mr.row0; row < mr.row1; ++row) {
    const int64_t end = static_cast<int64_t>(p.rowptr[row + 1]);
    const bool whole = row > mr.row0 || first_started_here;
    for (int64_t h0 = 0; h0 < p.H; h0 += c.hp) {
      const int64_t h = h0 + c.hl;
      const SegStat<acc_t<T>> st = seg_stats<BWD>(p, c, j, end, h);
      if (whole) seg_write<BWD>(p, c, j, end, h, st);
      else if (c.e == 0 && h < p.H) seg_store<T>(p.stat, head_slot(g), p.H, h, st);
    }
    j = end;
  }
  if (mr.row1 < p.M && j < mr.slot1) {
    for (int64_t h0 = 0; h0 < p.H; h0 += c.hp) {
      const int64_t h = h0 + c.hl;
      const SegStat<acc_t<T>> st = seg_stats<BWD>(p, c, j, mr.slot1, h);
      if (c.e == 0 && h < p.H) seg_store<T>(p.stat, tail_slot(g), p.H, h, st);
    }
  }
}

// Pass 2: the group that finishes a cut row folds tail slots ga..g-1 and its head slot, in
// that order, and leaves the row's final statistics in its head slot.
template <bool BWD, typename T, typename I>
__global__ void __launch_bounds__(256) edge_seg_fixup_kernel(const EdgeSegParams<T, I> p) {
  using A = acc_t<T>;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (g >= p.groups) return;
  const int64_t r = p.head_row[g];
  if (r < 0) return;
  const int lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
  const int64_t ga = group_of_first_edge(r, static_cast<int64_t>(p.rowptr[r]), p.items);
  constexpr int kBatch = 8;  // slots in flight: a hub can span hundreds of groups
  for (int64_t h = lane; h < p.H; h += kWarpSize) {
    SegStat<A> acc{neg_inf<A>(), A(0)};
    for (int64_t q0 = ga; q0 <= g; q0 += kBatch) {
      SegStat<A> v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (q0 + b <= g)
          v[b] = seg_load<T>(p.stat, q0 + b < g ? tail_slot(q0 + b) : head_slot(g), p.H, h);
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (q0 + b <= g) acc = seg_merge<BWD>(acc, v[b]);
    }
    seg_store<T>(p.stat, head_slot(g), p.H, h, acc);
  }
}

// Pass 3: outputs of the parts of cut rows, with the final statistics of each row (held in
// the head slot of the group that finishes it).
template <bool BWD, typename T, typename I>
__global__ void __launch_bounds__(256) edge_seg_finish_kernel(const EdgeSegParams<T, I> p) {
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (g >= p.groups) return;
  const SegLane c = seg_lane(p.head_lanes);
  const MergeRange mr = merge_range(g, p.items, p.rowptr, p.M, p.E);
  const int64_t r = p.head_row[g];
  if (r >= 0) {  // r == mr.row0, cut, finished here: edges [slot0, rowptr[r + 1])
    const int64_t end = static_cast<int64_t>(p.rowptr[r + 1]);
    for (int64_t h0 = 0; h0 < p.H; h0 += c.hp) {
      const int64_t h = h0 + c.hl;
      if (h < p.H) seg_write<BWD>(p, c, mr.slot0, end, h, seg_load<T>(p.stat, head_slot(g), p.H, h));
    }
  }
  const int64_t j = mr.row1 > mr.row0 ? static_cast<int64_t>(p.rowptr[mr.row1]) : mr.slot0;
  if (mr.row1 < p.M && j < mr.slot1) {  // tail: row1 continues and is finished by a later group
    const int64_t gb = group_of_row_end(mr.row1, static_cast<int64_t>(p.rowptr[mr.row1 + 1]), p.items);
    for (int64_t h0 = 0; h0 < p.H; h0 += c.hp) {
      const int64_t h = h0 + c.hl;
      if (h < p.H) seg_write<BWD>(p, c, j, mr.slot1, h, seg_load<T>(p.stat, head_slot(gb), p.H, h));
    }
  }
}

constexpr int kSegWarpsPerBlock = 8;

// Launches the three passes on `stream`. The caller has validated the structure and sized the
// scratch: stat holds 2 * groups * H * 2 accumulators, head_row `groups` int64.
template <bool BWD, typename T, typename I>
cudaError_t edge_seg_launch(const EdgeSegParams<T, I>& p, cudaStream_t stream) {
  const dim3 block(kSegWarpsPerBlock * kWarpSize);
  const dim3 grid(static_cast<unsigned>(ceil_div(p.groups, kSegWarpsPerBlock)));
  edge_seg_kernel<BWD, T, I><<<grid, block, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  edge_seg_fixup_kernel<BWD, T, I><<<grid, block, 0, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  edge_seg_finish_kernel<BWD, T, I><<<grid, block, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace gnncompile
