// gnncompile::fingerprint on CUDA (see fingerprint_core.cuh): the 0-d result stays on the
// device, so computing it never waits; comparing it on the host does (the structure cache only
// does that when asked to, see gnncompile/ops/structure.py).
#include <torch/library.h>

#include "fingerprint_core.cuh"
#include "glue.h"

namespace gnncompile {
namespace gpu {
namespace {

at::Tensor fingerprint_cuda(const at::Tensor& index_in) {
  const char* op = "gnncompile.fingerprint";
  const c10::cuda::CUDAGuard guard(index_in.device());
  const at::Tensor index = index_in.contiguous();
  at::Tensor out = at::empty({}, index.options().dtype(at::kLong));
  const int sms = device_props(index.device().index()).sm_count;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(index.scalar_type(), op, [&] {
    C10_CUDA_CHECK(fingerprint_launch<index_t>(index.const_data_ptr<index_t>(), index.numel(),
                                               reinterpret_cast<unsigned long long*>(out.data_ptr<int64_t>()),
                                               sms, stream));
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CUDA, m) { m.impl("fingerprint", &fingerprint_cuda); }

}  // namespace gpu
}  // namespace gnncompile
