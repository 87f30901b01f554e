// Message programs on the host (gnncompile/ops/program.py): one interpreter for every per-edge
// elementwise message. Torch-free.
//
// A program is a list of 5-int instructions (opcode, dst, a, b, c) over register tiles
// ("slots") of TILE accumulators. For each CSR slot j of row r (edge e = perm[j], neighbour
// col[j]) and each tile of features [f0, f0 + n), the instructions run in order, each a plain
// loop over the tile that the compiler vectorizes; the last instruction's slot is the message.
// Input k is a [rows, W_k] tensor read at row col[j] / r / e / 0 (its side) and column
// f / (F / W_k). Nothing per edge is written to memory except by message_edges, whose output
// is per edge. An edge-encoder input (side Enc, program.py) is read for edge e as
// b[c] + a[e, 0] * Wt[0, c] + ... + a[e, D-1] * Wt[D-1, c] (c = f / (F / W_k)), summed in that
// order, each product rounded (message.cpp is compiled with -ffp-contract=off: no multiply-add),
// computed per tile inside the kernel: its [E, W] values never exist in memory. Side EncSlot is
// the same encoder with its features stored per CSR slot (a[sl], a copy made once in CSR order:
// read in order, not at random through perm; the same sums, the same bits). Transcendental
// operators call vmath.h (float32: inline, branch-free functions the tile loops vectorize;
// float64: libm), as the generated kernels do: the same functions, the same bits.
//
//  * message_reduce: the messages of a row reduced (sum, mean, max, min) in registers, one
//    thread per row, in CSR order: deterministic, no atomics. max/min record the CSR slot of
//    the chosen edge (NaN wins), or how many edges tie (arg_fold in common/macros.h), for the
//    backward pass.
//  * message_softmax: the messages of a row reduced by PyG's softmax aggregation with a
//    temperature t, in one pass with an online maximum (softmax_rows), out and lse per (row, feature).
//  * message_edges: the message of every edge written to out[e] (out[j] with by_slot: CSR order;
//    grouped sums: column g of a [E, W_out] output sums features [g * F / W_out, (g + 1) * F / W_out)).
//  * message_encoder_grad: an edge encoder's gradients from a derivative program, walked as
//    message_edges walks, accumulated per chunk (encoder_grad_rows): no [E, W] tensor.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../common/macros.h"
#include "encoder_core.h"
#include "reduce_core.h"
#include "rows_core.h"
#include "vmath.h"

