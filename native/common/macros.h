// Portable qualifiers shared by the CPU and CUDA kernel cores. No torch headers here.
#pragma once
#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define GNN_HD __host__ __device__ __forceinline__
#else
#define GNN_HD inline
#endif

namespace gnncompile {

// Reductions understood by every spmm kernel. Python passes the reduce as a string (the
// schema's `str reduce`); reduce_from_name maps it onto this enum (parse_reduce in torch_glue.h
// raises for an unknown name). The integer values stay inside the native code (the CUDA kernels
// receive them as SpmmParams::reduce).
enum class Reduce : int { Sum = 0, Mean = 1, Max = 2, Min = 3 };

// sum, mean, max, min, or the aliases add, amax, amin; false for any other name. Host-only.
inline bool reduce_from_name(std::string_view name, Reduce& out) {
  if (name == "sum" || name == "add") out = Reduce::Sum;
  else if (name == "mean") out = Reduce::Mean;
  else if (name == "max" || name == "amax") out = Reduce::Max;
  else if (name == "min" || name == "amin") out = Reduce::Min;
  else return false;
  return true;
}

// Whether a reduction records the slot of its winner (spmm's `arg` output; on CUDA an int64
// per feature in the scratch of cut rows too, which the launch rule sizes).
constexpr bool reduce_keeps_arg(Reduce r) { return r == Reduce::Max || r == Reduce::Min; }

// How a per-edge weight multiplies the gathered feature row.
//   None:   no weight, message = x[src]
//   Scalar: one weight per edge, broadcast over every feature
//   Head:   weight [E, H], x viewed as [N, H, C]; head h scales features [h*C, (h+1)*C)
enum class WeightMode : int { None = 0, Scalar = 1, Head = 2 };

// The max / min rule of every backend. Messages are folded in CSR slot order (and, on CUDA, the
// partial results of a row cut between groups in group order, each partial being the fold of
// its slots): the first message always enters; after it a NaN wins once and then stays (as in
// torch's scatter_reduce, NaN propagates); otherwise the first strictly better value wins, so
// ties go to the earliest edge. `empty`: nothing folded yet. Splitting a row into consecutive
// runs and folding the runs' results with the same rule gives the same value and slot as one
// sequential fold (tests/test_native_rules.py checks this on the host).
template <typename A>
GNN_HD bool arg_takes(bool is_min, A v, A acc, bool empty) {
  const bool better = is_min ? (v < acc) : (v > acc);
  return empty || better || (v != v && acc == acc);
}

// The max / min fold of every backend, recording what torch's gradient needs besides the
// winner (its `N`, the number of messages equal to the extreme): `best` is -1 before the first
// message; the CSR slot of the extreme when exactly one message reached it; -N when N >= 2
// messages are equal to it (a tie: torch splits the gradient between them); kNanRecord when it
// is NaN (NaN == NaN is false: N = 0). `code` is what is folded: for one message
// arg_code(slot, v is NaN); for the result of a run of messages (CUDA) its own record.
constexpr int64_t kNanRecord = -(int64_t(1) << 62);

// N of a record other than -1.
GNN_HD int64_t arg_count(int64_t r) { return r >= 0 ? 1 : (r == kNanRecord ? 0 : -r); }

template <typename A>
GNN_HD void arg_fold(bool is_min, A v, int64_t code, A& acc, int64_t& best) {
  const bool take = arg_takes(is_min, v, acc, best == -1);
  const bool tie = !take && v == acc;  // best != -1 here, and neither is NaN
  acc = take ? v : acc;
  best = take ? code : (tie ? -(arg_count(best) + arg_count(code)) : best);
}

GNN_HD int64_t arg_code(int64_t slot, bool is_nan) { return is_nan ? kNanRecord : slot; }

// Status codes returned by the torch-free cores that validate input; the glue turns them into
// Python exceptions with the offending value.
enum class Status : int {
  Ok = 0,
  DstOutOfRange = 1,  // build_csr: a destination index outside [0, num_dst)
  SrcOutOfRange = 2,  // build_csr: a source index outside [0, num_src)
  BadRowptr = 3,      // a structure handed to an op: rowptr decreasing or outside [0, E]
  BadCol = 4,         // ... a col entry outside [0, num_src)
  BadPerm = 5,        // ... a perm entry outside [0, E)
};

}  // namespace gnncompile
