// The counter-based random numbers of gnncompile's dropout: 32 random bits of element i as a
// pure function of (seed, i), on the host and on the device (torch-free). gnncompile::dropout
// (native/cpu/dropout.cpp) draws its mask with it a block at a time; the fused attention kernels
// (native/cpu/attention_core.h, native/cuda/attention_core.cuh) draw the mask of attention
// coefficient (edge e, head h) as element e * H + h of the [E, H] tensor, so their dropout is the
// dropout op's, bit for bit, and a backward pass regenerates it instead of storing it. The Python
// reference (gnncompile/ops/reference.py, dropout) computes the same bits.
#pragma once
#include <cstdint>

#include "macros.h"

namespace gnncompile {

// splitmix64 of the seed: the 64-bit key of every draw (z + golden ratio, then the finaliser).
GNN_HD uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// murmur3's finaliser: 32-bit lanes, so a loop of draws vectorises.
GNN_HD uint32_t fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bU;
  h ^= h >> 13;
  h *= 0xc2b2ae35U;
  return h ^ (h >> 16);
}

// The first key word for elements [2^32 k, 2^32 (k + 1)): the high half of the index joins it,
// so tensors of more than 2^32 elements do not repeat.
GNN_HD uint32_t draw_key1(uint64_t key, int64_t i) {
  return static_cast<uint32_t>(key) ^ (static_cast<uint32_t>(static_cast<uint64_t>(i) >> 32) * 0x9e3779b1U);
}

// 32 random bits of element i under `key` (= splitmix64(seed)): two finaliser rounds.
GNN_HD uint32_t draw_bits(uint32_t k1, uint32_t k2, uint32_t lo) {
  return fmix32(fmix32(lo * 0x9e3779b1U ^ k1) ^ k2);
}
GNN_HD uint32_t draw(uint64_t key, int64_t i) {
  return draw_bits(draw_key1(key, i), static_cast<uint32_t>(key >> 32), static_cast<uint32_t>(i));
}

// Element i is kept when its draw is >= this threshold (p in [0, 1)).
inline uint32_t keep_threshold(double p) { return static_cast<uint32_t>(p * 4294967296.0); }

}  // namespace gnncompile
