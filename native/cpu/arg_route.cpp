// gnncompile::arg_route and gnncompile::arg_edge_dot on the CPU: the max / min backward's fast
// form (each gradient to its recorded winner), no sort, no atomics. See arg_route_core.h.
#include <torch/library.h>

#include <algorithm>
#include <atomic>

#include "../common/arg_route_glue.h"
#include "arg_route_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

// Feature tile of the CSC pass: 64 accumulators, compared against 64 int64 records per edge.
constexpr int kArgRouteTile = 64;
// Features per task of the winner pass: one 64-byte line of float32 sums, so that no two
// threads write one cache line.
constexpr int64_t kWinnerBlock = 16;
constexpr int64_t kInvertGrain = 1 << 15;
constexpr int64_t kZeroGrain = 1 << 16;

// knobs[1] of arg_route (CPU only; knobs[0] is the chunks per thread of glue.h): which pass, for
// tests and measurements. 0 or absent: the rule (route_pass); 1: the CSC pass; 2: the winner pass.
// Without the CSC the winner pass runs (it reads the CSR alone).
enum class RoutePass : int64_t { Rule = 0, Csc = 1, Winners = 2 };

// The rule, a cost model fitted on a 2-core x86 VM (AMD EPYC, AVX-512) to the measurements of
// benchmarks/arg_backward.py --passes (benchmarks/results/arg_backward_passes.md):
//   the CSC pass costs about kCscEdgeCost per edge and feature tile of kArgRouteTile (the records
//     and gradient of a random row: memory latency, more than the compares), on every thread;
//   the winner pass about 1 per record (a random read-modify-write, prefetched), on at most one
//     thread per block of kWinnerBlock features.
// So the winner pass pays where rows have many edges (E >> M) and F is wide enough to keep the
// threads busy: M F / min(T, blocks) <= kCscEdgeCost E tiles / T. Fitted between 13 (100k nodes,
// 500k edges, F = 128: the winner pass 10% faster) and 21 (300k edges, F = 128: the CSC pass 20%
// faster); not measured on a machine with more cores.
constexpr int64_t kCscEdgeCost = 16;

RoutePass route_pass(c10::IntArrayRef knobs, int64_t M, int64_t E, int64_t F, int64_t H) {
  if (knobs.size() > 1 && knobs[1] == static_cast<int64_t>(RoutePass::Csc)) return RoutePass::Csc;
  if (knobs.size() > 1 && knobs[1] == static_cast<int64_t>(RoutePass::Winners)) return RoutePass::Winners;
  const int64_t T = std::max<int64_t>(1, at::get_num_threads());
  const int64_t blocks = (F + kWinnerBlock - 1) / kWinnerBlock;
  const int64_t tiles = H * ((F / H + kArgRouteTile - 1) / kArgRouteTile);
  // in double: M * F * T may overflow int64 on a huge graph
  const double winners = static_cast<double>(M) * static_cast<double>(F) / static_cast<double>(std::min(T, blocks));
  const double csc = static_cast<double>(kCscEdgeCost) * static_cast<double>(E) * static_cast<double>(tiles) /
                     static_cast<double>(T);
  return winners <= csc ? RoutePass::Winners : RoutePass::Csc;
}

// Runs fn(begin, end) -> Status over [0, n) in parallel; the first non-Ok status.
template <typename Fn>
Status parallel_range(int64_t n, int64_t grain, const Fn& fn) {
  std::atomic<int> status{static_cast<int>(Status::Ok)};
  at::parallel_for(0, n, grain, [&](int64_t b, int64_t e) {
    if (status.load(std::memory_order_relaxed) != static_cast<int>(Status::Ok)) return;
    const Status st = fn(b, e);
    if (st != Status::Ok) {
      int expected = static_cast<int>(Status::Ok);
      status.compare_exchange_strong(expected, static_cast<int>(st));
    }
  });
  return static_cast<Status>(status.load());
}

