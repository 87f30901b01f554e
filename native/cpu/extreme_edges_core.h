// torch's max / min gradient of per-edge messages reduced over a CSR-by-destination structure,
// on the host, one pass per row. Torch-free.
//
// For row r, feature f, reduced value y = out[r, f] and upstream gradient g = grad[r, f], torch's
// scatter_reduce amax / amin backward gives every message m_e of the row
//
//   (m_e == y) * (g / N),   N = #{e in row : m_e == y}  (+ 1 where count_zeros and y == 0)
//
// (gnncompile/ops/extremes.py: the zeros buffer PyG reduces into counts where it equals the
// extreme; N = 0, a NaN extreme, divides by zero where nan_gives_nan, else counts as 1). The
// count is a sum of 1s in the feature type, as torch's scatter_add of the equality mask; the
// mask multiplies the share (0 * inf = NaN, as torch's), so ties, NaN and infinities give
// torch's bits. A row's messages are read twice (count, then share: the second read hits the
// cache), through perm (the user's edge order) or by CSR slot (by_slot), and every message of
// the row is written once.
#pragma once
#include <cstdint>
#include <vector>

#include "../common/macros.h"
#include "rows_core.h"

namespace gnncompile {
namespace cpu {

constexpr int kExtremePrefetch = 8;  // edges ahead whose message rows a row walk prefetches

template <typename scalar_t, typename index_t>
struct ExtremeEdgesArgs {
  const index_t* rowptr;     // [M + 1]
  const index_t* perm;       // [E] original edge id of CSR slot j (read unless by_slot)
  const scalar_t* messages;  // [E, F] user order, or CSR slot order (by_slot)
  const scalar_t* out;       // [M, F] the reduced values
  const scalar_t* grad;      // [M, F]
  scalar_t* result;          // [E, F], the messages' order
  int64_t F;
  int64_t num_edges;
  bool count_zeros;
  bool nan_gives_nan;
};

template <typename scalar_t, typename index_t, bool kBySlot>
Status extreme_edges_backward_rows(const ExtremeEdgesArgs<scalar_t, index_t>& a, int64_t row_begin,
                                   int64_t row_end) {
  const int64_t F = a.F, E = a.num_edges;
  thread_local std::vector<scalar_t> share;
  if (static_cast<int64_t>(share.size()) < F) share.resize(static_cast<size_t>(F));
  scalar_t* q = share.data();
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, E)) return Status::BadRowptr;
    const int64_t begin = a.rowptr[row], end = a.rowptr[row + 1];
    if (begin == end) continue;
    if constexpr (!kBySlot) {
      for (int64_t j = begin; j < end; ++j)
        if (!in_range(static_cast<int64_t>(a.perm[j]), E)) return Status::BadPerm;
    }
    const scalar_t* y = a.out + row * F;
    const scalar_t* g = a.grad + row * F;
    for (int64_t f = 0; f < F; ++f) q[f] = (a.count_zeros && y[f] == scalar_t(0)) ? scalar_t(1) : scalar_t(0);
    for (int64_t j = begin; j < end; ++j) {  // N: the messages equal to the extreme
      const int64_t e = kBySlot ? j : static_cast<int64_t>(a.perm[j]);
      if (j + kExtremePrefetch < end) {
        const int64_t ahead = kBySlot ? j + kExtremePrefetch : static_cast<int64_t>(a.perm[j + kExtremePrefetch]);
        prefetch_bytes<0, 3>(a.messages + ahead * F, F * static_cast<int64_t>(sizeof(scalar_t)));
      }
      const scalar_t* m = a.messages + e * F;
      for (int64_t f = 0; f < F; ++f) q[f] += m[f] == y[f] ? scalar_t(1) : scalar_t(0);
    }
    for (int64_t f = 0; f < F; ++f) {  // the share g / N
      const scalar_t n = (!a.nan_gives_nan && q[f] == scalar_t(0)) ? scalar_t(1) : q[f];
      q[f] = g[f] / n;
    }
    for (int64_t j = begin; j < end; ++j) {  // (m == y) * share, a product (0 * inf is NaN)
      const int64_t e = kBySlot ? j : static_cast<int64_t>(a.perm[j]);
      const scalar_t* m = a.messages + e * F;
      scalar_t* o = a.result + e * F;
      for (int64_t f = 0; f < F; ++f) o[f] = (m[f] == y[f] ? scalar_t(1) : scalar_t(0)) * q[f];
    }
  }
  return Status::Ok;
}

}  // namespace cpu
}  // namespace gnncompile
