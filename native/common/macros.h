// Portable qualifiers shared by the CPU and CUDA kernel cores. No torch headers here.
#pragma once

#if defined(__CUDACC__)
#define GNN_HD __host__ __device__ __forceinline__
#else
#define GNN_HD inline
#endif

namespace gnncompile {

// Reductions understood by every spmm kernel. Python passes the reduce as a string (the
// schema's `str reduce`); parse_reduce in torch_glue.h maps it onto this enum. The integer
// values stay inside the native code (the CUDA kernels receive them as SpmmParams::reduce).
enum class Reduce : int { Sum = 0, Mean = 1, Max = 2, Min = 3 };

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
