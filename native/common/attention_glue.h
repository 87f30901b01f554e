// The input checks of gnncompile::attention and gnncompile::attention_backward (graph attention
// in one pass: native/cpu/attention_core.h, native/cuda/attention_core.cuh) that the CPU and the
// CUDA glue share, with the same messages. Torch-side, not for the cores.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <optional>

#include "counter_rng.h"
#include "torch_glue.h"

namespace gnncompile {

// One attention call: the CSR (rowptr, col, perm) over M destinations, x [N, H, C], a_src [N, H],
// a_dst [M, H], a_edge [E, H] (or undefined), contiguous; the dropout key.
struct AttentionCall {
  at::Tensor rowptr, col, perm, x, a_src, a_dst, a_edge;
  int64_t N = 0, M = 0, E = 0, H = 0, C = 0;
  bool dropout = false;
  uint64_t key = 0;
  uint32_t threshold = 0;
  double scale = 1.0;
};

template <typename CheckDevice>
AttentionCall attention_call(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                             const at::Tensor& x, const at::Tensor& a_src, const at::Tensor& a_dst,
                             const std::optional<at::Tensor>& a_edge, double slope, double p,
                             const std::optional<at::Tensor>& seed, const char* op, const CheckDevice& check_device) {
  AttentionCall c;
  check_structure(rowptr, col, perm, op);
  check_device(rowptr, "rowptr");
  check_device(col, "col");
  check_device(perm, "perm");
  TORCH_CHECK_VALUE(x.dim() == 3, op, ": x must be [num_src, heads, channels], got ", x.sizes());
  check_feature_dtype(x, op);
  check_device(x, "x");
  c.N = x.size(0);
  c.H = x.size(1);
  c.C = x.size(2);
  c.M = rowptr.numel() - 1;
  c.E = col.numel();
  TORCH_CHECK_VALUE(a_src.dim() == 2 && a_src.size(0) == c.N && a_src.size(1) == c.H, op, ": a_src must be [",
                    c.N, ", ", c.H, "] (a score per source node and head), got ", a_src.sizes());
  TORCH_CHECK_VALUE(a_dst.dim() == 2 && a_dst.size(0) == c.M && a_dst.size(1) == c.H, op, ": a_dst must be [",
                    c.M, ", ", c.H, "] (a score per destination row and head), got ", a_dst.sizes());
  TORCH_CHECK_TYPE(a_src.scalar_type() == x.scalar_type() && a_dst.scalar_type() == x.scalar_type(), op,
                   ": a_src and a_dst must have x's dtype ", x.scalar_type());
  check_device(a_src, "a_src");
  check_device(a_dst, "a_dst");
  if (a_edge.has_value() && a_edge->defined()) {
    TORCH_CHECK_VALUE(a_edge->dim() == 2 && a_edge->size(0) == c.E && a_edge->size(1) == c.H, op,
                      ": a_edge must be [", c.E, ", ", c.H, "] (a score per edge and head), got ", a_edge->sizes());
    TORCH_CHECK_TYPE(a_edge->scalar_type() == x.scalar_type(), op, ": a_edge must have x's dtype ",
                     x.scalar_type());
    check_device(*a_edge, "a_edge");
    c.a_edge = a_edge->contiguous();
  }
  TORCH_CHECK_VALUE(std::isfinite(slope), op, ": negative_slope must be finite, got ", slope);
  TORCH_CHECK_VALUE(p >= 0.0 && p < 1.0, op, ": dropout p must be in [0, 1), got ", p);
  if (p > 0.0) {
    TORCH_CHECK_VALUE(seed.has_value() && seed->defined() && seed->numel() == 1 &&
                          seed->scalar_type() == at::kLong && seed->device().is_cpu(),
                      op, ": dropout p > 0 needs a seed, one int64 on the CPU");
    c.dropout = true;
    c.key = splitmix64(static_cast<uint64_t>(seed->item<int64_t>()));
    c.threshold = keep_threshold(p);
    c.scale = 1.0 / (1.0 - p);
  }
  c.rowptr = rowptr.contiguous();
  c.col = col.contiguous();
  c.perm = perm.contiguous();
  c.x = x.contiguous();
  c.a_src = a_src.contiguous();
  c.a_dst = a_dst.contiguous();
  return c;
}

// The backward's extra inputs: the CSC (all three), out and grad [M, H, C], stats [M, 2, H].
template <typename CheckDevice>
void check_attention_backward(const AttentionCall& c, const at::Tensor& rowptr_t, const at::Tensor& col_t,
                              const at::Tensor& perm_t, const at::Tensor& out, const at::Tensor& stats,
                              const at::Tensor& grad, const char* op, const CheckDevice& check_device) {
  check_structure(rowptr_t, col_t, perm_t, op);
  TORCH_CHECK_VALUE(col_t.numel() == c.E && rowptr_t.numel() == c.N + 1, op, ": the CSC (", rowptr_t.numel() - 1,
                    " sources, ", col_t.numel(), " edges) is not the transpose of a CSR of ", c.E, " edges from ",
                    c.N, " sources");
  TORCH_CHECK_TYPE(rowptr_t.scalar_type() == c.rowptr.scalar_type(), op,
                   ": the CSR and the CSC must share one index dtype");
  check_device(rowptr_t, "rowptr_t");
  check_device(col_t, "col_t");
  check_device(perm_t, "perm_t");
  for (const at::Tensor* t : {&out, &grad}) {
    TORCH_CHECK_VALUE(t->dim() == 3 && t->size(0) == c.M && t->size(1) == c.H && t->size(2) == c.C, op,
                      ": out and grad must be [", c.M, ", ", c.H, ", ", c.C, "], got ", t->sizes());
    TORCH_CHECK_TYPE(t->scalar_type() == c.x.scalar_type(), op, ": out and grad must have x's dtype");
    check_device(*t, t == &out ? "out" : "grad");
  }
  const at::ScalarType acc = c.x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK_VALUE(stats.dim() == 3 && stats.size(0) == c.M && stats.size(1) == 2 && stats.size(2) == c.H, op,
                    ": stats must be [", c.M, ", 2, ", c.H, "] (the forward's), got ", stats.sizes());
  TORCH_CHECK_TYPE(stats.scalar_type() == acc, op, ": stats must be ", acc, " (the forward's), got ",
                   stats.scalar_type());
  check_device(stats, "stats");
}

}  // namespace gnncompile
