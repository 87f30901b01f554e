// gnncompile::message_reduce, message_sum_multi and message_edges on the CPU: message programs
// (gnncompile/ops/program.py) run by the interpreter of message_core.h, or by a generated kernel
// of the program and op when gnncompile/codegen registered one (message_codegen.h).
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>
#include <vector>

#include "glue.h"
#include "message_codegen.h"
#include "message_core.h"

namespace gnncompile {
namespace cpu {
namespace {

// The number of (slot, float-param) operands each opcode reads: program.py's OPS table.
constexpr int kArity[msg::NumOps] = {0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1,
                                     1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 2, 2};
constexpr int kParams[msg::NumOps] = {0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 2, 0, 0, 2, 0, 0,
                                      0, 1, 1, 0, 2, 2, 0, 0, 0, 1, 0, 0};

struct Program {
  std::vector<int32_t> code;
  int64_t n_instr = 0;
};

// Every instruction checked before a kernel runs: known opcode, slots in range and written
// before they are read, inputs and constants that exist. A program that fails here would
// otherwise read uninitialised registers or out of bounds.
Program check_program(c10::IntArrayRef code, int64_t n_consts, int64_t n_inputs, const char* op) {
  TORCH_CHECK_VALUE(code.size() > 0 && code.size() % msg::kInstr == 0, op,
                    ": code must hold whole 5-int instructions (got ", code.size(), " ints)");
  Program p;
  p.n_instr = static_cast<int64_t>(code.size()) / msg::kInstr;
  p.code.resize(code.size());
  bool written[msg::kMaxSlots] = {false};
  for (int64_t i = 0; i < p.n_instr; ++i) {
    const int64_t* ins = code.data() + i * msg::kInstr;
    const int64_t opc = ins[0], dst = ins[1], a = ins[2], b = ins[3], c = ins[4];
    TORCH_CHECK_VALUE(opc >= 0 && opc < msg::NumOps, op, ": instruction ", i, " has unknown opcode ", opc);
    TORCH_CHECK_VALUE(dst >= 0 && dst < msg::kMaxSlots, op, ": instruction ", i, " writes slot ", dst,
                      " outside [0, ", msg::kMaxSlots, ")");
    auto slot_ok = [&](int64_t s) { return s >= 0 && s < msg::kMaxSlots && written[s]; };
    auto const_ok = [&](int64_t k) { return k >= 0 && k < n_consts; };
    if (opc == msg::In) {
      TORCH_CHECK_VALUE(a >= 0 && a < n_inputs, op, ": instruction ", i, " reads input ", a, " of ", n_inputs);
    } else if (opc == msg::Const) {
      TORCH_CHECK_VALUE(const_ok(a), op, ": instruction ", i, " reads constant ", a, " of ", n_consts);
    } else {
      TORCH_CHECK_VALUE(slot_ok(a), op, ": instruction ", i, " reads slot ", a, " before it is written");
      if (kArity[opc] == 2)
        TORCH_CHECK_VALUE(slot_ok(b), op, ": instruction ", i, " reads slot ", b, " before it is written");
      if (kParams[opc] >= 1)
        TORCH_CHECK_VALUE(const_ok(b), op, ": instruction ", i, " reads constant ", b, " of ", n_consts);
      if (kParams[opc] == 2)
        TORCH_CHECK_VALUE(const_ok(c), op, ": instruction ", i, " reads constant ", c, " of ", n_consts);
    }
    written[dst] = true;
    for (int k = 0; k < msg::kInstr; ++k) p.code[i * msg::kInstr + k] = static_cast<int32_t>(ins[k]);
  }
  return p;
}

struct Inputs {
  std::vector<at::Tensor> tensors;
  int64_t num_src = 0;
  bool reads_col = false, reads_perm = false, reads_slot = false;
};

// An edge encoder at input k (program.py, side enc): the edge features a [E, D], then the
// constant inputs k + 1 and k + 2, its transposed weight Wt [D, W] (W dividing F) and bias b [1, W].
void check_encoder(const at::TensorList inputs, c10::IntArrayRef sides, size_t k, int64_t F, int64_t E,
                   const char* op) {
  TORCH_CHECK_VALUE(k + 2 < inputs.size() && sides[k + 1] == msg::Global && sides[k + 2] == msg::Global, op,
                    ": the edge encoder at input ", k, " needs its weight and bias as constant inputs ", k + 1,
                    " and ", k + 2);
  const at::Tensor &a = inputs[k], &wt = inputs[k + 1], &b = inputs[k + 2];
  TORCH_CHECK_VALUE(a.size(0) == E && a.size(1) >= 1, op, ": the edge encoder's features (input ", k,
                    ") have shape ", a.sizes(), ", not [", E, " edges, D]");
  const int64_t D = a.size(1);
  TORCH_CHECK_VALUE(wt.dim() == 2 && wt.size(0) == D && wt.size(1) >= 1 && F % wt.size(1) == 0, op,
                    ": the edge encoder's weight (input ", k + 1, ") has shape ", wt.sizes(), ", not [", D,
                    ", W] with W dividing ", F);
  TORCH_CHECK_VALUE(b.dim() == 2 && b.size(0) == 1 && b.size(1) == wt.size(1), op, ": the edge encoder's bias (input ",
                    k + 2, ") has shape ", b.sizes(), ", not [1, ", wt.size(1), "]");
  TORCH_CHECK_TYPE(wt.scalar_type() == a.scalar_type() && b.scalar_type() == a.scalar_type(), op,
                   ": the edge encoder at input ", k, " has dtypes ", a.scalar_type(), ", ", wt.scalar_type(), ", ",
                   b.scalar_type(), "; inputs must share one float dtype");
}

Inputs check_inputs(const at::TensorList inputs, c10::IntArrayRef sides, int64_t F, int64_t M, int64_t E,
                    const char* op) {
  TORCH_CHECK_VALUE(inputs.size() == sides.size(), op, ": ", inputs.size(), " inputs but ", sides.size(),
                    " sides");
  TORCH_CHECK_VALUE(inputs.size() > 0, op, ": a message program needs at least one input");
  TORCH_CHECK_VALUE(F >= 0, op, ": width must be >= 0");
  Inputs r;
  const auto dtype = inputs[0].scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kDouble, op,
                   ": inputs must be float32 or float64, got ", dtype);
  r.num_src = -1;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const at::Tensor& t = inputs[k];
    check_cpu(t, op, "inputs");
    TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": input ", k, " has dtype ", t.scalar_type(),
                     ", input 0 has ", dtype);
    TORCH_CHECK_VALUE(t.dim() == 2, op, ": input ", k, " must be 2-D [rows, width], got ", t.dim(), "-D");
    const int64_t W = t.size(1), rows = t.size(0), side = sides[k];
    if (msg::is_encoder(static_cast<int32_t>(side))) {  // the edge features: D need not divide F (the weight's width must)
      check_encoder(inputs, sides, k, F, E, op);
      (side == msg::Enc ? r.reads_perm : r.reads_slot) = true;  // EncSlot: stored per CSR slot
      r.tensors.push_back(t.contiguous());
      continue;
    }
    TORCH_CHECK_VALUE(W >= 1 && F % W == 0, op, ": input ", k, " has width ", W,
                      ", which does not divide the message width ", F);
    switch (side) {
      case msg::Col:
        TORCH_CHECK_VALUE(r.num_src < 0 || rows == r.num_src, op, ": neighbour inputs have ", r.num_src,
                          " and ", rows, " rows");
        r.num_src = rows;
        r.reads_col = true;
        break;
      case msg::Row:
        TORCH_CHECK_VALUE(rows >= M, op, ": input ", k, " is read per destination row but has ", rows,
                          " rows for ", M, " rows");
        break;
      case msg::Edge:
        TORCH_CHECK_VALUE(rows == E, op, ": input ", k, " is read per edge but has ", rows, " rows for ", E,
                          " edges");
        r.reads_perm = true;
        break;
      case msg::Global:
        TORCH_CHECK_VALUE(rows >= 1, op, ": constant input ", k, " has no row");
        break;
      case msg::Slot:
        TORCH_CHECK_VALUE(rows == E, op, ": input ", k, " is stored per CSR slot but has ", rows, " rows for ", E,
                          " edges");
        r.reads_slot = true;
        break;
      default:
        TORCH_CHECK_VALUE(false, op, ": input ", k, " has unknown side ", side);
    }
    r.tensors.push_back(t.contiguous());
  }
  if (r.num_src < 0) r.num_src = 0;
  return r;
}

