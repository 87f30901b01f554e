// Torch-side helpers shared by the CPU and the CUDA glue files (not by the torch-free cores):
// dtype dispatch over the feature and index types the kernels support, and the reduce names.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "macros.h"

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

inline Reduce parse_reduce(c10::string_view reduce) {
  if (reduce == "sum" || reduce == "add") return Reduce::Sum;
  if (reduce == "mean") return Reduce::Mean;
  if (reduce == "max" || reduce == "amax") return Reduce::Max;
  if (reduce == "min" || reduce == "amin") return Reduce::Min;
  TORCH_CHECK_VALUE(false, "gnncompile.spmm: unknown reduce '", std::string(reduce),
                    "' (expected sum, mean, max or min)");
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
  o.need_arg = reduce == Reduce::Max || reduce == Reduce::Min;
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

}  // namespace gnncompile
