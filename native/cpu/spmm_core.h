// Fused gather -> (weight) -> segment-reduce over a CSR-by-destination structure, on the host.
// Torch-free. One destination row is produced by exactly one thread, in a fixed edge order, so
// results are deterministic and no atomics are needed. Features are processed in tiles of TILE
// accumulators held in registers; each gathered row is prefetched a.prefetch edges ahead.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

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
  int64_t block = 0;       // features per column block (column_block, knobs[2]); F: one pass, no blocking
  // gnncompile::spmm_self (sum only, M == num_src): out[i] = sum + round(self_scale * self_x[i]),
  // the row's own term added after its edges' sum, each product rounded as torch's mul rounds it
  // (GINConv's `out + (1 + eps) * x_r`, bit for bit). nullptr: no self term.
  const scalar_t* self_x = nullptr;
  scalar_t self_scale{};
};

// spmm_self's term: acc[t] += round(s * x[t]), the product rounded before the sum as torch's mul
// then add round it. Never a fused multiply-add: GCC contracts across statements under its
// default -ffp-contract=fast (hence the attribute, and no inlining into a function compiled
// with contraction), Clang within one expression (hence the two statements).
#if defined(__GNUC__) && !defined(__clang__)
#define GNN_NO_FP_CONTRACT __attribute__((noinline, optimize("fp-contract=off")))
#else
#define GNN_NO_FP_CONTRACT
#endif
template <typename scalar_t, typename acc_t>
GNN_NO_FP_CONTRACT void add_self_term(acc_t* acc, const scalar_t* x, scalar_t s, int n) {
  for (int t = 0; t < n; ++t) {
    const scalar_t p = s * x[t];
    acc[t] = acc[t] + static_cast<acc_t>(p);
  }
}

// One tile of one row: features [f0, f0 + n) with a single weight column `h`.
// FULL means n == TILE, a compile-time bound the compiler can unroll and keep in registers.
// [fb, fe) is the column block being walked (the whole row, [0, F), without blocking): the
// prefetch's next visit stays inside it.
template <typename scalar_t, typename index_t, Reduce R, WeightMode W, int TILE, bool FULL, typename out_t>
inline Status spmm_tile(const SpmmArgs<scalar_t, index_t, out_t>& a, int64_t row, int64_t h, int64_t f0,
                      int n_rt, int64_t fb, int64_t fe) {
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
  // tile of this row (its first edges, at the next features) or, after the row's last tile in
  // the block, the next rows' first tile of the block. Short rows (a median in-degree of a few
  // edges) get their reads prefetched as well. A prefetch never faults: the slots ahead are
  // checked when they are read.
  const bool last_tile = f0 + n == fe;
  const int64_t next_f = last_tile ? fb : f0 + n;  // the features of the next visit
  const int64_t next_h = next_f / a.C;             // and its head
  const int64_t limit = last_tile ? a.num_edges : end;
  // Only the cache lines of the tile that will be read are prefetched: this tile's n features,
  // or the next visit's tile (at most TILE features, to the end of its head and of the block).
  // A row narrower than TILE (F < 128 floats) would otherwise pull its neighbours' rows from
  // memory too.
  const int64_t bytes_here = static_cast<int64_t>(n) * static_cast<int64_t>(sizeof(scalar_t));
  const int64_t bytes_next =
      std::min<int64_t>(std::min<int64_t>(TILE, (next_h + 1) * a.C - next_f), fe - next_f) *
      static_cast<int64_t>(sizeof(scalar_t));
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

  if constexpr (R == Reduce::Sum && std::is_floating_point<scalar_t>::value) {  // float32 / float64 only
    if (a.self_x != nullptr)  // spmm_self: the row's own term, after its edges
      add_self_term(acc, a.self_x + row * a.F + f0, a.self_scale, n);
  }
  if (kArg && a.zero_ties_free)  // a tie at 0 of a relu's output needs no record: its backward drops it
    for (int t = 0; t < n; ++t) eq[t] = acc[t] == acc_t(0) ? acc_t(0) : eq[t];
  store_reduced<out_t, R>(acc, win, eq, begin, end - begin, n, a.out + row * a.F + f0,
                             kArg ? a.arg + row * a.F + f0 : nullptr);
  return Status::Ok;
}

// Rows [row_begin, row_end), features [fb, fe) of each (a column block; [0, F) without
// blocking). Tiles are cut at TILE features, at the end of each head (one weight covers a whole
// tile) and at the end of the block, so heads are walked outermost. A tile of exactly TILE, TILE
// / 2 or TILE / 4 features runs with its width known at compile time (its accumulators stay in
// registers: F = 32 and 64 float32, and blocks of those widths); any other width runs the
// runtime-width form. Every output element is a sum over its row's edges in CSR order whatever
// the tiles and the block, so neither changes a bit of the result.
template <typename scalar_t, typename index_t, Reduce R, WeightMode W, int TILE, typename out_t>
Status spmm_rows(const SpmmArgs<scalar_t, index_t, out_t>& a, int64_t row_begin, int64_t row_end, int64_t fb,
                 int64_t fe) {
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.num_edges)) return Status::BadRowptr;
    for (int64_t f = fb; f < fe;) {
      const int64_t h = f / a.C;
      const int64_t n = std::min<int64_t>(std::min<int64_t>(TILE, fe - f), (h + 1) * a.C - f);
      Status st;
      if (n == TILE) st = spmm_tile<scalar_t, index_t, R, W, TILE, true>(a, row, h, f, TILE, fb, fe);
      else if (n == TILE / 2) st = spmm_tile<scalar_t, index_t, R, W, TILE / 2, true>(a, row, h, f, TILE / 2, fb, fe);
      else if (n == TILE / 4) st = spmm_tile<scalar_t, index_t, R, W, TILE / 4, true>(a, row, h, f, TILE / 4, fb, fe);
      else st = spmm_tile<scalar_t, index_t, R, W, TILE, false>(a, row, h, f, static_cast<int>(n), fb, fe);
      if (st != Status::Ok) return st;
      f += n;
    }
  }
  return Status::Ok;
}

// The column block of a walk: how many features of each row one pass over the structure reads.
// `budget_bytes` is the cache the block of x (num_src rows by the block's features) may fill:
// the widest block that fits, in whole 64-byte lines (at least one), or the whole row (F, one
// pass, no blocking) when the row fits or the budget is 0. A block never splits a cache line
// of a row that starts on a line (F * sizeof a multiple of 64 bytes).
inline int64_t column_block(int64_t budget_bytes, int64_t num_src, int64_t F, int64_t elem_bytes) {
  if (budget_bytes <= 0 || num_src <= 0 || F <= 0) return F > 0 ? F : 1;
  const int64_t line = 64 / elem_bytes;  // features per cache line (elem_bytes divides 64)
  int64_t width = budget_bytes / num_src / elem_bytes / line * line;
  if (width < line) width = line;
  return width >= F ? F : width;
}

}  // namespace cpu
}  // namespace gnncompile
