// gnncompile::attention_dot and gnncompile::attention_dot_backward on the CPU: TransformerConv's
// dot-product attention (logits scale * (<q_i, k_j> + <qe_i, ea_e>), softmax, dropout, aggregation
// of v_j and ea_e) in one pass per destination row; the backward in one pass over the CSR and one
// over the CSC (attention_dot_core.h). Deterministic: every output row is produced by one thread in
// a fixed order.
#include <torch/library.h>

#include "../common/attention_glue.h"
#include "attention_dot_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

using DotCall = AttentionDotCall;

template <typename scalar_t, typename core_t, typename index_t>
AttentionDotArgs<core_t, index_t> core_args(const DotCall& c) {
  using a_t = typename acc_type<core_t>::type;
  AttentionDotArgs<core_t, index_t> a;
  set_core_common<index_t, a_t>(a, c);
  a.q = core_ptr<scalar_t>(c.q);
  a.k = core_ptr<scalar_t>(c.k);
  a.v = core_ptr<scalar_t>(c.v);
  a.qe = c.qe.defined() ? core_ptr<scalar_t>(c.qe) : nullptr;
  a.ea = c.ea.defined() ? core_ptr<scalar_t>(c.ea) : nullptr;
  a.De = c.De;
  a.logit_scale = static_cast<a_t>(c.logit_scale);
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
  const DotCall c = attention_dot_call(rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, op, on_cpu(op));
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
    const at::Tensor& perm_t_in, bool grad_edge_attr) {
  const char* op = "gnncompile.attention_dot_backward";
  const DotCall c = attention_dot_call(rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, op, on_cpu(op));
  check_attention_dot_backward(c, rowptr_t_in, col_t_in, perm_t_in, out_in, out_e_in, stats_in, grad_in, grad_e_in,
                               op, on_cpu(op));
  const at::ScalarType acc = acc_of(c.k);
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
  // edge features that need no gradient (a model's input): none computed, [0, De] returned
  const bool want_ea = c.ea.defined() && grad_edge_attr;
  at::Tensor g_ea = !c.ea.defined() ? at::empty({c.E, 0}, c.k.options())
                    : want_ea       ? at::empty_like(c.ea)
                                    : at::empty({0, c.De}, c.k.options());
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
      core_t* gea = want_ea ? core_ptr<scalar_t>(g_ea) : nullptr;
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
