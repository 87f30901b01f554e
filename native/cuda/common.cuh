// Device-side building blocks shared by the CUDA kernel cores. Free of torch headers: plain
// pointers, CUDA's own 16-bit types (__half, __nv_bfloat16) and templates.
//
//   * storage type -> accumulator type (float for 16/32-bit storage, double for double)
//   * Pack<T, V>: V consecutive elements loaded or stored with one instruction (float4, half2,
//     8 x half in 16 bytes, double2, ...) through the read-only data path
//   * lane-group helpers: a "group" is L = 1, 2, 4, 8, 16 or 32 consecutive lanes of one warp
//     that work on the same destination row; shuffles are masked to the group so groups in one
//     warp may follow different control flow
//   * merge-path search: the balanced partition of (rows + edges) that every op uses to split
//     heavy rows of power-law graphs across groups deterministically
//   * launch shape: the compiled vector widths and the block of a lane-group launch
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>
#include <cstring>

#include "../common/macros.h"

namespace gnncompile {
namespace gpu {

constexpr int kWarpSize = 32;
// Largest block the lane-group kernels are compiled for (__launch_bounds__): lets ptxas give
// each thread up to 255 registers (a 1024-thread bound would cap it at 64 and spill the
// vectorised accumulators). knobs.h never asks for more.
constexpr int kMaxBlockThreads = 256;

// ------------------------------------------------------------------------------ types
template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
template <typename T> using acc_t = typename AccOf<T>::type;

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

// Rounds an accumulator to the storage type once, on the way out (round to nearest even).
template <typename T> struct FromAcc;
template <> struct FromAcc<float> {
  static __device__ __forceinline__ float apply(float v) { return v; }
};
template <> struct FromAcc<double> {
  static __device__ __forceinline__ double apply(double v) { return v; }
};
template <> struct FromAcc<__half> {
  static __device__ __forceinline__ __half apply(float v) { return __float2half_rn(v); }
};
template <> struct FromAcc<__nv_bfloat16> {
  static __device__ __forceinline__ __nv_bfloat16 apply(float v) { return __float2bfloat16_rn(v); }
};
template <typename T>
__device__ __forceinline__ T from_acc(acc_t<T> v) { return FromAcc<T>::apply(v); }

template <typename A> __device__ __forceinline__ A acc_exp(A v);
template <> __device__ __forceinline__ float acc_exp<float>(float v) { return expf(v); }
template <> __device__ __forceinline__ double acc_exp<double>(double v) { return exp(v); }

template <typename A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return -CUDART_INF_F; }
template <> __device__ __forceinline__ double neg_inf<double>() { return -CUDART_INF; }

// The CPU cores' max: std::max(m, v) == (m < v) ? v : m, so a NaN v is never taken.
template <typename A>
__device__ __forceinline__ A max_keep(A m, A v) { return (m < v) ? v : m; }

// ------------------------------------------------------------------------------ vector access
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int Bytes> struct Word;
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<16> { using type = uint4; };

// Read-only (non-coherent) load of V aligned elements: one ld.global.nc of 2..16 bytes.
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  using W = typename Word<sizeof(T) * V>::type;
  const W w = __ldg(reinterpret_cast<const W*>(p));
  Pack<T, V> r;
  memcpy(&r, &w, sizeof(W));
  return r;
}

template <typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& v) {
  using W = typename Word<sizeof(T) * V>::type;
  W w;
  memcpy(&w, &v, sizeof(W));
  *reinterpret_cast<W*>(p) = w;
}

template <typename T>
__device__ __forceinline__ acc_t<T> load_acc(const T* p) {
  return to_acc(load_pack<T, 1>(p).v[0]);
}

// ------------------------------------------------------------------------------ lane groups
// Mask of the L-lane group (L a power of two <= 32) that the calling lane belongs to. Groups
// start at multiples of L inside the warp because blocks hold a whole number of warps.
__device__ __forceinline__ unsigned group_mask(int L) {
  if (L >= kWarpSize) return 0xffffffffu;
  const unsigned lane = threadIdx.x & (kWarpSize - 1);
  return ((1u << L) - 1u) << (lane & ~static_cast<unsigned>(L - 1));
}

