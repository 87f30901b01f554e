// Fused gather -> (weight) -> segment-reduce over a CSR-by-destination structure, on the host.
// Torch-free. One destination row is produced by exactly one thread, in a fixed edge order, so
// results are deterministic and no atomics are needed. Features are processed in tiles of TILE
// accumulators held in registers; each gathered row is prefetched a.prefetch edges ahead.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>

#include "../common/dtype.h"
#include "../common/macros.h"
#include "reduce_core.h"
#include "rows_core.h"

namespace gnncompile {
namespace cpu {

// out_t: the output's storage type, scalar_t's unless asked (gnncompile::spmm_bf16 gathers bf16_t
// and writes float: the accumulator, rounded once less).
template <typename scalar_t, typename index_t, typename out_t = scalar_t>
struct SpmmArgs {
  const index_t* rowptr;   // [M + 1]
  const index_t* col;      // [E] source node of CSR slot j
  const index_t* perm;     // [E] original edge id of CSR slot j (to read the weight)
  const scalar_t* weight;  // [E] or [E, H] in original edge order, or nullptr
  const scalar_t* x;       // [N, F]
  out_t* out;              // [M, F]
  int64_t* arg;            // [M, F] CSR slot of the chosen edge (max/min only), -1 when empty
  int64_t F;               // features per node (all heads)
  int64_t H;               // heads (1 unless WeightMode::Head)
  int64_t C;               // features per head, F = H * C
  int64_t num_src;         // rows of x: every col entry is checked against it
  int64_t num_edges;       // E: every rowptr and perm entry is checked against it
  bool zero_ties_free;     // max / min of a relu's output: ties at 0 need no record (its backward drops them)
  int64_t prefetch = kPrefetchDistance;  // edges ahead whose rows are prefetched (knobs[1], glue.h)
};

// One tile of one row: features [f0, f0 + n) with a single weight column `h`.
// FULL means n == TILE, a compile-time bound the compiler can unroll and keep in registers.
template <typename scalar_t, typename index_t, Reduce R, WeightMode W, int TILE, bool FULL, typename out_t>
inline Status spmm_tile(const SpmmArgs<scalar_t, index_t, out_t>& a, int64_t row, int64_t h, int64_t f0,
                      int n_rt) {
  using acc_t = typename acc_type<scalar_t>::type;
  const int n = FULL ? TILE : n_rt;
  const int64_t begin = static_cast<int64_t>(a.rowptr[row]);
  const int64_t end = static_cast<int64_t>(a.rowptr[row + 1]);
  constexpr bool kArg = (R == Reduce::Max || R == Reduce::Min);

  acc_t acc[TILE];
  int32_t win[kArg ? TILE : 1];
  acc_t eq[kArg ? TILE : 1];  // 1 where a message equalled the extreme when it came (a possible tie)
  for (int t = 0; t < n; ++t) acc[t] = reduce_init<R, acc_t>();
  if (kArg)
    for (int t = 0; t < n; ++t) { win[t] = -1; eq[t] = acc_t(0); }

  const scalar_t* xbase = a.x + f0;
  // What is read a.prefetch edges ahead is prefetched, past the row's end too: the next
  // tile of this row (its first edges, at the next features) or, after the row's last tile, the
  // next rows' first tile. Short rows (a median in-degree of a few edges) get their reads
  // prefetched as well. A prefetch never faults: the slots ahead are checked when they are read.
  const bool last_tile = f0 + n == a.F;
  const int64_t next_f = last_tile ? 0 : f0 + n;       // the features of the next visit
  const int64_t next_h = last_tile ? 0 : next_f / a.C;  // and its head
  const int64_t limit = last_tile ? a.num_edges : end;
  // Only the cache lines of the tile that will be read are prefetched: this tile's n features,
  // or the next visit's tile (at most TILE features, to the end of its head). A row narrower
  // than TILE (F < 128 floats) would otherwise pull its neighbours' rows from memory too.
  const int64_t bytes_here = static_cast<int64_t>(n) * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t bytes_next =
      std::min<int64_t>(TILE, (next_h + 1) * a.C - next_f) * static_cast<int64_t>(sizeof(scalar_t));
  constexpr int64_t kTileBytes = TILE * static_cast<int64_t>(sizeof(scalar_t));
  const bool whole = bytes_here == kTileBytes && bytes_next == kTileBytes;  // every prefetch a whole tile
  for (int64_t j = begin; j < end; ++j) {
    int64_t ahead = j + a.prefetch, pf = f0, ph = h, bytes = bytes_here;
    if (ahead >= end) {  // past the row: its next tile's first edges, or the next rows' first tile
      if (!last_tile) ahead = begin + (ahead - end);
      pf = next_f;
      ph = next_h;
      bytes = bytes_next;
    }
    if (ahead < limit) {
      const char* p = reinterpret_cast<const char*>(a.x + pf + static_cast<int64_t>(a.col[ahead]) * a.F);
      if (whole) {  // a fixed count the compiler unrolls
        for (int64_t b = 0; b < kTileBytes; b += 64) __builtin_prefetch(p + b, 0, 0);
      } else {  // a narrower one: every line it touches, from the line holding its first byte
        const uintptr_t first = reinterpret_cast<uintptr_t>(p);
        for (uintptr_t line = first & ~uintptr_t(63); line < first + static_cast<uintptr_t>(bytes); line += 64)
          __builtin_prefetch(reinterpret_cast<const char*>(line), 0, 0);
      }
      if (W != WeightMode::None) {  // the edge's weight: read through perm, a random access
        const int64_t e = static_cast<int64_t>(a.perm[ahead]);
        __builtin_prefetch(a.weight + (W == WeightMode::Head ? e * a.H + ph : e), 0, 0);
      }
    }
    const int64_t src = static_cast<int64_t>(a.col[j]);
    if (!in_range(src, a.num_src)) return Status::BadCol;
    const scalar_t* xr = xbase + src * a.F;
    acc_t w = acc_t(1);
    if (W != WeightMode::None) {
      const int64_t e = static_cast<int64_t>(a.perm[j]);
      if (!in_range(e, a.num_edges)) return Status::BadPerm;
      w = to_float(a.weight[W == WeightMode::Head ? e * a.H + h : e]);
    }
    if (R == Reduce::Sum || R == Reduce::Mean) {
      if (W == WeightMode::None) {
        for (int t = 0; t < n; ++t) acc[t] += to_float(xr[t]);
      } else {
        for (int t = 0; t < n; ++t) acc[t] += w * to_float(xr[t]);
      }
    } else {
      const int32_t off = static_cast<int32_t>(j - begin);
      for (int t = 0; t < n; ++t) {
        const acc_t v = (W == WeightMode::None) ? acc_t(to_float(xr[t])) : w * to_float(xr[t]);
        fold_extreme(R == Reduce::Min, v, off, acc[t], win[t], eq[t]);  // reduce_core.h
      }
    }
  }

  if (kArg && a.zero_ties_free)  // a tie at 0 of a relu's output needs no record: its backward drops it
    for (int t = 0; t < n; ++t) eq[t] = acc[t] == acc_t(0) ? acc_t(0) : eq[t];
  store_reduced<out_t, R>(acc, win, eq, begin, end - begin, n, a.out + row * a.F + f0,
                             kArg ? a.arg + row * a.F + f0 : nullptr);
  return Status::Ok;
}

// Rows [row_begin, row_end). Heads are walked outermost so one weight covers a whole tile.
template <typename scalar_t, typename index_t, Reduce R, WeightMode W, int TILE, typename out_t>
Status spmm_rows(const SpmmArgs<scalar_t, index_t, out_t>& a, int64_t row_begin, int64_t row_end) {
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.num_edges)) return Status::BadRowptr;
    for (int64_t h = 0; h < a.H; ++h) {
      const int64_t head0 = h * a.C;
      int64_t c = 0;
      Status st = Status::Ok;
      for (; c + TILE <= a.C && st == Status::Ok; c += TILE)
        st = spmm_tile<scalar_t, index_t, R, W, TILE, true>(a, row, h, head0 + c, TILE);
      if (st == Status::Ok && c < a.C)
        st = spmm_tile<scalar_t, index_t, R, W, TILE, false>(a, row, h, head0 + c,
                                                             static_cast<int>(a.C - c));
      if (st != Status::Ok) return st;
    }
  }
  return Status::Ok;
}

}  // namespace cpu
}  // namespace gnncompile
