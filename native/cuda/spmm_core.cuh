// Fused gather -> (weight) -> segment reduce over a CSR-by-destination structure, on the GPU.
// Torch-free: plain pointers and templates; the glue in spmm.cu binds it to torch.
//
// Work split. A group of L lanes (L = 1..32, part of one warp) owns a run of K items of the
// merge of row ends and edge slots (see merge_path_search in common.cuh): every group does the
// same amount of work whatever the degree distribution, so a power-law hub with 100k edges is
// spread over many groups instead of serialising one. Each lane owns V consecutive features
// (one vector load: float4, 8 x half, double2, ...), the group covers L*V features, and wider
// rows are covered by more feature tiles (gridDim.y). No atomics anywhere:
//
//   pass 1 (spmm_kernel): a row that starts and ends inside one group is reduced in edge
//     order and written once. A row cut by group boundaries leaves partial results in
//     per-group scratch slots: the "tail" slot of every group that starts or continues it,
//     the "head" slot of the group that finishes it.
//   pass 2 (spmm_fixup_kernel): the finishing group of every cut row combines those slots in
//     group order (= CSR edge order) and writes the row once.
//
// The cut points depend only on (rowptr, K), so the result is bit-for-bit reproducible for a
// given structure and knobs. Max/min follow the CPU core's rule (arg_takes in macros.h): the
// first edge enters, a NaN propagates, ties go to the first CSR slot; runs of a cut row are
// combined in order with the same rule, which gives the sequential result.
#pragma once
#include "common.cuh"

namespace gnncompile {
namespace gpu {

template <typename T, typename I>
struct SpmmParams {
  const I* rowptr;        // [M + 1]
  const I* col;           // [E] source node of CSR slot j
  const I* perm;          // [E] original edge id of CSR slot j (to read the weight)
  const T* weight;        // [E] or [E, H] in original edge order, or nullptr
  const T* x;             // [N, F]
  T* out;                 // [M, F]
  int64_t* arg;           // [M, F] chosen CSR slot (max/min), -1 for rows with no edge
  acc_t<T>* part;         // [2 * groups, F] partial results of rows cut by group boundaries
  int64_t* part_arg;      // [2 * groups, F] their chosen slots (max/min), else unused
  int64_t* head_row;      // [groups] row whose head partial group g holds, or -1
  int64_t M, E;
  int64_t F;              // features per node (all heads)
  int64_t H, C;           // weight columns, features per column (F = H * C; H = 1 unless per-head)
  int64_t items;          // K: merge items (rows + edges) per group
  int64_t groups;         // ceil((M + E) / K)
  int lanes;              // L: lanes per group, power of two <= 32
  int reduce;             // Reduce
};

// What one lane needs to know about its place in the launch.
struct SpmmLane {
  int L;          // lanes per group
  int lane;       // 0..L-1
  unsigned mask;  // this group's lanes
  int64_t f;      // first feature of this lane's vector
  bool active;    // f < F
  int64_t h;      // weight column of this lane's features
  bool is_min, is_mean;
};

constexpr int kSpmmUnroll = 4;  // gathered rows in flight per lane

template <typename T, bool ARG, int V>
__device__ __forceinline__ void spmm_init(const SpmmLane& c, acc_t<T> (&acc)[V], int64_t (&best)[V]) {
  using A = acc_t<T>;
  const A init = ARG ? (c.is_min ? -neg_inf<A>() : neg_inf<A>()) : A(0);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    acc[k] = init;
    best[k] = -1;
  }
}

// Folds one gathered message (CSR slot `slot`) into the lane's accumulators.
template <typename T, bool ARG, bool W, int V>
__device__ __forceinline__ void spmm_fold(const SpmmLane& c, const Pack<T, V>& xv, acc_t<T> w, int64_t slot,
                                          acc_t<T> (&acc)[V], int64_t (&best)[V]) {
  using A = acc_t<T>;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    A v = to_acc(xv.v[k]);
    if (W) v = w * v;
    if (!ARG) {
      acc[k] += v;
    } else {
      arg_fold(c.is_min, v, arg_code(slot, v != v), acc[k], best[k]);  // the CPU core's rule
    }
  }
}

