// Softmax of per-edge scores over a CSR-by-destination structure, on the host. Torch-free.
//   edge_softmax:          softmax of scores[e, h] over the edges that share a destination
//   edge_softmax_backward: grad_s = y * (g - sum_seg(g * y))
// Edges are read and written in their original order through perm, so callers never permute.
#pragma once
#include <vector>
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

// scores, out: [E, H] in original edge order. A row's scores are read through perm (random
// accesses, prefetched kSoftmaxPrefetch edges ahead) into a per-thread buffer once; the max,
// the sum and the outputs are computed there, and written back through perm once.
constexpr int kSoftmaxPrefetch = 8;

template <typename acc_t>
inline acc_t* row_buffer(std::vector<acc_t>& buf, int64_t n) {
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
  return buf.data();
}

template <typename scalar_t, typename index_t, typename acc_t>
inline void gather_row(const index_t* perm, const scalar_t* src, acc_t* dst, int64_t begin,
                       int64_t end, int64_t H) {
  for (int64_t j = begin; j < end; ++j) {
    if (j + kSoftmaxPrefetch < end)
      __builtin_prefetch(src + static_cast<int64_t>(perm[j + kSoftmaxPrefetch]) * H, 0, 0);
    const scalar_t* r = src + static_cast<int64_t>(perm[j]) * H;
    acc_t* d = dst + (j - begin) * H;
    for (int64_t h = 0; h < H; ++h) d[h] = acc_t(to_float(r[h]));
  }
}

template <typename scalar_t, typename index_t>
Status edge_softmax_rows(const index_t* rowptr, const index_t* perm, const scalar_t* scores,
                         scalar_t* out, int64_t H, int64_t num_edges, int64_t row_begin,
                         int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  thread_local std::vector<acc_t> buf, head;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const Status st = check_perm_row(rowptr, perm, row, num_edges);
    if (st != Status::Ok) return st;
    const int64_t begin = rowptr[row], end = rowptr[row + 1], deg = end - begin;
    if (deg == 0) continue;
    acc_t* v = row_buffer(buf, deg * H);
    acc_t* inv = row_buffer(head, 2 * H);
    acc_t* m = inv + H;
    gather_row(perm, scores, v, begin, end, H);
    for (int64_t h = 0; h < H; ++h) {
      acc_t mh = -std::numeric_limits<acc_t>::infinity();
      for (int64_t k = 0; k < deg; ++k) mh = std::max<acc_t>(mh, v[k * H + h]);
      if (std::isinf(mh) && mh < 0) mh = 0;  // every score -inf: keep exp finite-free of NaN
      m[h] = mh;
    }
    for (int64_t h = 0; h < H; ++h) inv[h] = 0;
    for (int64_t k = 0; k < deg; ++k)
      for (int64_t h = 0; h < H; ++h) {
        const acc_t ex = std::exp(v[k * H + h] - m[h]);
        v[k * H + h] = ex;
        inv[h] += ex;
      }
    // Same guard as PyG's softmax: divide by (sum + 1e-16).
    for (int64_t h = 0; h < H; ++h) inv[h] = acc_t(1) / (inv[h] + acc_t(1e-16));
    for (int64_t j = begin; j < end; ++j) {
      if (j + kSoftmaxPrefetch < end)
        __builtin_prefetch(out + static_cast<int64_t>(perm[j + kSoftmaxPrefetch]) * H, 1, 0);
      scalar_t* o = out + static_cast<int64_t>(perm[j]) * H;
      const acc_t* ex = v + (j - begin) * H;
      for (int64_t h = 0; h < H; ++h) o[h] = from_acc<scalar_t>(ex[h] * inv[h]);
    }
  }
  return Status::Ok;
}

template <typename scalar_t, typename index_t>
Status edge_softmax_backward_rows(const index_t* rowptr, const index_t* perm, const scalar_t* y,
                                  const scalar_t* g, scalar_t* grad, int64_t H, int64_t num_edges,
                                  int64_t row_begin, int64_t row_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  thread_local std::vector<acc_t> ybuf, gbuf, head;
  for (int64_t row = row_begin; row < row_end; ++row) {
    const Status st = check_perm_row(rowptr, perm, row, num_edges);
    if (st != Status::Ok) return st;
    const int64_t begin = rowptr[row], end = rowptr[row + 1], deg = end - begin;
    if (deg == 0) continue;
    acc_t* yv = row_buffer(ybuf, deg * H);
    acc_t* gv = row_buffer(gbuf, deg * H);
    acc_t* s = row_buffer(head, H);
    for (int64_t j = begin; j < end; ++j) {  // y and g of the row, read through perm once
      if (j + kSoftmaxPrefetch < end) {
        const int64_t e = static_cast<int64_t>(perm[j + kSoftmaxPrefetch]) * H;
        __builtin_prefetch(y + e, 0, 0);
        __builtin_prefetch(g + e, 0, 0);
      }
      const int64_t e = static_cast<int64_t>(perm[j]) * H, k = (j - begin) * H;
      for (int64_t h = 0; h < H; ++h) {
        yv[k + h] = acc_t(to_float(y[e + h]));
        gv[k + h] = acc_t(to_float(g[e + h]));
      }
    }
    for (int64_t h = 0; h < H; ++h) s[h] = 0;
    for (int64_t k = 0; k < deg; ++k)
      for (int64_t h = 0; h < H; ++h) s[h] += yv[k * H + h] * gv[k * H + h];
    for (int64_t j = begin; j < end; ++j) {
      if (j + kSoftmaxPrefetch < end)
        __builtin_prefetch(grad + static_cast<int64_t>(perm[j + kSoftmaxPrefetch]) * H, 1, 0);
      scalar_t* o = grad + static_cast<int64_t>(perm[j]) * H;
      const int64_t k = (j - begin) * H;
      for (int64_t h = 0; h < H; ++h) o[h] = from_acc<scalar_t>(yv[k + h] * (gv[k + h] - s[h]));
    }
  }
  return Status::Ok;
}

}  // namespace cpu
}  // namespace gnncompile
