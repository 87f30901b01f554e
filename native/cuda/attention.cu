// gnncompile::attention and gnncompile::attention_backward on CUDA: graph attention (scores,
// softmax, dropout, aggregation) with one warp per destination row; the backward in one pass
// over the CSC and two light passes over the CSR (attention_core.cuh). Deterministic: no
// atomics, every sum in a fixed order. The input checks are the CPU glue's
// (../common/attention_glue.h), with a device check of their own.
#include <torch/library.h>

#include <climits>

#include "../common/attention_glue.h"
#include "attention_core.cuh"
#include "glue.h"

namespace gnncompile {
namespace gpu {
namespace {

// The kernels keep heads and offsets inside a row (h * C + c) in 32 bits.
void check_row_width(const AttentionCall& c, const char* op) {
  TORCH_CHECK_VALUE(c.H <= INT_MAX && c.H * c.C <= INT_MAX, op, ": ", c.H * c.C,
                    " features per node (heads x channels) is more than the CUDA kernels support (", INT_MAX, ")");
}

template <typename T, typename I>
AttentionParams<T, I> core_params(const AttentionCall& c, double slope, const DeviceProps& props) {
  using A = acc_t<T>;
  AttentionParams<T, I> p;
  set_core_common<I, A>(p, c);
  p.slope = static_cast<A>(slope);
  p.lay = attention_layout(c.H, c.C);
  // The kernels grid-stride over rows: four waves of 256-thread blocks at 8 per SM are enough
  // to fill the device. The knobs (spmm's lane-group layout) do not apply to this layout and
  // are ignored.
  p.max_blocks = std::max(1, props.sm_count) * 32;
  return p;
}

template <typename scalar_t, typename T, typename I>
void set_features(AttentionParams<T, I>& p, const AttentionCall& c) {
  p.x = dev_ptr<scalar_t>(c.x);
  p.a_src = dev_ptr<scalar_t>(c.a_src);
  p.a_dst = dev_ptr<scalar_t>(c.a_dst);
  p.a_edge = c.a_edge.defined() ? dev_ptr<scalar_t>(c.a_edge) : nullptr;
}

std::tuple<at::Tensor, at::Tensor> attention_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& x,
    const at::Tensor& a_src, const at::Tensor& a_dst, const std::optional<at::Tensor>& a_edge, double slope,
    double p, const std::optional<at::Tensor>& seed, c10::IntArrayRef /*knobs: see core_params*/,
    const std::optional<at::Tensor>& /*rowptr_t*/, const std::optional<at::Tensor>& /*col_t*/,
    const std::optional<at::Tensor>& /*perm_t*/) {
  const char* op = "gnncompile.attention";
  const at::Device dev = x.device();
  const AttentionCall c =
      attention_call(rowptr, col, perm, x, a_src, a_dst, a_edge, slope, p, seed, op, on_device(dev, op));
  const c10::cuda::CUDAGuard guard(dev);
  validate_once(c.rowptr, c.col, c.perm, c.N, op);  // col: sources, perm: edge ids
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor out = at::empty({c.M, c.H, c.C}, c.x.options());
  at::Tensor stats = at::empty({c.M, 2, c.H}, c.x.options().dtype(acc));
  if (c.E == 0 || c.H == 0 || c.M == 0) {
    out.zero_();
    stats.zero_();
    return {out, stats};
  }
  check_row_width(c, op);
  const DeviceProps props = device_props(dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.x.scalar_type(), op, [&] {
      using T = typename cuda_type<scalar_t>::type;
      using A = acc_t<T>;
      AttentionParams<T, index_t> a = core_params<T, index_t>(c, slope, props);
      set_features<scalar_t>(a, c);
      C10_CUDA_CHECK((attention_forward_launch<T, index_t>(a, dev_ptr<scalar_t>(out),
                                                           reinterpret_cast<A*>(stats.data_ptr()), stream)));
    });
  });
  return {out, stats};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_cuda(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& x,
    const at::Tensor& a_src, const at::Tensor& a_dst, const std::optional<at::Tensor>& a_edge, double slope,
    double p, const std::optional<at::Tensor>& seed, const at::Tensor& out_in, const at::Tensor& stats_in,
    const at::Tensor& grad_in, c10::IntArrayRef /*knobs: see core_params*/, const at::Tensor& rowptr_t_in,
    const at::Tensor& col_t_in, const at::Tensor& perm_t_in) {
  const char* op = "gnncompile.attention_backward";
  const at::Device dev = x.device();
  const auto on = on_device(dev, op);
  const AttentionCall c = attention_call(rowptr, col, perm, x, a_src, a_dst, a_edge, slope, p, seed, op, on);
  check_attention_backward(c, c.x, "x", rowptr_t_in, col_t_in, perm_t_in, out_in, stats_in, grad_in, op, on);
  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor rowptr_t, col_t, perm_t;  // (not structured bindings: the dispatch lambdas capture them)
  std::tie(rowptr_t, col_t, perm_t) =
      validated_csc(c.rowptr, c.col, c.perm, c.N, rowptr_t_in, col_t_in, perm_t_in, c.M, op);
  const at::Tensor out = out_in.contiguous(), stats = stats_in.contiguous(), grad = grad_in.contiguous();
  at::Tensor gx = at::empty_like(c.x);
  at::Tensor g_src = at::empty_like(c.a_src);
  at::Tensor g_dst = at::empty_like(c.a_dst);
  if (c.E == 0 || c.H == 0 || c.M == 0) {
    gx.zero_();
    g_src.zero_();
    g_dst.zero_();
    return {gx, g_src, g_dst, at::zeros({c.a_edge.defined() ? c.E : 0, c.H}, c.x.options())};
  }
  check_row_width(c, op);
  ensure_perm_unique(perm_t, op);  // d_edge[perm_t[k]] is written once per slot
  at::Tensor rec = at::empty({c.M, 4 * c.H}, stats.options());
  at::Tensor d_edge = at::empty({c.E, c.H}, stats.options());
  const DeviceProps props = device_props(dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.x.scalar_type(), op, [&] {
      using T = typename cuda_type<scalar_t>::type;
      using A = acc_t<T>;
      AttentionParams<T, index_t> a = core_params<T, index_t>(c, slope, props);
      set_features<scalar_t>(a, c);
      a.rowptr_t = rowptr_t.const_data_ptr<index_t>();
      a.col_t = col_t.const_data_ptr<index_t>();
      a.perm_t = perm_t.const_data_ptr<index_t>();
      C10_CUDA_CHECK((attention_backward_launch<T, index_t>(
          a, dev_ptr<scalar_t>(out), dev_ptr<scalar_t>(grad), reinterpret_cast<const A*>(stats.const_data_ptr()),
          reinterpret_cast<A*>(rec.data_ptr()), dev_ptr<scalar_t>(gx), dev_ptr<scalar_t>(g_src),
          dev_ptr<scalar_t>(g_dst), reinterpret_cast<A*>(d_edge.data_ptr()), stream)));
    });
  });
  // the gradient of a_edge ([0, H] without one: a schema's outputs are tensors)
  return {gx, g_src, g_dst, c.a_edge.defined() ? d_edge.to(c.x.scalar_type()) : at::empty({0, c.H}, c.x.options())};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CUDA, m) {
  m.impl("attention", &attention_cuda);
  m.impl("attention_backward", &attention_backward_cuda);
}

}  // namespace gpu
}  // namespace gnncompile
