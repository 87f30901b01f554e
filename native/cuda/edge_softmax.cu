// gnncompile::edge_softmax and its backward on CUDA: softmax of per-edge scores over the edges
// that share a destination; cut rows combined over a fixed partition (see edge_softmax_core.cuh).
#include <torch/library.h>

#include "edge_softmax_core.cuh"
#include "glue.h"

namespace gnncompile {
namespace gpu {
namespace {

void check_edge_tensor(const at::Tensor& t, int64_t E, const at::Device& dev, const char* op,
                       const char* name) {
  check_on(t, dev, op, name);
  check_edge_rows(t, E, op, name);
}

void check_perm(const at::Tensor& rowptr, const at::Tensor& perm, const at::Device& dev, const char* op) {
  check_rowptr_perm(rowptr, perm, op);
  check_on(rowptr, dev, op, "rowptr");
  check_on(perm, dev, op, "perm");
}

template <bool BWD>
at::Tensor run(const at::Tensor& rowptr_in, const at::Tensor& perm_in, const at::Tensor& a_in,
               const at::Tensor* b_in, c10::IntArrayRef knobs, const char* op) {
  const at::Device dev = a_in.device();
  check_perm(rowptr_in, perm_in, dev, op);
  const int64_t E = perm_in.numel();
  check_edge_tensor(a_in, E, dev, op, BWD ? "out" : "scores");
  if constexpr (BWD) {
    check_edge_tensor(*b_in, E, dev, op, "grad");
    check_out_grad(a_in, *b_in, op);
  }
  check_feature_dtype(a_in, op);
  const c10::cuda::CUDAGuard guard(dev);
  const at::Tensor rowptr = rowptr_in.contiguous(), perm = perm_in.contiguous(), a = a_in.contiguous();
  const at::Tensor b = BWD ? b_in->contiguous() : at::Tensor();
  // col is not used here: only perm is checked (every edge id in [0, E), each once).
  validate_once(rowptr, at::Tensor(), perm, E, op);
  ensure_perm_unique(perm, op);
  at::Tensor out = at::empty_like(a, at::MemoryFormat::Contiguous);
  const int64_t H = c10::multiply_integers(a.sizes().slice(1));
  if (E == 0 || H == 0) return out;
  const int64_t M = rowptr.numel() - 1;

  const DeviceProps props = device_props(dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(a.scalar_type(), op, [&] {
      using T = typename cuda_type<scalar_t>::type;
      using A = acc_t<T>;
      const LaunchKnobs k = edge_softmax_knobs(props, knobs.data(), static_cast<int64_t>(knobs.size()), M, E, H,
                                               static_cast<int>(sizeof(A)));
      const int64_t groups = ceil_div(M + E, k.items);
      at::Tensor stat = at::empty({2 * groups * H * 2}, a.options().dtype(acc_dtype<A>()));
      at::Tensor head_row = at::empty({groups}, a.options().dtype(at::kLong));
      EdgeSegParams<T, index_t> p;
      p.rowptr = rowptr.const_data_ptr<index_t>();
      p.perm = perm.const_data_ptr<index_t>();
      p.a = dev_ptr<scalar_t>(a);
      p.b = BWD ? dev_ptr<scalar_t>(b) : nullptr;
      p.out = dev_ptr<scalar_t>(out);
      p.stat = reinterpret_cast<A*>(stat.data_ptr());
      p.head_row = head_row.data_ptr<int64_t>();
      p.M = M;
      p.E = E;
      p.H = H;
      p.items = k.items;
      p.groups = groups;
      p.head_lanes = softmax_head_lanes(H);
      C10_CUDA_CHECK((edge_seg_launch<BWD, T, index_t>(p, stream)));
    });
  });
  return out;
}

at::Tensor edge_softmax_cuda(const at::Tensor& rowptr, const at::Tensor& perm, const at::Tensor& scores,
                             c10::IntArrayRef knobs) {
  return run<false>(rowptr, perm, scores, nullptr, knobs, "gnncompile.edge_softmax");
}

at::Tensor edge_softmax_backward_cuda(const at::Tensor& rowptr, const at::Tensor& perm, const at::Tensor& out,
                                      const at::Tensor& grad, c10::IntArrayRef knobs) {
  return run<true>(rowptr, perm, out, &grad, knobs, "gnncompile.edge_softmax_backward");
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CUDA, m) {
  m.impl("edge_softmax", &edge_softmax_cuda);
  m.impl("edge_softmax_backward", &edge_softmax_backward_cuda);
}

}  // namespace gpu
}  // namespace gnncompile
