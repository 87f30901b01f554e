// Shared helpers for the thin files that bind the torch-free CPU cores to torch's dispatcher.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../common/dtype.h"

namespace gnncompile {
namespace cpu {

// Maps torch's storage types onto the cores' plain types.
template <typename T> struct core_type { using type = T; };
template <> struct core_type<at::Half> { using type = half_t; };
template <> struct core_type<at::BFloat16> { using type = bf16_t; };

template <typename T>
inline typename core_type<T>::type* core_ptr(at::Tensor& t) {
  return reinterpret_cast<typename core_type<T>::type*>(t.data_ptr<T>());
}
template <typename T>
inline const typename core_type<T>::type* core_ptr(const at::Tensor& t) {
  return reinterpret_cast<const typename core_type<T>::type*>(t.const_data_ptr<T>());
}

#define GNN_DISPATCH_FLOAT(dtype, NAME, ...)                                      \
  [&] {                                                                           \
    switch (dtype) {                                                              \
      case at::kFloat: { using scalar_t = float; return __VA_ARGS__(); }          \
      case at::kDouble: { using scalar_t = double; return __VA_ARGS__(); }        \
      case at::kHalf: { using scalar_t = at::Half; return __VA_ARGS__(); }        \
      case at::kBFloat16: { using scalar_t = at::BFloat16; return __VA_ARGS__(); } \
      default:                                                                    \
        TORCH_CHECK_TYPE(false, NAME, ": unsupported feature dtype ", dtype,      \
                         " (expected float32, float64, float16 or bfloat16)");    \
    }                                                                             \
  }()

#define GNN_DISPATCH_INDEX(dtype, NAME, ...)                                      \
  [&] {                                                                           \
    switch (dtype) {                                                              \
      case at::kInt: { using index_t = int32_t; return __VA_ARGS__(); }           \
      case at::kLong: { using index_t = int64_t; return __VA_ARGS__(); }          \
      default:                                                                    \
        TORCH_CHECK_TYPE(false, NAME, ": unsupported index dtype ", dtype,        \
                         " (expected int32 or int64)");                           \
    }                                                                             \
  }()

inline void check_cpu(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ",
                    t.device());
}

inline void check_structure(const at::Tensor& rowptr, const at::Tensor& col,
                            const at::Tensor& perm, const char* op) {
  TORCH_CHECK_VALUE(rowptr.dim() == 1 && rowptr.numel() >= 1, op,
                    ": rowptr must be 1-D with num_rows + 1 entries");
  TORCH_CHECK_VALUE(col.dim() == 1 && perm.dim() == 1 && col.numel() == perm.numel(), op,
                    ": col and perm must be 1-D of the same length");
  TORCH_CHECK_TYPE(rowptr.scalar_type() == col.scalar_type() &&
                       col.scalar_type() == perm.scalar_type(),
                   op, ": rowptr, col and perm must share one index dtype");
}

// A structure handed straight to an op (not built by build_csr) is checked before any kernel
// reads through it: rowptr spans [0, E], every col is a valid source row, every perm an edge.
inline void check_indices(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                          int64_t num_src, const char* op) {
  const int64_t E = col.numel();
  const int64_t M = rowptr.numel() - 1;
  TORCH_CHECK_VALUE(rowptr[0].item<int64_t>() == 0 && rowptr[M].item<int64_t>() == E, op,
                    ": rowptr must start at 0 and end at the number of edges (", E, ")");
  if (M > 0) {
    TORCH_CHECK_VALUE(
        at::all(rowptr.slice(0, 1) >= rowptr.slice(0, 0, M)).item<bool>(), op,
        ": rowptr must be non-decreasing");
  }
  if (E == 0) return;
  auto c = at::aminmax(col);
  const int64_t cmin = std::get<0>(c).item<int64_t>(), cmax = std::get<1>(c).item<int64_t>();
  TORCH_CHECK_INDEX(cmin >= 0 && cmax < num_src, op, ": source index out of range [", cmin, ", ",
                    cmax, "] for ", num_src, " source nodes");
  auto p = at::aminmax(perm);
  TORCH_CHECK_INDEX(std::get<0>(p).item<int64_t>() >= 0 && std::get<1>(p).item<int64_t>() < E, op,
                    ": perm holds an edge id outside [0, ", E, ")");
}

// CPU knobs (explicit kernel arguments, filled from the device profile):
//   knobs[0] = work chunks per thread (load balance vs. scheduling overhead), default 4.
inline int64_t chunks_per_thread(c10::IntArrayRef knobs) {
  return (knobs.size() > 0 && knobs[0] > 0) ? knobs[0] : 4;
}

// Runs fn(row_begin, row_end) over rows split into edge-balanced chunks, in parallel.
template <typename index_t, typename Fn>
void parallel_rows(const index_t* rowptr, int64_t num_rows, c10::IntArrayRef knobs, const Fn& fn);

}  // namespace cpu
}  // namespace gnncompile

#include "spmm_core.h"

namespace gnncompile {
namespace cpu {

template <typename index_t, typename Fn>
void parallel_rows(const index_t* rowptr, int64_t num_rows, c10::IntArrayRef knobs, const Fn& fn) {
  if (num_rows == 0) return;
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  const int64_t chunks = std::min<int64_t>(num_rows, threads == 1 ? 1 : threads * chunks_per_thread(knobs));
  if (chunks <= 1) {
    fn(0, num_rows);
    return;
  }
  std::vector<int64_t> bounds(chunks + 1);
  balanced_row_split(rowptr, num_rows, chunks, bounds.data());
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      if (bounds[c] < bounds[c + 1]) fn(bounds[c], bounds[c + 1]);
  });
}

}  // namespace cpu
}  // namespace gnncompile
