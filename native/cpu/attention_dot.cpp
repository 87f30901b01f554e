// gnncompile::attention_dot and gnncompile::attention_dot_backward on the CPU: TransformerConv's
// dot-product attention (logits scale * (<q_i, k_j> + <qe_i, ea_e>), softmax, dropout, aggregation
// of v_j and ea_e) in one pass per destination row; the backward in one pass over the CSR and one
// over the CSC (attention_dot_core.h). Deterministic: every output row is produced by one thread in
// a fixed order.
#include <torch/library.h>

#include "../common/counter_rng.h"
#include "attention_dot_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

struct DotCall {
  at::Tensor rowptr, col, perm, q, k, v, qe, ea;
  int64_t N = 0, M = 0, E = 0, H = 0, C = 0, De = 0;
  double logit_scale = 1.0;
  bool dropout = false;
  uint64_t key = 0;
  uint32_t threshold = 0;
  double scale = 1.0;
};

DotCall dot_call(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& q,
                 const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& qe,
                 const std::optional<at::Tensor>& ea, double logit_scale, double p,
                 const std::optional<at::Tensor>& seed, const char* op) {
  DotCall c;
  check_structure(rowptr, col, perm, op);
  check_cpu(rowptr, op, "rowptr");
  check_cpu(col, op, "col");
  check_cpu(perm, op, "perm");
  TORCH_CHECK_VALUE(k.dim() == 3, op, ": k must be [num_src, heads, channels], got ", k.sizes());
  check_feature_dtype(k, op);
  check_cpu(k, op, "k");
  c.N = k.size(0);
  c.H = k.size(1);
  c.C = k.size(2);
  c.M = rowptr.numel() - 1;
  c.E = col.numel();
  TORCH_CHECK_VALUE(q.dim() == 3 && q.size(0) == c.M && q.size(1) == c.H && q.size(2) == c.C, op, ": q must be [",
                    c.M, ", ", c.H, ", ", c.C, "] (a row per destination), got ", q.sizes());
  TORCH_CHECK_VALUE(v.dim() == 3 && v.size(0) == c.N && v.size(1) == c.H && v.size(2) == c.C, op, ": v must be [",
                    c.N, ", ", c.H, ", ", c.C, "] (k's shape), got ", v.sizes());
  for (const at::Tensor* t : {&q, &v})
    TORCH_CHECK_TYPE(t->scalar_type() == k.scalar_type(), op, ": q, v, qe and edge_attr must have k's dtype ",
                     k.scalar_type());
  check_cpu(q, op, "q");
  check_cpu(v, op, "v");
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
    check_cpu(*qe, op, "qe");
    check_cpu(*ea, op, "edge_attr");
    c.qe = qe->contiguous();
    c.ea = ea->contiguous();
  }
  TORCH_CHECK_VALUE(std::isfinite(logit_scale), op, ": scale must be finite, got ", logit_scale);
  c.logit_scale = logit_scale;
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
  c.q = q.contiguous();
  c.k = k.contiguous();
  c.v = v.contiguous();
  return c;
}

template <typename scalar_t, typename core_t, typename index_t>
AttentionDotArgs<core_t, index_t> core_args(const DotCall& c) {
  using a_t = typename acc_type<core_t>::type;
  AttentionDotArgs<core_t, index_t> a;
  a.rowptr = c.rowptr.const_data_ptr<index_t>();
  a.col = c.col.const_data_ptr<index_t>();
  a.perm = c.perm.const_data_ptr<index_t>();
  a.q = core_ptr<scalar_t>(c.q);
  a.k = core_ptr<scalar_t>(c.k);
  a.v = core_ptr<scalar_t>(c.v);
  a.qe = c.qe.defined() ? core_ptr<scalar_t>(c.qe) : nullptr;
  a.ea = c.ea.defined() ? core_ptr<scalar_t>(c.ea) : nullptr;
  a.N = c.N;
  a.M = c.M;
  a.E = c.E;
  a.H = c.H;
  a.C = c.C;
  a.De = c.De;
  a.logit_scale = static_cast<a_t>(c.logit_scale);
  a.dropout = c.dropout;
  a.key = c.key;
  a.threshold = c.threshold;
  a.scale = static_cast<a_t>(c.scale);
  return a;
}

