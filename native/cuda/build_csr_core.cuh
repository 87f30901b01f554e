// Graph-structure build on the GPU: a validated, stable sort of edges by destination. Torch-free.
//
//   1. edge_minmax: one fused min/max reduction over dst and src; the host checks the range
//      before any kernel indexes memory with them (first_bad_edge then names the culprit).
//   2. LSD radix sort of the destinations with the edge ids as values, 8 bits per pass, only
//      over the bits num_dst - 1 needs (1 pass up to 256 nodes, 3 up to 16.7M). Each pass is a
//      counting sort: per-tile digit histograms (shared-memory atomics: counts, so order does
//      not matter), an exclusive scan over (digit, tile) done by the caller, and a stable
//      placement in which each element's rank among equal digits of its tile comes from
//      __match_any_sync and a per-warp prefix, so edges keep their original order inside a row.
//      The last pass also writes col[j] = src[perm[j]].
//   3. rowptr[r] = lower_bound(sorted dst, r): no atomics, one binary search per row.
// O(E * passes + M log E) work; deterministic.
#pragma once
#include <climits>

#include "common.cuh"
#include "validate_core.cuh"

namespace gnncompile {
namespace gpu {

// stats: [dst min, dst max, src min, src max]. Launch with blockDim 256.
template <typename I>
__global__ void __launch_bounds__(256) edge_minmax_kernel(const I* dst, const I* src, int64_t E,
                                                          long long* stats) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  long long dmin = LLONG_MAX, dmax = LLONG_MIN, smin = LLONG_MAX, smax = LLONG_MIN;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < E; e += stride) {
    const long long d = static_cast<long long>(dst[e]);
    const long long s = static_cast<long long>(src[e]);
    dmin = d < dmin ? d : dmin;
    dmax = d > dmax ? d : dmax;
    smin = s < smin ? s : smin;
    smax = s > smax ? s : smax;
  }
  warp_min_max_atomic(&stats[0], &stats[1], dmin, dmax);
  warp_min_max_atomic(&stats[2], &stats[3], smin, smax);
}

// first[0] = smallest edge id whose dst or src is out of range (initialised to LLONG_MAX).
template <typename I>
__global__ void __launch_bounds__(256) first_bad_edge_kernel(const I* dst, const I* src, int64_t E,
                                                             int64_t num_dst, int64_t num_src,
                                                             long long* first) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  long long bad = LLONG_MAX;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < E; e += stride) {
    const int64_t d = static_cast<int64_t>(dst[e]);
    const int64_t s = static_cast<int64_t>(src[e]);
    // One unsigned compare covers both negative and too-large indices.
    if ((static_cast<uint64_t>(d) >= static_cast<uint64_t>(num_dst) ||
         static_cast<uint64_t>(s) >= static_cast<uint64_t>(num_src)) && e < bad)
      bad = e;
  }
  warp_min_max_atomic(first, nullptr, bad, LLONG_MIN);
}

template <typename I>
cudaError_t edge_minmax_launch(const I* dst, const I* src, int64_t E, long long* stats, int sm_count,
                               cudaStream_t stream) {
  stats_init_kernel<><<<1, 32, 0, stream>>>(stats, 4, 0);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  edge_minmax_kernel<I><<<reduction_blocks(E, sm_count), 256, 0, stream>>>(dst, src, E, stats);
  return cudaGetLastError();
}

template <typename I>
cudaError_t first_bad_edge_launch(const I* dst, const I* src, int64_t E, int64_t num_dst, int64_t num_src,
                                  long long* first, int sm_count, cudaStream_t stream) {
  stats_init_kernel<><<<1, 32, 0, stream>>>(first, 1, 1);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  first_bad_edge_kernel<I><<<reduction_blocks(E, sm_count), 256, 0, stream>>>(dst, src, E, num_dst,
                                                                                num_src, first);
  return cudaGetLastError();
}

