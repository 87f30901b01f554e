// The max / min backward's fast form on the host, without a sort and without atomics. Torch-free.
//
// The forward kernels record per output element arg[r, f]: the CSR slot of the one message
// that reached the extreme (the other records, -1 for an empty row, ties and NaN, are negative
// and match no slot; see arg_fold in ../common/macros.h). The gradient then goes to that
// message alone:
//
//   arg_route     gx[s, f] += g[r, f] * w[e]   for every edge e = (s -> r) with arg[r, f] == slot(e)
//   arg_edge_dot  dw[e, h] += g[r, f] * x[s, f]   for every f of head h with arg[r, f] == slot(e)
//
// arg_route has two passes that give the same bits (the choice is the glue's, by cost):
//   * over the CSC (by source): source s is produced by one thread, reading the records of the
//     destination of each of its out-edges, E x F compares in all. The CSC lists a source's
//     edges in CSR slot order (build_csr's sort is stable), so the terms of every (s, f) are
//     added in destination order.
//   * over the winners: one thread per block of features walks the rows in order and adds each
//     routed gradient to its source (M x F records, random writes): the same order again, so the
//     same sums. Cheaper where rows have many edges (E >> M).
// Both sum in the accumulator type (float, double for double) and round once: the order and
// the sums of torch's scatter_add_ over the [M, F] winners on the CPU (float32, float64).
//
// arg_edge_dot walks the CSR rows (a row owns its slots, hence the edges it records), features
// in ascending order.
#pragma once
#include <cstdint>

#include "../common/dtype.h"
#include "../common/macros.h"
#include "reduce_core.h"
#include "rows_core.h"

namespace gnncompile {
namespace cpu {

// A product rounded as a product. GCC contracts a product and the sum it feeds into one FMA
// (-ffp-contract=fast, its default), which rounds once where torch's scatter path rounds the
// product and then the sum; the empty asm takes the product through memory, so it must exist.
template <typename T>
inline T as_product(T v) {
#if defined(__GNUC__)
  asm("" : "+m"(v));
#endif
  return v;
}

template <typename scalar_t, typename index_t>
struct ArgRouteArgs {
  using acc_t = typename acc_type<scalar_t>::type;
  const index_t* rowptr;    // [M + 1] CSR (by destination)
  const index_t* col;       // [E] source of CSR slot j
  const index_t* perm;      // [E] original edge id of CSR slot j
  const index_t* rowptr_t;  // [N + 1] CSC (by source)
  const index_t* col_t;     // [E] destination of CSC slot k
  const index_t* perm_t;    // [E] original edge id of CSC slot k
  const index_t* slot_of;   // [E] CSR slot of every edge id (perm inverted), CSC pass only
  const scalar_t* weight;   // [E] or [E, H] in original edge order, or nullptr
  const int64_t* arg;       // [M, F] records of the forward pass
  const scalar_t* grad;     // [M, F]
  scalar_t* out;            // [N, F] (CSC pass)
  acc_t* sums;              // [N, F] zeroed accumulators (winner pass; out itself unless 16-bit)
  int64_t F;                // features per row (all heads)
  int64_t H;                // weight columns (1 unless per head)
  int64_t C;                // features per weight column, F = H * C
  int64_t num_src;          // N: every col entry is checked against it
  int64_t num_rows;         // M: every col_t entry is checked against it
  int64_t num_edges;        // E: every rowptr, rowptr_t, perm and perm_t entry is checked against it
};

// slot_of[perm[j]] = j for the slots [j0, j1) (perm a permutation: the glue checks it once).
template <typename index_t>
inline Status invert_perm(const index_t* perm, int64_t num_edges, index_t* slot_of, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const int64_t e = static_cast<int64_t>(perm[j]);
    if (!in_range(e, num_edges)) return Status::BadPerm;
    slot_of[e] = static_cast<index_t>(j);
  }
  return Status::Ok;
}

// CSC pass: one tile of features [f0, f0 + n) of source s, all of one weight column h.
// FULL: n == TILE, a compile-time bound the compiler unrolls and vectorises.
template <typename scalar_t, typename index_t, bool W, int TILE, bool FULL>
inline Status arg_route_tile(const ArgRouteArgs<scalar_t, index_t>& a, int64_t s, int64_t h, int64_t f0,
                             int n_rt) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int n = FULL ? TILE : n_rt;
  const int64_t begin = static_cast<int64_t>(a.rowptr_t[s]);
  const int64_t end = static_cast<int64_t>(a.rowptr_t[s + 1]);
  acc_t acc[TILE];
  for (int t = 0; t < n; ++t) acc[t] = acc_t(0);
  for (int64_t k = begin; k < end; ++k) {
    if (k + kPrefetchDistance < end) {  // the records and gradient of a destination ahead
      const int64_t rn = static_cast<int64_t>(a.col_t[k + kPrefetchDistance]);
      if (in_range(rn, a.num_rows)) {
        const char* pa = reinterpret_cast<const char*>(a.arg + rn * a.F + f0);
        for (int b = 0; b < static_cast<int>(TILE * sizeof(int64_t)); b += 64) __builtin_prefetch(pa + b, 0, 0);
        const char* pg = reinterpret_cast<const char*>(a.grad + rn * a.F + f0);
        for (int b = 0; b < static_cast<int>(TILE * sizeof(scalar_t)); b += 64) __builtin_prefetch(pg + b, 0, 0);
      }
    }
    const int64_t r = static_cast<int64_t>(a.col_t[k]);
    const int64_t e = static_cast<int64_t>(a.perm_t[k]);
    if (!in_range(r, a.num_rows)) return Status::BadCol;
    if (!in_range(e, a.num_edges)) return Status::BadPerm;
    const int64_t slot = static_cast<int64_t>(a.slot_of[e]);
    const int64_t* ar = a.arg + r * a.F + f0;
    const scalar_t* gr = a.grad + r * a.F + f0;
    if (W) {
      const acc_t w = to_float(a.weight[e * a.H + h]);
      // g * w as the scatter path forms it (rounded; 0 * inf stays NaN), selected, then added
      acc_t prod[TILE];
      for (int t = 0; t < n; ++t) prod[t] = acc_t(to_float(gr[t])) * w;
#if defined(__GNUC__)
      asm("" : "+m"(prod));  // as as_product: no FMA with the sums below
#endif
      for (int t = 0; t < n; ++t) acc[t] += ar[t] == slot ? prod[t] : acc_t(0);
    } else {
      for (int t = 0; t < n; ++t) acc[t] += ar[t] == slot ? acc_t(to_float(gr[t])) : acc_t(0);
    }
  }
  scalar_t* o = a.out + s * a.F + f0;
  for (int t = 0; t < n; ++t) o[t] = from_acc<scalar_t>(acc[t]);
  return Status::Ok;
}