// Final value of one output element from its reduced accumulator (mean scale; 0 and slot -1 for
// a row with no edge), as the CPU core computes it.
template <typename T, bool ARG>
__device__ __forceinline__ T spmm_final(bool is_mean, int64_t deg, acc_t<T> acc, int64_t& best) {
  using A = acc_t<T>;
  if (!ARG) {
    if (is_mean) acc = acc * (A(1) / static_cast<A>(deg > 0 ? deg : 1));
    return from_acc<T>(acc);
  }
  if (deg == 0) {
    best = -1;
    return from_acc<T>(A(0));
  }
  return from_acc<T>(acc);  // best != -1: the rule always takes a row's first edge
}

template <typename T, typename I, bool ARG, int V>
__device__ __forceinline__ void spmm_write_row(const SpmmParams<T, I>& p, const SpmmLane& c,
                                               int64_t row, int64_t begin, int64_t end,
                                               acc_t<T> (&acc)[V], int64_t (&best)[V]) {
  if (!c.active) return;
  Pack<T, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k)
    o.v[k] = spmm_final<T, ARG>(c.is_mean, end - begin, acc[k], best[k]);
  store_pack<T, V>(p.out + row * p.F + c.f, o);
  if (ARG) {
    int64_t* ar = p.arg + row * p.F + c.f;
#pragma unroll
    for (int k = 0; k < V; ++k) ar[k] = best[k];
  }
}

template <typename T, typename I, bool ARG, int V>
__device__ __forceinline__ void spmm_store_partial(const SpmmParams<T, I>& p, const SpmmLane& c,
                                                   int64_t slot, const acc_t<T> (&acc)[V],
                                                   const int64_t (&best)[V]) {
  if (!c.active) return;
  acc_t<T>* dst = p.part + slot * p.F + c.f;
#pragma unroll
  for (int k = 0; k < V; ++k) dst[k] = acc[k];
  if (ARG) {
    int64_t* da = p.part_arg + slot * p.F + c.f;
#pragma unroll
    for (int k = 0; k < V; ++k) da[k] = best[k];
  }
}