// The CSR slot of every traversed slot (a CSC's), or undefined on the CSR itself.
at::Tensor check_slot(const std::optional<at::Tensor>& slot, const at::Tensor& col, const char* op) {
  if (!slot.has_value() || !slot->defined()) return at::Tensor();
  check_cpu(*slot, op, "slot");
  TORCH_CHECK_VALUE(slot->dim() == 1 && slot->numel() == col.numel() && slot->scalar_type() == col.scalar_type(), op,
                    ": slot must be 1-D with one entry per edge, of col's dtype");
  return slot->contiguous();
}

template <typename scalar_t, typename acc_t, typename index_t>
msg::Args<scalar_t, acc_t, index_t> make_args(const at::Tensor& rowptr, const at::Tensor& col,
                                             const at::Tensor& perm, const at::Tensor& slot, const Inputs& in,
                                             std::vector<msg::Input<scalar_t>>& views,
                                             c10::IntArrayRef sides, const Program& p,
                                             const std::vector<acc_t>& consts, int64_t F) {
  for (size_t k = 0; k < in.tensors.size(); ++k) {
    const at::Tensor& t = in.tensors[k];
    msg::Input<scalar_t> v{t.const_data_ptr<scalar_t>(), static_cast<int32_t>(sides[k]), t.size(1), F / t.size(1)};
    if (msg::is_encoder(static_cast<int32_t>(sides[k]))) {  // checked: inputs k + 1 and k + 2 are Wt [D, W] and b [1, W]
      const at::Tensor& wt = in.tensors[k + 1];
      v.width = wt.size(1);
      v.div = F / v.width;
      v.wt = wt.const_data_ptr<scalar_t>();
      v.bias = in.tensors[k + 2].const_data_ptr<scalar_t>();
      v.dim = t.size(1);
    }
    views.push_back(v);
  }
  msg::Args<scalar_t, acc_t, index_t> a;
  a.rowptr = rowptr.const_data_ptr<index_t>();
  a.col = col.const_data_ptr<index_t>();
  a.perm = perm.const_data_ptr<index_t>();
  a.slot = slot.defined() ? slot.const_data_ptr<index_t>() : nullptr;
  a.inputs = views.data();
  a.n_inputs = static_cast<int>(views.size());
  a.code = p.code.data();
  a.n_instr = p.n_instr;
  a.consts = consts.data();
  a.F = F;
  a.num_src = in.num_src;
  a.num_edges = col.numel();
  a.reads_col = in.reads_col;
  a.reads_perm = in.reads_perm;
  a.reads_slot = in.reads_slot;
  a.by_slot = false;
  a.out = nullptr;
  a.arg = nullptr;
  a.out_width = F;
  return a;
}

