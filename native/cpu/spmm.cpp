// gnncompile::spmm on the CPU: fused gather -> weight -> segment reduce, no E x F tensor.
#include <torch/library.h>

#include <cstring>

#include "glue.h"
#include "spmm_core.h"

namespace gnncompile {
namespace cpu {
namespace {

// Feature tile (accumulators per pass over a row's edges): wide enough to cover a 128-float
// row in one pass, which the 32 vector registers of AVX-512 hold.
template <typename scalar_t> struct Tile { static constexpr int value = 128; };
template <> struct Tile<double> { static constexpr int value = 64; };

// One pass over the structure per column block (knobs[2], glue.h: the block of x a pass reads
// stays in the cache; one block, the whole row, without it).
template <typename scalar_t, typename index_t, Reduce R, WeightMode W, typename out_t>
Status run(const SpmmArgs<scalar_t, index_t, out_t>& a, int64_t M, c10::IntArrayRef knobs) {
  constexpr int TILE = Tile<scalar_t>::value;
  const int64_t width = a.block > 0 ? a.block : a.F;
  for (int64_t fb = 0; fb < a.F; fb += width) {
    const int64_t fe = std::min<int64_t>(a.F, fb + width);
    const Status st = parallel_rows(a.rowptr, M, knobs, [&](int64_t r0, int64_t r1) {
      return spmm_rows<scalar_t, index_t, R, W, TILE>(a, r0, r1, fb, fe);
    });
    if (st != Status::Ok) return st;
  }
  return Status::Ok;
}

template <typename scalar_t, typename index_t, Reduce R, typename out_t>
Status run_weight(const SpmmArgs<scalar_t, index_t, out_t>& a, int64_t M, WeightMode w,
                c10::IntArrayRef knobs) {
  switch (w) {
    case WeightMode::None: return run<scalar_t, index_t, R, WeightMode::None>(a, M, knobs);
    case WeightMode::Scalar: return run<scalar_t, index_t, R, WeightMode::Scalar>(a, M, knobs);
    case WeightMode::Head: return run<scalar_t, index_t, R, WeightMode::Head>(a, M, knobs);
  }
  return Status::Ok;
}

// The kernel arguments the three entry points fill alike: the structure, x and the output (of
// out_scalar_t: float for spmm_bf16), the sizes, and the column block and prefetch distance from
// the knobs; no weight, arg record or self term (the caller sets those it has).
template <typename scalar_t, typename index_t, typename out_scalar_t = scalar_t,
          typename core_t = typename core_type<scalar_t>::type,
          typename out_t = typename core_type<out_scalar_t>::type>
SpmmArgs<core_t, index_t, out_t> spmm_args(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                                           const at::Tensor& x, at::Tensor& out, int64_t F, int64_t H, int64_t E,
                                           c10::IntArrayRef knobs) {
  SpmmArgs<core_t, index_t, out_t> a;
  a.rowptr = rowptr.const_data_ptr<index_t>();
  a.col = col.const_data_ptr<index_t>();
  a.perm = perm.const_data_ptr<index_t>();
  a.weight = nullptr;
  a.x = core_ptr<scalar_t>(x);
  a.out = core_ptr<out_scalar_t>(out);
  a.arg = nullptr;
  a.F = F;
  a.H = H;
  a.C = F / H;
  a.block = column_block(block_budget_bytes(knobs), x.size(0), F, sizeof(core_t));
  a.prefetch = prefetch_distance(knobs, a.block * static_cast<int64_t>(sizeof(core_t)));
  a.num_src = x.size(0);
  a.num_edges = E;
  a.zero_ties_free = false;
  return a;
}

std::tuple<at::Tensor, at::Tensor> spmm_cpu(
    const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
    const std::optional<at::Tensor>& weight_in, const at::Tensor& x_in, c10::string_view reduce_s,
    c10::IntArrayRef knobs, const std::optional<at::Tensor>& /*rowptr_t*/,
    const std::optional<at::Tensor>& /*col_t*/, const std::optional<at::Tensor>& /*perm_t*/,
    bool relu_input) {
  const char* op = "gnncompile.spmm";
  const SpmmCall c = spmm_call(rowptr_in, col_in, perm_in, weight_in, x_in, reduce_s, op,
                               [&](const at::Tensor& t, const char* name) { check_cpu(t, op, name); });
  const at::Tensor &rowptr = c.rowptr, &col = c.col, &perm = c.perm, &x = c.x, &weight = c.w.weight;
  const int64_t M = c.M, E = c.E, Fx = c.F, H = c.w.heads;
  const Reduce reduce = c.reduce;
  check_rowptr(rowptr, E, op);
  at::Tensor out = c.o.out, arg = c.o.arg;
  const bool need_arg = c.o.need_arg;
  if (c.o.done) {
    check_unwalked_structure(col, perm, x.size(0), op);
    return {out, arg};
  }
  if (c.w.mode == WeightMode::None) check_unread_perm(perm, op);

  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      SpmmArgs<core_t, index_t> a = spmm_args<scalar_t, index_t>(rowptr, col, perm, x, out, Fx, H, E, knobs);
      a.weight = weight.defined() ? core_ptr<scalar_t>(weight) : nullptr;
      a.arg = need_arg ? arg.data_ptr<int64_t>() : nullptr;
      a.zero_ties_free = relu_input && !weight.defined();
      switch (reduce) {
        case Reduce::Sum: st = run_weight<core_t, index_t, Reduce::Sum>(a, M, c.w.mode, knobs); break;
        case Reduce::Mean: st = run_weight<core_t, index_t, Reduce::Mean>(a, M, c.w.mode, knobs); break;
        case Reduce::Max: st = run_weight<core_t, index_t, Reduce::Max>(a, M, c.w.mode, knobs); break;
        case Reduce::Min: st = run_weight<core_t, index_t, Reduce::Min>(a, M, c.w.mode, knobs); break;
      }
    });
  });
  raise_status(st, op, x.size(0), E);
  return {out, arg};
}