// ------------------------------------------------------------------------------ radix sort
constexpr int kRadixBits = 8;
constexpr int kRadixBins = 1 << kRadixBits;
constexpr int kRadixThreads = kRadixBins;  // one thread per digit in the per-tile scans
constexpr int kRadixWarps = kRadixThreads / kWarpSize;
constexpr int kRadixItems = 16;            // chunks of kRadixThreads elements per tile
constexpr int64_t kRadixTile = static_cast<int64_t>(kRadixThreads) * kRadixItems;

// Sort passes needed for keys in [0, num_keys).
inline int radix_passes(int64_t num_keys) {
  int bits = 0;
  for (uint64_t v = num_keys > 1 ? static_cast<uint64_t>(num_keys - 1) : 0; v != 0; v >>= 1) ++bits;
  return (bits + kRadixBits - 1) / kRadixBits;
}

inline int64_t radix_tiles(int64_t n) { return ceil_div(n, kRadixTile); }

template <typename I>
__device__ __forceinline__ int radix_digit(I key, int shift) {
  return static_cast<int>((static_cast<uint64_t>(key) >> shift) & (kRadixBins - 1));
}

// hist[digit * tiles + tile] = number of keys of `tile` with that digit.
template <typename I>
__global__ void __launch_bounds__(kRadixThreads) radix_hist_kernel(const I* keys, int64_t n, int shift,
                                                                   int* hist, int64_t tiles) {
  __shared__ int cnt[kRadixBins];
  cnt[threadIdx.x] = 0;
  __syncthreads();
  const int64_t tile = blockIdx.x;
  const int64_t base = tile * kRadixTile;
#pragma unroll 4
  for (int i = 0; i < kRadixItems; ++i) {
    const int64_t idx = base + static_cast<int64_t>(i) * kRadixThreads + threadIdx.x;
    if (idx < n) atomicAdd(&cnt[radix_digit(keys[idx], shift)], 1);
  }
  __syncthreads();
  hist[static_cast<int64_t>(threadIdx.x) * tiles + tile] = cnt[threadIdx.x];
}

// Stable placement of one pass. incl = inclusive scan of hist (digit-major), so the first slot
// of (digit, tile) is incl - hist. vals_in == nullptr means the identity (edge ids, first pass);
// col_out != nullptr (last pass) also writes col_out[pos] = src[val].
template <typename I>
__global__ void __launch_bounds__(kRadixThreads) radix_scatter_kernel(
    const I* keys_in, const I* vals_in, I* keys_out, I* vals_out, const I* src, I* col_out, int64_t n,
    int shift, const int64_t* incl, const int* hist, int64_t tiles) {
  __shared__ int warp_cnt[kRadixWarps][kRadixBins];  // per chunk: count, then exclusive prefix
  __shared__ long long tile_base[kRadixBins];        // first output slot of (digit, this tile)
  __shared__ int chunk_start[kRadixBins];            // elements of the digit in earlier chunks
  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid & (kWarpSize - 1);
  const int64_t tile = blockIdx.x;
  {
    const int64_t h = static_cast<int64_t>(tid) * tiles + tile;
    tile_base[tid] = incl[h] - hist[h];
  }
  int running = 0;  // this thread's digit (tid): elements placed so far in the tile
  for (int i = 0; i < kRadixItems; ++i) {
#pragma unroll
    for (int w = 0; w < kRadixWarps; ++w) warp_cnt[w][tid] = 0;
    __syncthreads();
    const int64_t idx = tile * kRadixTile + static_cast<int64_t>(i) * kRadixThreads + tid;
    const bool valid = idx < n;
    I key = 0, val = 0;
    int d = kRadixBins;  // sentinel digit for lanes past the end
    if (valid) {
      key = keys_in[idx];
      val = vals_in != nullptr ? vals_in[idx] : static_cast<I>(idx);
      d = radix_digit(key, shift);
    }
    // Lanes of this warp with the same digit, and this lane's rank among them (lane order =
    // element order, so the placement is stable).
    const unsigned peers = __match_any_sync(0xffffffffu, d);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (valid && rank == 0) warp_cnt[warp][d] = __popc(peers);
    __syncthreads();
    {  // thread tid owns digit tid: exclusive prefix over warps (warp order = element order)
      int sum = 0;
#pragma unroll
      for (int w = 0; w < kRadixWarps; ++w) {
        const int c = warp_cnt[w][tid];
        warp_cnt[w][tid] = sum;
        sum += c;
      }
      chunk_start[tid] = running;
      running += sum;
    }
    __syncthreads();
    if (valid) {
      const int64_t pos = tile_base[d] + chunk_start[d] + warp_cnt[warp][d] + rank;
      if (keys_out != nullptr) keys_out[pos] = key;
      vals_out[pos] = val;
      if (col_out != nullptr) col_out[pos] = src[static_cast<int64_t>(val)];
    }
    __syncthreads();  // warp_cnt and chunk_start are rewritten by the next chunk
  }
}