namespace gnncompile {
namespace cpu {
namespace msg {

enum Op : int32_t {
  In = 0, Const = 1, Add = 2, Sub = 3, Mul = 4, Div = 5, Neg = 6, Relu = 7, LeakyRelu = 8,
  Elu = 9, Gelu = 10, Sigmoid = 11, Tanh = 12, Softplus = 13, Exp = 14, Log = 15, Clamp = 16,
  Pow = 17, Sqrt = 18, Step = 19, LeakyReluGrad = 20, EluGrad = 21, GeluGrad = 22,
  SoftplusGrad = 23, ClampGrad = 24, PowExpGrad = 25, Abs = 26, Sign = 27, PowC = 28, Gate = 29,
  Eq = 30,
  NumOps = 31,
};
enum Side : int32_t { Col = 0, Row = 1, Edge = 2, Global = 3, Slot = 4, Enc = 5, EncSlot = 6 };
// an edge encoder, its features read per edge (Enc, at perm[j]) or per CSR slot (EncSlot, at sl)
inline bool is_encoder(int32_t side) { return side == Enc || side == EncSlot; }
constexpr int kMaxSlots = 32;
constexpr int kInstr = 5;

template <typename scalar_t>
struct Input {
  const scalar_t* data;  // Enc: the edge features a [E, dim]
  int32_t side;
  int64_t width;  // W_k (Enc: the encoder's output width, Wt's columns)
  int64_t div;    // F / W_k
  const scalar_t* wt = nullptr;    // Enc: the transposed weight Wt [dim, width] (contiguous)
  const scalar_t* bias = nullptr;  // Enc: the bias b [1, width]
  int64_t dim = 0;                 // Enc: D, the edge features per edge
};

// An edge encoder's values for columns [c0, c0 + nc) of the edge whose features are ar:
// d[i] = b[c0 + i] + ar[0] * Wt[0, c0 + i] + ... (in that order: encoder_core.h; the loop over
// the features outside, over the columns inside: a row of Wt is contiguous over the columns).
template <typename scalar_t, typename acc_t>
inline void encode_columns(const Input<scalar_t>& in, const scalar_t* ar, int64_t c0, int nc, acc_t* d) {
  if constexpr (std::is_same<scalar_t, acc_t>::value) {  // the kernels' case (message.cpp): encoder_core.h
    encode_run(ar, in.dim, in.wt + c0, in.width, in.bias + c0, nc, d);
    return;
  }
  const scalar_t* b = in.bias + c0;
  for (int i = 0; i < nc; ++i) d[i] = to_float(b[i]);
  for (int64_t k = 0; k < in.dim; ++k) {
    const acc_t av = to_float(ar[k]);
    const scalar_t* w = in.wt + k * in.width + c0;
    for (int i = 0; i < nc; ++i) d[i] = d[i] + av * to_float(w[i]);
  }
}

template <typename scalar_t, typename acc_t, typename index_t>
struct Args {
  using scalar_type = scalar_t;
  using acc_type = acc_t;
  using index_type = index_t;
  const index_t* rowptr;
  const index_t* col;
  const index_t* perm;
  const index_t* slot;  // CSR slot of each traversed slot (a CSC); nullptr: the traversal is the CSR
  const Input<scalar_t>* inputs;
  int n_inputs;
  const int32_t* code;  // n_instr * 5
  int64_t n_instr;
  const acc_t* consts;
  int64_t F;
  int64_t num_src;    // rows of every col-side input (checked against col)
  int64_t num_edges;  // E (checked against perm)
  bool reads_col, reads_perm, reads_slot;
  bool by_slot;       // edges: write row j instead of perm[j]
  scalar_t* out;      // reduce: [M, F]; edges: [E, W_out]
  int64_t* arg;       // reduce max/min: [M, F]
  int64_t out_width;  // edges: W_out
  int64_t prefetch = kPrefetchDistance;  // slots ahead whose rows are prefetched (knobs[1], glue.h)
};


// x ** c for a number c as torch computes it (a tensor to a scalar power): its special cases
// first (sqrt for 0.5 differs from pow at -0 and -inf), then pow.
template <typename acc_t>
inline acc_t pow_number(acc_t x, acc_t c) {
  if (c == acc_t(2)) return x * x;
  if (c == acc_t(3)) return x * x * x;
  if (c == acc_t(0.5)) return std::sqrt(x);
  if (c == acc_t(-0.5)) return acc_t(1) / std::sqrt(x);
  if (c == acc_t(-1)) return acc_t(1) / x;
  if (c == acc_t(-2)) return acc_t(1) / (x * x);
  return std::pow(x, c);
}

// Runs the program for one edge on one tile; returns the result. Registers are pointers: an
// input read at full width (and in the compute type) points straight into its row, with no copy;
// every other instruction writes its own slot tile.
template <typename scalar_t, typename acc_t, typename index_t, int TILE>
inline const acc_t* eval(const Args<scalar_t, acc_t, index_t>& a, acc_t (*s)[TILE], const acc_t** reg,
                         int64_t row, int64_t src, int64_t e, int64_t sl, int64_t f0, int n) {
  const int32_t* ins = a.code;
  const acc_t* res = nullptr;
  for (int64_t i = 0; i < a.n_instr; ++i, ins += kInstr) {
    const int32_t op = ins[0];
    // no __restrict__: a slot freed by its last reader is reused as that instruction's
    // destination, so d may be x or y (the same element is read, then written)
    acc_t* d = s[ins[1]];
    const acc_t* x = reg[ins[2]];
    const acc_t* y = reg[ins[3]];
    switch (op) {
      case In: {
        const Input<scalar_t>& in = a.inputs[ins[2]];
        if (is_encoder(in.side)) {
          // the tile's columns [c0, c1] once each, then spread over the tile in place from its end
          // (the column of feature f0 + t is at index (f0 + t) / div - c0 <= t)
          const scalar_t* ar = in.data + (in.side == Enc ? e : sl) * in.dim;
          if (in.div == 1) {
            encode_columns(in, ar, f0, n, d);
          } else if (n > 0) {
            const int64_t c0 = f0 / in.div;
            encode_columns(in, ar, c0, static_cast<int>((f0 + n - 1) / in.div - c0 + 1), d);
            for (int t = n - 1; t >= 0; --t) d[t] = d[(f0 + t) / in.div - c0];
          }
          break;
        }
        const int64_t r = in.side == Col ? src : in.side == Row ? row : in.side == Edge ? e : in.side == Slot ? sl : 0;
        const scalar_t* p = in.data + r * in.width;
        if constexpr (std::is_same<scalar_t, acc_t>::value) {
          if (in.div == 1) {
            reg[ins[1]] = p + f0;
            res = p + f0;
            continue;
          }
        }
        if (in.div == 1) {
          for (int t = 0; t < n; ++t) d[t] = to_float(p[f0 + t]);
        } else {
          for (int t = 0; t < n; ++t) d[t] = to_float(p[(f0 + t) / in.div]);
        }
        break;
      }
      case Const: { const acc_t c = a.consts[ins[2]]; for (int t = 0; t < n; ++t) d[t] = c; break; }
      case Add: for (int t = 0; t < n; ++t) d[t] = x[t] + y[t]; break;
      case Sub: for (int t = 0; t < n; ++t) d[t] = x[t] - y[t]; break;
      case Mul: for (int t = 0; t < n; ++t) d[t] = x[t] * y[t]; break;
      case Div: for (int t = 0; t < n; ++t) d[t] = x[t] / y[t]; break;
      case Neg: for (int t = 0; t < n; ++t) d[t] = -x[t]; break;
      // torch.relu: NaN and both zeros pass unchanged (relu(-0.0) is -0.0), a negative gives +0
      case Relu: for (int t = 0; t < n; ++t) d[t] = x[t] < acc_t(0) ? acc_t(0) : x[t]; break;
      case LeakyRelu: {
        const acc_t sl = a.consts[ins[3]];
        for (int t = 0; t < n; ++t) d[t] = x[t] > acc_t(0) ? x[t] : x[t] * sl;
        break;
      }
      case Elu: {
        const acc_t al = a.consts[ins[3]];
        for (int t = 0; t < n; ++t) d[t] = x[t] > acc_t(0) ? x[t] : al * vm::expm1(x[t]);
        break;
      }
      case Gelu:
        for (int t = 0; t < n; ++t)
          d[t] = x[t] * acc_t(0.5) * (acc_t(1) + vm::erf(x[t] * acc_t(0.70710678118654752440)));
        break;
      case Sigmoid: for (int t = 0; t < n; ++t) d[t] = vm::sigmoid(x[t]); break;
      case Tanh: for (int t = 0; t < n; ++t) d[t] = vm::tanh(x[t]); break;
      case Softplus: {
        const acc_t beta = a.consts[ins[3]], thr = a.consts[ins[4]];
        for (int t = 0; t < n; ++t)
          d[t] = x[t] * beta > thr ? x[t] : vm::log1p(vm::exp(x[t] * beta)) / beta;
        break;
      }
      case Exp: for (int t = 0; t < n; ++t) d[t] = vm::exp(x[t]); break;
      case Log: for (int t = 0; t < n; ++t) d[t] = vm::log(x[t]); break;
      case Clamp: {
        const acc_t lo = a.consts[ins[3]], hi = a.consts[ins[4]];
        for (int t = 0; t < n; ++t) {
          const acc_t v = x[t] < lo ? lo : x[t];
          d[t] = x[t] != x[t] ? x[t] : (v > hi ? hi : v);
        }
        break;
      }
      case Pow: for (int t = 0; t < n; ++t) d[t] = std::pow(x[t], y[t]); break;
      case Sqrt: for (int t = 0; t < n; ++t) d[t] = std::sqrt(x[t]); break;
      case Abs: for (int t = 0; t < n; ++t) d[t] = std::abs(x[t]); break;
      case Sign:
        for (int t = 0; t < n; ++t) d[t] = x[t] > acc_t(0) ? acc_t(1) : (x[t] < acc_t(0) ? acc_t(-1) : acc_t(0));
        break;
      // relu's mask as torch's threshold_backward reads it: 0 where x <= 0 (NaN passes)
      case Step: for (int t = 0; t < n; ++t) d[t] = x[t] <= acc_t(0) ? acc_t(0) : acc_t(1); break;
      case LeakyReluGrad: {
        const acc_t sl = a.consts[ins[3]];
        for (int t = 0; t < n; ++t) d[t] = x[t] > acc_t(0) ? acc_t(1) : sl;
        break;
      }
      case EluGrad: {
        const acc_t al = a.consts[ins[3]];
        for (int t = 0; t < n; ++t) d[t] = x[t] > acc_t(0) ? acc_t(1) : al * vm::exp(x[t]);
        break;
      }
      case GeluGrad:
        for (int t = 0; t < n; ++t) {
          const acc_t v = x[t];
          const acc_t cdf = acc_t(0.5) * (acc_t(1) + vm::erf(v * acc_t(0.70710678118654752440)));
          const acc_t pdf = vm::exp(acc_t(-0.5) * v * v) * acc_t(0.39894228040143267794);
          d[t] = cdf + v * pdf;
        }
        break;
      case SoftplusGrad: {
        const acc_t beta = a.consts[ins[3]], thr = a.consts[ins[4]];
        for (int t = 0; t < n; ++t) {
          const acc_t z = vm::exp(x[t] * beta);
          d[t] = x[t] * beta > thr ? acc_t(1) : z / (z + acc_t(1));
        }
        break;
      }
      case ClampGrad: {
        const acc_t lo = a.consts[ins[3]], hi = a.consts[ins[4]];
        for (int t = 0; t < n; ++t) d[t] = (x[t] >= lo && x[t] <= hi) ? acc_t(1) : acc_t(0);
        break;
      }
      case PowExpGrad:
        for (int t = 0; t < n; ++t)
          d[t] = (x[t] == acc_t(0) && y[t] >= acc_t(0)) ? acc_t(0) : std::pow(x[t], y[t]) * vm::log(x[t]);
        break;
      case PowC: {
        const acc_t c = a.consts[ins[3]];
        for (int t = 0; t < n; ++t) d[t] = pow_number(x[t], c);
        break;
      }
      case Gate: for (int t = 0; t < n; ++t) d[t] = y[t] != acc_t(0) ? x[t] : acc_t(0); break;
      case Eq: for (int t = 0; t < n; ++t) d[t] = x[t] == y[t] ? acc_t(1) : acc_t(0); break;
      default: break;  // opcodes are validated before any kernel runs
    }
    reg[ins[1]] = d;
    res = d;
  }
  return res;
}

// Prefetches the rows that CSR slot j reads through col and perm (random accesses), one tile.
template <typename scalar_t, typename acc_t, typename index_t>
inline void prefetch_slot(const Args<scalar_t, acc_t, index_t>& a, int64_t j, int64_t f0, int n) {
  const int64_t src = a.reads_col ? static_cast<int64_t>(a.col[j]) : 0;
  const int64_t e = a.reads_perm ? static_cast<int64_t>(a.perm[j]) : 0;
  if ((a.reads_col && !in_range(src, a.num_src)) || (a.reads_perm && !in_range(e, a.num_edges))) return;
  for (int k = 0; k < a.n_inputs; ++k) {
    const Input<scalar_t>& in = a.inputs[k];
    if (in.side == Enc) {  // the edge's features, all D of them (every tile reads them all)
      const char* p = reinterpret_cast<const char*>(in.data + e * in.dim);
      const int64_t bytes = in.dim * static_cast<int64_t>(sizeof(scalar_t));
      for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 0);
      continue;
    }
    // (EncSlot, Slot: read in slot order on the CSR; not prefetched, as a Slot input never was)
    if (in.side != Col && in.side != Edge) continue;
    const char* p = reinterpret_cast<const char*>(in.data + (in.side == Col ? src : e) * in.width + f0 / in.div);
    const int bytes = static_cast<int>((n / in.div + 1) * sizeof(scalar_t));
    for (int b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 0);
  }
}

// The prefetch of a row walk a.prefetch slots ahead of slot j (in the row [begin, end),
// tile [f0, f0 + n)), past the row's end too: the row's first slots at its next tile, or after
// its last tile the next rows' first tile (as spmm_core.h), so short rows are prefetched.
template <typename scalar_t, typename acc_t, typename index_t, int TILE>
inline void prefetch_ahead(const Args<scalar_t, acc_t, index_t>& a, int64_t j, int64_t begin, int64_t end,
                           int64_t f0, int n) {
  const int64_t ahead = j + a.prefetch;
  if (ahead < end) {
    prefetch_slot(a, ahead, f0, n);
  } else if (f0 + n < a.F) {
    const int64_t wrap = begin + (ahead - end);
    if (wrap < end) prefetch_slot(a, wrap, f0 + n, static_cast<int>(a.F - f0 - n < TILE ? a.F - f0 - n : TILE));
  } else if (ahead < a.num_edges) {
    prefetch_slot(a, ahead, 0, static_cast<int>(a.F < TILE ? a.F : TILE));
  }
}

// The edge of traversed slot j: its neighbour (checked against num_src), id (checked against E)
// and CSR slot (checked against E).
template <typename scalar_t, typename acc_t, typename index_t>
inline Status edge_of(const Args<scalar_t, acc_t, index_t>& a, int64_t j, int64_t& src, int64_t& e, int64_t& sl) {
  src = 0;
  e = 0;
  sl = j;
  if (a.reads_col) {
    src = static_cast<int64_t>(a.col[j]);
    if (!in_range(src, a.num_src)) return Status::BadCol;
  }
  if (a.reads_perm) {
    e = static_cast<int64_t>(a.perm[j]);
    if (!in_range(e, a.num_edges)) return Status::BadPerm;
  }
  if (a.reads_slot && a.slot != nullptr) {
    sl = static_cast<int64_t>(a.slot[j]);
    if (!in_range(sl, a.num_edges)) return Status::BadPerm;
  }
  return Status::Ok;
}

template <typename scalar_t, typename acc_t, typename index_t, Reduce R, int TILE>
Status reduce_rows(const Args<scalar_t, acc_t, index_t>& a, int64_t row_begin, int64_t row_end) {
  constexpr bool kArg = (R == Reduce::Max || R == Reduce::Min);
  alignas(64) acc_t s[kMaxSlots][TILE];
  const acc_t* reg[kMaxSlots];
  acc_t acc[TILE];
  int32_t win[kArg ? TILE : 1];
  acc_t eq[kArg ? TILE : 1];  // 1 where a message equalled the extreme when it came (a possible tie)
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.num_edges)) return Status::BadRowptr;
    const int64_t begin = static_cast<int64_t>(a.rowptr[row]), end = static_cast<int64_t>(a.rowptr[row + 1]);
    for (int64_t f0 = 0; f0 < a.F; f0 += TILE) {
      const int n = static_cast<int>(a.F - f0 < TILE ? a.F - f0 : TILE);
      for (int t = 0; t < n; ++t) acc[t] = reduce_init<R, acc_t>();
      if (kArg)
        for (int t = 0; t < n; ++t) { win[t] = -1; eq[t] = acc_t(0); }
      for (int64_t j = begin; j < end; ++j) {
        prefetch_ahead<scalar_t, acc_t, index_t, TILE>(a, j, begin, end, f0, n);
        int64_t src, e, sl;
        const Status st = edge_of(a, j, src, e, sl);
        if (st != Status::Ok) return st;
        const acc_t* v = eval<scalar_t, acc_t, index_t, TILE>(a, s, reg, row, src, e, sl, f0, n);
        if (!kArg) {
          for (int t = 0; t < n; ++t) acc[t] += v[t];
        } else {
          const int32_t off = static_cast<int32_t>(j - begin);
          for (int t = 0; t < n; ++t)
            fold_extreme(R == Reduce::Min, v[t], off, acc[t], win[t], eq[t]);
        }
      }
      store_reduced<scalar_t, R>(acc, win, eq, begin, end - begin, n, a.out + row * a.F + f0,
                                 kArg ? a.arg + row * a.F + f0 : nullptr);
    }
  }
  return Status::Ok;
}