// Pass 1. Block = (blockDim.x / L) groups; gridDim.y = feature tiles of L * V features.
// Bounds: at least two resident blocks of 256 threads per SM, i.e. at most 128 registers a
// thread. ptxas (CUDA 13, sm_90) then keeps the variants at 59-122 registers, the float4 sum
// at 78 (3 blocks a SM, each lane with kSpmmUnroll 16-byte gathers in flight: ~48 KB in
// flight per SM); a bound of 4 blocks (64 registers) made the max/min and 16-bit variants
// spill. Not measured on a GPU yet: rows_per_block and this bound are the knobs to tune.
template <typename T, typename I, bool ARG, bool W, int V>
__global__ void __launch_bounds__(kMaxBlockThreads, 2) spmm_kernel(const SpmmParams<T, I> p) {
  using A = acc_t<T>;
  SpmmLane c;
  c.L = p.lanes;
  c.lane = static_cast<int>(threadIdx.x) & (c.L - 1);
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / c.L) + threadIdx.x / c.L;
  if (g >= p.groups) return;  // whole groups leave together: shuffles stay within a group
  c.mask = group_mask(c.L);
  c.f = (static_cast<int64_t>(blockIdx.y) * c.L + c.lane) * V;
  c.active = c.f < p.F;
  c.h = (W && c.active) ? c.f / p.C : 0;
  c.is_min = p.reduce == static_cast<int>(Reduce::Min);
  c.is_mean = p.reduce == static_cast<int>(Reduce::Mean);

  const MergeRange mr = merge_range(g, p.items, p.rowptr, p.M, p.E);
  int64_t row = mr.row0;  // < M: a non-empty run never starts at the end of the merge
  int64_t row_begin = static_cast<int64_t>(p.rowptr[row]);
  int64_t row_end = static_cast<int64_t>(p.rowptr[row + 1]);
  const bool first_started_here = mr.slot0 == row_begin;
  if (blockIdx.y == 0 && c.lane == 0)
    p.head_row[g] = (mr.row1 > mr.row0 && !first_started_here) ? mr.row0 : -1;

  A acc[V];
  int64_t best[V];
  spmm_init<T, ARG, V>(c, acc, best);
  // All edges of `row` in this run are folded: write it (or, for a first row begun by an
  // earlier group, leave the head partial) and move on to the next row.
  auto finish_row = [&]() {
    if (row > mr.row0 || first_started_here)
      spmm_write_row<T, I, ARG, V>(p, c, row, row_begin, row_end, acc, best);
    else
      spmm_store_partial<T, I, ARG, V>(p, c, head_slot(g), acc, best);
    spmm_init<T, ARG, V>(c, acc, best);
    ++row;
    row_begin = row_end;
    if (row < p.M) row_end = static_cast<int64_t>(p.rowptr[row + 1]);
  };

  // The run's edge slots as one stream, across row boundaries: the group reads L column
  // indices (and edge ids) with one coalesced load and broadcasts them by shuffle, and each
  // lane issues kSpmmUnroll vector gathers before consuming any, so short rows (most rows of
  // a power-law graph) still keep several gathers in flight.
  for (int64_t base = mr.slot0; base < mr.slot1; base += c.L) {
    const int n = static_cast<int>(mr.slot1 - base < c.L ? mr.slot1 - base : c.L);
    I my_col = 0, my_perm = 0;
    if (c.lane < n) {
      my_col = __ldg(p.col + base + c.lane);
      if (W) my_perm = __ldg(p.perm + base + c.lane);
    }
    for (int t = 0; t < n; t += kSpmmUnroll) {
      Pack<T, V> xv[kSpmmUnroll];
      A wv[kSpmmUnroll];
#pragma unroll
      for (int u = 0; u < kSpmmUnroll; ++u) {
        const int64_t src = static_cast<int64_t>(__shfl_sync(c.mask, my_col, t + u, c.L));
        const int64_t eid = W ? static_cast<int64_t>(__shfl_sync(c.mask, my_perm, t + u, c.L)) : 0;
        wv[u] = A(1);
        if (c.active && t + u < n) {
          xv[u] = load_pack<T, V>(p.x + src * p.F + c.f);
          if (W) wv[u] = load_acc(p.weight + eid * p.H + c.h);
        }
      }
      // Consume in slot order. The loop stays rolled (one inlined copy of finish_row) and
      // reads its operand from xv[0], shifting the others down: constant indices only, so the
      // gathered vectors stay in registers.
#pragma unroll 1
      for (int u = 0; u < kSpmmUnroll && t + u < n; ++u) {  // group-uniform bounds
        const int64_t slot = base + t + u;
        while (slot >= row_end) finish_row();  // also steps over rows with no edge
        if (c.active) spmm_fold<T, ARG, W, V>(c, xv[0], wv[0], slot, acc, best);
#pragma unroll
        for (int k = 0; k + 1 < kSpmmUnroll; ++k) {
          xv[k] = xv[k + 1];
          wv[k] = wv[k + 1];
        }
      }
    }
  }
  while (row < mr.row1) finish_row();  // rows whose end (or emptiness) closes the run
  const int64_t tail_begin = row_begin > mr.slot0 ? row_begin : mr.slot0;
  if (mr.row1 < p.M && mr.slot1 > tail_begin)  // row1 continues in the next group(s)
    spmm_store_partial<T, I, ARG, V>(p, c, tail_slot(g), acc, best);
}

