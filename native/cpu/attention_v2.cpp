// gnncompile::attention_v2 and gnncompile::attention_v2_backward on the CPU: GATv2's attention
// (z = x_l[src] + x_r[dst] (+ e_term), logits att . leaky_relu(z), softmax, dropout, aggregation
// of x_l) in one pass per destination row; the backward in one pass over the CSR and one over the
// CSC (attention_v2_core.h). Deterministic: every output row is produced by one thread in a fixed
// order, and att's gradient is summed per fixed block of rows, then over the blocks in order.
#include <torch/library.h>

#include <atomic>

#include "../common/attention_glue.h"
#include "attention_v2_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

// Rows per block of att's gradient partial sums: fixed, so the sum's order (and bits) does not
// depend on the thread count.
constexpr int64_t kAttGradBlock = 64;

using V2Call = AttentionV2Call;

template <typename scalar_t, typename core_t, typename index_t>
AttentionV2Args<core_t, index_t> core_args(const V2Call& c, double slope) {
  AttentionV2Args<core_t, index_t> a;
  set_core_common<index_t, typename acc_type<core_t>::type>(a, c);
  a.xl = core_ptr<scalar_t>(c.xl);
  a.xr = core_ptr<scalar_t>(c.xr);
  a.att = core_ptr<scalar_t>(c.att);
  a.e_term = c.e_term.defined() ? core_ptr<scalar_t>(c.e_term) : nullptr;
  a.slope = static_cast<typename acc_type<core_t>::type>(slope);
  return a;
}