// message_softmax: PyG's softmax aggregation of the messages (SoftmaxAggregation: alpha =
// softmax(t * m) over each row's edges, per feature; out = sum of alpha * m) in one pass over a
// row's edges per tile, with an online maximum: per feature the running maximum mx of t * m, the
// running sum s of exp(t * m - mx) and the running weighted sum w of exp(t * m - mx) * m, both
// rescaled by exp(mx_old - mx_new) when the maximum grows. At the row's end out = w / s and
// lse = mx + log(s) (the backward's statistics: alpha = exp(t * m - lse)); a row without edges
// gets 0 and 0. temp: t [Wt] read at feature f / temp_div. No per-edge value is stored.
template <typename scalar_t, typename acc_t, typename index_t, int TILE>
Status softmax_rows(const Args<scalar_t, acc_t, index_t>& a, const scalar_t* temp, int64_t temp_div, scalar_t* lse,
                    int64_t row_begin, int64_t row_end) {
  alignas(64) acc_t s[kMaxSlots][TILE];
  const acc_t* reg[kMaxSlots];
  alignas(64) acc_t mx[TILE];
  alignas(64) acc_t sum[TILE];
  alignas(64) acc_t ws[TILE];
  alignas(64) acc_t tt[TILE];
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.num_edges)) return Status::BadRowptr;
    const int64_t begin = static_cast<int64_t>(a.rowptr[row]), end = static_cast<int64_t>(a.rowptr[row + 1]);
    for (int64_t f0 = 0; f0 < a.F; f0 += TILE) {
      const int n = static_cast<int>(a.F - f0 < TILE ? a.F - f0 : TILE);
      for (int t = 0; t < n; ++t) {
        tt[t] = to_float(temp[(f0 + t) / temp_div]);
        mx[t] = kNegInf;
        sum[t] = acc_t(0);
        ws[t] = acc_t(0);
      }
      for (int64_t j = begin; j < end; ++j) {
        prefetch_ahead<scalar_t, acc_t, index_t, TILE>(a, j, begin, end, f0, n);
        int64_t src, e, sl;
        const Status st = edge_of(a, j, src, e, sl);
        if (st != Status::Ok) return st;
        const acc_t* v = eval<scalar_t, acc_t, index_t, TILE>(a, s, reg, row, src, e, sl, f0, n);
        for (int t = 0; t < n; ++t) {
          const acc_t z = tt[t] * v[t];
          const acc_t m_new = z > mx[t] ? z : mx[t];
          const acc_t c = vm::exp(mx[t] - m_new);
          const acc_t p = vm::exp(z - m_new);
          sum[t] = sum[t] * c + p;
          ws[t] = ws[t] * c + p * v[t];
          mx[t] = m_new;
        }
      }
      scalar_t* o = a.out + row * a.F + f0;
      scalar_t* l = lse + row * a.F + f0;
      if (end > begin) {
        for (int t = 0; t < n; ++t) {
          o[t] = from_acc<scalar_t>(ws[t] / sum[t]);
          l[t] = from_acc<scalar_t>(mx[t] + vm::log(sum[t]));
        }
      } else {
        for (int t = 0; t < n; ++t) {
          o[t] = scalar_t(0);
          l[t] = scalar_t(0);
        }
      }
    }
  }
  return Status::Ok;
}

