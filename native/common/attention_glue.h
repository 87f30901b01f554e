// The input checks of the fused attention ops and their backwards (gnncompile::attention,
// attention_v2, attention_dot: native/cpu/attention*_core.h, native/cuda/attention*_core.cuh)
// that the CPU and the CUDA glue share, with the same messages. Torch-side, not for the cores.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <optional>

#include "counter_rng.h"
#include "torch_glue.h"

namespace gnncompile {

// What every attention call holds: the CSR over M destinations (contiguous), the sizes (N sources,
// E edges, H heads, C channels) and the dropout key.
struct AttentionCallBase {
  at::Tensor rowptr, col, perm;
  int64_t N = 0, M = 0, E = 0, H = 0, C = 0;
  bool dropout = false;
  uint64_t key = 0;
  uint32_t threshold = 0;
  double scale = 1.0;
};

// The attention dropout of every fused attention op: p in [0, 1), and with p > 0 a seed (one
// int64 on the CPU) whose key draws the mask (counter_rng.h). Sets c.dropout, key, threshold, scale.
inline void parse_dropout(AttentionCallBase& c, double p, const std::optional<at::Tensor>& seed, const char* op) {
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
}

// The checks every attention call opens with: the CSR (its index tensors on the device), the
// features x [num_src, heads, channels] (named `name`) of a float dtype; sets c's N, H, C (x's
// sizes), M, E and the contiguous CSR.
template <typename CheckDevice>
void check_call_head(AttentionCallBase& c, const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                     const at::Tensor& x, const char* name, const char* op, const CheckDevice& check_device) {
  check_structure(rowptr, col, perm, op);
  check_device(rowptr, "rowptr");
  check_device(col, "col");
  check_device(perm, "perm");
  TORCH_CHECK_VALUE(x.dim() == 3, op, ": ", name, " must be [num_src, heads, channels], got ", x.sizes());
  check_feature_dtype(x, op);
  check_device(x, name);
  c.N = x.size(0);
  c.H = x.size(1);
  c.C = x.size(2);
  c.M = rowptr.numel() - 1;
  c.E = col.numel();
  c.rowptr = rowptr.contiguous();
  c.col = col.contiguous();
  c.perm = perm.contiguous();
}

// The structure, sizes and dropout of a call into a kernel core's arguments (the CPU cores' *Args
// and the CUDA cores' *Params name them alike); I: the index type, A: the core's accumulator type.
template <typename I, typename A, typename Core>
void set_core_common(Core& a, const AttentionCallBase& c) {
  a.rowptr = c.rowptr.const_data_ptr<I>();
  a.col = c.col.const_data_ptr<I>();
  a.perm = c.perm.const_data_ptr<I>();
  a.N = c.N;
  a.M = c.M;
  a.E = c.E;
  a.H = c.H;
  a.C = c.C;
  a.dropout = c.dropout;
  a.key = c.key;
  a.threshold = c.threshold;
  a.scale = static_cast<A>(c.scale);
}

// One attention call: the CSR (rowptr, col, perm) over M destinations, x [N, H, C], a_src [N, H],
// a_dst [M, H], a_edge [E, H] (or undefined), contiguous; the dropout key.
struct AttentionCall : AttentionCallBase {
  at::Tensor x, a_src, a_dst, a_edge;
};

template <typename CheckDevice>
AttentionCall attention_call(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                             const at::Tensor& x, const at::Tensor& a_src, const at::Tensor& a_dst,
                             const std::optional<at::Tensor>& a_edge, double slope, double p,
                             const std::optional<at::Tensor>& seed, const char* op, const CheckDevice& check_device) {
  AttentionCall c;
  check_call_head(c, rowptr, col, perm, x, "x", op, check_device);
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
  parse_dropout(c, p, seed, op);
  c.x = x.contiguous();
  c.a_src = a_src.contiguous();
  c.a_dst = a_dst.contiguous();
  return c;
}

// The backward's CSC: all three index tensors, the transpose's sizes, the CSR's index dtype.
template <typename CheckDevice>
void check_backward_csc(const at::Tensor& rowptr, int64_t N, int64_t E, const at::Tensor& rowptr_t,
                        const at::Tensor& col_t, const at::Tensor& perm_t, const char* op,
                        const CheckDevice& check_device) {
  check_structure(rowptr_t, col_t, perm_t, op);
  TORCH_CHECK_VALUE(col_t.numel() == E && rowptr_t.numel() == N + 1, op, ": the CSC (", rowptr_t.numel() - 1,
                    " sources, ", col_t.numel(), " edges) is not the transpose of a CSR of ", E, " edges from ", N,
                    " sources");
  TORCH_CHECK_TYPE(rowptr_t.scalar_type() == rowptr.scalar_type(), op,
                   ": the CSR and the CSC must share one index dtype");
  check_device(rowptr_t, "rowptr_t");
  check_device(col_t, "col_t");
  check_device(perm_t, "perm_t");
}

// A forward output and its gradient (names a and b): [M, H, C], of `feat`'s dtype (named).
template <typename CheckDevice>
void check_output_pair(const at::Tensor& a, const at::Tensor& b, const char* name_a, const char* name_b, int64_t M,
                       int64_t H, int64_t C, const at::Tensor& feat, const char* feat_name, const char* op,
                       const CheckDevice& check_device) {
  for (const at::Tensor* t : {&a, &b}) {
    TORCH_CHECK_VALUE(t->dim() == 3 && t->size(0) == M && t->size(1) == H && t->size(2) == C, op, ": ", name_a,
                      " and ", name_b, " must be [", M, ", ", H, ", ", C, "], got ", t->sizes());
    TORCH_CHECK_TYPE(t->scalar_type() == feat.scalar_type(), op, ": ", name_a, " and ", name_b, " must have ",
                     feat_name, "'s dtype");
    check_device(*t, t == &a ? name_a : name_b);
  }
}

// The forward's stats: [M, 2, H] in the accumulator dtype of `feat` (double for double, else float).
template <typename CheckDevice>
void check_attention_stats(const at::Tensor& stats, int64_t M, int64_t H, const at::Tensor& feat, const char* op,
                           const CheckDevice& check_device) {
  const at::ScalarType acc = feat.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK_VALUE(stats.dim() == 3 && stats.size(0) == M && stats.size(1) == 2 && stats.size(2) == H, op,
                    ": stats must be [", M, ", 2, ", H, "] (the forward's), got ", stats.sizes());
  TORCH_CHECK_TYPE(stats.scalar_type() == acc, op, ": stats must be ", acc, " (the forward's), got ",
                   stats.scalar_type());
  check_device(stats, "stats");
}

// The backward's extra inputs (attention's and attention_v2's): the CSC (all three), out and grad
// [M, H, C] of the features' dtype (x, named), stats [M, 2, H].
template <typename CheckDevice>
void check_attention_backward(const AttentionCallBase& c, const at::Tensor& x, const char* x_name,
                              const at::Tensor& rowptr_t, const at::Tensor& col_t, const at::Tensor& perm_t,
                              const at::Tensor& out, const at::Tensor& stats, const at::Tensor& grad, const char* op,
                              const CheckDevice& check_device) {
  check_backward_csc(c.rowptr, c.N, c.E, rowptr_t, col_t, perm_t, op, check_device);
  check_output_pair(out, grad, "out", "grad", c.M, c.H, c.C, x, x_name, op, check_device);
  check_attention_stats(stats, c.M, c.H, x, op, check_device);
}

// ------------------------------------------------------------------------------ attention_v2
// One GATv2 attention call (native/cpu/attention_v2_core.h, native/cuda/attention_v2_core.cuh):
// the CSR over M destinations, x_l [N, H, C], x_r [M, H, C], att [H, C] (or [1, H, C]), e_term
// [E, H, C] (or undefined), contiguous; the dropout key.
struct AttentionV2Call : AttentionCallBase {
  at::Tensor xl, xr, att, e_term;
};

template <typename CheckDevice>
AttentionV2Call attention_v2_call(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                                  const at::Tensor& x_l, const at::Tensor& x_r, const at::Tensor& att,
                                  const std::optional<at::Tensor>& e_term, double slope, double p,
                                  const std::optional<at::Tensor>& seed, const char* op,
                                  const CheckDevice& check_device) {
  AttentionV2Call c;
  check_call_head(c, rowptr, col, perm, x_l, "x_l", op, check_device);
  TORCH_CHECK_VALUE(x_r.dim() == 3 && x_r.size(0) == c.M && x_r.size(1) == c.H && x_r.size(2) == c.C, op,
                    ": x_r must be [", c.M, ", ", c.H, ", ", c.C, "] (a row per destination), got ", x_r.sizes());
  TORCH_CHECK_VALUE(att.numel() == c.H * c.C && (att.dim() == 2 || att.dim() == 3) &&
                        att.size(att.dim() - 1) == c.C,
                    op, ": att must be [", c.H, ", ", c.C, "] (or [1, ", c.H, ", ", c.C, "]), got ", att.sizes());
  for (const at::Tensor* t : {&x_r, &att})
    TORCH_CHECK_TYPE(t->scalar_type() == x_l.scalar_type(), op, ": x_r, att and e_term must have x_l's dtype ",
                     x_l.scalar_type());
  check_device(x_r, "x_r");
  check_device(att, "att");
  if (e_term.has_value() && e_term->defined()) {
    TORCH_CHECK_VALUE(e_term->dim() == 3 && e_term->size(0) == c.E && e_term->size(1) == c.H &&
                          e_term->size(2) == c.C,
                      op, ": e_term must be [", c.E, ", ", c.H, ", ", c.C, "] (a term per edge), got ",
                      e_term->sizes());
    TORCH_CHECK_TYPE(e_term->scalar_type() == x_l.scalar_type(), op,
                     ": x_r, att and e_term must have x_l's dtype ", x_l.scalar_type());
    check_device(*e_term, "e_term");
    c.e_term = e_term->contiguous();
  }
  TORCH_CHECK_VALUE(std::isfinite(slope), op, ": negative_slope must be finite, got ", slope);
  parse_dropout(c, p, seed, op);
  c.xl = x_l.contiguous();
  c.xr = x_r.contiguous();
  c.att = att.contiguous();
  return c;
}

// ------------------------------------------------------------------------------ attention_dot
// One dot-product attention call (native/cpu/attention_dot_core.h, native/cuda/
// attention_dot_core.cuh): the CSR over M destinations, q [M, H, C], k and v [N, H, C], qe
// [M, H, De] and ea [E, De] (both or neither; De = 0 without), contiguous; the dropout key.
struct AttentionDotCall : AttentionCallBase {
  at::Tensor q, k, v, qe, ea;
  int64_t De = 0;
  double logit_scale = 1.0;
};

template <typename CheckDevice>
AttentionDotCall attention_dot_call(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                                    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const std::optional<at::Tensor>& qe, const std::optional<at::Tensor>& ea,
                                    double logit_scale, double p, const std::optional<at::Tensor>& seed,
                                    const char* op, const CheckDevice& check_device) {
  AttentionDotCall c;
  check_call_head(c, rowptr, col, perm, k, "k", op, check_device);
  TORCH_CHECK_VALUE(q.dim() == 3 && q.size(0) == c.M && q.size(1) == c.H && q.size(2) == c.C, op, ": q must be [",
                    c.M, ", ", c.H, ", ", c.C, "] (a row per destination), got ", q.sizes());
  TORCH_CHECK_VALUE(v.dim() == 3 && v.size(0) == c.N && v.size(1) == c.H && v.size(2) == c.C, op, ": v must be [",
                    c.N, ", ", c.H, ", ", c.C, "] (k's shape), got ", v.sizes());
  for (const at::Tensor* t : {&q, &v})
    TORCH_CHECK_TYPE(t->scalar_type() == k.scalar_type(), op, ": q, v, qe and edge_attr must have k's dtype ",
                     k.scalar_type());
  check_device(q, "q");
  check_device(v, "v");
  const bool has_qe = qe.has_value() && qe->defined(), has_ea = ea.has_value() && ea->defined();
  TORCH_CHECK_VALUE(has_qe == has_ea, op, ": qe and edge_attr come together (both or neither)");
  if (has_ea) {
    TORCH_CHECK_VALUE(ea->dim() == 2 && ea->size(0) == c.E, op, ": edge_attr must be [", c.E,
                      ", edge_dim] (a row per edge), got ", ea->sizes());
    c.De = ea->size(1);
    TORCH_CHECK_VALUE(qe->dim() == 3 && qe->size(0) == c.M && qe->size(1) == c.H && qe->size(2) == c.De, op,
                      ": qe must be [", c.M, ", ", c.H, ", ", c.De, "] (a row per destination), got ", qe->sizes());
    for (const at::Tensor* t : {&*qe, &*ea})
      TORCH_CHECK_TYPE(t->scalar_type() == k.scalar_type(), op, ": q, v, qe and edge_attr must have k's dtype ",
                       k.scalar_type());
    check_device(*qe, "qe");
    check_device(*ea, "edge_attr");
    c.qe = qe->contiguous();
    c.ea = ea->contiguous();
  }
  TORCH_CHECK_VALUE(std::isfinite(logit_scale), op, ": scale must be finite, got ", logit_scale);
  c.logit_scale = logit_scale;
  parse_dropout(c, p, seed, op);
  c.q = q.contiguous();
  c.k = k.contiguous();
  c.v = v.contiguous();
  return c;
}

// The dot backward's extra inputs: the CSC, out and grad [M, H, C], out_e and grad_e [M, H, De],
// stats [M, 2, H].
template <typename CheckDevice>
void check_attention_dot_backward(const AttentionDotCall& c, const at::Tensor& rowptr_t, const at::Tensor& col_t,
                                  const at::Tensor& perm_t, const at::Tensor& out, const at::Tensor& out_e,
                                  const at::Tensor& stats, const at::Tensor& grad, const at::Tensor& grad_e,
                                  const char* op, const CheckDevice& check_device) {
  check_backward_csc(c.rowptr, c.N, c.E, rowptr_t, col_t, perm_t, op, check_device);
  check_output_pair(out, grad, "out", "grad", c.M, c.H, c.C, c.k, "k", op, check_device);
  check_output_pair(out_e, grad_e, "out_e", "grad_e", c.M, c.H, c.De, c.k, "k", op, check_device);
  check_attention_stats(stats, c.M, c.H, c.k, op, check_device);
}

}  // namespace gnncompile
