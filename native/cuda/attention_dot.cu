// gnncompile::attention_dot and gnncompile::attention_dot_backward on CUDA: TransformerConv's
// dot-product attention (logits scale * (<q_i, k_j> + <qe_i, ea_e>), softmax, dropout,
// aggregation of v_j and ea_e) with one warp per destination row; the backward in one pass over
// the CSR and one over the CSC (attention_dot_core.cuh). Deterministic: no atomics, every sum in a
// fixed order. The input checks are the CPU glue's (../common/attention_glue.h), with a device
// check of their own. Not yet run on a GPU (the passes leave TransformerConv's chain unfused on
// CUDA unless GNNCOMPILE_CUDA_UNVERIFIED names attention_dot).
#include <torch/library.h>

#include "../common/attention_glue.h"
#include "attention_dot_core.cuh"
#include "glue.h"

namespace gnncompile {
namespace gpu {
namespace {

template <typename scalar_t, typename T, typename I>
AttentionDotParams<T, I> core_params(const AttentionDotCall& c, const DeviceProps& props) {
  using A = acc_t<T>;
  AttentionDotParams<T, I> p;
  set_core_common<I, A>(p, c);
  p.q = dev_ptr<scalar_t>(c.q);
  p.k = dev_ptr<scalar_t>(c.k);
  p.v = dev_ptr<scalar_t>(c.v);
  p.qe = c.qe.defined() ? dev_ptr<scalar_t>(c.qe) : nullptr;
  p.ea = c.ea.defined() ? dev_ptr<scalar_t>(c.ea) : nullptr;
  p.De = c.De;
  p.logit_scale = static_cast<A>(c.logit_scale);
  // grid-strided warps, as attention.cu's; the knobs do not apply to this layout
  p.max_blocks = std::max(1, props.sm_count) * 32;
  return p;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_dot_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& qe,
    const std::optional<at::Tensor>& edge_attr, double scale, double p, const std::optional<at::Tensor>& seed,
    c10::IntArrayRef /*knobs: see core_params*/, const std::optional<at::Tensor>& /*rowptr_t*/,
    const std::optional<at::Tensor>& /*col_t*/, const std::optional<at::Tensor>& /*perm_t*/) {
  const char* op = "gnncompile.attention_dot";
  const at::Device dev = k.device();
  const AttentionDotCall c =
      attention_dot_call(rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, op, on_device(dev, op));
  const c10::cuda::CUDAGuard guard(dev);
  validate_once(c.rowptr, c.col, c.perm, c.N, op);  // col: sources, perm: edge ids
  const at::ScalarType acc = k.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor out = at::empty({c.M, c.H, c.C}, c.k.options());
  at::Tensor out_e = at::empty({c.M, c.H, c.De}, c.k.options());
  at::Tensor stats = at::empty({c.M, 2, c.H}, c.k.options().dtype(acc));
  if (c.E == 0 || c.H == 0 || c.M == 0) {
    out.zero_();
    out_e.zero_();
    stats.zero_();
    return {out, out_e, stats};
  }
  at::Tensor lg = at::empty({c.E * c.H}, stats.options());  // the rows' logits, then w
  const DeviceProps props = device_props(dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.k.scalar_type(), op, [&] {
      using T = typename cuda_type<scalar_t>::type;
      using A = acc_t<T>;
      const AttentionDotParams<T, index_t> a = core_params<scalar_t, T, index_t>(c, props);
      C10_CUDA_CHECK((attention_dot_forward_launch<T, index_t>(
          a, dev_ptr<scalar_t>(out), c.ea.defined() ? dev_ptr<scalar_t>(out_e) : nullptr,
          reinterpret_cast<A*>(stats.data_ptr()), reinterpret_cast<A*>(lg.data_ptr()), stream)));
    });
  });
  return {out, out_e, stats};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_dot_backward_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& qe,
    const std::optional<at::Tensor>& edge_attr, double scale, double p, const std::optional<at::Tensor>& seed,
    const at::Tensor& out_in, const at::Tensor& out_e_in, const at::Tensor& stats_in, const at::Tensor& grad_in,
    const at::Tensor& grad_e_in, c10::IntArrayRef /*knobs: see core_params*/, const at::Tensor& rowptr_t_in,
    const at::Tensor& col_t_in, const at::Tensor& perm_t_in, bool grad_edge_attr) {
  const char* op = "gnncompile.attention_dot_backward";
  const at::Device dev = k.device();
  const auto on = on_device(dev, op);
  const AttentionDotCall c = attention_dot_call(rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, op, on);
  check_attention_dot_backward(c, rowptr_t_in, col_t_in, perm_t_in, out_in, out_e_in, stats_in, grad_in, grad_e_in,
                               op, on);
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor rowptr_t, col_t, perm_t;  // (not structured bindings: the dispatch lambdas capture them)
  std::tie(rowptr_t, col_t, perm_t) =
      validated_csc(c.rowptr, c.col, c.perm, c.N, rowptr_t_in, col_t_in, perm_t_in, c.M, op);
  const at::Tensor out = out_in.contiguous(), out_e = out_e_in.contiguous(), stats = stats_in.contiguous(),
                   grad = grad_in.contiguous(), grad_e = grad_e_in.contiguous();
  at::Tensor g_q = at::empty_like(c.q);
  at::Tensor g_k = at::empty_like(c.k);
  at::Tensor g_v = at::empty_like(c.v);
  at::Tensor g_qe = c.qe.defined() ? at::empty_like(c.qe) : at::empty({c.M, c.H, 0}, c.k.options());
  at::Tensor g_ea = c.ea.defined() ? at::empty_like(c.ea) : at::empty({c.E, 0}, c.k.options());
  // grad_edge_attr false: the kernel still computes g_ea here (the CPU kernel skips it); [0, De] returned
  const at::Tensor no_ea = at::empty({0, c.De}, c.k.options());
  const bool drop_ea = c.ea.defined() && !grad_edge_attr;
  if (c.E == 0 || c.H == 0 || c.M == 0) {
    for (at::Tensor* t : {&g_q, &g_k, &g_v, &g_qe, &g_ea}) t->zero_();
    return {g_q, g_k, g_v, g_qe, drop_ea ? no_ea : g_ea};
  }
  ensure_perm_unique(c.perm, op);  // per-edge records and g_ea are written at perm[j], once per slot
  at::Tensor D = at::empty({c.M, c.H}, stats.options());
  at::Tensor rec = at::empty({c.E, 2 * c.H}, stats.options());
  const DeviceProps props = device_props(dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool edge = c.ea.defined();
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.k.scalar_type(), op, [&] {
      using T = typename cuda_type<scalar_t>::type;
      using A = acc_t<T>;
      AttentionDotParams<T, index_t> a = core_params<scalar_t, T, index_t>(c, props);
      a.rowptr_t = rowptr_t.const_data_ptr<index_t>();
      a.col_t = col_t.const_data_ptr<index_t>();
      a.perm_t = perm_t.const_data_ptr<index_t>();
      C10_CUDA_CHECK((attention_dot_backward_launch<T, index_t>(
          a, dev_ptr<scalar_t>(out), dev_ptr<scalar_t>(out_e), dev_ptr<scalar_t>(grad), dev_ptr<scalar_t>(grad_e),
          reinterpret_cast<const A*>(stats.const_data_ptr()), reinterpret_cast<A*>(D.data_ptr()),
          reinterpret_cast<A*>(rec.data_ptr()), dev_ptr<scalar_t>(g_q), dev_ptr<scalar_t>(g_k),
          dev_ptr<scalar_t>(g_v), edge ? dev_ptr<scalar_t>(g_qe) : nullptr,
          edge ? dev_ptr<scalar_t>(g_ea) : nullptr, stream)));
    });
  });
  return {g_q, g_k, g_v, g_qe, drop_ea ? no_ea : g_ea};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CUDA, m) {
  m.impl("attention_dot", &attention_dot_cuda);
  m.impl("attention_dot_backward", &attention_dot_backward_cuda);
}

}  // namespace gpu
}  // namespace gnncompile