// Several results of one instruction stream (results[k]: their slots), each summed over the
// row: out is [K, M, F]. Used by the backward pass (every gradient read per destination in one
// pass over the CSR, every one read per neighbour in one pass over the CSC).
constexpr int kMaxResults = 16;
template <typename scalar_t, typename acc_t, typename index_t, int TILE>
Status sum_rows_multi(const Args<scalar_t, acc_t, index_t>& a, const int32_t* results, int K, int64_t M,
                      int64_t row_begin, int64_t row_end) {
  alignas(64) acc_t s[kMaxSlots][TILE];
  const acc_t* reg[kMaxSlots];
  acc_t acc[kMaxResults][TILE];
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.num_edges)) return Status::BadRowptr;
    const int64_t begin = static_cast<int64_t>(a.rowptr[row]), end = static_cast<int64_t>(a.rowptr[row + 1]);
    for (int64_t f0 = 0; f0 < a.F; f0 += TILE) {
      const int n = static_cast<int>(a.F - f0 < TILE ? a.F - f0 : TILE);
      for (int k = 0; k < K; ++k)
        for (int t = 0; t < n; ++t) acc[k][t] = acc_t(0);
      for (int64_t j = begin; j < end; ++j) {
        prefetch_ahead<scalar_t, acc_t, index_t, TILE>(a, j, begin, end, f0, n);
        int64_t src, e, sl;
        const Status st = edge_of(a, j, src, e, sl);
        if (st != Status::Ok) return st;
        eval<scalar_t, acc_t, index_t, TILE>(a, s, reg, row, src, e, sl, f0, n);
        for (int k = 0; k < K; ++k) {
          const acc_t* v = reg[results[k]];
          for (int t = 0; t < n; ++t) acc[k][t] += v[t];
        }
      }
      for (int k = 0; k < K; ++k) {
        scalar_t* o = a.out + (k * M + row) * a.F + f0;
        for (int t = 0; t < n; ++t) o[t] = from_acc<scalar_t>(acc[k][t]);
      }
    }
  }
  return Status::Ok;
}

