// What the CPU kernels that reduce over a CSR row share (spmm_core.h, message_core.h): the
// prefetch distance, the accumulator's initial value, and the store of a finished row tile.
// Torch-free.
#pragma once
#include <cstdint>
#include <limits>

#include "../common/dtype.h"
#include "../common/macros.h"

namespace gnncompile {
namespace cpu {

// Rows reached through col / perm are prefetched this many edges ahead.
constexpr int kPrefetchDistance = 4;

template <Reduce R, typename acc_t>
inline acc_t reduce_init() {
  if (R == Reduce::Max) return -std::numeric_limits<acc_t>::infinity();
  if (R == Reduce::Min) return std::numeric_limits<acc_t>::infinity();
  return acc_t(0);
}

// Writes n reduced features of a row with `deg` edges: the mean divides by the degree (an empty
// row gives 0); max / min write 0 and arg -1 for an empty row, else the value and `best` (the
// CSR slot of the chosen edge, -2 - slot for a tie or a NaN: arg_fold in common/macros.h; `ar`
// is unused for sum / mean).
template <typename scalar_t, Reduce R, typename acc_t>
inline void store_reduced(const acc_t* acc, const int64_t* best, int64_t deg, int n, scalar_t* o, int64_t* ar) {
  if (R == Reduce::Mean) {
    const acc_t scale = acc_t(1) / static_cast<acc_t>(deg > 0 ? deg : 1);
    for (int t = 0; t < n; ++t) o[t] = from_acc<scalar_t>(acc[t] * scale);
  } else if (R == Reduce::Max || R == Reduce::Min) {
    if (deg == 0) {
      for (int t = 0; t < n; ++t) { o[t] = from_acc<scalar_t>(acc_t(0)); ar[t] = -1; }
    } else {
      for (int t = 0; t < n; ++t) { o[t] = from_acc<scalar_t>(acc[t]); ar[t] = best[t]; }
    }
  } else {
    for (int t = 0; t < n; ++t) o[t] = from_acc<scalar_t>(acc[t]);
  }
}

}  // namespace cpu
}  // namespace gnncompile
