// gnncompile::edge_softmax and its backward on the CPU: softmax of per-edge scores over the
// edges that share a destination, one destination row per thread (deterministic).
#include <torch/library.h>

#include "edge_softmax_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

void check_edge_tensor(const at::Tensor& t, int64_t E, const char* op, const char* name) {
  check_cpu(t, op, name);
  check_edge_rows(t, E, op, name);
}

void check_perm(const at::Tensor& rowptr, const at::Tensor& perm, const char* op) {
  check_rowptr_perm(rowptr, perm, op);
  check_cpu(rowptr, op, "rowptr");
  check_cpu(perm, op, "perm");
}

// One body for both ops, as in the CUDA glue. Forward: a = scores. Backward: a = out (the
// softmax), b = grad.
template <bool BWD>
at::Tensor run(const at::Tensor& rowptr_in, const at::Tensor& perm_in, const at::Tensor& a_in,
               const at::Tensor* b_in, c10::IntArrayRef knobs, const char* op) {
  check_perm(rowptr_in, perm_in, op);
  const int64_t E = perm_in.numel();
  check_edge_tensor(a_in, E, op, BWD ? "out" : "scores");
  if constexpr (BWD) {
    check_edge_tensor(*b_in, E, op, "grad");
    check_out_grad(a_in, *b_in, op);
  }
  check_feature_dtype(a_in, op);
  const at::Tensor rowptr = rowptr_in.contiguous(), perm = perm_in.contiguous(), a = a_in.contiguous();
  check_rowptr(rowptr, E, op);
  ensure_perm_unique(perm, op);  // out[perm[j]] is written once per slot
  const at::Tensor b = BWD ? b_in->contiguous() : at::Tensor();
  at::Tensor out = at::empty_like(a, at::MemoryFormat::Contiguous);
  const int64_t H = c10::multiply_integers(a.sizes().slice(1));
  if (E == 0 || H == 0) {
    check_unwalked_structure(at::Tensor(), perm, E, op);
    return out;
  }
  const int64_t M = rowptr.numel() - 1;
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(a.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      const index_t* rp = rowptr.const_data_ptr<index_t>();
      const index_t* pm = perm.const_data_ptr<index_t>();
      const core_t* ap = core_ptr<scalar_t>(a);
      core_t* o = core_ptr<scalar_t>(out);
      if constexpr (BWD) {
        const core_t* bp = core_ptr<scalar_t>(b);
        st = parallel_rows(rp, M, knobs, [&](int64_t r0, int64_t r1) {
          return edge_softmax_backward_rows<core_t, index_t>(rp, pm, ap, bp, o, H, E, r0, r1);
        });
      } else {
        st = parallel_rows(rp, M, knobs, [&](int64_t r0, int64_t r1) {
          return edge_softmax_rows<core_t, index_t>(rp, pm, ap, o, H, E, r0, r1);
        });
      }
    });
  });
  raise_status(st, op, E, E);
  return out;
}

at::Tensor edge_softmax_cpu(const at::Tensor& rowptr, const at::Tensor& perm, const at::Tensor& scores,
                            c10::IntArrayRef knobs) {
  return run<false>(rowptr, perm, scores, nullptr, knobs, "gnncompile.edge_softmax");
}

at::Tensor edge_softmax_backward_cpu(const at::Tensor& rowptr, const at::Tensor& perm, const at::Tensor& out,
                                     const at::Tensor& grad, c10::IntArrayRef knobs) {
  return run<true>(rowptr, perm, out, &grad, knobs, "gnncompile.edge_softmax_backward");
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("edge_softmax", &edge_softmax_cpu);
  m.impl("edge_softmax_backward", &edge_softmax_backward_cpu);
}

}  // namespace cpu
}  // namespace gnncompile