// float32 / float64 only (checked by check_inputs): the programs compute in the input dtype.
#define GNN_DISPATCH_F32_F64(dtype, ...)                                          \
  [&] {                                                                           \
    if (dtype == at::kDouble) { using scalar_t = double; return __VA_ARGS__(); } \
    using scalar_t = float;                                                       \
    return __VA_ARGS__();                                                         \
  }()

template <typename scalar_t> struct Tile { static constexpr int value = 128; };
template <> struct Tile<double> { static constexpr int value = 64; };

// What every message op checks before a kernel runs: the structure, the inputs, the optional
// CSR slots of a transposed structure and the program.
struct Call {
  const char* op;
  at::Tensor rowptr, col, perm, slot;
  int64_t M = 0, E = 0;
  Inputs in;
  Program p;
};

Call prepare(const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in, at::TensorList inputs,
             c10::IntArrayRef sides, c10::IntArrayRef code, c10::ArrayRef<double> consts, int64_t F,
             const std::optional<at::Tensor>& slot_in, const char* op) {
  Call c;
  c.op = op;
  check_structure(rowptr_in, col_in, perm_in, op);
  check_cpu(rowptr_in, op, "rowptr");
  check_cpu(col_in, op, "col");
  check_cpu(perm_in, op, "perm");
  c.rowptr = rowptr_in.contiguous();
  c.col = col_in.contiguous();
  c.perm = perm_in.contiguous();
  c.M = c.rowptr.numel() - 1;
  c.E = c.col.numel();
  check_rowptr(c.rowptr, c.E, op);
  c.in = check_inputs(inputs, sides, F, c.M, c.E, op);
  c.slot = check_slot(slot_in, c.col, op);
  c.p = check_program(code, static_cast<int64_t>(consts.size()), static_cast<int64_t>(inputs.size()), op);
  return c;
}

