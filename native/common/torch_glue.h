// Torch-side helpers shared by the CPU and the CUDA glue files (not by the torch-free cores):
// dtype dispatch over the feature and index types the kernels support, the reduce names, and
// the input checks both backends run with the same messages (device checks are each
// backend's own: check_cpu in cpu/glue.h, check_on in cuda/glue.h).
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "macros.h"
#include "trust.h"

// Calls the lambda with `scalar_t` bound to the torch storage type of `dtype`; each backend
// maps it onto its own core type (cpu::core_type, gpu::cuda_type).
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

namespace gnncompile {

// A tensor's data as the type a backend's cores use for its storage type T: Map<T>::type has
// T's bit layout (cpu::core_type and gpu::cuda_type map at::Half / at::BFloat16 onto their own
// 16-bit types, and every other type onto itself).
template <template <typename> class Map, typename T>
inline typename Map<T>::type* mapped_ptr(at::Tensor& t) {
  return reinterpret_cast<typename Map<T>::type*>(t.data_ptr<T>());
}
template <template <typename> class Map, typename T>
inline const typename Map<T>::type* mapped_ptr(const at::Tensor& t) {
  return reinterpret_cast<const typename Map<T>::type*>(t.const_data_ptr<T>());
}

// build_csr's edge lists: 1-D of one length and one dtype; node counts non-negative and, with
// int32 indices, within int32. Returns the number of edges.
inline int64_t check_edge_lists(const at::Tensor& dst, const at::Tensor& src, int64_t num_dst,
                                int64_t num_src, const char* op) {
  TORCH_CHECK_VALUE(dst.dim() == 1 && src.dim() == 1 && dst.numel() == src.numel(), op,
                    ": dst and src must be 1-D of the same length, got ", dst.sizes(), " and ",
                    src.sizes());
  TORCH_CHECK_TYPE(dst.scalar_type() == src.scalar_type(), op, ": dst and src must share one dtype");
  TORCH_CHECK_VALUE(num_dst >= 0 && num_src >= 0, op, ": node counts must be non-negative");
  // rowptr has num_dst + 1 entries: that count must fit int64 (torch reports the allocation
  // failure of any count short of that)
  TORCH_CHECK_VALUE(num_dst < std::numeric_limits<int64_t>::max(), op, ": num_dst (", num_dst,
                    ") is too large: rowptr needs num_dst + 1 entries");
  const int64_t E = dst.numel();
  if (dst.scalar_type() == at::kInt) {
    TORCH_CHECK_VALUE(E <= std::numeric_limits<int32_t>::max() &&
                          num_dst <= std::numeric_limits<int32_t>::max(),
                      op, ": graph too large for int32 indices; use int64 edge_index");
  }
  return E;
}

// build_csr's IndexError for edge `edge`, whose destination (is_dst) or else source index
// `value` lies outside [0, num_dst) or [0, num_src).
[[noreturn]] inline void raise_bad_edge_index(bool is_dst, int64_t value, int64_t edge,
                                              int64_t num_dst, int64_t num_src) {
  const char* which = is_dst ? "edge_index[1] (destination)" : "edge_index[0] (source)";
  if (value < 0) {
    TORCH_CHECK_INDEX(false, which, " holds the negative index ", value, " at edge ", edge,
                      "; node indices must be >= 0");
  }
  TORCH_CHECK_INDEX(false, which, " holds index ", value, " at edge ", edge, ", out of range for ",
                    is_dst ? num_dst : num_src, is_dst ? " destination" : " source", " nodes");
  TORCH_INTERNAL_ASSERT(false, "unreachable");
}

// The feature dtypes the kernels compute in (GNN_DISPATCH_FLOAT's), checked up front: a call
// that needs no kernel (no edges, rows or features) refuses the same dtypes as one that does.
inline void check_feature_dtype(const at::Tensor& t, const char* op) {
  GNN_DISPATCH_FLOAT(t.scalar_type(), op, [&] {});
}

// A structure handed to spmm or edge_dot: shapes and one index dtype. Its values are checked
// by each backend (CPU: check_rowptr, and the kernels as they walk it; CUDA: validate_once
// before launch), once per tensor where the record (trust.h) can keep what was found.
inline void check_structure(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                            const char* op) {
  TORCH_CHECK_VALUE(rowptr.dim() == 1 && rowptr.numel() >= 1, op,
                    ": rowptr must be 1-D with num_rows + 1 entries");
  TORCH_CHECK_VALUE(col.dim() == 1 && perm.dim() == 1 && col.numel() == perm.numel(), op,
                    ": col and perm must be 1-D of the same length");
  TORCH_CHECK_TYPE(rowptr.scalar_type() == col.scalar_type() &&
                       col.scalar_type() == perm.scalar_type(),
                   op, ": rowptr, col and perm must share one index dtype");
}

// The schema's `str reduce` (sum, mean, max, min, or the aliases add, amax, amin) as a Reduce.
inline Reduce parse_reduce(c10::string_view reduce) {
  Reduce r = Reduce::Sum;
  TORCH_CHECK_VALUE(reduce_from_name(std::string_view(reduce.data(), reduce.size()), r),
                    "gnncompile.spmm: unknown reduce '", std::string(reduce),
                    "' (expected sum, mean, max or min)");
  return r;
}

// The edge weight of an spmm call, checked against x: none, one per edge ([E] or [E, 1]), or
// one per edge and head ([E, H] with x of shape [N, H, C]).
struct SpmmWeight {
  at::Tensor weight;  // contiguous, or undefined
  WeightMode mode = WeightMode::None;
  int64_t heads = 1;
};

inline SpmmWeight parse_weight(const std::optional<at::Tensor>& weight_in, const at::Tensor& x,
                               int64_t num_edges, const char* op) {
  SpmmWeight w;
  if (!weight_in.has_value() || !weight_in->defined()) return w;
  w.weight = weight_in->contiguous();
  const at::Tensor& t = w.weight;
  TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), op, ": weight dtype ", t.scalar_type(),
                   " does not match x dtype ", x.scalar_type());
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.size(0) == num_edges && (t.dim() == 1 || t.dim() == 2), op,
                    ": weight must be [E] or [E, H] with E = ", num_edges, ", got ", t.sizes());
  if (t.dim() == 2 && t.size(1) != 1) {
    w.mode = WeightMode::Head;
    w.heads = t.size(1);
    TORCH_CHECK_VALUE(x.dim() == 3 && x.size(1) == w.heads, op, ": a weight of shape [E, ", w.heads,
                      "] needs x of shape [N, ", w.heads, ", C], got ", x.sizes());
  } else {
    w.mode = WeightMode::Scalar;
  }
  return w;
}