// CSC pass over the sources [s_begin, s_end). Weight columns outermost: one weight a tile.
template <typename scalar_t, typename index_t, bool W, int TILE>
Status arg_route_sources(const ArgRouteArgs<scalar_t, index_t>& a, int64_t s_begin, int64_t s_end) {
  for (int64_t s = s_begin; s < s_end; ++s) {
    if (!row_ok(a.rowptr_t, s, a.num_edges)) return Status::BadRowptr;
    for (int64_t h = 0; h < a.H; ++h) {
      const int64_t head0 = h * a.C;
      int64_t c = 0;
      Status st = Status::Ok;
      for (; c + TILE <= a.C && st == Status::Ok; c += TILE)
        st = arg_route_tile<scalar_t, index_t, W, TILE, true>(a, s, h, head0 + c, TILE);
      if (st == Status::Ok && c < a.C)
        st = arg_route_tile<scalar_t, index_t, W, TILE, false>(a, s, h, head0 + c, static_cast<int>(a.C - c));
      if (st != Status::Ok) return st;
    }
  }
  return Status::Ok;
}

// Rows ahead whose output lines the winner pass prefetches (100k nodes, 1M edges, F = 64: 1.5-2x
// faster; no loss measured where the output stays in cache).
constexpr int64_t kWinnerPrefetchRows = 4;

