// The copy loops of the pooled loader's collation on the host (collate_rows, segment_ids; see
// collate.cpp for what they compute). Torch-free: plain pointers. The glue validates every
// graph index, span and capacity (and the running sum of incs) before calling them, without
// forming sums that can overflow, so they never check: every offset here is <= out's size.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gnncompile {
namespace cpu {

// Graph idx[b]'s rows of values, rows of `row` elements of `elem` bytes, copied to out back to
// back: one memcpy per graph.
inline void collate_copy(const char* src, char* dst, const int64_t* st, const int64_t* sz,
                         const int64_t* id, int64_t B, int64_t row, size_t elem) {
  int64_t o = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t g = id[b];
    if (sz[g]) std::memcpy(dst + o * row * elem, src + st[g] * row * elem, sz[g] * row * elem);
    o += sz[g];
  }
}

// The same copy with the running sum of inc over the graphs before b added to graph b's values.
template <typename scalar_t>
void collate_add(const scalar_t* s, scalar_t* d, const int64_t* st, const int64_t* sz,
                 const int64_t* id, const int64_t* inc, int64_t B, int64_t row) {
  int64_t o = 0, add = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t g = id[b];
    const int64_t n = sz[g] * row;
    const scalar_t* from = s + st[g] * row;
    scalar_t* to = d + o * row;
    const scalar_t a = static_cast<scalar_t>(add);
    for (int64_t k = 0; k < n; ++k) to[k] = from[k] + a;
    o += sz[g];
    if (b + 1 < B) add += inc[g];  // the glue checked that these sums fit int64
  }
}

// out = b repeated sizes[idx[b]] times for b = 0..B-1; ptr = [0, o_1, ..., o_B] (B + 1 entries).
inline void fill_segment_ids(const int64_t* sz, const int64_t* id, int64_t B, int64_t* o,
                             int64_t* p) {
  int64_t at = 0;
  p[0] = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = sz[id[b]];
    std::fill(o + at, o + at + n, b);
    at += n;
    p[b + 1] = at;
  }
}

}  // namespace cpu
}  // namespace gnncompile
