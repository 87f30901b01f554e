// gnncompile::spmm on the CPU: fused gather -> weight -> segment reduce, no E x F tensor.
#include <torch/library.h>

#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

// Feature tile (accumulators per pass over a row's edges): wide enough to cover a 128-float
// row in one pass, which the 32 vector registers of AVX-512 hold.
template <typename scalar_t> struct Tile { static constexpr int value = 128; };
template <> struct Tile<double> { static constexpr int value = 64; };

template <typename scalar_t, typename index_t, Reduce R, WeightMode W>
Status run(const SpmmArgs<scalar_t, index_t>& a, int64_t M, c10::IntArrayRef knobs) {
  constexpr int TILE = Tile<scalar_t>::value;
  return parallel_rows(a.rowptr, M, knobs, [&](int64_t r0, int64_t r1) {
    return spmm_rows<scalar_t, index_t, R, W, TILE>(a, r0, r1);
  });
}

template <typename scalar_t, typename index_t, Reduce R>
Status run_weight(const SpmmArgs<scalar_t, index_t>& a, int64_t M, WeightMode w,
                c10::IntArrayRef knobs) {
  switch (w) {
    case WeightMode::None: return run<scalar_t, index_t, R, WeightMode::None>(a, M, knobs);
    case WeightMode::Scalar: return run<scalar_t, index_t, R, WeightMode::Scalar>(a, M, knobs);
    case WeightMode::Head: return run<scalar_t, index_t, R, WeightMode::Head>(a, M, knobs);
  }
  return Status::Ok;
}

std::tuple<at::Tensor, at::Tensor> spmm_cpu(
    const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
    const std::optional<at::Tensor>& weight_in, const at::Tensor& x_in, c10::string_view reduce_s,
    c10::IntArrayRef knobs, const std::optional<at::Tensor>& /*rowptr_t*/,
    const std::optional<at::Tensor>& /*col_t*/, const std::optional<at::Tensor>& /*perm_t*/) {
  const char* op = "gnncompile.spmm";
  const Reduce reduce = parse_reduce(reduce_s);
  check_structure(rowptr_in, col_in, perm_in, op);
  check_cpu(rowptr_in, op, "rowptr");
  check_cpu(x_in, op, "x");
  TORCH_CHECK_VALUE(x_in.dim() >= 1, op, ": x must have a node dimension");
  const at::Tensor rowptr = rowptr_in.contiguous();
  const at::Tensor col = col_in.contiguous();
  const at::Tensor perm = perm_in.contiguous();
  const at::Tensor x = x_in.contiguous();
  const int64_t M = rowptr.numel() - 1;
  const int64_t E = col.numel();
  const int64_t Fx = c10::multiply_integers(x.sizes().slice(1));
  check_rowptr_ends(rowptr, col.numel(), op);

  WeightMode wmode = WeightMode::None;
  int64_t H = 1;
  at::Tensor weight;
  if (weight_in.has_value() && weight_in->defined()) {
    weight = weight_in->contiguous();
    check_cpu(weight, op, "weight");
    TORCH_CHECK_TYPE(weight.scalar_type() == x.scalar_type(), op, ": weight dtype ",
                     weight.scalar_type(), " does not match x dtype ", x.scalar_type());
    TORCH_CHECK_VALUE(weight.size(0) == E && (weight.dim() == 1 || weight.dim() == 2), op,
                      ": weight must be [E] or [E, H] with E = ", E, ", got ", weight.sizes());
    if (weight.dim() == 2 && !(weight.size(1) == 1)) {
      wmode = WeightMode::Head;
      H = weight.size(1);
      TORCH_CHECK_VALUE(x.dim() == 3 && x.size(1) == H, op, ": a weight of shape [E, ", H,
                        "] needs x of shape [N, ", H, ", C], got ", x.sizes());
    } else {
      wmode = WeightMode::Scalar;
    }
  }

  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  if (out_shape.empty()) out_shape.push_back(0);
  out_shape[0] = M;
  at::Tensor out = at::empty(out_shape, x.options());
  const bool need_arg = reduce == Reduce::Max || reduce == Reduce::Min;
  at::Tensor arg = need_arg ? at::empty(out_shape, x.options().dtype(at::kLong))
                            : at::empty({0}, x.options().dtype(at::kLong));
  if (M == 0 || Fx == 0) return {out, arg};
  if (E == 0) {
    out.zero_();
    if (need_arg) arg.fill_(-1);
    return {out, arg};
  }

  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      SpmmArgs<core_t, index_t> a;
      a.rowptr = rowptr.const_data_ptr<index_t>();
      a.col = col.const_data_ptr<index_t>();
      a.perm = perm.const_data_ptr<index_t>();
      a.weight = weight.defined() ? core_ptr<scalar_t>(static_cast<const at::Tensor&>(weight)) : nullptr;
      a.x = core_ptr<scalar_t>(x);
      a.out = core_ptr<scalar_t>(out);
      a.arg = need_arg ? arg.data_ptr<int64_t>() : nullptr;
      a.F = Fx;
      a.H = H;
      a.C = Fx / H;
      a.num_src = x.size(0);
      a.num_edges = E;
      switch (reduce) {
        case Reduce::Sum: st = run_weight<core_t, index_t, Reduce::Sum>(a, M, wmode, knobs); break;
        case Reduce::Mean: st = run_weight<core_t, index_t, Reduce::Mean>(a, M, wmode, knobs); break;
        case Reduce::Max: st = run_weight<core_t, index_t, Reduce::Max>(a, M, wmode, knobs); break;
        case Reduce::Min: st = run_weight<core_t, index_t, Reduce::Min>(a, M, wmode, knobs); break;
      }
    });
  });
  raise_status(st, op, x.size(0), E);
  return {out, arg};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) { m.impl("spmm", &spmm_cpu); }

}  // namespace cpu
}  // namespace gnncompile
