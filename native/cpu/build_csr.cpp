// gnncompile::build_csr on the CPU: validated, stable O(E) counting sort by destination.
#include <torch/library.h>

#include "csr_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> build_csr_cpu(const at::Tensor& dst_in,
                                                             const at::Tensor& src_in,
                                                             int64_t num_dst, int64_t num_src) {
  const char* op = "gnncompile.build_csr";
  check_cpu(dst_in, op, "dst");
  check_cpu(src_in, op, "src");
  TORCH_CHECK_VALUE(dst_in.dim() == 1 && src_in.dim() == 1 && dst_in.numel() == src_in.numel(), op,
                    ": dst and src must be 1-D of the same length, got ", dst_in.sizes(), " and ",
                    src_in.sizes());
  TORCH_CHECK_TYPE(dst_in.scalar_type() == src_in.scalar_type(), op,
                   ": dst and src must share one dtype");
  TORCH_CHECK_VALUE(num_dst >= 0 && num_src >= 0, op, ": node counts must be non-negative");
  const int64_t E = dst_in.numel();
  if (dst_in.scalar_type() == at::kInt) {
    TORCH_CHECK_VALUE(E <= std::numeric_limits<int32_t>::max() &&
                          num_dst <= std::numeric_limits<int32_t>::max(),
                      op, ": graph too large for int32 indices; use int64 edge_index");
  }
  const at::Tensor dst = dst_in.contiguous();
  const at::Tensor src = src_in.contiguous();
  at::Tensor rowptr = at::empty({num_dst + 1}, dst.options());
  at::Tensor col = at::empty({E}, dst.options());
  at::Tensor perm = at::empty({E}, dst.options());
  GNN_DISPATCH_INDEX(dst.scalar_type(), op, [&] {
    const index_t* d = dst.const_data_ptr<index_t>();
    const index_t* s = src.const_data_ptr<index_t>();
    index_t* rp = rowptr.data_ptr<index_t>();
    CsrError err = count_and_scan(d, s, E, num_dst, num_src, rp);
    if (err.status != Status::Ok) {
      const bool is_dst = err.status == Status::DstOutOfRange;
      const char* which = is_dst ? "edge_index[1] (destination)" : "edge_index[0] (source)";
      const int64_t bound = is_dst ? num_dst : num_src;
      if (err.value < 0) {
        TORCH_CHECK_INDEX(false, which, " holds the negative index ", err.value, " at edge ",
                          err.edge, "; node indices must be >= 0");
      }
      TORCH_CHECK_INDEX(false, which, " holds index ", err.value, " at edge ", err.edge,
                        ", out of range for ", bound, is_dst ? " destination" : " source",
                        " nodes");
    }
    place(d, s, E, num_dst, rp, col.data_ptr<index_t>(), perm.data_ptr<index_t>());
  });
  return {rowptr, col, perm};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) { m.impl("build_csr", &build_csr_cpu); }

}  // namespace cpu
}  // namespace gnncompile
