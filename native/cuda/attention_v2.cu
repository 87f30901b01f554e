// gnncompile::attention_v2 and gnncompile::attention_v2_backward on CUDA: GATv2's attention (z,
// logits att . leaky_relu(z), softmax, dropout, aggregation of x_l) with one warp per destination
// row; the backward in one pass over the CSR, one over the CSC and att's gradient summed per
// fixed block of rows (attention_v2_core.cuh). Deterministic: no atomics, every sum in a fixed
// order. The input checks are the CPU glue's (../common/attention_glue.h), with a device check of
// their own. Not yet run on a GPU (the passes leave GATv2's chain unfused on CUDA unless
// GNNCOMPILE_CUDA_UNVERIFIED names attention_v2).
#include <torch/library.h>

#include "../common/attention_glue.h"
#include "attention_v2_core.cuh"
#include "glue.h"

namespace gnncompile {
namespace gpu {
namespace {

template <typename scalar_t, typename T, typename I>
AttentionV2Params<T, I> core_params(const AttentionV2Call& c, double slope, const DeviceProps& props) {
  using A = acc_t<T>;
  AttentionV2Params<T, I> p;
  set_core_common<I, A>(p, c);
  p.xl = dev_ptr<scalar_t>(c.xl);
  p.xr = dev_ptr<scalar_t>(c.xr);
  p.att = dev_ptr<scalar_t>(c.att);
  p.e_term = c.e_term.defined() ? dev_ptr<scalar_t>(c.e_term) : nullptr;
  p.slope = static_cast<A>(slope);
  // grid-strided warps, as attention.cu's; the knobs do not apply to this layout
  p.max_blocks = std::max(1, props.sm_count) * 32;
  return p;
}

std::tuple<at::Tensor, at::Tensor> attention_v2_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& x_l,
    const at::Tensor& x_r, const at::Tensor& att, const std::optional<at::Tensor>& e_term, double slope, double p,
    const std::optional<at::Tensor>& seed, c10::IntArrayRef /*knobs: see core_params*/,
    const std::optional<at::Tensor>& /*rowptr_t*/, const std::optional<at::Tensor>& /*col_t*/,
    const std::optional<at::Tensor>& /*perm_t*/) {
  const char* op = "gnncompile.attention_v2";
  const at::Device dev = x_l.device();
  const AttentionV2Call c =
      attention_v2_call(rowptr, col, perm, x_l, x_r, att, e_term, slope, p, seed, op, on_device(dev, op));
  const c10::cuda::CUDAGuard guard(dev);
  validate_once(c.rowptr, c.col, c.perm, c.N, op);  // col: sources, perm: edge ids
  const at::ScalarType acc = x_l.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor out = at::empty({c.M, c.H, c.C}, c.xl.options());
  at::Tensor stats = at::empty({c.M, 2, c.H}, c.xl.options().dtype(acc));
  if (c.E == 0 || c.H == 0 || c.C == 0 || c.M == 0) {
    out.zero_();
    stats.zero_();
    return {out, stats};
  }
  at::Tensor lg = at::empty({c.E * c.H}, stats.options());  // the rows' logits, then w
  const DeviceProps props = device_props(dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.xl.scalar_type(), op, [&] {
      using T = typename cuda_type<scalar_t>::type;
      using A = acc_t<T>;
      const AttentionV2Params<T, index_t> a = core_params<scalar_t, T, index_t>(c, slope, props);
      C10_CUDA_CHECK((attention_v2_forward_launch<T, index_t>(a, dev_ptr<scalar_t>(out),
                                                              reinterpret_cast<A*>(stats.data_ptr()),
                                                              reinterpret_cast<A*>(lg.data_ptr()), stream)));
    });
  });
  return {out, stats};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_v2_backward_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& x_l,
    const at::Tensor& x_r, const at::Tensor& att, const std::optional<at::Tensor>& e_term, double slope, double p,
    const std::optional<at::Tensor>& seed, const at::Tensor& out_in, const at::Tensor& stats_in,
    const at::Tensor& grad_in, c10::IntArrayRef /*knobs: see core_params*/, const at::Tensor& rowptr_t_in,
    const at::Tensor& col_t_in, const at::Tensor& perm_t_in) {
  const char* op = "gnncompile.attention_v2_backward";
  const at::Device dev = x_l.device();
  const auto on = on_device(dev, op);
  const AttentionV2Call c = attention_v2_call(rowptr, col, perm, x_l, x_r, att, e_term, slope, p, seed, op, on);
  check_attention_backward(c, c.xl, "x_l", rowptr_t_in, col_t_in, perm_t_in, out_in, stats_in, grad_in, op, on);
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor rowptr_t, col_t, perm_t;  // (not structured bindings: the dispatch lambdas capture them)
  std::tie(rowptr_t, col_t, perm_t) =
      validated_csc(c.rowptr, c.col, c.perm, c.N, rowptr_t_in, col_t_in, perm_t_in, c.M, op);
  const at::Tensor out = out_in.contiguous(), stats = stats_in.contiguous(), grad = grad_in.contiguous();
  at::Tensor g_xl = at::empty_like(c.xl);
  at::Tensor g_xr = at::empty_like(c.xr);
  at::Tensor g_e = c.e_term.defined() ? at::empty_like(c.e_term) : at::empty({0, c.H, c.C}, c.xl.options());
  const int64_t F = c.H * c.C;
  if (c.E == 0 || F == 0 || c.M == 0) {
    g_xl.zero_();
    g_xr.zero_();
    g_e.zero_();
    return {g_xl, g_xr, at::zeros_like(att, at::MemoryFormat::Contiguous), g_e};
  }
  ensure_perm_unique(c.perm, op);  // per-edge records and g_e are written at perm[j], once per slot
  const at::TensorOptions acc = stats.options();
  at::Tensor D = at::empty({c.M, c.H}, acc);
  at::Tensor rec = at::empty({c.E, 2 * c.H}, acc);
  at::Tensor part = at::empty({c.M, F}, acc);
  at::Tensor blk = at::empty({v2_att_blocks(c.M), F}, acc);
  at::Tensor sg = at::empty({c.E, c.H * v2_sign_words(c.C)}, acc.dtype(at::kInt));
  at::Tensor g_att = at::empty({F}, c.xl.options());
  const DeviceProps props = device_props(dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.xl.scalar_type(), op, [&] {
      using T = typename cuda_type<scalar_t>::type;
      using A = acc_t<T>;
      AttentionV2Params<T, index_t> a = core_params<scalar_t, T, index_t>(c, slope, props);
      a.rowptr_t = rowptr_t.const_data_ptr<index_t>();
      a.col_t = col_t.const_data_ptr<index_t>();
      a.perm_t = perm_t.const_data_ptr<index_t>();
      C10_CUDA_CHECK((attention_v2_backward_launch<T, index_t>(
          a, dev_ptr<scalar_t>(out), dev_ptr<scalar_t>(grad), reinterpret_cast<const A*>(stats.const_data_ptr()),
          reinterpret_cast<A*>(D.data_ptr()), reinterpret_cast<A*>(rec.data_ptr()),
          reinterpret_cast<uint32_t*>(sg.data_ptr()), reinterpret_cast<A*>(part.data_ptr()),
          reinterpret_cast<A*>(blk.data_ptr()), dev_ptr<scalar_t>(g_xl), dev_ptr<scalar_t>(g_xr),
          dev_ptr<scalar_t>(g_att), c.e_term.defined() ? dev_ptr<scalar_t>(g_e) : nullptr, stream)));
    });
  });
  return {g_xl, g_xr, g_att.view(att.sizes()), g_e};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CUDA, m) {
  m.impl("attention_v2", &attention_v2_cuda);
  m.impl("attention_v2_backward", &attention_v2_backward_cuda);
}

}  // namespace gpu
}  // namespace gnncompile
