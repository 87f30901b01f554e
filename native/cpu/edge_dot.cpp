// gnncompile::edge_dot on the CPU: per-edge (per-head) dot product of a source row of x and a
// destination row of g. It is the gradient of an edge weight in spmm: E x H out, never E x F.
#include <torch/library.h>

#include "edge_dot_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

at::Tensor edge_dot_cpu(const at::Tensor& rowptr_in, const at::Tensor& col_in,
                        const at::Tensor& perm_in, const at::Tensor& x_in, const at::Tensor& g_in,
                        int64_t heads, c10::IntArrayRef knobs) {
  const char* op = "gnncompile.edge_dot";
  check_structure(rowptr_in, col_in, perm_in, op);
  check_cpu(rowptr_in, op, "rowptr");
  check_cpu(x_in, op, "x");
  check_cpu(g_in, op, "g");
  TORCH_CHECK_TYPE(x_in.scalar_type() == g_in.scalar_type(), op, ": x and g dtypes differ");
  check_feature_dtype(x_in, op);
  const at::Tensor rowptr = rowptr_in.contiguous(), col = col_in.contiguous(),
                   perm = perm_in.contiguous(), x = x_in.contiguous(), g = g_in.contiguous();
  const int64_t M = rowptr.numel() - 1, E = col.numel();
  const int64_t F = c10::multiply_integers(x.sizes().slice(1));
  check_edge_dot_g(g, M, F, heads, op);
  check_rowptr(rowptr, E, op);
  ensure_perm_unique(perm, op);  // out[perm[j]] is written once per slot
  at::Tensor out = at::empty({E, heads}, x.options());
  if (E == 0 || F == 0) {
    check_unwalked_structure(col, perm, x.size(0), op);
    return out.zero_();
  }
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      const index_t* rp = rowptr.const_data_ptr<index_t>();
      const index_t* cl = col.const_data_ptr<index_t>();
      const index_t* pm = perm.const_data_ptr<index_t>();
      const core_t* xp = core_ptr<scalar_t>(x);
      const core_t* gp = core_ptr<scalar_t>(g);
      core_t* op_ = core_ptr<scalar_t>(out);
      const int64_t N = x.size(0);
      st = parallel_rows(rp, M, knobs, [&](int64_t r0, int64_t r1) {
        return edge_dot_rows<core_t, index_t>(rp, cl, pm, xp, gp, op_, heads, F / heads, N, E, r0, r1);
      });
    });
  });
  raise_status(st, op, x.size(0), E);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) { m.impl("edge_dot", &edge_dot_cpu); }

}  // namespace cpu
}  // namespace gnncompile
