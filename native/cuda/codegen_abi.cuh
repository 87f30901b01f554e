// The arguments of the CUDA message kernels that gnncompile/codegen generates (cuda.py), and the
// device helpers they share with nothing else: the max / min fold and store of the CPU kernels
// (native/cpu/reduce_core.h) written for one lane's features. Torch-free: a generated kernel
// includes this header and common.cuh only, so it compiles with nvcc alone (make cuda-check,
// tests/codegen/test_codegen_cuda.py).
//
// A generated kernel is one extern "C" __global__ function: one warp per row (rows grid-strided),
// the lanes over the row's features (message_reduce / message_sum_multi; message_edges' group
// sums: the lanes over the output columns), every sum over a row's edges in CSR order in one
// lane, so results do not change from run to run (no atomics but the status flag). The
// expressions are the CPU kernels' (the same emitter); float32 transcendental operators are the
// CPU's own vmath.h functions (nvcc may fuse their multiply-adds), float64 ones and pow CUDA's
// libm, which is not glibc's: they agree with the CPU within a few ulp, not bit for bit.
#pragma once
#include <cstdint>

#include "../common/macros.h"
#include "../cpu/vmath.h"
#include "common.cuh"

namespace gnncompile {
namespace gpu {

constexpr int kCodegenCudaAbi = 1;
constexpr int kGenMaxInputs = 16;  // inputs of one generated kernel (the arguments are passed by value)
constexpr int kGenSlots = 4;       // features a lane holds per pass over a row's edges

struct GenArgsCuda {
  const void* rowptr;                  // [M + 1], index_t
  const void* col;                     // [E], index_t
  const void* perm;                    // [E], index_t
  const void* slot;                    // [E], index_t: CSR slot of each traversed slot, or nullptr
  const void* inputs[kGenMaxInputs];   // contiguous [rows, W_k] scalar_t
  int64_t widths[kGenMaxInputs];       // W_k
  int64_t divs[kGenMaxInputs];         // F / W_k
  int64_t F;
  int64_t M;                           // rows
  int64_t num_src;                     // rows of the neighbour inputs (checked against col)
  int64_t num_edges;                   // E (checked against perm / slot / rowptr)
  void* out;                           // reduce: [M, F]; sum_multi: [K, M, F]; edges: [E, out_width]
  int64_t* arg;                        // [M, F] for max / min, else nullptr
  int64_t out_width;                   // edges: W_out
  int* status;                         // the first Status a kernel met (0: none); set by atomicCAS
};

__device__ __forceinline__ void gen_fail(const GenArgsCuda& a, Status s) {
  atomicCAS(a.status, 0, static_cast<int>(s));
}

__device__ __forceinline__ bool gen_in_range(int64_t v, int64_t bound) {
  return static_cast<uint64_t>(v) < static_cast<uint64_t>(bound);
}

template <typename I>
__device__ __forceinline__ bool gen_row_ok(const I* rowptr, int64_t row, int64_t num_edges) {
  const int64_t b = static_cast<int64_t>(rowptr[row]), e = static_cast<int64_t>(rowptr[row + 1]);
  return b >= 0 && b <= e && e <= num_edges;
}

template <Reduce R, typename A>
__device__ __forceinline__ A gen_reduce_init() {
  if (R == Reduce::Max) return neg_inf<A>();
  if (R == Reduce::Min) return -neg_inf<A>();
  return A(0);
}

// fold_extreme of reduce_core.h
template <typename A>
__device__ __forceinline__ void gen_fold_extreme(bool is_min, A v, int32_t j, A& acc, int32_t& win, A& ties) {
  const bool take = arg_takes(is_min, v, acc, win == -1);
  const bool tie = !take && v == acc;
  acc = take ? v : acc;
  win = take ? j : win;
  ties = take ? A(0) : ties + (tie ? A(1) : A(0));
}

// store_reduced of reduce_core.h, for one feature
template <typename T, Reduce R, typename A>
__device__ __forceinline__ void gen_store(A acc, int32_t win, A ties, int64_t begin, int64_t deg, T* o,
                                          int64_t* ar) {
  if (R == Reduce::Mean) {
    const A scale = A(1) / static_cast<A>(deg > 0 ? deg : 1);
    *o = from_acc<T>(acc * scale);
  } else if (R == Reduce::Max || R == Reduce::Min) {
    if (deg == 0) {
      *o = from_acc<T>(A(0));
      *ar = -1;
    } else {
      *o = from_acc<T>(acc);
      *ar = acc != acc ? kNanRecord : (ties > A(0) ? -(static_cast<int64_t>(ties) + 1) : begin + win);
    }
  } else {
    *o = from_acc<T>(acc);
  }
}

}  // namespace gpu
}  // namespace gnncompile