// Dispatches on the index and feature dtypes and calls fn(args, tile) with the kernel arguments
// (out and the mode fields left for fn to set) and the tile width as an integral constant.
template <typename Fn>
void run(const Call& c, c10::IntArrayRef sides, c10::ArrayRef<double> consts, int64_t F, const Fn& fn) {
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(c.rowptr.scalar_type(), c.op, [&] {
    GNN_DISPATCH_F32_F64(c.in.tensors[0].scalar_type(), [&] {
      using acc_t = scalar_t;
      std::vector<acc_t> cs(consts.begin(), consts.end());
      std::vector<msg::Input<scalar_t>> views;
      auto a = make_args<scalar_t, acc_t, index_t>(c.rowptr, c.col, c.perm, c.slot, c.in, views, sides, c.p, cs, F);
      st = fn(a, std::integral_constant<int, Tile<scalar_t>::value>());
    });
  });
  raise_status(st, c.op, c.in.num_src, c.E);
}

// A generated kernel of this call's program (message_codegen.h) for the op `op_key`
// (reduce_op_key / multi_op_key / edges_op_key), run after every check of the interpreter's and
// over the same row split; false when none is registered for its key.
bool run_generated(const Call& c, const std::string& op_key, c10::IntArrayRef sides, c10::IntArrayRef code,
                   c10::ArrayRef<double> consts, int64_t F, c10::IntArrayRef knobs, at::Tensor& out, at::Tensor* arg,
                   int64_t out_width, bool always, void* out2 = nullptr) {
  const auto dtype = c.in.tensors[0].scalar_type();
  const auto itype = c.rowptr.scalar_type();
  std::vector<int64_t> widths, divs;
  std::vector<const void*> ptrs;
  for (const at::Tensor& t : c.in.tensors) {
    widths.push_back(t.size(1));
    divs.push_back(F / t.size(1));
    ptrs.push_back(t.const_data_ptr());
  }
  const GenRowsFn fn =
      find_generated(codegen_key(op_key, dtype == at::kDouble, itype == at::kLong, code, consts, sides, widths, F));
  if (fn == nullptr) return false;
  count_generated_call();
  GenArgs g;
  g.rowptr = c.rowptr.const_data_ptr();
  g.col = c.col.const_data_ptr();
  g.perm = c.perm.const_data_ptr();
  g.slot = c.slot.defined() ? c.slot.const_data_ptr() : nullptr;
  g.inputs = ptrs.data();
  g.widths = widths.data();
  g.divs = divs.data();
  g.n_inputs = static_cast<int64_t>(ptrs.size());
  g.F = F;
  g.num_src = c.in.num_src;
  g.num_edges = c.E;
  g.prefetch = prefetch_distance(knobs);
  g.out = out.data_ptr();
  g.arg = arg != nullptr && arg->numel() > 0 ? arg->data_ptr<int64_t>() : nullptr;
  g.out_width = out_width;
  g.M = c.M;
  g.out2 = out2;
  Status st = Status::Ok;
  if (F > 0 || always) {  // message_edges walks the edges (and checks them) as its interpreter does
    GNN_DISPATCH_INDEX(itype, c.op, [&] {
      st = parallel_rows(c.rowptr.const_data_ptr<index_t>(), c.M, knobs,
                         [&](int64_t r0, int64_t r1) { return static_cast<Status>(fn(&g, r0, r1)); });
    });
  }
  raise_status(st, c.op, c.in.num_src, c.E);
  return true;
}

