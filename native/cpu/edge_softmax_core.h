// Softmax of per-edge scores over a CSR-by-destination structure, on the host. Torch-free.
//   edge_softmax:          softmax of scores[e, h] over the edges that share a destination
//   edge_softmax_backward: grad_s = y * (g - sum_seg(g * y))
// Edges are read and written in their original order through perm, so callers never permute.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../common/dtype.h"
#include "../common/macros.h"
#include "rows_core.h"

namespace gnncompile {
namespace cpu {

// Softmax kernels read perm only: validate a whole row's slice before touching scores.
template <typename index_t>
inline Status check_perm_row(const index_t* rowptr, const index_t* perm, int64_t row,
                             int64_t num_edges) {
  if (!row_ok(rowptr, row, num_edges)) return Status::BadRowptr;
  for (int64_t j = rowptr[row]; j < rowptr[row + 1]; ++j)
    if (!in_range(static_cast<int64_t>(perm[j]), num_edges)) return Status::BadPerm;
  return Status::Ok;
}

// scores, out: [E, H] in original edge order.
template <typename scalar_t, typename index_t>
Status edge_softmax_rows(const index_t* rowptr, const index_t* perm, const scalar_t* scores,
                         scalar_t* out, int64_t H, int64_t num_edges, int64_t row_begin,
                         int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const Status st = check_perm_row(rowptr, perm, row, num_edges);
    if (st != Status::Ok) return st;
    const int64_t begin = rowptr[row], end = rowptr[row + 1];
    for (int64_t h = 0; h < H; ++h) {
      acc_t m = -std::numeric_limits<acc_t>::infinity();
      for (int64_t j = begin; j < end; ++j)
        m = std::max<acc_t>(m, to_float(scores[static_cast<int64_t>(perm[j]) * H + h]));
      if (std::isinf(m) && m < 0) m = 0;  // every score -inf: keep exp finite-free of NaN
      acc_t s = 0;
      for (int64_t j = begin; j < end; ++j)
        s += std::exp(acc_t(to_float(scores[static_cast<int64_t>(perm[j]) * H + h])) - m);
      // Same guard as PyG's softmax: divide by (sum + 1e-16).
      const acc_t inv = acc_t(1) / (s + acc_t(1e-16));
      for (int64_t j = begin; j < end; ++j) {
        const int64_t e = static_cast<int64_t>(perm[j]) * H + h;
        out[e] = from_acc<scalar_t>(std::exp(acc_t(to_float(scores[e])) - m) * inv);
      }
    }
  }
  return Status::Ok;
}

template <typename scalar_t, typename index_t>
Status edge_softmax_backward_rows(const index_t* rowptr, const index_t* perm, const scalar_t* y,
                                  const scalar_t* g, scalar_t* grad, int64_t H, int64_t num_edges,
                                  int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const Status st = check_perm_row(rowptr, perm, row, num_edges);
    if (st != Status::Ok) return st;
    const int64_t begin = rowptr[row], end = rowptr[row + 1];
    for (int64_t h = 0; h < H; ++h) {
      acc_t s = 0;
      for (int64_t j = begin; j < end; ++j) {
        const int64_t e = static_cast<int64_t>(perm[j]) * H + h;
        s += acc_t(to_float(y[e])) * acc_t(to_float(g[e]));
      }
      for (int64_t j = begin; j < end; ++j) {
        const int64_t e = static_cast<int64_t>(perm[j]) * H + h;
        grad[e] = from_acc<scalar_t>(acc_t(to_float(y[e])) * (acc_t(to_float(g[e])) - s));
      }
    }
  }
  return Status::Ok;
}

}  // namespace cpu
}  // namespace gnncompile
