// Device-side range checks, run before any kernel indexes memory through user-supplied indices:
// an index out of range must become a Python exception, never an illegal address that poisons
// the CUDA context. One fused pass reduces everything the host needs to decide, and the host
// reads back a handful of integers. Torch-free.
#pragma once
#include <climits>

#include "common.cuh"

namespace gnncompile {
namespace gpu {

// Layout of the statistics buffer (long long each).
enum StructStat : int {
  kRowptrFirst = 0,  // rowptr[0]
  kRowptrLast = 1,   // rowptr[M]
  kFirstDecrease = 2,// smallest r with rowptr[r + 1] < rowptr[r], LLONG_MAX if none
  kColMin = 3, kColMax = 4,
  kPermMin = 5, kPermMax = 6,
  kNumStructStats = 7
};

// Minimum and maximum over the warp, then one atomic per warp.
__device__ __forceinline__ void warp_min_max_atomic(long long* lo_out, long long* hi_out, long long lo,
                                                    long long hi) {
#pragma unroll
  for (int o = kWarpSize >> 1; o > 0; o >>= 1) {
    const long long olo = __shfl_xor_sync(0xffffffffu, lo, o);
    const long long ohi = __shfl_xor_sync(0xffffffffu, hi, o);
    lo = olo < lo ? olo : lo;
    hi = ohi > hi ? ohi : hi;
  }
  if ((threadIdx.x & (kWarpSize - 1)) == 0) {
    if (lo_out != nullptr) atomicMin(lo_out, lo);
    if (hi_out != nullptr) atomicMax(hi_out, hi);
  }
}

// Resets a statistics buffer: slots [0, minima) start at LLONG_MAX, then pairs (min, max)
// start at (LLONG_MAX, LLONG_MIN). A template only so that every translation unit may hold it.
template <typename Unused = void>
__global__ void __launch_bounds__(32) stats_init_kernel(long long* stats, int n, int minima) {
  const int i = threadIdx.x;
  if (i < n) stats[i] = (i < minima || ((i - minima) % 2 == 0)) ? LLONG_MAX : LLONG_MIN;
}

// stats (kNumStructStats): see StructStat. col may be nullptr (then kColMin/Max stay untouched).
// The grid must be a whole number of warps (blockDim a multiple of 32).
template <typename I>
__global__ void __launch_bounds__(256) structure_stats_kernel(const I* rowptr, int64_t M, const I* col,
                                                              const I* perm, int64_t E,
                                                              long long* stats) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tid == 0) {
    stats[kRowptrFirst] = static_cast<long long>(rowptr[0]);
    stats[kRowptrLast] = static_cast<long long>(rowptr[M]);
  }
  long long first_dec = LLONG_MAX;
  long long cmin = LLONG_MAX, cmax = LLONG_MIN, pmin = LLONG_MAX, pmax = LLONG_MIN;
  const int64_t n = M > E ? M : E;
  for (int64_t i = tid; i < n; i += stride) {
    if (i < M && rowptr[i + 1] < rowptr[i] && i < first_dec) first_dec = i;
    if (i < E) {
      if (col != nullptr) {
        const long long c = static_cast<long long>(col[i]);
        cmin = c < cmin ? c : cmin;
        cmax = c > cmax ? c : cmax;
      }
      const long long q = static_cast<long long>(perm[i]);
      pmin = q < pmin ? q : pmin;
      pmax = q > pmax ? q : pmax;
    }
  }
  warp_min_max_atomic(&stats[kFirstDecrease], nullptr, first_dec, LLONG_MIN);
  if (col != nullptr) warp_min_max_atomic(&stats[kColMin], &stats[kColMax], cmin, cmax);
  warp_min_max_atomic(&stats[kPermMin], &stats[kPermMax], pmin, pmax);
}

// Grid size for grid-stride reductions: enough blocks to fill the device, no more than needed.
inline unsigned reduction_blocks(int64_t n, int sm_count) {
  const int64_t want = ceil_div(n > 0 ? n : 1, 256 * 8);
  const int64_t cap = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * 8;
  return static_cast<unsigned>(want < cap ? want : cap);
}

// Fills stats (device, kNumStructStats long longs) for the host to check.
template <typename I>
cudaError_t structure_stats_launch(const I* rowptr, int64_t M, const I* col, const I* perm, int64_t E,
                                   long long* stats, int sm_count, cudaStream_t stream) {
  stats_init_kernel<><<<1, 32, 0, stream>>>(stats, kNumStructStats, kColMin);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  structure_stats_kernel<I><<<reduction_blocks(M > E ? M : E, sm_count), 256, 0, stream>>>(
      rowptr, M, col, perm, E, stats);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace gnncompile
