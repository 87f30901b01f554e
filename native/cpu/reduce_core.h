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
constexpr int kPrefetchDistance = 4;  // the default of the prefetch-distance knob (glue.h)

template <Reduce R, typename acc_t>
inline acc_t reduce_init() {
  if (R == Reduce::Max) return -std::numeric_limits<acc_t>::infinity();
  if (R == Reduce::Min) return std::numeric_limits<acc_t>::infinity();
  return acc_t(0);
}

// The CPU form of the max / min record (common/macros.h has the rule): the fold over a row keeps
// the first edge reaching the extreme (`win`, its offset in the row, int32: the fold's blends then
// use 32-bit lanes, as the float accumulators do) and counts the messages equal to the extreme
// since it was reached (`ties`, reset by a better one), so N = ties + 1 at the end.
template <typename acc_t>
inline void fold_extreme(bool is_min, acc_t v, int32_t j, acc_t& acc, int32_t& win, acc_t& ties) {
  const bool take = arg_takes(is_min, v, acc, win == -1);
  const bool tie = !take && v == acc;
  acc = take ? v : acc;
  win = take ? j : win;
  ties = take ? acc_t(0) : ties + (tie ? acc_t(1) : acc_t(0));
}

// Writes n reduced features of a row with `deg` edges from CSR slot `begin`: the mean divides by
// the degree (an empty row gives 0); max / min write 0 and arg -1 for an empty row, else the value
// and its record: the winner's slot (`win`: its offset in the row), -N for a tie of N (`ties`
// more messages), kNanRecord for NaN (`ar`, `win` and `ties` are unused for sum / mean).
template <typename scalar_t, Reduce R, typename acc_t>
inline void store_reduced(const acc_t* acc, const int32_t* win, const acc_t* ties, int64_t begin, int64_t deg,
                          int n, scalar_t* o, int64_t* ar) {
  if (R == Reduce::Mean) {
    const acc_t scale = acc_t(1) / static_cast<acc_t>(deg > 0 ? deg : 1);
    for (int t = 0; t < n; ++t) o[t] = from_acc<scalar_t>(acc[t] * scale);
  } else if (R == Reduce::Max || R == Reduce::Min) {
    if (deg == 0) {
      for (int t = 0; t < n; ++t) { o[t] = from_acc<scalar_t>(acc_t(0)); ar[t] = -1; }
    } else {
      for (int t = 0; t < n; ++t) {
        o[t] = from_acc<scalar_t>(acc[t]);
        ar[t] = acc[t] != acc[t] ? kNanRecord
              : (ties[t] > acc_t(0) ? -(static_cast<int64_t>(ties[t]) + 1) : begin + win[t]);
      }
    }
  } else {
    for (int t = 0; t < n; ++t) o[t] = from_acc<scalar_t>(acc[t]);
  }
}

}  // namespace cpu
}  // namespace gnncompile