// The outputs of spmm: out [M, *x.shape[1:]] and, for max/min, arg of the same shape (else
// empty). `done` is true when nothing is left for a kernel: no rows, no features, or no edges
// (out = 0 and arg = -1 then, PyG's value for a node with no edge).
struct SpmmOutputs {
  at::Tensor out, arg;
  bool need_arg = false;
  bool done = false;
};

inline SpmmOutputs spmm_outputs(const at::Tensor& x, int64_t num_rows, int64_t num_edges,
                                int64_t features, Reduce reduce) {
  SpmmOutputs o;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  if (shape.empty()) shape.push_back(0);
  shape[0] = num_rows;
  o.out = at::empty(shape, x.options());
  o.need_arg = reduce_keeps_arg(reduce);
  o.arg = o.need_arg ? at::empty(shape, x.options().dtype(at::kLong))
                     : at::empty({0}, x.options().dtype(at::kLong));
  if (num_rows == 0 || features == 0) {
    o.done = true;
  } else if (num_edges == 0) {
    o.out.zero_();
    if (o.need_arg) o.arg.fill_(-1);
    o.done = true;
  }
  return o;
}

// The inputs of one spmm call, checked and made contiguous, and its outputs: what the CPU and
// the CUDA glue both start with. `check_device(tensor, name)` raises for a tensor on the wrong
// device (each backend has its own rule); the structure's contents are validated afterwards by
// the backend (while reading on CPU, in one pass on CUDA).
struct SpmmCall {
  Reduce reduce = Reduce::Sum;
  at::Tensor rowptr, col, perm, x;
  SpmmWeight w;
  int64_t M = 0, E = 0, F = 0;  // rows, edges, features per node
  SpmmOutputs o;
};

template <typename CheckDevice>
SpmmCall spmm_call(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                   const std::optional<at::Tensor>& weight, const at::Tensor& x,
                   c10::string_view reduce, const char* op, const CheckDevice& check_device) {
  SpmmCall c;
  c.reduce = parse_reduce(reduce);
  check_structure(rowptr, col, perm, op);
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": x must have a node dimension");
  check_device(rowptr, "rowptr");
  check_device(col, "col");
  check_device(perm, "perm");
  check_device(x, "x");
  if (weight.has_value() && weight->defined()) check_device(*weight, "weight");
  c.rowptr = rowptr.contiguous();
  c.col = col.contiguous();
  c.perm = perm.contiguous();
  c.x = x.contiguous();
  check_feature_dtype(c.x, op);
  c.M = c.rowptr.numel() - 1;
  c.E = c.col.numel();
  c.F = c10::multiply_integers(c.x.sizes().slice(1));
  c.w = parse_weight(weight, c.x, c.E, op);
  c.o = spmm_outputs(c.x, c.M, c.E, c.F, c.reduce);
  return c;
}