at::Tensor arg_route_cpu(const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
                         const std::optional<at::Tensor>& weight_in, const at::Tensor& arg_in,
                         const at::Tensor& grad_in, int64_t num_src, c10::IntArrayRef knobs,
                         const std::optional<at::Tensor>& rowptr_t_in, const std::optional<at::Tensor>& col_t_in,
                         const std::optional<at::Tensor>& perm_t_in) {
  const char* op = "gnncompile.arg_route";
  const ArgRouteCall c = arg_route_call(rowptr_in, col_in, perm_in, weight_in, arg_in, grad_in, num_src, rowptr_t_in,
                                        col_t_in, perm_t_in, op,
                                        [&](const at::Tensor& t, const char* name) { check_cpu(t, op, name); });
  const at::Tensor &rowptr = c.rowptr, &col = c.col, &perm = c.perm;
  const at::Tensor &rowptr_t = c.rowptr_t, &col_t = c.col_t, &perm_t = c.perm_t;
  const at::Tensor &weight = c.w.weight, &arg = c.arg, &grad = c.grad;
  check_rowptr(rowptr, c.E, op);
  if (c.has_csc) check_rowptr(rowptr_t, c.E, op);
  at::Tensor out = c.out;
  if (c.done) {
    check_unwalked_structure(col, perm, c.N, op);
    if (c.has_csc) check_unwalked_structure(col_t, perm_t, c.M, op);
    return out;
  }
  const RoutePass pass = c.has_csc ? route_pass(knobs, c.M, c.E, c.F, c.w.heads) : RoutePass::Winners;
  if (pass == RoutePass::Csc) ensure_perm_unique(perm, op);  // its inverse maps edges to slots
  const at::Tensor slot_of = pass == RoutePass::Csc ? at::empty({c.E}, perm.options()) : at::Tensor();
  const bool low_precision = grad.scalar_type() == at::kHalf || grad.scalar_type() == at::kBFloat16;
  at::Tensor sums;  // the winner pass's accumulators, zeroed below (in parallel: they are as large as out)
  if (pass == RoutePass::Winners) sums = low_precision ? at::empty({c.N, c.F}, grad.options().dtype(at::kFloat)) : out;
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(grad.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      using A = typename ArgRouteArgs<core_t, index_t>::acc_t;
      ArgRouteArgs<core_t, index_t> a;
      a.rowptr = rowptr.const_data_ptr<index_t>();
      a.col = col.const_data_ptr<index_t>();
      a.perm = perm.const_data_ptr<index_t>();
      a.rowptr_t = c.has_csc ? rowptr_t.const_data_ptr<index_t>() : nullptr;
      a.col_t = c.has_csc ? col_t.const_data_ptr<index_t>() : nullptr;
      a.perm_t = c.has_csc ? perm_t.const_data_ptr<index_t>() : nullptr;
      a.slot_of = slot_of.defined() ? slot_of.const_data_ptr<index_t>() : nullptr;
      a.weight = weight.defined() ? core_ptr<scalar_t>(weight) : nullptr;
      a.arg = arg.const_data_ptr<int64_t>();
      a.grad = core_ptr<scalar_t>(grad);
      a.out = core_ptr<scalar_t>(out);
      a.sums = sums.defined() ? reinterpret_cast<A*>(sums.data_ptr()) : nullptr;
      a.F = c.F;
      a.H = c.w.heads;
      a.C = c.F / c.w.heads;
      a.num_src = c.N;
      a.num_rows = c.M;
      a.num_edges = c.E;
      const bool w = a.weight != nullptr;
      if (pass == RoutePass::Csc) {
        index_t* inv = slot_of.data_ptr<index_t>();
        st = parallel_range(c.E, kInvertGrain, [&](int64_t j0, int64_t j1) {
          return invert_perm<index_t>(a.perm, c.E, inv, j0, j1);
        });
        if (st != Status::Ok) return;
        st = parallel_rows(a.rowptr_t, c.N, knobs, [&](int64_t s0, int64_t s1) {
          return w ? arg_route_sources<core_t, index_t, true, kArgRouteTile>(a, s0, s1)
                   : arg_route_sources<core_t, index_t, false, kArgRouteTile>(a, s0, s1);
        });
      } else {
        A* z = a.sums;
        at::parallel_for(0, c.N * c.F, kZeroGrain, [&](int64_t b, int64_t e) { std::fill(z + b, z + e, A(0)); });
        const int64_t blocks = (c.F + kWinnerBlock - 1) / kWinnerBlock;
        st = parallel_range(blocks, 1, [&](int64_t b0, int64_t b1) {
          const int64_t f0 = b0 * kWinnerBlock, f1 = std::min(c.F, b1 * kWinnerBlock);
          return w ? arg_route_winners<core_t, index_t, true>(a, f0, f1)
                   : arg_route_winners<core_t, index_t, false>(a, f0, f1);
        });
      }
    });
  });
  // the CSC pass reads col_t (destinations, M rows), the winner pass col (sources, N rows)
  TORCH_CHECK_INDEX(!(pass == RoutePass::Csc && st == Status::BadCol), op,
                    ": col_t (the CSC's destinations) holds a row outside [0, ", c.M, ")");
  raise_status(st, op, c.N, c.E);
  if (pass == RoutePass::Winners && low_precision) out.view({c.N, c.F}).copy_(sums);
  return out;
}

at::Tensor arg_edge_dot_cpu(const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
                            const at::Tensor& x_in, const at::Tensor& arg_in, const at::Tensor& grad_in,
                            int64_t heads, c10::IntArrayRef knobs) {
  const char* op = "gnncompile.arg_edge_dot";
  const ArgEdgeDotCall c = arg_edge_dot_call(rowptr_in, col_in, perm_in, x_in, arg_in, grad_in, heads, op,
                                             [&](const at::Tensor& t, const char* name) { check_cpu(t, op, name); });
  const at::Tensor &rowptr = c.rowptr, &col = c.col, &perm = c.perm, &x = c.x, &arg = c.arg, &grad = c.grad;
  check_rowptr(rowptr, c.E, op);
  ensure_perm_unique(perm, op);  // out[perm[j]] belongs to the row of slot j alone
  if (c.done) {
    check_unwalked_structure(col, perm, x.size(0), op);
    return c.finish();
  }
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    GNN_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
      using core_t = typename core_type<scalar_t>::type;
      using acc_t = typename acc_type<core_t>::type;
      ArgEdgeDotArgs<core_t, index_t> a;
      a.rowptr = rowptr.const_data_ptr<index_t>();
      a.col = col.const_data_ptr<index_t>();
      a.perm = perm.const_data_ptr<index_t>();
      a.x = core_ptr<scalar_t>(x);
      a.arg = arg.const_data_ptr<int64_t>();
      a.grad = core_ptr<scalar_t>(grad);
      a.out = reinterpret_cast<acc_t*>(c.acc.data_ptr());
      a.F = c.F;
      a.H = heads;
      a.C = c.F / heads;
      a.num_src = x.size(0);
      a.num_edges = c.E;
      st = parallel_rows(a.rowptr, c.M, knobs, [&](int64_t r0, int64_t r1) {
        return arg_edge_dot_rows<core_t, index_t>(a, r0, r1);
      });
    });
  });
  raise_status(st, op, x.size(0), c.E);
  return c.finish();
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("arg_route", &arg_route_cpu);
  m.impl("arg_edge_dot", &arg_edge_dot_cpu);
}

}  // namespace cpu
}  // namespace gnncompile
