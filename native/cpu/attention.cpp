// gnncompile::attention and gnncompile::attention_backward on the CPU: graph attention (scores,
// softmax, dropout, aggregation) in one pass per destination row; the backward in one pass over
// the CSC and two light passes (the rows' records; the destinations' sums of the logit gradients,
// read in CSC order) (attention_core.h). Deterministic: every output row is produced by one
// thread in a fixed order.
#include <torch/library.h>

#include "../common/attention_glue.h"
#include "attention_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

template <typename core_t, typename index_t>
AttentionArgs<core_t, index_t> core_args(const AttentionCall& c) {
  using scalar_t = core_t;
  AttentionArgs<core_t, index_t> a;
  set_core_common<index_t, typename acc_type<scalar_t>::type>(a, c);
  return a;
}

template <typename scalar_t, typename core_t, typename index_t>
void set_features(AttentionArgs<core_t, index_t>& a, const AttentionCall& c, double slope) {
  a.x = core_ptr<scalar_t>(c.x);
  a.a_src = core_ptr<scalar_t>(c.a_src);
  a.a_dst = core_ptr<scalar_t>(c.a_dst);
  a.a_edge = c.a_edge.defined() ? core_ptr<scalar_t>(c.a_edge) : nullptr;
  a.slope = static_cast<typename acc_type<core_t>::type>(slope);
}

std::tuple<at::Tensor, at::Tensor> attention_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& x,
    const at::Tensor& a_src, const at::Tensor& a_dst, const std::optional<at::Tensor>& a_edge, double slope,
    double p, const std::optional<at::Tensor>& seed, c10::IntArrayRef knobs,
    const std::optional<at::Tensor>& /*rowptr_t*/, const std::optional<at::Tensor>& /*col_t*/,
    const std::optional<at::Tensor>& /*perm_t*/) {
  const char* op = "gnncompile.attention";
  const AttentionCall c = attention_call(rowptr, col, perm, x, a_src, a_dst, a_edge, slope, p, seed, op, on_cpu(op));
  check_rowptr(c.rowptr, c.E, op);
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor out = at::empty({c.M, c.H, c.C}, c.x.options());
  at::Tensor stats = at::empty({c.M, 2, c.H}, c.x.options().dtype(acc));
  if (c.E == 0 || c.H == 0 || c.M == 0) {
    check_unwalked_structure(c.col, c.perm, c.N, op);
    out.zero_();
    stats.zero_();
    return {out, stats};
  }
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.x.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      using a_t = typename acc_type<core_t>::type;
      AttentionArgs<core_t, index_t> a = core_args<core_t, index_t>(c);
      set_features<scalar_t>(a, c, slope);
      a.prefetch = prefetch_distance(knobs);
      core_t* o = core_ptr<scalar_t>(out);
      a_t* s = reinterpret_cast<a_t*>(stats.data_ptr());
      st = parallel_rows(a.rowptr, c.M, knobs, [&](int64_t r0, int64_t r1) {
        return attention_rows<core_t, index_t>(a, o, s, r0, r1);
      });
    });
  });
  raise_status(st, op, c.N, c.E);
  return {out, stats};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& x,
    const at::Tensor& a_src, const at::Tensor& a_dst, const std::optional<at::Tensor>& a_edge, double slope,
    double p, const std::optional<at::Tensor>& seed, const at::Tensor& out_in, const at::Tensor& stats_in,
    const at::Tensor& grad_in, c10::IntArrayRef knobs, const at::Tensor& rowptr_t_in, const at::Tensor& col_t_in,
    const at::Tensor& perm_t_in) {
  const char* op = "gnncompile.attention_backward";
  const AttentionCall c = attention_call(rowptr, col, perm, x, a_src, a_dst, a_edge, slope, p, seed, op, on_cpu(op));
  check_attention_backward(c, c.x, "x", rowptr_t_in, col_t_in, perm_t_in, out_in, stats_in, grad_in, op, on_cpu(op));
  check_rowptr(c.rowptr, c.E, op);
  const at::Tensor rowptr_t = rowptr_t_in.contiguous(), col_t = col_t_in.contiguous(),
                   perm_t = perm_t_in.contiguous();
  check_rowptr(rowptr_t, c.E, op);
  const at::Tensor out = out_in.contiguous(), stats = stats_in.contiguous(), grad = grad_in.contiguous();
  const at::ScalarType acc = stats.scalar_type();
  at::Tensor gx = at::empty_like(c.x);
  at::Tensor g_src = at::empty_like(c.a_src);
  at::Tensor g_dst = at::empty_like(c.a_dst);
  if (c.E == 0 || c.H == 0 || c.M == 0) {
    check_unwalked_structure(c.col, c.perm, c.N, op);
    check_unwalked_structure(col_t, perm_t, c.M, op);
    gx.zero_();
    g_src.zero_();
    g_dst.zero_();
    return {gx, g_src, g_dst, at::zeros({c.a_edge.defined() ? c.E : 0, c.H}, c.x.options())};
  }
  ensure_perm_unique(perm_t, op);  // a CSC is a permutation of the edges (d_edge[perm_t[k]] is written once per slot)
  at::Tensor rec = at::empty({c.M, 4 * c.H}, stats.options());
  at::Tensor d_edge = at::empty({c.E, c.H}, stats.options().dtype(acc));
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.x.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      using a_t = typename acc_type<core_t>::type;
      AttentionArgs<core_t, index_t> a = core_args<core_t, index_t>(c);
      set_features<scalar_t>(a, c, slope);
      a.prefetch = prefetch_distance(knobs);
      a.rowptr_t = rowptr_t.const_data_ptr<index_t>();
      a.col_t = col_t.const_data_ptr<index_t>();
      a.perm_t = perm_t.const_data_ptr<index_t>();
      const core_t* o = core_ptr<scalar_t>(out);
      const core_t* g = core_ptr<scalar_t>(grad);
      const a_t* s = reinterpret_cast<const a_t*>(stats.const_data_ptr());
      a_t* rp = reinterpret_cast<a_t*>(rec.data_ptr());
      a_t* de = reinterpret_cast<a_t*>(d_edge.data_ptr());
      core_t* gxp = core_ptr<scalar_t>(gx);
      core_t* gsp = core_ptr<scalar_t>(g_src);
      core_t* gdp = core_ptr<scalar_t>(g_dst);
      const int64_t H = c.H, C = c.C;
      const core_t* ad = core_ptr<scalar_t>(c.a_dst);
      at::parallel_for(0, c.M, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, H * C)), [&](int64_t r0, int64_t r1) {
        attention_row_records<core_t>(o, g, s, ad, rp, H, C, r0, r1);
      });
      st = parallel_rows(a.rowptr_t, c.N, knobs, [&](int64_t r0, int64_t r1) {
        return attention_source_rows<core_t, index_t>(a, rp, g, gxp, gsp, de, r0, r1);
      });
      if (st == Status::Ok)
        st = parallel_rows(a.rowptr, c.M, knobs, [&](int64_t r0, int64_t r1) {
          return attention_dst_rows<core_t, index_t>(a, de, gdp, r0, r1);
        });
    });
  });
  raise_status(st, op, std::max(c.N, c.M), c.E);
  // the gradient of a_edge ([0, H] without one: a schema's outputs are tensors)
  return {gx, g_src, g_dst, c.a_edge.defined() ? d_edge.to(c.x.scalar_type()) : at::empty({0, c.H}, c.x.options())};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("attention", &attention_cpu);
  m.impl("attention_backward", &attention_backward_cpu);
}

}  // namespace cpu
}  // namespace gnncompile
