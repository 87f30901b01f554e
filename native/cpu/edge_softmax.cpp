// gnncompile::edge_softmax and its backward on the CPU: softmax of per-edge scores over the
// edges that share a destination, one destination row per thread (deterministic).
#include <torch/library.h>

#include "edge_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

void check_edge_tensor(const at::Tensor& t, int64_t E, const char* op, const char* name) {
  check_cpu(t, op, name);
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.size(0) == E, op, ": ", name, " must have E = ", E,
                    " rows, got shape ", t.sizes());
}

void check_perm(const at::Tensor& rowptr, const at::Tensor& perm, const char* op) {
  TORCH_CHECK_VALUE(rowptr.dim() == 1 && rowptr.numel() >= 1 && perm.dim() == 1, op,
                    ": rowptr and perm must be 1-D");
  TORCH_CHECK_TYPE(rowptr.scalar_type() == perm.scalar_type(), op,
                   ": rowptr and perm must share one index dtype");
  check_cpu(rowptr, op, "rowptr");
  check_cpu(perm, op, "perm");
  check_rowptr_ends(rowptr, perm.numel(), op);
}

at::Tensor edge_softmax_cpu(const at::Tensor& rowptr_in, const at::Tensor& perm_in,
                            const at::Tensor& scores_in, c10::IntArrayRef knobs) {
  const char* op = "gnncompile.edge_softmax";
  check_perm(rowptr_in, perm_in, op);
  const int64_t E = perm_in.numel();
  check_edge_tensor(scores_in, E, op, "scores");
  const at::Tensor rowptr = rowptr_in.contiguous(), perm = perm_in.contiguous(),
                   scores = scores_in.contiguous();
  at::Tensor out = at::empty_like(scores, at::MemoryFormat::Contiguous);
  const int64_t H = c10::multiply_integers(scores.sizes().slice(1));
  if (E == 0 || H == 0) return out;
  const int64_t M = rowptr.numel() - 1;
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(scores.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      const index_t* rp = rowptr.const_data_ptr<index_t>();
      const index_t* pm = perm.const_data_ptr<index_t>();
      const core_t* sp = core_ptr<scalar_t>(scores);
      core_t* o = core_ptr<scalar_t>(out);
      st = parallel_rows(rp, M, knobs, [&](int64_t r0, int64_t r1) {
        return edge_softmax_rows<core_t, index_t>(rp, pm, sp, o, H, E, r0, r1);
      });
    });
  });
  raise_status(st, op, E, E);
  return out;
}

at::Tensor edge_softmax_backward_cpu(const at::Tensor& rowptr_in, const at::Tensor& perm_in,
                                     const at::Tensor& out_in, const at::Tensor& grad_in,
                                     c10::IntArrayRef knobs) {
  const char* op = "gnncompile.edge_softmax_backward";
  check_perm(rowptr_in, perm_in, op);
  const int64_t E = perm_in.numel();
  check_edge_tensor(out_in, E, op, "out");
  check_edge_tensor(grad_in, E, op, "grad");
  TORCH_CHECK_VALUE(out_in.sizes() == grad_in.sizes(), op, ": out and grad shapes differ");
  TORCH_CHECK_TYPE(out_in.scalar_type() == grad_in.scalar_type(), op, ": out and grad dtypes differ");
  const at::Tensor rowptr = rowptr_in.contiguous(), perm = perm_in.contiguous(),
                   y = out_in.contiguous(), g = grad_in.contiguous();
  at::Tensor grad = at::empty_like(y, at::MemoryFormat::Contiguous);
  const int64_t H = c10::multiply_integers(y.sizes().slice(1));
  if (E == 0 || H == 0) return grad;
  const int64_t M = rowptr.numel() - 1;
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(y.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      const index_t* rp = rowptr.const_data_ptr<index_t>();
      const index_t* pm = perm.const_data_ptr<index_t>();
      st = parallel_rows(rp, M, knobs, [&](int64_t r0, int64_t r1) {
        return edge_softmax_backward_rows<core_t, index_t>(rp, pm, core_ptr<scalar_t>(y),
                                                           core_ptr<scalar_t>(g),
                                                           core_ptr<scalar_t>(grad), H, E, r0, r1);
      });
    });
  });
  raise_status(st, op, E, E);
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("edge_softmax", &edge_softmax_cpu);
  m.impl("edge_softmax_backward", &edge_softmax_backward_cpu);
}

}  // namespace cpu
}  // namespace gnncompile