// out (zeroed by the caller when grouped) gets every edge's message, in the user's edge order.
template <typename scalar_t, typename acc_t, typename index_t, int TILE>
Status edge_rows(const Args<scalar_t, acc_t, index_t>& a, int64_t row_begin, int64_t row_end) {
  alignas(64) acc_t s[kMaxSlots][TILE];
  const acc_t* reg[kMaxSlots];
  const int64_t div_o = a.F / a.out_width;
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.num_edges)) return Status::BadRowptr;
    const int64_t begin = static_cast<int64_t>(a.rowptr[row]), end = static_cast<int64_t>(a.rowptr[row + 1]);
    for (int64_t j = begin; j < end; ++j) {
      if (j + a.prefetch < a.num_edges) {  // past the row's end too
        prefetch_slot(a, j + a.prefetch, 0, static_cast<int>(a.F < TILE ? a.F : TILE));
        const int64_t ea = a.by_slot ? j + a.prefetch : static_cast<int64_t>(a.perm[j + a.prefetch]);
        if (in_range(ea, a.num_edges)) {
          const char* q = reinterpret_cast<const char*>(a.out + ea * a.out_width);
          for (int64_t b = 0; b < static_cast<int64_t>(a.out_width * sizeof(scalar_t)); b += 64)
            __builtin_prefetch(q + b, 1, 0);
        }
      }
      int64_t src, e, sl;
      const Status st = edge_of(a, j, src, e, sl);
      if (st != Status::Ok) return st;
      scalar_t* o = a.out + (a.by_slot ? j : e) * a.out_width;
      for (int64_t f0 = 0; f0 < a.F; f0 += TILE) {
        const int n = static_cast<int>(a.F - f0 < TILE ? a.F - f0 : TILE);
        const acc_t* v = eval<scalar_t, acc_t, index_t, TILE>(a, s, reg, row, src, e, sl, f0, n);
        if (div_o == 1) {
          for (int t = 0; t < n; ++t) o[f0 + t] = from_acc<scalar_t>(v[t]);
        } else {
          for (int t = 0; t < n; ++t) {
            scalar_t& dst = o[(f0 + t) / div_o];
            dst = from_acc<scalar_t>(to_float(dst) + v[t]);
          }
        }
      }
    }
  }
  return Status::Ok;
}

