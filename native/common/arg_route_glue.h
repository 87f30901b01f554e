// The input checks of gnncompile::arg_route and gnncompile::arg_edge_dot (the max / min
// backward's fast form, native/cpu/arg_route_core.h, native/cuda/arg_route_core.cuh) that the
// CPU and the CUDA glue share, with the same messages. Torch-side, not for the cores.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "torch_glue.h"

namespace gnncompile {

// arg_route: the CSR (rowptr, col, perm), the forward's records `arg` and the gradient `grad`
// ([M, *F] both), the optional edge weight (as spmm takes it, checked against grad), num_src
// (N), and optionally the CSR's transpose, the CSC (rowptr_t, col_t, perm_t: all three or
// none); out [N, *F].
struct ArgRouteCall {
  at::Tensor rowptr, col, perm, rowptr_t, col_t, perm_t, arg, grad, out;
  SpmmWeight w;
  int64_t N = 0, M = 0, E = 0, F = 0;  // sources, rows, edges, features per row
  bool has_csc = false;
  bool done = false;                   // nothing left for a kernel (out is final)
};

inline void check_records(const at::Tensor& arg, const at::Tensor& grad, const char* op) {
  TORCH_CHECK_VALUE(grad.dim() >= 1, op, ": grad must have a row dimension");
  TORCH_CHECK_VALUE(arg.sizes() == grad.sizes(), op, ": arg and grad must have one shape, got ", arg.sizes(),
                    " and ", grad.sizes());
  TORCH_CHECK_TYPE(arg.scalar_type() == at::kLong, op, ": arg must be int64 (the forward's records), got ",
                   arg.scalar_type());
  check_feature_dtype(grad, op);
}

template <typename CheckDevice>
ArgRouteCall arg_route_call(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                            const std::optional<at::Tensor>& weight, const at::Tensor& arg,
                            const at::Tensor& grad, int64_t num_src, const std::optional<at::Tensor>& rowptr_t,
                            const std::optional<at::Tensor>& col_t, const std::optional<at::Tensor>& perm_t,
                            const char* op, const CheckDevice& check_device) {
  ArgRouteCall c;
  check_structure(rowptr, col, perm, op);
  const bool given[3] = {rowptr_t.has_value() && rowptr_t->defined(), col_t.has_value() && col_t->defined(),
                         perm_t.has_value() && perm_t->defined()};
  TORCH_CHECK_VALUE(given[0] == given[1] && given[1] == given[2], op,
                    ": rowptr_t, col_t and perm_t come together (the CSC) or not at all");
  c.has_csc = given[0];
  TORCH_CHECK_VALUE(num_src >= 0, op, ": num_src must be non-negative, got ", num_src);
  if (c.has_csc) {
    check_structure(*rowptr_t, *col_t, *perm_t, op);
    TORCH_CHECK_VALUE(col_t->numel() == col.numel() && rowptr_t->numel() == num_src + 1, op, ": the CSC (",
                      rowptr_t->numel() - 1, " sources, ", col_t->numel(), " edges) is not the transpose of a CSR of ",
                      col.numel(), " edges from ", num_src, " sources");
    TORCH_CHECK_TYPE(rowptr_t->scalar_type() == rowptr.scalar_type(), op,
                     ": the CSR and the CSC must share one index dtype");
  }
  check_records(arg, grad, op);
  TORCH_CHECK_VALUE(grad.size(0) == rowptr.numel() - 1, op, ": grad has ", grad.size(0), " rows for ",
                    rowptr.numel() - 1, " destination rows");
  check_device(rowptr, "rowptr");
  check_device(col, "col");
  check_device(perm, "perm");
  if (c.has_csc) {
    check_device(*rowptr_t, "rowptr_t");
    check_device(*col_t, "col_t");
    check_device(*perm_t, "perm_t");
  }
  check_device(arg, "arg");
  check_device(grad, "grad");
  if (weight.has_value() && weight->defined()) check_device(*weight, "weight");
  c.rowptr = rowptr.contiguous();
  c.col = col.contiguous();
  c.perm = perm.contiguous();
  if (c.has_csc) {
    c.rowptr_t = rowptr_t->contiguous();
    c.col_t = col_t->contiguous();
    c.perm_t = perm_t->contiguous();
  }
  c.arg = arg.contiguous();
  c.grad = grad.contiguous();
  c.N = num_src;
  c.M = c.grad.size(0);
  c.E = c.col.numel();
  c.F = c10::multiply_integers(c.grad.sizes().slice(1));
  c.w = parse_weight(weight, c.grad, c.E, op);
  std::vector<int64_t> shape(c.grad.sizes().begin(), c.grad.sizes().end());
  shape[0] = c.N;
  c.out = at::empty(shape, c.grad.options());
  if (c.N == 0 || c.F == 0) {
    c.done = true;
  } else if (c.E == 0 || c.M == 0) {
    c.out.zero_();
    c.done = true;
  }
  return c;
}

// arg_edge_dot: the CSR (rowptr, col, perm), x [N, *F], the records and gradient [M, *F] with
// as many features, `heads` dividing F; the result [E, heads] is summed in `acc` (the
// accumulator type: float, double for double; zeroed) and finish() gives it in x's dtype.
struct ArgEdgeDotCall {
  at::Tensor rowptr, col, perm, x, arg, grad, acc;
  int64_t M = 0, E = 0, F = 0;
  bool done = false;
  at::Tensor finish() const { return acc.to(x.scalar_type()); }
};

template <typename CheckDevice>
ArgEdgeDotCall arg_edge_dot_call(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                                 const at::Tensor& x, const at::Tensor& arg, const at::Tensor& grad, int64_t heads,
                                 const char* op, const CheckDevice& check_device) {
  ArgEdgeDotCall c;
  check_structure(rowptr, col, perm, op);
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": x must have a node dimension");
  check_records(arg, grad, op);
  TORCH_CHECK_TYPE(x.scalar_type() == grad.scalar_type(), op, ": x and grad dtypes differ");
  check_device(rowptr, "rowptr");
  check_device(col, "col");
  check_device(perm, "perm");
  check_device(x, "x");
  check_device(arg, "arg");
  check_device(grad, "grad");
  c.rowptr = rowptr.contiguous();
  c.col = col.contiguous();
  c.perm = perm.contiguous();
  c.x = x.contiguous();
  c.arg = arg.contiguous();
  c.grad = grad.contiguous();
  c.M = c.rowptr.numel() - 1;
  c.E = c.col.numel();
  c.F = c10::multiply_integers(c.x.sizes().slice(1));
  check_edge_dot_g(c.grad, c.M, c.F, heads, op);
  c.acc = at::zeros({c.E, heads}, c.x.options().dtype(c.x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat));
  c.done = c.M == 0 || c.E == 0 || c.F == 0;
  return c;
}

}  // namespace gnncompile