std::tuple<at::Tensor, at::Tensor> message_reduce_cpu(
    const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in, at::TensorList inputs,
    c10::IntArrayRef sides, c10::IntArrayRef code, c10::ArrayRef<double> consts, int64_t F,
    c10::string_view reduce_s, c10::IntArrayRef knobs, at::TensorList /*csc: backward only*/,
    const std::optional<at::Tensor>& slot_in) {
  const Reduce reduce = parse_reduce(reduce_s);
  const Call c = prepare(rowptr_in, col_in, perm_in, inputs, sides, code, consts, F, slot_in,
                         "gnncompile.message_reduce");
  const bool need_arg = reduce == Reduce::Max || reduce == Reduce::Min;
  const auto opts = c.in.tensors[0].options();
  at::Tensor out = at::empty({c.M, F}, opts);
  at::Tensor arg = at::empty(need_arg ? std::vector<int64_t>{c.M, F} : std::vector<int64_t>{0}, opts.dtype(at::kLong));
  if (any_generated() && run_generated(c, reduce_op_key(static_cast<int>(reduce)), sides, code, consts, F, knobs, out,
                                       &arg, F, false))
    return {out, arg};
  run(c, sides, consts, F, [&](auto& a, auto tile) {
    using A = std::decay_t<decltype(a)>;
    using S = typename A::scalar_type;
    using Acc = typename A::acc_type;
    using I = typename A::index_type;
    constexpr int TILE = decltype(tile)::value;
    a.out = out.data_ptr<S>();
    a.arg = need_arg ? arg.data_ptr<int64_t>() : nullptr;
    a.prefetch = prefetch_distance(knobs);
    return parallel_rows(a.rowptr, c.M, knobs, [&](int64_t r0, int64_t r1) {
      switch (reduce) {
        case Reduce::Sum: return msg::reduce_rows<S, Acc, I, Reduce::Sum, TILE>(a, r0, r1);
        case Reduce::Mean: return msg::reduce_rows<S, Acc, I, Reduce::Mean, TILE>(a, r0, r1);
        case Reduce::Max: return msg::reduce_rows<S, Acc, I, Reduce::Max, TILE>(a, r0, r1);
        case Reduce::Min: return msg::reduce_rows<S, Acc, I, Reduce::Min, TILE>(a, r0, r1);
      }
      return Status::Ok;
    });
  });
  return {out, arg};
}

// gnncompile::message_softmax: the softmax aggregation of the program's messages with
// temperature t ([1, Wt], Wt dividing F, the inputs' dtype), one pass per row (softmax_rows):
// (out [M, F], lse [M, F]). t is checked and read as one more constant input after the
// program's (which the program does not read): the generated kernel of the call (op key "s")
// reads it there too.
std::tuple<at::Tensor, at::Tensor> message_softmax_cpu(
    const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in, at::TensorList inputs,
    c10::IntArrayRef sides, c10::IntArrayRef code, c10::ArrayRef<double> consts, int64_t F, const at::Tensor& t_in,
    c10::IntArrayRef knobs, at::TensorList /*csc: backward only*/) {
  const char* op = "gnncompile.message_softmax";
  check_cpu(t_in, op, "t");
  TORCH_CHECK_VALUE(t_in.dim() == 2 && t_in.size(0) == 1 && t_in.size(1) >= 1 && F % t_in.size(1) == 0, op,
                    ": t has shape ", t_in.sizes(), ", not [1, Wt] with Wt dividing ", F);
  TORCH_CHECK_TYPE(inputs.empty() || t_in.scalar_type() == inputs[0].scalar_type(), op, ": t has dtype ",
                   t_in.scalar_type(), ", the inputs ", inputs[0].scalar_type());
  std::vector<at::Tensor> all(inputs.begin(), inputs.end());
  all.push_back(t_in);
  std::vector<int64_t> all_sides(sides.begin(), sides.end());
  all_sides.push_back(msg::Global);
  const Call c = prepare(rowptr_in, col_in, perm_in, all, all_sides, code, consts, F, std::nullopt, op);
  const at::Tensor& t = c.in.tensors.back();
  const auto opts = c.in.tensors[0].options();
  at::Tensor out = at::empty({c.M, F}, opts);
  at::Tensor lse = at::empty({c.M, F}, opts);
  if (any_generated() &&
      run_generated(c, "s", all_sides, code, consts, F, knobs, out, nullptr, F, false, lse.data_ptr()))
    return {out, lse};
  run(c, all_sides, consts, F, [&](auto& a, auto tile) {
    using A = std::decay_t<decltype(a)>;
    using S = typename A::scalar_type;
    constexpr int TILE = decltype(tile)::value;
    a.out = out.data_ptr<S>();
    a.prefetch = prefetch_distance(knobs);
    const S* tp = t.const_data_ptr<S>();
    const int64_t tdiv = F / t.size(1);
    S* lp = lse.data_ptr<S>();
    return parallel_rows(a.rowptr, c.M, knobs, [&](int64_t r0, int64_t r1) {
      return msg::softmax_rows<S, typename A::acc_type, typename A::index_type, TILE>(a, tp, tdiv, lp, r0, r1);
    });
  });
  return {out, lse};
}