// Winner pass over the features [f0, f1) of every row, rows in order: each record that is a
// slot of its row adds its gradient (times the weight) to that slot's source in `sums`.
template <typename scalar_t, typename index_t, bool W>
Status arg_route_winners(const ArgRouteArgs<scalar_t, index_t>& a, int64_t f0, int64_t f1) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int64_t M = a.num_rows;
  for (int64_t r = 0; r < M; ++r) {
    if (r + kWinnerPrefetchRows < M) {  // the sums a row ahead adds to: random lines, fetched early
      const int64_t rn = r + kWinnerPrefetchRows;
      const int64_t bn = static_cast<int64_t>(a.rowptr[rn]), en = static_cast<int64_t>(a.rowptr[rn + 1]);
      const int64_t* an = a.arg + rn * a.F;
      if (bn >= 0 && bn <= en && en <= a.num_edges) {
        for (int64_t f = f0; f < f1; ++f) {
          const int64_t j = an[f];
          if (j < bn || j >= en) continue;
          const int64_t s = static_cast<int64_t>(a.col[j]);
          if (in_range(s, a.num_src)) __builtin_prefetch(a.sums + s * a.F + f, 1, 0);
        }
      }
    }
    if (!row_ok(a.rowptr, r, a.num_edges)) return Status::BadRowptr;
    const int64_t begin = static_cast<int64_t>(a.rowptr[r]);
    const int64_t end = static_cast<int64_t>(a.rowptr[r + 1]);
    if (begin == end) continue;
    const int64_t* ar = a.arg + r * a.F;
    const scalar_t* gr = a.grad + r * a.F;
    for (int64_t f = f0; f < f1; ++f) {
      const int64_t j = ar[f];
      if (j < begin || j >= end) continue;
      const int64_t s = static_cast<int64_t>(a.col[j]);
      if (!in_range(s, a.num_src)) return Status::BadCol;
      acc_t v = to_float(gr[f]);
      if (W) {
        const int64_t e = static_cast<int64_t>(a.perm[j]);
        if (!in_range(e, a.num_edges)) return Status::BadPerm;
        v = as_product(v * acc_t(to_float(a.weight[e * a.H + f / a.C])));
      }
      a.sums[s * a.F + f] += v;
    }
  }
  return Status::Ok;
}

template <typename scalar_t, typename index_t>
struct ArgEdgeDotArgs {
  const index_t* rowptr;  // [M + 1] CSR
  const index_t* col;     // [E] source of CSR slot j
  const index_t* perm;    // [E] original edge id of CSR slot j
  const scalar_t* x;      // [N, F]
  const int64_t* arg;     // [M, F]
  const scalar_t* grad;   // [M, F]
  typename acc_type<scalar_t>::type* out;  // [E, H] in original edge order, zeroed by the caller
  int64_t F, H, C;        // F = H * C
  int64_t num_src;        // N: every col entry is checked against it
  int64_t num_edges;      // E
};

// Rows [r_begin, r_end): every feature whose record is a slot of its row adds g * x[source] to
// that slot's edge, in feature order. A record outside the row (no winner, a tie, NaN) adds
// nothing.
template <typename scalar_t, typename index_t>
Status arg_edge_dot_rows(const ArgEdgeDotArgs<scalar_t, index_t>& a, int64_t r_begin, int64_t r_end) {
  using acc_t = typename acc_type<scalar_t>::type;
  for (int64_t r = r_begin; r < r_end; ++r) {
    if (!row_ok(a.rowptr, r, a.num_edges)) return Status::BadRowptr;
    const int64_t begin = static_cast<int64_t>(a.rowptr[r]);
    const int64_t end = static_cast<int64_t>(a.rowptr[r + 1]);
    if (begin == end) continue;
    const int64_t* ar = a.arg + r * a.F;
    const scalar_t* gr = a.grad + r * a.F;
    for (int64_t h = 0; h < a.H; ++h) {
      for (int64_t c = 0; c < a.C; ++c) {
        const int64_t f = h * a.C + c;
        const int64_t j = ar[f];
        if (j < begin || j >= end) continue;
        const int64_t s = static_cast<int64_t>(a.col[j]);
        const int64_t e = static_cast<int64_t>(a.perm[j]);
        if (!in_range(s, a.num_src)) return Status::BadCol;
        if (!in_range(e, a.num_edges)) return Status::BadPerm;
        // x * g as the scatter path forms it, then added
        a.out[e * a.H + h] += as_product(acc_t(to_float(a.x[s * a.F + f])) * acc_t(to_float(gr[f])));
      }
    }
  }
  return Status::Ok;
}

}  // namespace cpu
}  // namespace gnncompile
