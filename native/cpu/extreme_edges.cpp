// gnncompile::extreme_edges_backward on the CPU: torch's max / min gradient of per-edge messages
// reduced over a CSR (messages computed beforehand: EdgeCNN's max over its MLP's output), one pass
// per destination row, rows split over the threads (each row writes its own messages: no atomics,
// deterministic). See extreme_edges_core.h.
#include <torch/library.h>

#include "extreme_edges_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

at::Tensor extreme_edges_backward_cpu(const at::Tensor& rowptr_in, const at::Tensor& perm_in,
                                      const at::Tensor& messages_in, const at::Tensor& out_in,
                                      const at::Tensor& grad_in, bool by_slot, bool count_zeros, bool nan_gives_nan,
                                      c10::IntArrayRef knobs) {
  const char* op = "gnncompile.extreme_edges_backward";
  check_rowptr_perm(rowptr_in, perm_in, op);
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{rowptr_in, "rowptr"}, {perm_in, "perm"},
                                {messages_in, "messages"}, {out_in, "out"}, {grad_in, "grad"}})
    check_cpu(t, op, name);
  const int64_t E = perm_in.numel(), M = rowptr_in.numel() - 1;
  TORCH_CHECK_VALUE(messages_in.dim() == 2 && messages_in.size(0) == E, op,
                    ": messages must be [E, F] with E = ", E, " edges, got ", messages_in.sizes());
  const int64_t F = messages_in.size(1);
  TORCH_CHECK_VALUE(out_in.dim() == 2 && out_in.size(0) == M && out_in.size(1) == F, op, ": out must be [M, F] = [",
                    M, ", ", F, "], got ", out_in.sizes());
  TORCH_CHECK_VALUE(grad_in.dim() == 2 && grad_in.size(0) == M && grad_in.size(1) == F, op,
                    ": grad must be [M, F] = [", M, ", ", F, "], got ", grad_in.sizes());
  const at::ScalarType dt = messages_in.scalar_type();
  TORCH_CHECK_TYPE((dt == at::kFloat || dt == at::kDouble) && out_in.scalar_type() == dt &&
                       grad_in.scalar_type() == dt,
                   op, ": messages, out and grad must share one dtype, float32 or float64; got ", dt, ", ",
                   out_in.scalar_type(), ", ", grad_in.scalar_type());
  const at::Tensor rowptr = rowptr_in.contiguous(), perm = perm_in.contiguous();
  check_rowptr(rowptr, E, op);
  if (!by_slot) ensure_perm_unique(perm, op);  // result[perm[j]] is written once per slot
  at::Tensor result = at::empty({E, F}, messages_in.options());
  if (E == 0 || F == 0) {
    if (!by_slot) check_unwalked_structure(at::Tensor(), perm, E, op);
    return result;
  }
  const at::Tensor messages = messages_in.contiguous(), out = out_in.contiguous(), grad = grad_in.contiguous();
  Status st = Status::Ok;
  auto run = [&](auto tag, auto itag) {
    using scalar_t = decltype(tag);
    using index_t = decltype(itag);
    ExtremeEdgesArgs<scalar_t, index_t> a;
    a.rowptr = rowptr.const_data_ptr<index_t>();
    a.perm = perm.const_data_ptr<index_t>();
    a.messages = messages.const_data_ptr<scalar_t>();
    a.out = out.const_data_ptr<scalar_t>();
    a.grad = grad.const_data_ptr<scalar_t>();
    a.result = result.data_ptr<scalar_t>();
    a.F = F;
    a.num_edges = E;
    a.count_zeros = count_zeros;
    a.nan_gives_nan = nan_gives_nan;
    st = parallel_rows(a.rowptr, M, knobs, [&](int64_t r0, int64_t r1) {
      return by_slot ? extreme_edges_backward_rows<scalar_t, index_t, true>(a, r0, r1)
                     : extreme_edges_backward_rows<scalar_t, index_t, false>(a, r0, r1);
    });
  };
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    if (dt == at::kFloat) run(float(0), index_t(0));
    else run(double(0), index_t(0));  // the only other dtype the checks above let through
  });
  raise_status(st, op, E, E);
  return result;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) { m.impl("extreme_edges_backward", &extreme_edges_backward_cpu); }

}  // namespace cpu
}  // namespace gnncompile
