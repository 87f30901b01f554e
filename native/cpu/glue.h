// Shared helpers for the thin files that bind the torch-free CPU cores to torch's dispatcher:
// dtype mapping, the CPU device check, structure errors, and the parallel row loop. The checks
// that the CUDA glue shares are in ../common/torch_glue.h.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "../common/dtype.h"
#include "../common/torch_glue.h"
#include "reduce_core.h"
#include "rows_core.h"

namespace gnncompile {
namespace cpu {

// Maps torch's storage types onto the cores' plain types.
template <typename T> struct core_type { using type = T; };
template <> struct core_type<at::Half> { using type = half_t; };
template <> struct core_type<at::BFloat16> { using type = bf16_t; };

template <typename T> inline auto core_ptr(at::Tensor& t) { return mapped_ptr<core_type, T>(t); }
template <typename T> inline auto core_ptr(const at::Tensor& t) { return mapped_ptr<core_type, T>(t); }

inline void check_cpu(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ",
                    t.device());
}

// check_cpu as the device check the shared checks take (../common/attention_glue.h).
inline auto on_cpu(const char* op) {
  return [op](const at::Tensor& t, const char* name) { check_cpu(t, op, name); };
}

// A structure handed straight to an op must not make a kernel read out of bounds. rowptr is
// checked here, before any kernel runs (parallel_rows' split reads it through a binary search):
// it starts at 0, never decreases and ends at the number of edges; a rowptr the record knows
// (trust.h: build_csr's, a copy's, one checked before) is not read again. Every other index is
// checked by the kernels as they read it (see row_ok / in_range in rows_core.h), and a failure
// comes back as a Status that raise_status turns into a Python exception. `rowptr` must be
// contiguous.
inline void check_rowptr(const at::Tensor& rowptr, int64_t num_edges, const char* op) {
  if (trusted_rowptr(rowptr, num_edges)) return;
  count_validation();
  const int64_t M = rowptr.numel() - 1;
  bool ends = false, ordered = true;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    const index_t* rp = rowptr.const_data_ptr<index_t>();
    ends = rp[0] == 0 && static_cast<int64_t>(rp[M]) == num_edges;
    for (int64_t r = 0; ends && r < M; ++r)
      if (!row_ok(rp, r, num_edges)) { ordered = false; break; }
  });
  TORCH_CHECK_VALUE(ends, op, ": rowptr must start at 0 and end at the number of edges (", num_edges, ")");
  TORCH_CHECK_VALUE(ordered, op, ": rowptr must be non-decreasing and within [0, ", num_edges, "]");
  record_index_facts(rowptr, IndexFacts{-1, false, num_edges});
}

inline void raise_status(Status st, const char* op, int64_t num_src, int64_t num_edges) {
  switch (st) {
    case Status::Ok: return;
    case Status::BadRowptr:
      TORCH_CHECK_VALUE(false, op, ": rowptr must be non-decreasing and within [0, ", num_edges, "]");
    case Status::BadCol:
      TORCH_CHECK_INDEX(false, op, ": source index out of range (an entry of col lies outside [0, ",
                        num_src, ")) for ", num_src, " source nodes");
    case Status::BadPerm:
      TORCH_CHECK_INDEX(false, op, ": perm holds an edge id outside [0, ", num_edges, ")");
    default:
      TORCH_CHECK(false, op, ": invalid structure (status ", static_cast<int>(st), ")");
  }
}

// What the kernels check as they walk a structure, for a call that returns before any kernel
// runs (no edges, rows or features): col (when defined) in [0, num_src), perm in [0, E); rowptr
// has passed check_rowptr. A structure is refused or accepted whatever the sizes of x.
inline void check_unwalked_structure(const at::Tensor& col, const at::Tensor& perm, int64_t num_src,
                                     const char* op) {
  const int64_t E = perm.numel();
  if (col.defined()) {
    ensure_ids_within(col, num_src, op, ": source index out of range (an entry of col lies outside [0, ", num_src,
                      ")) for ", num_src, " source nodes");
  }
  ensure_ids_within(perm, E, op, ": perm holds an edge id outside [0, ", E, ")");
}

// spmm without a weight never reads perm, so its kernels cannot check it as they go: a perm
// that the record does not know to lie in [0, E) is checked here (once), as the CUDA glue
// checks every structure.
inline void check_unread_perm(const at::Tensor& perm, const char* op) {
  const int64_t E = perm.numel();
  ensure_ids_within(perm, E, op, ": perm holds an edge id outside [0, ", E, ")");
}

