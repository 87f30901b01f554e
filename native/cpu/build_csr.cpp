// gnncompile::build_csr on the CPU: validated, stable O(E) counting sort by destination.
#include <torch/library.h>

#include "build_csr_core.h"
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
  const int64_t E = check_edge_lists(dst_in, src_in, num_dst, num_src, op);
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
    if (err.status != Status::Ok)
      raise_bad_edge_index(err.status == Status::DstOutOfRange, err.value, err.edge, num_dst, num_src);
    place(d, s, E, num_dst, rp, col.data_ptr<index_t>(), perm.data_ptr<index_t>());
  });
  return built_structure(rowptr, col, perm, num_src);
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) { m.impl("build_csr", &build_csr_cpu); }

}  // namespace cpu
}  // namespace gnncompile
