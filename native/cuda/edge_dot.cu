// gnncompile::edge_dot on CUDA: per-edge (per-head) dot product of a source row of x and a
// destination row of g, E x H out (the gradient of an spmm edge weight). See edge_dot_core.cuh.
#include <torch/library.h>

#include "edge_dot_core.cuh"
#include "glue.h"

namespace gnncompile {
namespace gpu {
namespace {

at::Tensor edge_dot_cuda(const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
                         const at::Tensor& x_in, const at::Tensor& g_in, int64_t heads,
                         c10::IntArrayRef knobs) {
  const char* op = "gnncompile.edge_dot";
  check_structure(rowptr_in, col_in, perm_in, op);
  const at::Device dev = x_in.device();
  check_on(rowptr_in, dev, op, "rowptr");
  check_on(col_in, dev, op, "col");
  check_on(perm_in, dev, op, "perm");
  check_on(g_in, dev, op, "g");
  TORCH_CHECK_TYPE(x_in.scalar_type() == g_in.scalar_type(), op, ": x and g dtypes differ");
  check_feature_dtype(x_in, op);
  TORCH_CHECK_VALUE(x_in.dim() >= 1, op, ": x must have a node dimension");
  const c10::cuda::CUDAGuard guard(dev);
  const at::Tensor rowptr = rowptr_in.contiguous(), col = col_in.contiguous(), perm = perm_in.contiguous(),
                   x = x_in.contiguous(), g = g_in.contiguous();
  const int64_t M = rowptr.numel() - 1, E = col.numel();
  const int64_t F = c10::multiply_integers(x.sizes().slice(1));
  check_edge_dot_g(g, M, F, heads, op);
  validate_once(rowptr, col, perm, x.size(0), op);
  ensure_perm_unique(perm, op);  // out[perm[j]] is written once per slot
  at::Tensor out = at::empty({E, heads}, x.options());
  if (E == 0) return out;
  if (F == 0) return out.zero_();

  const DeviceProps props = device_props(dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
      using T = typename cuda_type<scalar_t>::type;
      const int64_t C = F / heads;
      const int64_t align = std::min(ptr_align(x.const_data_ptr()), ptr_align(g.const_data_ptr()));
      const LaunchKnobs k = edge_dot_knobs(props, knobs.data(), static_cast<int64_t>(knobs.size()), M, E, F, C,
                                           static_cast<int>(sizeof(T)), align);
      EdgeDotParams<T, index_t> p;
      p.rowptr = rowptr.const_data_ptr<index_t>();
      p.col = col.const_data_ptr<index_t>();
      p.perm = perm.const_data_ptr<index_t>();
      p.x = dev_ptr<scalar_t>(x);
      p.g = dev_ptr<scalar_t>(g);
      p.out = dev_ptr<scalar_t>(out);
      p.M = M;
      p.E = E;
      p.F = F;
      p.H = heads;
      p.C = C;
      p.items = k.items;
      p.groups = ceil_div(M + E, k.items);
      p.lanes = k.lanes;
      p.head_lanes = edge_dot_head_lanes(k.lanes, C, k.vec);
      const GroupConfig cfg{k.lanes, k.rows_per_block, k.vec, k.items};
      C10_CUDA_CHECK((edge_dot_launch<T, index_t>(p, cfg, stream)));
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CUDA, m) { m.impl("edge_dot", &edge_dot_cuda); }

}  // namespace gpu
}  // namespace gnncompile