// gnncompile::spmm_self: spmm's sum plus each row's own term, out[i] = sum over the row's edges of
// x[col] + round(scale * x[i]) (GINConv's `propagate(x) + (1 + eps) * x`, bit for bit: the sum in
// CSR order, then the rounded product added once), one pass and no [N, F] temporaries. Square
// structures only (M == rows of x); float32 / float64 (a 16-bit sum would round where the
// separate ops do not); `scale` a one-element tensor, cast to x's dtype as torch's mul casts it.
at::Tensor spmm_self_cpu(const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
                         const at::Tensor& x_in, const at::Tensor& scale, c10::IntArrayRef knobs,
                         const std::optional<at::Tensor>& /*rowptr_t*/, const std::optional<at::Tensor>& /*col_t*/,
                         const std::optional<at::Tensor>& /*perm_t*/) {
  const char* op = "gnncompile.spmm_self";
  const SpmmCall c = spmm_call(rowptr_in, col_in, perm_in, std::nullopt, x_in, "sum", op,
                               [&](const at::Tensor& t, const char* name) { check_cpu(t, op, name); });
  const at::Tensor &rowptr = c.rowptr, &col = c.col, &perm = c.perm, &x = c.x;
  TORCH_CHECK_VALUE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, op,
                    ": x must be float32 or float64, got ", x.scalar_type());
  TORCH_CHECK_VALUE(c.M == x.size(0), op, ": the structure must be square (", c.M, " rows) for x's ",
                    x.size(0), " rows");
  TORCH_CHECK_VALUE(scale.numel() == 1, op, ": scale must hold one value, got ", scale.numel());
  TORCH_CHECK_VALUE(scale.device().is_cpu(), op, ": scale must be on the CPU, got ", scale.device());
  check_rowptr(rowptr, c.E, op);
  const at::Tensor s = scale.reshape({}).to(x.scalar_type());
  at::Tensor out = c.o.out;
  if (c.o.done) {  // no rows or no edges: the zero sum plus the term, as the separate ops
    check_unwalked_structure(col, perm, x.size(0), op);
    return out.add_(x * s);
  }
  check_unread_perm(perm, op);
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      SpmmArgs<core_t, index_t> a = spmm_args<scalar_t, index_t>(rowptr, col, perm, x, out, c.F, 1, c.E, knobs);
      a.self_x = a.x;
      std::memcpy(&a.self_scale, s.const_data_ptr(), sizeof(core_t));  // s holds x's dtype (16-bit never runs)
      st = run<core_t, index_t, Reduce::Sum, WeightMode::None>(a, c.M, knobs);
    });
  });
  raise_status(st, op, x.size(0), c.E);
  return out;
}

