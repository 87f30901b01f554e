// gnncompile::spmm on CUDA: fused gather -> weight -> segment reduce (sum, mean, max, min),
// no E x F tensor, no atomics (see spmm_core.cuh for the work split).
#include <torch/library.h>

#include "glue.h"
#include "spmm_core.cuh"

namespace gnncompile {
namespace gpu {
namespace {

std::tuple<at::Tensor, at::Tensor> spmm_cuda(
    const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
    const std::optional<at::Tensor>& weight_in, const at::Tensor& x_in, c10::string_view reduce_s,
    c10::IntArrayRef knobs, const std::optional<at::Tensor>& /*rowptr_t*/,
    const std::optional<at::Tensor>& /*col_t*/, const std::optional<at::Tensor>& /*perm_t*/,
    bool /*relu_input: read by the backward only*/) {
  const char* op = "gnncompile.spmm";
  const at::Device dev = x_in.device();
  const SpmmCall c = spmm_call(rowptr_in, col_in, perm_in, weight_in, x_in, reduce_s, op,
                               [&](const at::Tensor& t, const char* name) { check_on(t, dev, op, name); });
  const c10::cuda::CUDAGuard guard(dev);
  const at::Tensor &rowptr = c.rowptr, &col = c.col, &perm = c.perm, &x = c.x, &weight = c.w.weight;
  const int64_t M = c.M, E = c.E, Fx = c.F, H = c.w.heads;
  const Reduce reduce = c.reduce;
  validate_once(rowptr, col, perm, x.size(0), op);
  at::Tensor out = c.o.out, arg = c.o.arg;
  const bool need_arg = c.o.need_arg;
  if (c.o.done) return {out, arg};

  // Feature tiles and fix-up chunks go on gridDim.y (at most 65535 of 32+ features each).
  TORCH_CHECK_VALUE(Fx <= kMaxSpmmFeatures, op, ": ", Fx, " features per node is more than the CUDA kernel supports (",
                    kMaxSpmmFeatures, ")");
  const DeviceProps props = device_props(dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
      using T = typename cuda_type<scalar_t>::type;
      using A = acc_t<T>;
      const int64_t C = Fx / H;
      const int64_t align = std::min(ptr_align(x.const_data_ptr()), ptr_align(out.const_data_ptr()));
      const LaunchKnobs k = spmm_knobs(props, knobs.data(), static_cast<int64_t>(knobs.size()), M, E, Fx, C,
                                       static_cast<int>(sizeof(T)), static_cast<int>(sizeof(A)), need_arg,
                                       align);
      const int64_t groups = ceil_div(M + E, k.items);
      at::Tensor part = at::empty({2 * groups * Fx}, x.options().dtype(acc_dtype<A>()));
      at::Tensor part_arg = at::empty({need_arg ? 2 * groups * Fx : 0}, x.options().dtype(at::kLong));
      at::Tensor head_row = at::empty({groups}, x.options().dtype(at::kLong));

      SpmmParams<T, index_t> p;
      p.rowptr = rowptr.const_data_ptr<index_t>();
      p.col = col.const_data_ptr<index_t>();
      p.perm = perm.const_data_ptr<index_t>();
      // Scalar and Head weights share one kernel: Scalar is Head with H = 1.
      p.weight = weight.defined() ? dev_ptr<scalar_t>(weight) : nullptr;
      p.x = dev_ptr<scalar_t>(x);
      p.out = dev_ptr<scalar_t>(out);
      p.arg = need_arg ? arg.data_ptr<int64_t>() : nullptr;
      p.part = reinterpret_cast<A*>(part.data_ptr());
      p.part_arg = need_arg ? part_arg.data_ptr<int64_t>() : nullptr;
      p.head_row = head_row.data_ptr<int64_t>();
      p.M = M;
      p.E = E;
      p.F = Fx;
      p.H = H;
      p.C = C;
      p.items = k.items;
      p.groups = groups;
      p.lanes = k.lanes;
      p.reduce = static_cast<int>(reduce);
      const GroupConfig cfg{k.lanes, k.rows_per_block, k.vec, k.items};
      C10_CUDA_CHECK((spmm_launch<T, index_t>(p, cfg, stream)));
    });
  });
  return {out, arg};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CUDA, m) { m.impl("spmm", &spmm_cuda); }

}  // namespace gpu
}  // namespace gnncompile
