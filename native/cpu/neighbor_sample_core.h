// Neighbor sampling on a CSC (colptr over destination nodes, row = source of each slot): the
// per-node draws, with a counter-based random stream so that what a node draws depends only on
// (seed, hop, its local index), never on threads or call order. gnncompile/ops/reference.py
// (neighbor_sample) is the same algorithm in Python and must stay bit-for-bit equal.
// Torch-free.
#pragma once
#include <algorithm>
#include <cstdint>

namespace gnncompile {
namespace cpu {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// splitmix64 stream of one frontier node.
struct NodeStream {
  uint64_t state;
  NodeStream(int64_t seed, int64_t hop, int64_t local)
      : state(mix64(static_cast<uint64_t>(seed) + kGolden * (static_cast<uint64_t>(hop) + 1)) ^
              (static_cast<uint64_t>(local) * 0xD1B54A32D192ED03ull)) {}
  uint64_t next() {
    state += kGolden;
    return mix64(state);
  }
  // Uniform in [0, n) (n >= 1): the high 64 bits of a 64x64 product.
  int64_t below(int64_t n) {
    return static_cast<int64_t>((static_cast<unsigned __int128>(next()) * static_cast<uint64_t>(n)) >> 64);
  }
};

// How many slots a node of in-degree `deg` takes with fanout k (-1: all).
inline int64_t draw_count(int64_t deg, int64_t k, bool replace) {
  if (k < 0) return deg;
  if (deg == 0) return 0;
  return replace ? k : std::min(deg, k);
}

// Writes draw_count(deg, k, replace) offsets in [0, deg) to out: all of them in order when they
// are all taken; k draws in draw order with replacement; otherwise k distinct offsets (Floyd's
// algorithm), sorted ascending.
inline void draw_offsets(NodeStream& rng, int64_t deg, int64_t k, bool replace, int64_t* out) {
  const int64_t n = draw_count(deg, k, replace);
  if (k < 0 || (!replace && deg <= k)) {
    for (int64_t t = 0; t < n; ++t) out[t] = t;
    return;
  }
  if (replace) {
    for (int64_t t = 0; t < n; ++t) out[t] = rng.below(deg);
    return;
  }
  int64_t taken = 0;
  for (int64_t t = deg - k; t < deg; ++t) {
    const int64_t r = rng.below(t + 1);
    const bool seen = std::find(out, out + taken, r) != out + taken;
    out[taken++] = seen ? t : r;
  }
  std::sort(out, out + taken);
}

}  // namespace cpu
}  // namespace gnncompile