// build_csr's result, recorded as valid (trust.h): by construction every col entry is below
// num_src and perm is a permutation of the edge ids.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> built_structure(const at::Tensor& rowptr,
                                                                     const at::Tensor& col,
                                                                     const at::Tensor& perm,
                                                                     int64_t num_src) {
  record_built_structure(rowptr, col, perm, num_src);
  return {rowptr, col, perm};
}

// Whether every entry of the index tensor `ids` lies in [0, bound) (true when it is empty).
// Device-agnostic (ATen ops, one small device-to-host copy).
inline bool ids_within(const at::Tensor& ids, int64_t bound) {
  if (ids.numel() == 0) return true;
  const auto mm = at::aminmax(ids);
  return std::get<0>(mm).item<int64_t>() >= 0 && std::get<1>(mm).item<int64_t>() < bound;
}

// Every entry of `ids` (a structure's col or perm) in [0, bound): from the record (trust.h),
// else checked once (a validation) and recorded; raises an IndexError with `message` otherwise.
// Device-agnostic (on CUDA one small device-to-host copy, the first time).
template <typename... Message>
inline void ensure_ids_within(const at::Tensor& ids, int64_t bound, const Message&... message) {
  if (trusted_ids(ids, bound)) return;
  count_validation();
  TORCH_CHECK_INDEX(ids_within(ids, bound), message...);
  record_index_facts(ids, IndexFacts{bound, false, -1});
}

// edge_dot and edge_softmax write out[perm[j]] for every CSR slot j: a perm that repeats an
// edge id would leave other outputs unwritten. Checked once per perm tensor (build_csr's,
// transpose_structure's and clone_structure's outputs are known permutations); an id out of
// range raises first. Device-agnostic (ATen ops; on CUDA two host waits, the first time).
inline void ensure_perm_unique(const at::Tensor& perm, const char* op) {
  const int64_t E = perm.numel();
  if (E == 0 || trusted_permutation(perm)) return;
  count_validation();
  TORCH_CHECK_INDEX(ids_within(perm, E), op, ": perm holds an edge id outside [0, ", E, ")");
  const at::Tensor counts = at::bincount(perm.to(at::kLong), {}, E);
  TORCH_CHECK_INDEX(counts.eq(1).all().item<bool>(), op, ": perm must hold every edge id in [0, ", E,
                    ") exactly once (a permutation); it repeats some");
  record_index_facts(perm, IndexFacts{E, true, -1});
}

// edge_dot's g: one row per destination with as many features F as x, and `heads` dividing F.
inline void check_edge_dot_g(const at::Tensor& g, int64_t M, int64_t F, int64_t heads,
                             const char* op) {
  TORCH_CHECK_VALUE(g.dim() >= 1 && g.size(0) == M && c10::multiply_integers(g.sizes().slice(1)) == F,
                    op, ": g must be [", M, ", ...] with as many features as x");
  TORCH_CHECK_VALUE(heads >= 1 && F % heads == 0, op, ": heads (", heads,
                    ") must divide the feature count (", F, ")");
}

// The structure edge_softmax and its backward read: rowptr and perm (no col).
inline void check_rowptr_perm(const at::Tensor& rowptr, const at::Tensor& perm, const char* op) {
  TORCH_CHECK_VALUE(rowptr.dim() == 1 && rowptr.numel() >= 1 && perm.dim() == 1, op,
                    ": rowptr and perm must be 1-D");
  TORCH_CHECK_TYPE(rowptr.scalar_type() == perm.scalar_type(), op,
                   ": rowptr and perm must share one index dtype");
}

// A per-edge tensor of edge_softmax or its backward: E rows in original edge order.
inline void check_edge_rows(const at::Tensor& t, int64_t E, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.size(0) == E, op, ": ", name, " must have E = ", E,
                    " rows, got shape ", t.sizes());
}

// edge_softmax_backward's out and grad, each checked by check_edge_rows: one shape, one dtype.
inline void check_out_grad(const at::Tensor& out, const at::Tensor& grad, const char* op) {
  TORCH_CHECK_VALUE(out.sizes() == grad.sizes(), op, ": out and grad shapes differ");
  TORCH_CHECK_TYPE(out.scalar_type() == grad.scalar_type(), op, ": out and grad dtypes differ");
}

}  // namespace gnncompile