// ------------------------------------------------------------------------------ merge path
// Work is the merge of two lists: the M row ends (rowptr[1..M]) and the E edge slots 0..E-1.
// Diagonal d of the merge is the point (row, slot) with row + slot = d, where `row` rows are
// complete and `slot` edges consumed. Cutting the merge into equal runs of K items gives every
// group the same amount of work however skewed the degrees are, and the cut points depend only
// on (rowptr, K): the partition is fixed, so every reduction over it is deterministic.
template <typename I>
__host__ __device__ __forceinline__ void merge_path_search(int64_t diag, const I* rowptr,
                                                           int64_t M, int64_t E, int64_t& row,
                                                           int64_t& slot) {
  int64_t lo = diag - E > 0 ? diag - E : 0;
  int64_t hi = diag < M ? diag : M;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    // Row `mid` ends before edge (diag - mid - 1) is consumed: its end comes first.
    if (static_cast<int64_t>(rowptr[mid + 1]) <= diag - mid - 1) lo = mid + 1; else hi = mid;
  }
  row = lo;
  slot = diag - lo;
}

// The part of the merge one group owns: diagonals [g*K, min((g+1)*K, M+E)).
struct MergeRange {
  int64_t row0, slot0;  // start point
  int64_t row1, slot1;  // end point (exclusive)
};

template <typename I>
__host__ __device__ __forceinline__ MergeRange merge_range(int64_t group, int64_t items,
                                                           const I* rowptr, int64_t M, int64_t E) {
  MergeRange r;
  const int64_t total = M + E;
  int64_t d0 = group * items;
  int64_t d1 = d0 + items;
  if (d0 > total) d0 = total;
  if (d1 > total) d1 = total;
  merge_path_search(d0, rowptr, M, E, r.row0, r.slot0);
  merge_path_search(d1, rowptr, M, E, r.row1, r.slot1);
  return r;
}

// Group whose run of the merge consumes the first edge of row r (row r has >= 1 edge).
__host__ __device__ __forceinline__ int64_t group_of_first_edge(int64_t r, int64_t row_begin,
                                                                int64_t items) {
  return (r + row_begin) / items;
}

// Group whose run of the merge completes row r (consumes its row end).
__host__ __device__ __forceinline__ int64_t group_of_row_end(int64_t r, int64_t row_end,
                                                             int64_t items) {
  return (r + row_end) / items;
}

// Scratch slots: every group owns two, one for the row it finishes but did not start (head)
// and one for the row it starts or continues but does not finish (tail).
__host__ __device__ __forceinline__ int64_t head_slot(int64_t g) { return 2 * g; }
__host__ __device__ __forceinline__ int64_t tail_slot(int64_t g) { return 2 * g + 1; }

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ------------------------------------------------------------------------------ launch shape
// Vector widths compiled for each storage type (elements per lane load), widest first; the
// last entry is always 1. knobs.h (compiled_vec) picks among the same widths.
template <typename T> struct VecSet;
template <> struct VecSet<float> { static constexpr int w[3] = {4, 2, 1}; };
template <> struct VecSet<double> { static constexpr int w[3] = {2, 1, 1}; };
template <> struct VecSet<__half> { static constexpr int w[3] = {8, 2, 1}; };
template <> struct VecSet<__nv_bfloat16> { static constexpr int w[3] = {8, 2, 1}; };

// Launch shape of the lane-group kernels (spmm, edge_dot), from the knobs.
struct GroupConfig {
  int lanes;             // L
  int groups_per_block;  // rows_per_block knob: lane groups per thread block
  int vec;               // V, one of VecSet<T>
  int64_t items;         // K
};

// Whether cfg's block (lanes * groups_per_block threads) fits the kernels' launch bounds: at
// most kMaxBlockThreads threads and a whole number of warps.
inline bool group_block_ok(const GroupConfig& cfg) {
  const int threads = cfg.lanes * cfg.groups_per_block;
  return threads <= kMaxBlockThreads && threads % kWarpSize == 0;
}

}  // namespace gpu
}  // namespace gnncompile