// gnncompile::spmm_bf16: the sum / mean of spmm over bfloat16 features `xb` (and a bfloat16 edge
// weight), accumulated in float and written as float32, with no rounding of the output and no
// cast after the op (passes/precision.py, the opt-in choices['precision'] = 'bf16'). `x` is the
// float32 tensor `xb` was cast from: only its shape is read here (autograd differentiates the
// op with respect to it, ops/autograd.py).
at::Tensor spmm_bf16_cpu(
    const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
    const std::optional<at::Tensor>& weight_in, const at::Tensor& x_in, const at::Tensor& xb_in,
    c10::string_view reduce_s, c10::IntArrayRef knobs, const std::optional<at::Tensor>& /*rowptr_t*/,
    const std::optional<at::Tensor>& /*col_t*/, const std::optional<at::Tensor>& /*perm_t*/) {
  const char* op = "gnncompile.spmm_bf16";
  TORCH_CHECK_TYPE(xb_in.scalar_type() == at::kBFloat16, op, ": xb must be bfloat16, got ", xb_in.scalar_type());
  TORCH_CHECK_TYPE(x_in.scalar_type() == at::kFloat, op, ": x must be float32, got ", x_in.scalar_type());
  TORCH_CHECK_VALUE(x_in.sizes() == xb_in.sizes(), op, ": x and xb must have one shape, got ", x_in.sizes(),
                    " and ", xb_in.sizes());
  check_cpu(x_in, op, "x");
  const SpmmCall c = spmm_call(rowptr_in, col_in, perm_in, weight_in, xb_in, reduce_s, op,
                               [&](const at::Tensor& t, const char* name) { check_cpu(t, op, name); });
  TORCH_CHECK_VALUE(c.reduce == Reduce::Sum || c.reduce == Reduce::Mean, op,
                    ": reduce must be sum or mean, got '", std::string(reduce_s), "'");
  const at::Tensor &rowptr = c.rowptr, &col = c.col, &perm = c.perm, &xb = c.x, &weight = c.w.weight;
  const int64_t M = c.M, E = c.E, Fx = c.F, H = c.w.heads;
  check_rowptr(rowptr, E, op);
  at::Tensor out = at::empty(c.o.out.sizes(), c.o.out.options().dtype(at::kFloat));
  if (c.o.done) {
    out.zero_();
    check_unwalked_structure(col, perm, xb.size(0), op);
    return out;
  }
  if (c.w.mode == WeightMode::None) check_unread_perm(perm, op);
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    SpmmArgs<bf16_t, index_t, float> a = spmm_args<at::BFloat16, index_t, float>(rowptr, col, perm, xb, out, Fx, H, E,
                                                                                knobs);
    a.weight = weight.defined() ? core_ptr<at::BFloat16>(weight) : nullptr;
    if (c.reduce == Reduce::Sum) st = run_weight<bf16_t, index_t, Reduce::Sum>(a, M, c.w.mode, knobs);
    else st = run_weight<bf16_t, index_t, Reduce::Mean>(a, M, c.w.mode, knobs);
  });
  raise_status(st, op, xb.size(0), E);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("spmm", &spmm_cpu);
  m.impl("spmm_self", &spmm_self_cpu);
  m.impl("spmm_bf16", &spmm_bf16_cpu);
}

}  // namespace cpu
}  // namespace gnncompile