at::ScalarType acc_of(const at::Tensor& x) { return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

std::tuple<at::Tensor, at::Tensor> attention_v2_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& x_l,
    const at::Tensor& x_r, const at::Tensor& att, const std::optional<at::Tensor>& e_term, double slope, double p,
    const std::optional<at::Tensor>& seed, c10::IntArrayRef knobs, const std::optional<at::Tensor>& /*rowptr_t*/,
    const std::optional<at::Tensor>& /*col_t*/, const std::optional<at::Tensor>& /*perm_t*/) {
  const char* op = "gnncompile.attention_v2";
  const V2Call c = attention_v2_call(rowptr, col, perm, x_l, x_r, att, e_term, slope, p, seed, op, on_cpu(op));
  check_rowptr(c.rowptr, c.E, op);
  at::Tensor out = at::empty({c.M, c.H, c.C}, c.xl.options());
  at::Tensor stats = at::empty({c.M, 2, c.H}, c.xl.options().dtype(acc_of(c.xl)));
  if (c.E == 0 || c.H == 0 || c.C == 0 || c.M == 0) {
    check_unwalked_structure(c.col, c.perm, c.N, op);
    out.zero_();
    stats.zero_();
    return {out, stats};
  }
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.xl.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      using a_t = typename acc_type<core_t>::type;
      AttentionV2Args<core_t, index_t> a = core_args<scalar_t, core_t, index_t>(c, slope);
      a.prefetch = prefetch_distance(knobs);
      core_t* o = core_ptr<scalar_t>(out);
      a_t* s = reinterpret_cast<a_t*>(stats.data_ptr());
      st = parallel_rows(a.rowptr, c.M, knobs, [&](int64_t r0, int64_t r1) {
        return attention_v2_rows<core_t, index_t>(a, o, s, r0, r1);
      });
    });
  });
  raise_status(st, op, c.N, c.E);
  return {out, stats};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_v2_backward_cpu(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm, const at::Tensor& x_l,
    const at::Tensor& x_r, const at::Tensor& att, const std::optional<at::Tensor>& e_term, double slope, double p,
    const std::optional<at::Tensor>& seed, const at::Tensor& out_in, const at::Tensor& stats_in,
    const at::Tensor& grad_in, c10::IntArrayRef knobs, const at::Tensor& rowptr_t_in, const at::Tensor& col_t_in,
    const at::Tensor& perm_t_in) {
  const char* op = "gnncompile.attention_v2_backward";
  const V2Call c = attention_v2_call(rowptr, col, perm, x_l, x_r, att, e_term, slope, p, seed, op, on_cpu(op));
  check_attention_backward(c, c.xl, "x_l", rowptr_t_in, col_t_in, perm_t_in, out_in, stats_in, grad_in, op, on_cpu(op));
  const at::ScalarType acc = acc_of(c.xl);
  check_rowptr(c.rowptr, c.E, op);
  const at::Tensor rowptr_t = rowptr_t_in.contiguous(), col_t = col_t_in.contiguous(),
                   perm_t = perm_t_in.contiguous();
  check_rowptr(rowptr_t, c.E, op);
  const at::Tensor out = out_in.contiguous(), stats = stats_in.contiguous(), grad = grad_in.contiguous();
  at::Tensor g_xl = at::empty_like(c.xl);
  at::Tensor g_xr = at::empty_like(c.xr);
  at::Tensor g_e = c.e_term.defined() ? at::empty_like(c.e_term) : at::empty({0, c.H, c.C}, c.xl.options());
  const int64_t F = c.H * c.C;
  if (c.E == 0 || F == 0 || c.M == 0) {
    check_unwalked_structure(c.col, c.perm, c.N, op);
    check_unwalked_structure(col_t, perm_t, c.M, op);
    g_xl.zero_();
    g_xr.zero_();
    g_e.zero_();
    return {g_xl, g_xr, at::zeros_like(att, at::MemoryFormat::Contiguous), g_e};
  }
  ensure_perm_unique(c.perm, op);  // per-edge records are written at perm[j], once per slot
  const int64_t blocks = (c.M + kAttGradBlock - 1) / kAttGradBlock;
  at::Tensor part = at::zeros({blocks, F}, c.xl.options().dtype(acc));
  const int64_t rb = acc == at::kDouble ? record_bytes<double>(c.H, F) : record_bytes<float>(c.H, F);
  at::Tensor rec = at::empty({c.E * rb + 64}, c.xl.options().dtype(at::kByte));  // (+ 64: room to align)
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(c.xl.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      using a_t = typename acc_type<core_t>::type;
      AttentionV2Args<core_t, index_t> a = core_args<scalar_t, core_t, index_t>(c, slope);
      a.prefetch = prefetch_distance(knobs);
      a.rowptr_t = rowptr_t.const_data_ptr<index_t>();
      a.col_t = col_t.const_data_ptr<index_t>();
      a.perm_t = perm_t.const_data_ptr<index_t>();
      const core_t* o = core_ptr<scalar_t>(out);
      const core_t* g = core_ptr<scalar_t>(grad);
      const a_t* s = reinterpret_cast<const a_t*>(stats.const_data_ptr());
      a_t* pp = reinterpret_cast<a_t*>(part.data_ptr());
      char* rp = reinterpret_cast<char*>(rec.data_ptr());
      rp += (64 - reinterpret_cast<uintptr_t>(rp) % 64) % 64;  // records on cache-line boundaries
      core_t* gxl = core_ptr<scalar_t>(g_xl);
      core_t* gxr = core_ptr<scalar_t>(g_xr);
      core_t* ge = c.e_term.defined() ? core_ptr<scalar_t>(g_e) : nullptr;
      std::atomic<int> status{static_cast<int>(Status::Ok)};
      at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          if (status.load(std::memory_order_relaxed) != static_cast<int>(Status::Ok)) return;
          const Status r = attention_v2_dst_rows<core_t, index_t>(
              a, o, g, s, gxr, pp + b * F, rp, ge, b * kAttGradBlock, std::min(c.M, (b + 1) * kAttGradBlock));
          if (r != Status::Ok) {
            int expected = static_cast<int>(Status::Ok);
            status.compare_exchange_strong(expected, static_cast<int>(r));
          }
        }
      });
      st = static_cast<Status>(status.load());
      if (st == Status::Ok)
        st = parallel_rows(a.rowptr_t, c.N, knobs, [&](int64_t r0, int64_t r1) {
          return attention_v2_source_rows<core_t, index_t>(a, g, rp, gxl, r0, r1);
        });
    });
  });
  raise_status(st, op, std::max(c.N, c.M), c.E);
  // att's gradient: the blocks' partial sums, added in block order (a serial loop: torch's sum
  // may split the blocks by thread)
  at::Tensor total = at::zeros({F}, part.options());
  GNN_DISPATCH_FLOAT(part.scalar_type(), op, [&] {
    scalar_t* t = total.data_ptr<scalar_t>();
    const scalar_t* pp = part.const_data_ptr<scalar_t>();
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t f = 0; f < F; ++f) t[f] += pp[b * F + f];
  });
  at::Tensor g_att = total.to(c.xl.scalar_type()).view(att.sizes());
  return {g_xl, g_xr, g_att, g_e};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("attention_v2", &attention_v2_cpu);
  m.impl("attention_v2_backward", &attention_v2_backward_cpu);
}

}  // namespace cpu
}  // namespace gnncompile
