// Walking the rows of a CSR-by-destination structure on the host, shared by every CPU core and
// by the glue's parallel_rows. Torch-free: plain pointers, templated on the index type.
#pragma once
#include <cstdint>

namespace gnncompile {
namespace cpu {

// The kernels validate a structure while they walk it (one predictable compare per index
// read), so a structure handed straight to an op can never make them read out of bounds, and
// a trusted one costs no extra pass over memory.
template <typename index_t>
inline bool row_ok(const index_t* rowptr, int64_t row, int64_t num_edges) {
  const int64_t b = static_cast<int64_t>(rowptr[row]), e = static_cast<int64_t>(rowptr[row + 1]);
  return b >= 0 && b <= e && e <= num_edges;
}
inline bool in_range(int64_t v, int64_t bound) {
  return static_cast<uint64_t>(v) < static_cast<uint64_t>(bound);
}

// Balanced work split for skewed (power-law) graphs: chunk k covers the rows whose cost
// (one unit per row plus one per edge) falls in [k, k + 1) / num_chunks of the total.
// bounds has num_chunks + 1 entries.
template <typename index_t>
void balanced_row_split(const index_t* rowptr, int64_t num_rows, int64_t num_chunks,
                        int64_t* bounds) {
  const int64_t total = num_rows + static_cast<int64_t>(rowptr[num_rows]);
  // target_k = floor(total * k / num_chunks), without forming total * k (it can overflow on a
  // large graph cut into many chunks): k * q + floor(k * r / num_chunks), the second term
  // carried incrementally (frac < num_chunks throughout).
  const int64_t q = total / num_chunks, r = total % num_chunks;
  int64_t whole = 0, frac = 0;
  bounds[0] = 0;
  int64_t row = 0;
  for (int64_t k = 1; k < num_chunks; ++k) {
    whole += q;
    frac += r;
    if (frac >= num_chunks) { frac -= num_chunks; ++whole; }
    const int64_t target = whole;
    // smallest row with row + rowptr[row] >= target (the cost function is increasing)
    int64_t lo = row, hi = num_rows;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (mid + static_cast<int64_t>(rowptr[mid]) < target) lo = mid + 1; else hi = mid;
    }
    row = lo;
    bounds[k] = row;
  }
  bounds[num_chunks] = num_rows;
}

// Prefetches the bytes [p, p + bytes) into the cache (kWrite: for a write; kHint: __builtin_prefetch's
// locality, 3 for rows read again by other rows, 0 for rows read once).
template <int kWrite, int kHint>
inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, kWrite, kHint);
}

}  // namespace cpu
}  // namespace gnncompile