// CPU knobs (explicit kernel arguments, filled from the device profile):
//   knobs[0] = work chunks per thread (load balance vs. scheduling overhead), default 4;
//              0 or negative: the default; clamped to kMaxChunksPerThread (each chunk costs a
//              binary search and a scheduling step, and chunks never outnumber rows anyway).
//              gnncompile/hardware/profiles.py clamps a profile's knobs to the same range.
//   knobs[1] = prefetch distance: how many edges ahead a row walk prefetches the rows it reads
//              through col / perm (spmm, message programs, the fused attention's gathered rows),
//              default kPrefetchDistance (reduce_core.h); 0 or negative: the default; clamped to
//              kMaxPrefetchDistance. Results do not depend on it (a prefetch only warms caches).
constexpr int64_t kDefaultChunksPerThread = 4;
constexpr int64_t kMaxPrefetchDistance = 64;
inline int64_t prefetch_distance(c10::IntArrayRef knobs) {
  if (knobs.size() < 2 || knobs[1] <= 0) return kPrefetchDistance;
  return std::min<int64_t>(knobs[1], kMaxPrefetchDistance);
}
// The spmm's default for a row of `row_bytes` gathered bytes: a row narrower than 512 bytes (F <
// 128 float32) brings fewer bytes per edge into flight, so the walk reads further ahead
// (kNarrowPrefetchDistance edges) to keep as many cache misses outstanding. Measured on a 2-core
// AMD EPYC (Zen 2), forward, power-law graphs of degree 10, against 4 edges ahead: F 32 1.45-1.80x
// at 100k-1M nodes, F 64 1.10-1.17x; at F 128 farther was 0.91-1.03x, so whole-tile rows keep
// kPrefetchDistance (benchmarks/results/HISTORY.md, section 25). An explicit knobs[1] wins.
constexpr int64_t kNarrowPrefetchDistance = 32;
constexpr int64_t kNarrowRowBytes = 512;
inline int64_t prefetch_distance(c10::IntArrayRef knobs, int64_t row_bytes) {
  if (knobs.size() >= 2 && knobs[1] > 0) return std::min<int64_t>(knobs[1], kMaxPrefetchDistance);
  return row_bytes < kNarrowRowBytes ? kNarrowPrefetchDistance : kPrefetchDistance;
}
// knobs[2] = column-block budget, KiB (the spmm; other ops ignore it): the cache a block of
//              gathered rows may fill. The spmm walks its structure once per column block, the
//              widest whole number of 64-byte lines per row whose block of x (all source rows)
//              fits (spmm_core.h, column_block), so each block of x is read from memory once and
//              then gathered from the cache; a row that fits the budget whole is one block, as
//              without blocking. 0 or negative: no blocking (the kernel does not know the
//              cache; gnncompile.hardware.default_settings fills this knob from the detected L3);
//              clamped to kMaxBlockBudgetKiB. Results do not depend on it (each output element
//              sums its row's edges in CSR order in every block).
constexpr int64_t kMaxBlockBudgetKiB = int64_t(1) << 22;  // 4 GiB
inline int64_t block_budget_bytes(c10::IntArrayRef knobs) {
  if (knobs.size() < 3 || knobs[2] <= 0) return 0;
  return std::min<int64_t>(knobs[2], kMaxBlockBudgetKiB) * 1024;
}
constexpr int64_t kMaxChunksPerThread = 4096;
inline int64_t chunks_per_thread(c10::IntArrayRef knobs) {
  if (knobs.size() == 0 || knobs[0] <= 0) return kDefaultChunksPerThread;
  return std::min<int64_t>(knobs[0], kMaxChunksPerThread);
}

// Chunks for num_rows rows on `threads` threads: threads * chunks_per_thread, at most one per
// row. No overflow: threads is an int and chunks_per_thread at most kMaxChunksPerThread.
inline int64_t num_chunks(int64_t num_rows, int64_t threads, c10::IntArrayRef knobs) {
  if (threads <= 1) return 1;
  return std::min<int64_t>(num_rows, threads * chunks_per_thread(knobs));
}

// Runs fn(row_begin, row_end) -> Status over rows split into edge-balanced chunks, in
// parallel; returns the first non-Ok status (chunks after a failure are skipped). rowptr must
// have passed check_rowptr.
template <typename index_t, typename Fn>
Status parallel_rows(const index_t* rowptr, int64_t num_rows, c10::IntArrayRef knobs, const Fn& fn) {
  if (num_rows == 0) return Status::Ok;
  const int64_t chunks = num_chunks(num_rows, at::get_num_threads(), knobs);
  if (chunks <= 1) return fn(0, num_rows);
  // The split reads rowptr through a binary search: meaningful for a non-decreasing rowptr
  // inside [0, E], which check_rowptr established (or the record vouched for) before the call.
  // A recorded rowptr written behind its version counter (`.data[...]`) still cannot make it
  // read out of bounds: the search reads only rowptr[0..num_rows], the bounds it returns stay
  // in [0, num_rows] and never decrease, and each kernel checks every row it walks (row_ok).
  std::vector<int64_t> bounds(chunks + 1);
  balanced_row_split(rowptr, num_rows, chunks, bounds.data());
  std::atomic<int> status{static_cast<int>(Status::Ok)};
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      if (status.load(std::memory_order_relaxed) != static_cast<int>(Status::Ok)) return;
      if (bounds[c] < bounds[c + 1]) {
        const Status st = fn(bounds[c], bounds[c + 1]);
        if (st != Status::Ok) {
          int expected = static_cast<int>(Status::Ok);
          status.compare_exchange_strong(expected, static_cast<int>(st));
        }
      }
    }
  });
  return static_cast<Status>(status.load());
}

}  // namespace cpu
}  // namespace gnncompile