template <typename I>
cudaError_t radix_hist_launch(const I* keys, int64_t n, int shift, int* hist, cudaStream_t stream) {
  const int64_t tiles = radix_tiles(n);
  radix_hist_kernel<I><<<static_cast<unsigned>(tiles), kRadixThreads, 0, stream>>>(keys, n, shift, hist, tiles);
  return cudaGetLastError();
}

template <typename I>
cudaError_t radix_scatter_launch(const I* keys_in, const I* vals_in, I* keys_out, I* vals_out, const I* src,
                                 I* col_out, int64_t n, int shift, const int64_t* incl, const int* hist,
                                 cudaStream_t stream) {
  const int64_t tiles = radix_tiles(n);
  radix_scatter_kernel<I><<<static_cast<unsigned>(tiles), kRadixThreads, 0, stream>>>(
      keys_in, vals_in, keys_out, vals_out, src, col_out, n, shift, incl, hist, tiles);
  return cudaGetLastError();
}

// ------------------------------------------------------------------------------ rowptr
// rowptr[r] = number of sorted keys < r, for r in [0, M].
template <typename I>
__global__ void __launch_bounds__(256) rowptr_from_sorted_kernel(const I* keys, int64_t n, int64_t M,
                                                                 I* rowptr) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r <= M; r += stride) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = (lo + hi) >> 1;
      if (static_cast<int64_t>(keys[mid]) < r) lo = mid + 1; else hi = mid;
    }
    rowptr[r] = static_cast<I>(lo);
  }
}

// No sort needed (every key equal): perm = identity, col = src.
template <typename I>
__global__ void __launch_bounds__(256) identity_perm_kernel(const I* src, int64_t n, I* perm, I* col) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    perm[e] = static_cast<I>(e);
    col[e] = src[e];
  }
}

inline unsigned elementwise_blocks(int64_t n, int sm_count) {
  const int64_t want = ceil_div(n > 0 ? n : 1, 256);
  const int64_t cap = static_cast<int64_t>(sm_count > 0 ? sm_count : 1) * 32;
  return static_cast<unsigned>(want < cap ? want : cap);
}

template <typename I>
cudaError_t rowptr_from_sorted_launch(const I* keys, int64_t n, int64_t M, I* rowptr, int sm_count,
                                      cudaStream_t stream) {
  rowptr_from_sorted_kernel<I><<<elementwise_blocks(M + 1, sm_count), 256, 0, stream>>>(keys, n, M, rowptr);
  return cudaGetLastError();
}

template <typename I>
cudaError_t identity_perm_launch(const I* src, int64_t n, I* perm, I* col, int sm_count, cudaStream_t stream) {
  identity_perm_kernel<I><<<elementwise_blocks(n, sm_count), 256, 0, stream>>>(src, n, perm, col);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace gnncompile
