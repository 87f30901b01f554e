// gnncompile::build_csr on CUDA: validated, stable sort of edges by destination (see
// build_csr_core.cuh).
#include <torch/library.h>

#include "build_csr_core.cuh"
#include "glue.h"

namespace gnncompile {
namespace gpu {
namespace {

// Raises the same IndexError as the CPU kernel, naming the first offending edge.
template <typename index_t>
[[noreturn]] void raise_bad_edge(const at::Tensor& dst, const at::Tensor& src, int64_t num_dst, int64_t num_src,
                                 int sms, cudaStream_t stream) {
  at::Tensor first = at::empty({1}, dst.options().dtype(at::kLong));
  C10_CUDA_CHECK(first_bad_edge_launch<index_t>(dst.const_data_ptr<index_t>(), src.const_data_ptr<index_t>(),
                                                dst.numel(), num_dst, num_src,
                                                reinterpret_cast<long long*>(first.data_ptr<int64_t>()), sms,
                                                stream));
  const int64_t e = first.item<int64_t>();
  TORCH_INTERNAL_ASSERT(e >= 0 && e < dst.numel(), "gnncompile.build_csr: range check disagrees");
  const int64_t d = dst[e].item<int64_t>();
  const int64_t s = src[e].item<int64_t>();
  const bool is_dst = static_cast<uint64_t>(d) >= static_cast<uint64_t>(num_dst);
  raise_bad_edge_index(is_dst, is_dst ? d : s, e, num_dst, num_src);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> build_csr_cuda(const at::Tensor& dst_in, const at::Tensor& src_in,
                                                              int64_t num_dst, int64_t num_src) {
  const char* op = "gnncompile.build_csr";
  const at::Device dev = dst_in.device();
  check_on(src_in, dev, op, "src");
  const int64_t E = check_edge_lists(dst_in, src_in, num_dst, num_src, op);
  const c10::cuda::CUDAGuard guard(dev);
  const at::Tensor dst = dst_in.contiguous();
  const at::Tensor src = src_in.contiguous();
  at::Tensor rowptr = at::empty({num_dst + 1}, dst.options());
  at::Tensor col = at::empty({E}, dst.options());
  at::Tensor perm = at::empty({E}, dst.options());
  if (E == 0) {
    rowptr.zero_();
    return built_structure(rowptr, col, perm, num_src);
  }
  const int sms = device_props(dev.index()).sm_count;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  GNN_DISPATCH_INDEX(dst.scalar_type(), op, [&] {
    const index_t* d = dst.const_data_ptr<index_t>();
    const index_t* s = src.const_data_ptr<index_t>();
    // 1. range check on the device, decided on the host before anything indexes with them.
    at::Tensor stats = at::empty({4}, dst.options().dtype(at::kLong));
    C10_CUDA_CHECK(edge_minmax_launch<index_t>(d, s, E, reinterpret_cast<long long*>(stats.data_ptr<int64_t>()),
                                               sms, stream));
    const at::Tensor h = stats.cpu();
    const int64_t* mm = h.const_data_ptr<int64_t>();
    if (mm[0] < 0 || mm[1] >= num_dst || mm[2] < 0 || mm[3] >= num_src)
      raise_bad_edge<index_t>(dst, src, num_dst, num_src, sms, stream);

    // 2. stable LSD radix sort of dst, carrying edge ids; the last pass writes perm and col.
    index_t* pm = perm.data_ptr<index_t>();
    index_t* cl = col.data_ptr<index_t>();
    const int passes = radix_passes(num_dst);
    at::Tensor keys_a, keys_b;
    const index_t* sorted = d;  // every key is 0 when no pass is needed
    if (passes == 0) {
      C10_CUDA_CHECK(identity_perm_launch<index_t>(s, E, pm, cl, sms, stream));
    } else {
      const int64_t tiles = radix_tiles(E);
      at::Tensor hist = at::empty({kRadixBins * tiles}, dst.options().dtype(at::kInt));
      keys_a = at::empty({E}, dst.options());
      keys_b = passes > 1 ? at::empty({E}, dst.options()) : at::Tensor();
      at::Tensor vals_a = passes > 1 ? at::empty({E}, dst.options()) : at::Tensor();
      at::Tensor vals_b = passes > 2 ? at::empty({E}, dst.options()) : at::Tensor();
      const index_t* kin = d;
      const index_t* vin = nullptr;  // identity: edge ids
      for (int pass = 0; pass < passes; ++pass) {
        const int shift = pass * kRadixBits;
        const bool last = pass == passes - 1;
        index_t* kout = (pass % 2 == 0) ? keys_a.data_ptr<index_t>() : keys_b.data_ptr<index_t>();
        index_t* vout = last ? pm : ((pass % 2 == 0) ? vals_a.data_ptr<index_t>() : vals_b.data_ptr<index_t>());
        C10_CUDA_CHECK(radix_hist_launch<index_t>(kin, E, shift, hist.data_ptr<int>(), stream));
        const at::Tensor incl = at::cumsum(hist, 0, at::kLong);  // on the current stream
        C10_CUDA_CHECK(radix_scatter_launch<index_t>(kin, vin, kout, vout, s, last ? cl : nullptr, E, shift,
                                                     incl.const_data_ptr<int64_t>(), hist.const_data_ptr<int>(),
                                                     stream));
        kin = kout;
        vin = vout;
      }
      sorted = kin;
    }
    // 3. rowptr from the sorted destinations.
    C10_CUDA_CHECK(rowptr_from_sorted_launch<index_t>(sorted, E, num_dst, rowptr.data_ptr<index_t>(), sms, stream));
  });
  return built_structure(rowptr, col, perm, num_src);
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CUDA, m) { m.impl("build_csr", &build_csr_cuda); }

}  // namespace gpu
}  // namespace gnncompile