// Pass 2. One warp per (group, 32 features); only groups that finish a cut row do work.
// Row r was cut: its first edge was consumed by group ga, groups ga..g-1 hold it in their tail
// slots (every group in between lies wholly inside r), and g holds the rest in its head slot.
template <typename T, typename I, bool ARG>
__global__ void __launch_bounds__(256) spmm_fixup_kernel(const SpmmParams<T, I> p) {
  using A = acc_t<T>;
  const int lane = static_cast<int>(threadIdx.x) & (kWarpSize - 1);
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (g >= p.groups) return;
  const int64_t r = p.head_row[g];
  if (r < 0) return;
  const int64_t f = static_cast<int64_t>(blockIdx.y) * kWarpSize + lane;
  if (f >= p.F) return;
  const bool is_min = p.reduce == static_cast<int>(Reduce::Min);
  const bool is_mean = p.reduce == static_cast<int>(Reduce::Mean);
  const int64_t begin = static_cast<int64_t>(p.rowptr[r]);
  const int64_t end = static_cast<int64_t>(p.rowptr[r + 1]);
  const int64_t ga = group_of_first_edge(r, begin, p.items);

  A acc = ARG ? (is_min ? -neg_inf<A>() : neg_inf<A>()) : A(0);
  int64_t best = -1;
  constexpr int kBatch = 8;  // partials in flight
  for (int64_t q0 = ga; q0 <= g; q0 += kBatch) {
    A v[kBatch];
    int64_t s[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t q = q0 + b;
      if (q <= g) {
        const int64_t slot = q < g ? tail_slot(q) : head_slot(g);
        v[b] = p.part[slot * p.F + f];
        if (ARG) s[b] = p.part_arg[slot * p.F + f];
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (q0 + b <= g) {
        if (!ARG) {
          acc += v[b];
        } else {
          // a partial whose slot is -1 folded nothing (its feature is past F, or it is empty);
          // the others carry their own tie / NaN record
          if (s[b] != -1) arg_fold(is_min, v[b], s[b], acc, best);
        }
      }
    }
  }
  p.out[r * p.F + f] = spmm_final<T, ARG>(is_mean, end - begin, acc, best);
  if (ARG) p.arg[r * p.F + f] = best;
}

// ------------------------------------------------------------------------------ launch
template <typename T, typename I, bool ARG, bool W, int V>
cudaError_t spmm_launch_v(const SpmmParams<T, I>& p, const GroupConfig& cfg, cudaStream_t stream) {
  const int64_t tile = static_cast<int64_t>(cfg.lanes) * V;
  if (!group_block_ok(cfg)) return cudaErrorInvalidConfiguration;
  const dim3 block(static_cast<unsigned>(cfg.lanes * cfg.groups_per_block));
  const dim3 grid(static_cast<unsigned>(ceil_div(p.groups, cfg.groups_per_block)),
                  static_cast<unsigned>(ceil_div(p.F, tile)));
  spmm_kernel<T, I, ARG, W, V><<<grid, block, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  constexpr int kFixWarps = 8;
  const dim3 fgrid(static_cast<unsigned>(ceil_div(p.groups, kFixWarps)),
                   static_cast<unsigned>(ceil_div(p.F, kWarpSize)));
  spmm_fixup_kernel<T, I, ARG><<<fgrid, dim3(kFixWarps * kWarpSize), 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, typename I, bool ARG, bool W>
cudaError_t spmm_launch_w(const SpmmParams<T, I>& p, const GroupConfig& cfg, cudaStream_t stream) {
  constexpr int V0 = VecSet<T>::w[0], V1 = VecSet<T>::w[1];
  if (cfg.vec == V0) return spmm_launch_v<T, I, ARG, W, V0>(p, cfg, stream);
  if (cfg.vec == V1) return spmm_launch_v<T, I, ARG, W, V1>(p, cfg, stream);
  return spmm_launch_v<T, I, ARG, W, 1>(p, cfg, stream);
}

// Launches both passes on `stream`. The caller has validated the structure, sized the scratch
// (part: 2 * groups * F accumulators, part_arg: as many int64 for max/min, head_row: groups)
// and chosen cfg with cfg.vec in VecSet<T>, dividing C, with x and out aligned to it.
template <typename T, typename I>
cudaError_t spmm_launch(const SpmmParams<T, I>& p, const GroupConfig& cfg, cudaStream_t stream) {
  const bool arg = p.reduce == static_cast<int>(Reduce::Max) || p.reduce == static_cast<int>(Reduce::Min);
  const bool w = p.weight != nullptr;
  if (arg) {
    return w ? spmm_launch_w<T, I, true, true>(p, cfg, stream)
             : spmm_launch_w<T, I, true, false>(p, cfg, stream);
  }
  return w ? spmm_launch_w<T, I, false, true>(p, cfg, stream)
           : spmm_launch_w<T, I, false, false>(p, cfg, stream);
}

}  // namespace gpu
}  // namespace gnncompile
