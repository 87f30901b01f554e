// An edge encoder's mat-vec alone (native/cpu/encoder_core.h's encode_run), torch-free, on one
// thread, every operand in L1: what the arithmetic of gnncompile's encoder-inside kernel costs
// per edge at D = 16 features and 128 columns (2048 products and 2048 sums, unfused), against
// hand-written forms of the same sums in the same order (equal results: the printed checks, the sum
// of the last edge's columns; z8x2's last call ends at the one before):
//
//   encode_run  the shared code (8 vectors of 256 bits per block, 2 blocks of 64 columns)
//   y16         all 128 columns in 16 vectors of 256 bits
//   z8          all 128 columns in 8 vectors of 512 bits
//   z8x2        z8 for two edges at once, sharing each load of the weights
//   block       encode_block: kEncodeBlock edges at once (5 with AVX-512), 4 vectors of 256 bits
//               each, every load of the weights shared (the generated reductions' code)
//
//   g++ -O3 -march=native -std=gnu++17 -ffp-contract=off -fno-trapping-math -I native \
//       benchmarks/native/encoder_matvec.cpp -o /tmp/encoder_matvec && /tmp/encoder_matvec
//
// ns per edge, two passes. Measured on a 2-core AMD EPYC (family 25 model 17, Zen 4), GCC 12.2:
// encode_run 65-70, y16 63-64, z8 66, z8x2 87-93 (benchmarks/results/README.md, codegen_encoder_zen4);
// block 39-40 (GCC 12.2, 2026-12-04: "The encoder by blocks of edges"; its check sums the first edge
// of its last block, edge E - 5).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cpu/encoder_core.h"

using gnncompile::cpu::encode_block;
using gnncompile::cpu::encode_run;
using gnncompile::cpu::kEncodeBlock;
typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
template <class V>
static inline V ld(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V>
static inline void st(float* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

__attribute__((noinline)) void z8(const float* a, const float* w, const float* b, float* out) {
  v16 r[8];
  for (int i = 0; i < 8; ++i) r[i] = ld<v16>(b + 16 * i);
#pragma GCC unroll 16
  for (int d = 0; d < 16; ++d) {
    const float ad = a[d];
    for (int i = 0; i < 8; ++i) r[i] = r[i] + ad * ld<v16>(w + d * 128 + 16 * i);
  }
  for (int i = 0; i < 8; ++i) st(out + 16 * i, r[i]);
}

__attribute__((noinline)) void z8x2(const float* a0, const float* a1, const float* w, const float* b, float* o0,
                                    float* o1) {
  v16 r[8], s[8];
  for (int i = 0; i < 8; ++i) s[i] = r[i] = ld<v16>(b + 16 * i);
#pragma GCC unroll 16
  for (int d = 0; d < 16; ++d) {
    const float x = a0[d], y = a1[d];
    for (int i = 0; i < 8; ++i) {
      const v16 ww = ld<v16>(w + d * 128 + 16 * i);
      r[i] = r[i] + x * ww;
      s[i] = s[i] + y * ww;
    }
  }
  for (int i = 0; i < 8; ++i) {
    st(o0 + 16 * i, r[i]);
    st(o1 + 16 * i, s[i]);
  }
}

__attribute__((noinline)) void y16(const float* a, const float* w, const float* b, float* out) {
  v8 r[16];
  for (int i = 0; i < 16; ++i) r[i] = ld<v8>(b + 8 * i);
#pragma GCC unroll 16
  for (int d = 0; d < 16; ++d) {
    const float ad = a[d];
    for (int i = 0; i < 16; ++i) r[i] = r[i] + ad * ld<v8>(w + d * 128 + 8 * i);
  }
  for (int i = 0; i < 16; ++i) st(out + 8 * i, r[i]);
}

__attribute__((noinline)) void shared(const float* a, const float* w, int64_t W, const float* b, float* out) {
  encode_run<float>(a, 16, w, W, b, 128, out);
}

int main() {
  const int E = 4096, R = 200;  // 4096 edges' features (256 KiB: L2), weights and bias in L1
  std::vector<float> A(E * 16), w(16 * 128), b(128), out(128 * 8);
  for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(i % 7) * 0.1f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 5) * 0.1f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 3) * 0.1f;
  volatile int64_t W = 128;  // the kernels' width is a run-time value
  auto run = [&](const char* name, auto fn, int per) {
    double check = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < R; ++r)
      for (int e = 0; e + per <= E; e += per) fn(e);
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                      (static_cast<double>(R) * E);
    for (int i = 0; i < 128; ++i) check += out[i];
    std::printf("%-10s %6.1f ns per edge  (check %.6f)\n", name, ns, check);
  };
  for (int pass = 0; pass < 2; ++pass) {
    run("encode_run", [&](int e) { shared(&A[e * 16], w.data(), W, b.data(), out.data()); }, 1);
    run("y16", [&](int e) { y16(&A[e * 16], w.data(), b.data(), out.data()); }, 1);
    run("z8", [&](int e) { z8(&A[e * 16], w.data(), b.data(), out.data()); }, 1);
    run("z8x2", [&](int e) { z8x2(&A[e * 16], &A[e * 16 + 16], w.data(), b.data(), out.data(), out.data() + 128); }, 2);
    run("block", [&](int e) {
      const float* p[kEncodeBlock];
      for (int k = 0; k < kEncodeBlock; ++k) p[k] = &A[(e + k) * 16];
      encode_block<float, kEncodeBlock>(p, 16, w.data(), W, b.data(), 128, out.data(), 128);
    }, kEncodeBlock);
  }
  return 0;
}