at::ScalarType acc_of(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_dot_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& qe,
    const std::optional<at::Tensor>& edge_attr, double scale, double p, const std::optional<at::Tensor>& seed,
    c10::IntArrayRef knobs, const std::optional<at::Tensor>& /*rowptr_t*/,
    const std::optional<at::Tensor>& /*col_t*/, const std::optional<at::Tensor>& /*perm_t*/) {
  const char* op = "gnncompile.attention_dot";
  const DotCall c = dot_call(rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, op);
  check_rowptr(c.rowptr, c.E, op);
  at::Tensor out = at::empty({c.M, c.H, c.C}, c.k.options());
  at::Tensor out_e = at::empty({c.M, c.H, c.De}, c.k.options());
  at::Tensor stats = at::empty({c.M, 2, c.H}, c.k.options().dtype(acc_of(c.k)));
  if (c.E == 0 || c.H == 0 || c.M == 0) {
    check_unwalked_structure(c.col, c.perm, c.N, op);
    out.zero_();
    out_e.zero_();
    stats.zero_();
    return {out, out_e, stats};
  }
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.k.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      using a_t = typename acc_type<core_t>::type;
      AttentionDotArgs<core_t, index_t> a = core_args<scalar_t, core_t, index_t>(c);
      a.prefetch = prefetch_distance(knobs);
      core_t* o = core_ptr<scalar_t>(out);
      core_t* oe = c.ea.defined() ? core_ptr<scalar_t>(out_e) : nullptr;
      a_t* s = reinterpret_cast<a_t*>(stats.data_ptr());
      st = parallel_rows(a.rowptr, c.M, knobs, [&](int64_t r0, int64_t r1) {
        return attention_dot_rows<core_t, index_t>(a, o, oe, s, r0, r1);
      });
    });
  });
  raise_status(st, op, c.N, c.E);
  return {out, out_e, stats};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_dot_backward_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& qe,
    const std::optional<at::Tensor>& edge_attr, double scale, double p, const std::optional<at::Tensor>& seed,
    const at::Tensor& out_in, const at::Tensor& out_e_in, const at::Tensor& stats_in, const at::Tensor& grad_in,
    const at::Tensor& grad_e_in, c10::IntArrayRef knobs, const at::Tensor& rowptr_t_in, const at::Tensor& col_t_in,
    const at::Tensor& perm_t_in) {
  const char* op = "gnncompile.attention_dot_backward";
  const DotCall c = dot_call(rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, op);
  check_structure(rowptr_t_in, col_t_in, perm_t_in, op);
  TORCH_CHECK_VALUE(col_t_in.numel() == c.E && rowptr_t_in.numel() == c.N + 1, op, ": the CSC (",
                    rowptr_t_in.numel() - 1, " sources, ", col_t_in.numel(),
                    " edges) is not the transpose of a CSR of ", c.E, " edges from ", c.N, " sources");
  TORCH_CHECK_TYPE(rowptr_t_in.scalar_type() == c.rowptr.scalar_type(), op,
                   ": the CSR and the CSC must share one index dtype");
  check_cpu(rowptr_t_in, op, "rowptr_t");
  check_cpu(col_t_in, op, "col_t");
  check_cpu(perm_t_in, op, "perm_t");
  for (const at::Tensor* t : {&out_in, &grad_in}) {
    TORCH_CHECK_VALUE(t->dim() == 3 && t->size(0) == c.M && t->size(1) == c.H && t->size(2) == c.C, op,
                      ": out and grad must be [", c.M, ", ", c.H, ", ", c.C, "], got ", t->sizes());
    TORCH_CHECK_TYPE(t->scalar_type() == c.k.scalar_type(), op, ": out and grad must have k's dtype");
    check_cpu(*t, op, t == &out_in ? "out" : "grad");
  }
  for (const at::Tensor* t : {&out_e_in, &grad_e_in}) {
    TORCH_CHECK_VALUE(t->dim() == 3 && t->size(0) == c.M && t->size(1) == c.H && t->size(2) == c.De, op,
                      ": out_e and grad_e must be [", c.M, ", ", c.H, ", ", c.De, "], got ", t->sizes());
    TORCH_CHECK_TYPE(t->scalar_type() == c.k.scalar_type(), op, ": out_e and grad_e must have k's dtype");
    check_cpu(*t, op, t == &out_e_in ? "out_e" : "grad_e");
  }
  const at::ScalarType acc = acc_of(c.k);
  TORCH_CHECK_VALUE(stats_in.dim() == 3 && stats_in.size(0) == c.M && stats_in.size(1) == 2 &&
                        stats_in.size(2) == c.H,
                    op, ": stats must be [", c.M, ", 2, ", c.H, "] (the forward's), got ", stats_in.sizes());
  TORCH_CHECK_TYPE(stats_in.scalar_type() == acc, op, ": stats must be ", acc, " (the forward's), got ",
                   stats_in.scalar_type());
  check_cpu(stats_in, op, "stats");
  check_rowptr(c.rowptr, c.E, op);
  const at::Tensor rowptr_t = rowptr_t_in.contiguous(), col_t = col_t_in.contiguous(),
                   perm_t = perm_t_in.contiguous();
  check_rowptr(rowptr_t, c.E, op);
  const at::Tensor out = out_in.contiguous(), out_e = out_e_in.contiguous(), stats = stats_in.contiguous(),
                   grad = grad_in.contiguous(), grad_e = grad_e_in.contiguous();
  at::Tensor g_q = at::empty_like(c.q);
  at::Tensor g_k = at::empty_like(c.k);
  at::Tensor g_v = at::empty_like(c.v);
  at::Tensor g_qe = c.qe.defined() ? at::empty_like(c.qe) : at::empty({c.M, c.H, 0}, c.k.options());
  at::Tensor g_ea = c.ea.defined() ? at::empty_like(c.ea) : at::empty({c.E, 0}, c.k.options());
  if (c.E == 0 || c.H == 0 || c.M == 0) {
    check_unwalked_structure(c.col, c.perm, c.N, op);
    check_unwalked_structure(col_t, perm_t, c.M, op);
    for (at::Tensor* t : {&g_q, &g_k, &g_v, &g_qe, &g_ea}) t->zero_();
    return {g_q, g_k, g_v, g_qe, g_ea};
  }
  ensure_perm_unique(c.perm, op);  // per-edge records are written at perm[j], once per slot
  const int64_t rb = acc == at::kDouble ? dot_record_bytes<double>(c.H) : dot_record_bytes<float>(c.H);
  at::Tensor rec = at::empty({c.E * rb + 64}, c.k.options().dtype(at::kByte));  // (+ 64: room to align)
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.k.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      using a_t = typename acc_type<core_t>::type;
      AttentionDotArgs<core_t, index_t> a = core_args<scalar_t, core_t, index_t>(c);
      a.prefetch = prefetch_distance(knobs);
      a.rowptr_t = rowptr_t.const_data_ptr<index_t>();
      a.col_t = col_t.const_data_ptr<index_t>();
      a.perm_t = perm_t.const_data_ptr<index_t>();
      const core_t* o = core_ptr<scalar_t>(out);
      const core_t* oe = core_ptr<scalar_t>(out_e);
      const core_t* g = core_ptr<scalar_t>(grad);
      const core_t* ge = core_ptr<scalar_t>(grad_e);
      const a_t* s = reinterpret_cast<const a_t*>(stats.const_data_ptr());
      char* rp = reinterpret_cast<char*>(rec.data_ptr());
      rp += (64 - reinterpret_cast<uintptr_t>(rp) % 64) % 64;  // records on cache-line boundaries
      core_t* gq = core_ptr<scalar_t>(g_q);
      core_t* gk = core_ptr<scalar_t>(g_k);
      core_t* gv = core_ptr<scalar_t>(g_v);
      core_t* gqe = core_ptr<scalar_t>(g_qe);
      core_t* gea = c.ea.defined() ? core_ptr<scalar_t>(g_ea) : nullptr;
      st = parallel_rows(a.rowptr, c.M, knobs, [&](int64_t r0, int64_t r1) {
        return attention_dot_dst_rows<core_t, index_t>(a, o, oe, g, ge, s, gq, gqe, gea, rp, r0, r1);
      });
      if (st == Status::Ok)
        st = parallel_rows(a.rowptr_t, c.N, knobs, [&](int64_t r0, int64_t r1) {
          return attention_dot_source_rows<core_t, index_t>(a, g, rp, gk, gv, r0, r1);
        });
    });
  });
  raise_status(st, op, std::max(c.N, c.M), c.E);
  return {g_q, g_k, g_v, g_qe, g_ea};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("attention_dot", &attention_dot_cpu);
  m.impl("attention_dot_backward", &attention_dot_backward_cpu);
}

}  // namespace cpu
}  // namespace gnncompile
