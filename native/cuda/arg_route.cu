// gnncompile::arg_route and gnncompile::arg_edge_dot on CUDA: the max / min backward's fast form
// (each gradient to its recorded winner) without a sort and without atomics: a sum over the CSC
// on spmm's work split, and one thread per (row, head). See arg_route_core.cuh.
#include <torch/library.h>

#include "../common/arg_route_glue.h"
#include "arg_route_core.cuh"
#include "glue.h"

namespace gnncompile {
namespace gpu {
namespace {

at::Tensor arg_route_cuda(const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
                          const std::optional<at::Tensor>& weight_in, const at::Tensor& arg_in,
                          const at::Tensor& grad_in, int64_t num_src, c10::IntArrayRef knobs,
                          const std::optional<at::Tensor>& rowptr_t_in, const std::optional<at::Tensor>& col_t_in,
                          const std::optional<at::Tensor>& perm_t_in) {
  const char* op = "gnncompile.arg_route";
  const at::Device dev = grad_in.device();
  const ArgRouteCall c = arg_route_call(rowptr_in, col_in, perm_in, weight_in, arg_in, grad_in, num_src, rowptr_t_in,
                                        col_t_in, perm_t_in, op,
                                        [&](const at::Tensor& t, const char* name) { check_on(t, dev, op, name); });
  TORCH_CHECK_VALUE(c.has_csc, op, ": on CUDA the CSC (rowptr_t, col_t, perm_t) is needed: the pass runs over it");
  const c10::cuda::CUDAGuard guard(dev);
  const at::Tensor &rowptr = c.rowptr, &col = c.col, &perm = c.perm;
  const at::Tensor &rowptr_t = c.rowptr_t, &col_t = c.col_t, &perm_t = c.perm_t;
  const at::Tensor &weight = c.w.weight, &arg = c.arg, &grad = c.grad;
  validate_once(rowptr, col, perm, c.N, op);        // col: sources
  validate_once(rowptr_t, col_t, perm_t, c.M, op);  // col_t: destination rows
  ensure_perm_unique(perm, op);                     // its inverse maps edge ids to CSR slots
  at::Tensor out = c.out;
  if (c.done) return out;
  TORCH_CHECK_VALUE(c.F <= kMaxSpmmFeatures, op, ": ", c.F, " features per row is more than the CUDA kernel supports (",
                    kMaxSpmmFeatures, ")");
  const DeviceProps props = device_props(dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(grad.scalar_type(), op, [&] {
      using T = typename cuda_type<scalar_t>::type;
      using A = acc_t<T>;
      const int64_t H = c.w.heads, C = c.F / H;
      const int64_t align = std::min(ptr_align(grad.const_data_ptr()), ptr_align(out.const_data_ptr()));
      // spmm's rule for a sum over the CSC: N rows (the sources), E slots
      const LaunchKnobs k = spmm_knobs(props, knobs.data(), static_cast<int64_t>(knobs.size()), c.N, c.E, c.F, C,
                                       static_cast<int>(sizeof(T)), static_cast<int>(sizeof(A)), false, align);
      const int64_t groups = ceil_div(c.N + c.E, k.items);
      at::Tensor part = at::empty({2 * groups * c.F}, grad.options().dtype(acc_dtype<A>()));
      at::Tensor head_row = at::empty({groups}, grad.options().dtype(at::kLong));
      at::Tensor slot_of = at::empty({c.E}, perm.options());
      C10_CUDA_CHECK((invert_perm_launch<index_t>(perm.const_data_ptr<index_t>(), c.E, slot_of.data_ptr<index_t>(),
                                                  props.sm_count, stream)));
      ArgRouteParams<T, index_t> p;
      p.rowptr_t = rowptr_t.const_data_ptr<index_t>();
      p.col_t = col_t.const_data_ptr<index_t>();
      p.perm_t = perm_t.const_data_ptr<index_t>();
      p.slot_of = slot_of.const_data_ptr<index_t>();
      p.weight = weight.defined() ? dev_ptr<scalar_t>(weight) : nullptr;
      p.arg = arg.const_data_ptr<int64_t>();
      p.grad = dev_ptr<scalar_t>(grad);
      p.out = dev_ptr<scalar_t>(out);
      p.part = reinterpret_cast<A*>(part.data_ptr());
      p.head_row = head_row.data_ptr<int64_t>();
      p.N = c.N;
      p.E = c.E;
      p.F = c.F;
      p.H = H;
      p.C = C;
      p.items = k.items;
      p.groups = groups;
      p.lanes = k.lanes;
      const GroupConfig cfg{k.lanes, k.rows_per_block, k.vec, k.items};
      C10_CUDA_CHECK((arg_route_launch<T, index_t>(p, cfg, stream)));
    });
  });
  return out;
}

at::Tensor arg_edge_dot_cuda(const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
                             const at::Tensor& x_in, const at::Tensor& arg_in, const at::Tensor& grad_in,
                             int64_t heads, c10::IntArrayRef /*knobs: one thread per (row, head), no layout*/) {
  const char* op = "gnncompile.arg_edge_dot";
  const at::Device dev = x_in.device();
  const ArgEdgeDotCall c = arg_edge_dot_call(rowptr_in, col_in, perm_in, x_in, arg_in, grad_in, heads, op,
                                             [&](const at::Tensor& t, const char* name) { check_on(t, dev, op, name); });
  const c10::cuda::CUDAGuard guard(dev);
  validate_once(c.rowptr, c.col, c.perm, c.x.size(0), op);
  ensure_perm_unique(c.perm, op);  // out[perm[j]] belongs to the row of slot j alone
  if (c.done) return c.finish();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.x.scalar_type(), op, [&] {
      using T = typename cuda_type<scalar_t>::type;
      using A = acc_t<T>;
      ArgEdgeDotParams<T, index_t> p;
      p.rowptr = c.rowptr.const_data_ptr<index_t>();
      p.col = c.col.const_data_ptr<index_t>();
      p.perm = c.perm.const_data_ptr<index_t>();
      p.x = dev_ptr<scalar_t>(c.x);
      p.arg = c.arg.const_data_ptr<int64_t>();
      p.grad = dev_ptr<scalar_t>(c.grad);
      p.out = reinterpret_cast<A*>(c.acc.data_ptr());
      p.M = c.M;
      p.F = c.F;
      p.H = heads;
      p.C = c.F / heads;
      C10_CUDA_CHECK((arg_edge_dot_launch<T, index_t>(p, stream)));
    });
  });
  return c.finish();
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CUDA, m) {
  m.impl("arg_route", &arg_route_cuda);
  m.impl("arg_edge_dot", &arg_edge_dot_cuda);
}

}  // namespace gpu
}  // namespace gnncompile