at::Tensor message_edges_cpu(const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
                             at::TensorList inputs, c10::IntArrayRef sides, c10::IntArrayRef code,
                             c10::ArrayRef<double> consts, int64_t F, int64_t out_width, bool by_slot,
                             c10::IntArrayRef knobs, at::TensorList /*csc: backward only*/,
                             const std::optional<at::Tensor>& slot_in) {
  const Call c = prepare(rowptr_in, col_in, perm_in, inputs, sides, code, consts, F, slot_in,
                         "gnncompile.message_edges");
  TORCH_CHECK_VALUE(out_width >= 1 && F % out_width == 0, c.op, ": out_width ", out_width,
                    " does not divide the message width ", F);
  const auto opts = c.in.tensors[0].options();
  at::Tensor out = out_width == F ? at::empty({c.E, out_width}, opts) : at::zeros({c.E, out_width}, opts);
  if (any_generated() && run_generated(c, edges_op_key(by_slot, out_width, F), sides, code, consts, F, knobs, out,
                                       nullptr, out_width, true))
    return out;
  run(c, sides, consts, F, [&](auto& a, auto tile) {
    using A = std::decay_t<decltype(a)>;
    a.out = out.data_ptr<typename A::scalar_type>();
    a.out_width = out_width;
    a.reads_perm = true;
    a.by_slot = by_slot;
    a.prefetch = prefetch_distance(knobs);
    return parallel_rows(a.rowptr, c.M, knobs, [&](int64_t r0, int64_t r1) {
      return msg::edge_rows<typename A::scalar_type, typename A::acc_type, typename A::index_type,
                            decltype(tile)::value>(a, r0, r1);
    });
  });
  return out;
}

at::Tensor message_sum_multi_cpu(const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in,
                                 at::TensorList inputs, c10::IntArrayRef sides, c10::IntArrayRef code,
                                 c10::ArrayRef<double> consts, c10::IntArrayRef results, int64_t F,
                                 c10::IntArrayRef knobs, const std::optional<at::Tensor>& slot_in) {
  const Call c = prepare(rowptr_in, col_in, perm_in, inputs, sides, code, consts, F, slot_in,
                         "gnncompile.message_sum_multi");
  const int K = static_cast<int>(results.size());
  TORCH_CHECK_VALUE(K >= 1 && K <= msg::kMaxResults, c.op, ": 1 to ", msg::kMaxResults, " results, got ", K);
  std::vector<int32_t> res(K);
  std::vector<bool> written(msg::kMaxSlots, false);
  for (int64_t i = 0; i < c.p.n_instr; ++i) written[c.p.code[i * msg::kInstr + 1]] = true;
  for (int k = 0; k < K; ++k) {
    TORCH_CHECK_VALUE(results[k] >= 0 && results[k] < msg::kMaxSlots && written[results[k]], c.op, ": result ", k,
                      " names slot ", results[k], ", which no instruction writes");
    res[k] = static_cast<int32_t>(results[k]);
  }
  at::Tensor out = at::empty({K, c.M, F}, c.in.tensors[0].options());
  if (any_generated() && run_generated(c, multi_op_key(results), sides, code, consts, F, knobs, out, nullptr, F, false))
    return out;
  run(c, sides, consts, F, [&](auto& a, auto tile) {
    using A = std::decay_t<decltype(a)>;
    a.out = out.data_ptr<typename A::scalar_type>();
    a.prefetch = prefetch_distance(knobs);
    return parallel_rows(a.rowptr, c.M, knobs, [&](int64_t r0, int64_t r1) {
      return msg::sum_rows_multi<typename A::scalar_type, typename A::acc_type, typename A::index_type,
                                 decltype(tile)::value>(a, res.data(), K, c.M, r0, r1);
    });
  });
  return out;
}