// message_encoder_grad: the edges walked as edge_rows walks them, the program's value of every
// edge (grouped to the encoder's W columns: column c sums features [c * F / W, (c + 1) * F / W)
// in order) kept in its row of the scratch [kEncoderGradBlock, W] and folded, by blocks of
// kEncoderGradBlock edges and the chunk's last block, into the chunk's accumulators
// acc = [dWt (D x W) | db (W)] and, with da, the edges' feature gradients da[e]
// (encode_grad_edges, encoder_core.h). The encoder is input `enc` (its features a [E, D], Wt,
// b); out_width is W. One call: one chunk of the row split (the generated kernels flush the
// same blocks).
template <typename scalar_t, typename acc_t, typename index_t, int TILE>
Status encoder_grad_rows(const Args<scalar_t, acc_t, index_t>& a, int enc, acc_t* acc, acc_t* scratch, scalar_t* da,
                         int64_t row_begin, int64_t row_end) {
  static_assert(std::is_same<scalar_t, acc_t>::value, "encoder_grad_rows computes in the input dtype");
  alignas(64) acc_t s[kMaxSlots][TILE];
  const acc_t* reg[kMaxSlots];
  const Input<scalar_t>& in = a.inputs[enc];
  const int64_t W = a.out_width, D = in.dim;
  const int64_t div_o = a.F / W;
  acc_t* dwt = acc;
  acc_t* db = acc + D * W;
  const scalar_t* pa[kEncoderGradBlock];
  scalar_t* pda[kEncoderGradBlock];
  int pend = 0;
  for (int64_t row = row_begin; row < row_end; ++row) {
    if (!row_ok(a.rowptr, row, a.num_edges)) return Status::BadRowptr;
    const int64_t begin = static_cast<int64_t>(a.rowptr[row]), end = static_cast<int64_t>(a.rowptr[row + 1]);
    for (int64_t j = begin; j < end; ++j) {
      if (j + a.prefetch < a.num_edges) {  // past the row's end too
        prefetch_slot(a, j + a.prefetch, 0, static_cast<int>(a.F < TILE ? a.F : TILE));
        const int64_t ea = static_cast<int64_t>(a.perm[j + a.prefetch]);
        if (in.side == Enc && in_range(ea, a.num_edges)) {
          const char* q = reinterpret_cast<const char*>(in.data + ea * D);
          for (int64_t b = 0; b < static_cast<int64_t>(D * sizeof(scalar_t)); b += 64) __builtin_prefetch(q + b, 0, 0);
        }
      }
      int64_t src, e, sl;
      const Status st = edge_of(a, j, src, e, sl);
      if (st != Status::Ok) return st;
      acc_t* vb = scratch + pend * W;
      if (div_o != 1)
        for (int64_t c = 0; c < W; ++c) vb[c] = acc_t(0);
      for (int64_t f0 = 0; f0 < a.F; f0 += TILE) {
        const int n = static_cast<int>(a.F - f0 < TILE ? a.F - f0 : TILE);
        const acc_t* v = eval<scalar_t, acc_t, index_t, TILE>(a, s, reg, row, src, e, sl, f0, n);
        if (div_o == 1) {
          for (int t = 0; t < n; ++t) vb[f0 + t] = v[t];
        } else {
          for (int t = 0; t < n; ++t) vb[(f0 + t) / div_o] += v[t];
        }
      }
      const int64_t ra = in.side == Enc ? e : sl;  // EncSlot: features and their gradient per CSR slot
      pa[pend] = in.data + ra * D;
      pda[pend] = da != nullptr ? da + ra * D : nullptr;
      if (++pend == kEncoderGradBlock) {
        encode_grad_edges<acc_t>(pa, pda, pend, D, scratch, in.wt, W, dwt, db);
        pend = 0;
      }
    }
  }
  if (pend > 0) encode_grad_edges<acc_t>(pa, pda, pend, D, scratch, in.wt, W, dwt, db);
  return Status::Ok;
}

}  // namespace msg
}  // namespace cpu
}  // namespace gnncompile
