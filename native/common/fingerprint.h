// The content fingerprint of an index tensor (gnncompile::fingerprint), shared by the CPU and
// CUDA kernels and mirrored by reference.fingerprint. Torch-free.
//
// fingerprint = final(sum over i of term(v[i], i), n), all arithmetic modulo 2^64, where v[i]
// is the i-th element in row-major order, sign-extended to 64 bits. A sum of per-element terms
// is independent of how the elements are split across threads or blocks (deterministic, one
// pass, no ordering between chunks), and each term depends on its position, so moving a value
// changes it. For a fixed position the map v -> term(v, i) is a bijection of 64-bit words (an
// xor with a position key, then the splitmix64 finalizer, whose xor-shifts and odd multipliers
// are invertible): changing any single element always changes the fingerprint; several changes
// cancel only by a 64-bit coincidence. It detects edits, it is not a defence against an
// adversary who crafts collisions.
#pragma once
#include <cstdint>

#include "macros.h"

namespace gnncompile {

constexpr uint64_t kFingerprintPosKey = 0x9e3779b97f4a7c15ULL;  // 2^64 / golden ratio, odd

GNN_HD uint64_t fingerprint_mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

GNN_HD uint64_t fingerprint_term(int64_t value, uint64_t position) {
  return fingerprint_mix(static_cast<uint64_t>(value) ^ (position * kFingerprintPosKey));
}

// The fingerprint of n elements whose terms sum to `sum`.
GNN_HD uint64_t fingerprint_final(uint64_t sum, uint64_t n) {
  return fingerprint_mix(sum ^ fingerprint_mix(n + kFingerprintPosKey));
}

// Sum of the terms of v[begin, end) (positions begin..end-1): the CPU kernel's chunk.
template <typename I>
inline uint64_t fingerprint_sum(const I* v, int64_t begin, int64_t end) {
  uint64_t acc = 0;
  for (int64_t i = begin; i < end; ++i)
    acc += fingerprint_term(static_cast<int64_t>(v[i]), static_cast<uint64_t>(i));
  return acc;
}

}  // namespace gnncompile