// gnncompile::message_encoder_grad: the gradients of the edge encoder at input `enc` (features
// a [E, D], Wt [D, W], b [1, W]) from the derivative program (code, consts) whose value per edge
// is G * dm/d(encoder value), without its [E, W] values: walked as message_edges walks (its
// checks, the balanced row split), each chunk of the split accumulating dWt and db in a buffer of
// its own, the buffers then summed in chunk order (deterministic for a given split: another
// thread count or knobs may round differently, as any parallel sum), and da[e] written per edge
// when need_features. Returns (da [E, D] or [0, D], dWt [D, W], db [1, W]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> message_encoder_grad_cpu(
    const at::Tensor& rowptr_in, const at::Tensor& col_in, const at::Tensor& perm_in, at::TensorList inputs,
    c10::IntArrayRef sides, c10::IntArrayRef code, c10::ArrayRef<double> consts, int64_t F, int64_t enc,
    bool need_features, c10::IntArrayRef knobs) {
  const char* op = "gnncompile.message_encoder_grad";
  TORCH_CHECK_VALUE(enc >= 0 && enc < static_cast<int64_t>(inputs.size()) &&
                        static_cast<int64_t>(sides.size()) == static_cast<int64_t>(inputs.size()) &&
                        msg::is_encoder(static_cast<int32_t>(sides[enc])),
                    op, ": input ", enc, " is not an edge encoder (side ", static_cast<int>(msg::Enc), " or ",
                    static_cast<int>(msg::EncSlot), ")");
  const Call c = prepare(rowptr_in, col_in, perm_in, inputs, sides, code, consts, F, std::nullopt, op);
  const at::Tensor& a_t = c.in.tensors[enc];
  const at::Tensor& wt_t = c.in.tensors[enc + 1];
  const int64_t D = a_t.size(1), W = wt_t.size(1);
  const auto opts = a_t.options();
  at::Tensor da = need_features ? at::zeros({c.E, D}, opts) : at::empty({0, D}, opts);
  // the split: parallel_rows' (glue.h), each chunk with its accumulators
  const int64_t chunks = c.M == 0 ? 0 : std::max<int64_t>(1, num_chunks(c.M, at::get_num_threads(), knobs));
  std::vector<int64_t> bounds(chunks + 1, 0);
  if (chunks == 1) bounds[1] = c.M;
  const int64_t stride = D * W + W + kEncoderGradBlock * W;  // [dWt | db | scratch of a block of edges]
  at::Tensor acc = at::zeros({std::max<int64_t>(chunks, 1), stride}, opts);
  // a generated kernel of the call's program and encoder, if one is registered
  const auto dtype = a_t.scalar_type();
  const auto itype = c.rowptr.scalar_type();
  std::vector<int64_t> widths, divs;
  std::vector<const void*> ptrs;
  for (const at::Tensor& t : c.in.tensors) {
    widths.push_back(t.size(1));
    divs.push_back(F / t.size(1));
    ptrs.push_back(t.const_data_ptr());
  }
  GenRowsFn gen = nullptr;
  if (any_generated())
    gen = find_generated(codegen_key(encoder_grad_op_key(enc, need_features, W, F), dtype == at::kDouble,
                                     itype == at::kLong, code, consts, sides, widths, F));
  Status st = Status::Ok;
  GNN_DISPATCH_INDEX(itype, op, [&] {
    const index_t* rp = c.rowptr.const_data_ptr<index_t>();
    if (chunks > 1) balanced_row_split(rp, c.M, chunks, bounds.data());
    std::atomic<int> status{static_cast<int>(Status::Ok)};
    auto each_chunk = [&](const auto& body) {
      at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
        for (int64_t k = c0; k < c1; ++k) {
          if (status.load(std::memory_order_relaxed) != static_cast<int>(Status::Ok)) return;
          if (bounds[k] >= bounds[k + 1]) continue;
          const Status s = body(k, bounds[k], bounds[k + 1]);
          if (s != Status::Ok) {
            int expected = static_cast<int>(Status::Ok);
            status.compare_exchange_strong(expected, static_cast<int>(s));
          }
        }
      });
    };
    if (gen != nullptr) {
      count_generated_call();
      GenArgs g;
      g.rowptr = c.rowptr.const_data_ptr();
      g.col = c.col.const_data_ptr();
      g.perm = c.perm.const_data_ptr();
      g.slot = nullptr;
      g.inputs = ptrs.data();
      g.widths = widths.data();
      g.divs = divs.data();
      g.n_inputs = static_cast<int64_t>(ptrs.size());
      g.F = F;
      g.num_src = c.in.num_src;
      g.num_edges = c.E;
      g.prefetch = prefetch_distance(knobs);
      g.arg = nullptr;
      g.out_width = W;
      g.M = c.M;
      g.out2 = need_features ? da.data_ptr() : nullptr;
      char* base = static_cast<char*>(acc.data_ptr());
      const int64_t bytes = stride * static_cast<int64_t>(acc.element_size());
      each_chunk([&](int64_t k, int64_t r0, int64_t r1) {
        GenArgs mine = g;
        mine.out = base + k * bytes;
        return static_cast<Status>(gen(&mine, r0, r1));
      });
    } else {
      GNN_DISPATCH_F32_F64(dtype, [&] {
        using acc_t = scalar_t;
        constexpr int TILE = Tile<scalar_t>::value;
        std::vector<acc_t> cs(consts.begin(), consts.end());
        std::vector<msg::Input<scalar_t>> views;
        auto a = make_args<scalar_t, acc_t, index_t>(c.rowptr, c.col, c.perm, c.slot, c.in, views, sides, c.p, cs, F);
        a.reads_perm = true;
        a.out_width = W;
        a.prefetch = prefetch_distance(knobs);
        scalar_t* buf = acc.data_ptr<scalar_t>();
        scalar_t* dap = need_features ? da.data_ptr<scalar_t>() : nullptr;
        each_chunk([&](int64_t k, int64_t r0, int64_t r1) {
          acc_t* mine = buf + k * stride;
          return msg::encoder_grad_rows<scalar_t, acc_t, index_t, TILE>(a, static_cast<int>(enc), mine,
                                                                        mine + D * W + W, dap, r0, r1);
        });
      });
    }
    st = static_cast<Status>(status.load());
  });
  raise_status(st, op, c.in.num_src, c.E);
  // the chunks' sums, in chunk order
  at::Tensor dwt = at::zeros({D, W}, opts), db = at::zeros({1, W}, opts);
  GNN_DISPATCH_F32_F64(dtype, [&] {
    const scalar_t* buf = acc.const_data_ptr<scalar_t>();
    scalar_t* pw = dwt.data_ptr<scalar_t>();
    scalar_t* pb = db.data_ptr<scalar_t>();
    for (int64_t k = 0; k < chunks; ++k) {
      const scalar_t* m = buf + k * stride;
      for (int64_t i = 0; i < D * W; ++i) pw[i] = pw[i] + m[i];
      for (int64_t i = 0; i < W; ++i) pb[i] = pb[i] + m[D * W + i];
    }
  });
  return {da, dwt, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("message_encoder_grad", &message_encoder_grad_cpu);
  m.impl("message_sum_multi", &message_sum_multi_cpu);
  m.impl("message_reduce", &message_reduce_cpu);
  m.impl("message_edges", &message_edges_cpu);
  m.impl("message_softmax", &message_softmax_cpu);
}

}  // namespace cpu
}  // namespace gnncompile
