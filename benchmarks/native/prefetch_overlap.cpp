// Does issuing the x_j gather's prefetches overlap the edge encoder's arithmetic? (issue 25)
// Torch-free, one thread: blocks of the generated kernels' encoder arithmetic (5 edges x 128
// columns x D = 16, 4 vectors of 256 bits per edge, operands in L1: encode_block's loop shape),
// each with 45 prefetches (prefetcht1) of random 64-byte lines of a 51 MB x (100k rows of 128
// floats: the benchmark's x; 9 lines per edge, as the kernel prefetches 8 x lines and one feature
// line), issued:
//
//   mode 0  in one burst before the block (what the generated kernel does, one edge at a time)
//   mode 1  in four bursts, one before each 32-column pass of the block
//   mode 2  one every second feature step inside the block's loop (32 of them), the rest after it
//   mode 3  one per feature step inside the block's loop
//   mode 4  the prefetches alone, no arithmetic (np lines a block, one read of the first)
//
// mode 0 with np = 0 is the arithmetic alone. ns per block of 5 edges. HUGE=1 in the environment:
// x advised to transparent huge pages (madvise), fewer TLB misses.
//
//   g++ -O3 -march=native -std=gnu++17 -ffp-contract=off benchmarks/native/prefetch_overlap.cpp \
//       -o /tmp/prefetch_overlap && for m in "0 0" "4 45" "0 45" "1 45" "2 45" "3 45"; do /tmp/prefetch_overlap $m; done
//
// Measured on a 2-core AMD EPYC (family 25 model 17, Zen 4), GCC 12.2, 2026-12-05, three runs
// each, ns a block (benchmarks/results/README.md, "The gather and the encoder's arithmetic taken
// apart"). 4 KiB pages: arithmetic alone 189-190 (38 ns an edge, near the 128-cycle bound of 2048
// products and 2048 sums on two multiply and two add pipes), prefetches alone 85-88, burst before
// 279-303 (the sum of the two is 275: nothing hidden), four bursts 293-308, every second step
// 293-295, every step 302. HUGE=1: 189-194, 77-85, 248-256, 253-255, 242-246, 254-256 (58-66 of
// the prefetches' 77-85 ns not hidden). Spreading the prefetches through the arithmetic did not
// beat the single burst, with either page size.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <sys/mman.h>

namespace {
typedef float vec __attribute__((vector_size(32)));
constexpr int kD = 16, kCols = 128, kK = 5, kNV = 4, kLines = 45;
alignas(64) float W[kD * kCols], B[kCols], A[kK * kD];

template <int MODE>
__attribute__((noinline)) float block(const char* const* pf, int np, float* out) {
  int pd = 0;
  for (int c0 = 0; c0 < kCols; c0 += 8 * kNV) {
    vec r[kK][kNV];
    for (int k = 0; k < kK; ++k)
      for (int i = 0; i < kNV; ++i) std::memcpy(&r[k][i], B + c0 + 8 * i, sizeof(vec));
    if (MODE == 1) {
      const int upto = np * (c0 / (8 * kNV) + 1) / (kCols / (8 * kNV));
      for (; pd < upto; ++pd) __builtin_prefetch(pf[pd], 0, 2);
    }
#pragma GCC unroll 1
    for (int d = 0; d < kD; ++d) {
      if (MODE == 2 && pd < np && (d & 1)) __builtin_prefetch(pf[pd++], 0, 2);
      if (MODE == 3 && pd < np) __builtin_prefetch(pf[pd++], 0, 2);
      vec y[kNV];
      for (int i = 0; i < kNV; ++i) std::memcpy(&y[i], W + d * kCols + c0 + 8 * i, sizeof(vec));
      for (int k = 0; k < kK; ++k) {
        const float ad = A[k * kD + d];
        for (int i = 0; i < kNV; ++i) r[k][i] = r[k][i] + ad * y[i];
      }
    }
    for (int k = 0; k < kK; ++k)
      for (int i = 0; i < kNV; ++i) std::memcpy(out + k * kCols + c0 + 8 * i, &r[k][i], sizeof(vec));
  }
  for (; pd < np; ++pd) __builtin_prefetch(pf[pd], 0, 2);
  return out[0];
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: prefetch_overlap MODE NP (MODE 0-4, NP <= 45 prefetches a block)\n");
    return 2;
  }
  const int mode = std::atoi(argv[1]);
  int np = std::atoi(argv[2]);
  if (np < 0 || np > kLines) np = kLines;
  const size_t rows = 100000, bytes = rows * kCols * sizeof(float);
  float* x = static_cast<float*>(std::aligned_alloc(1 << 21, bytes));
  if (std::getenv("HUGE") != nullptr) madvise(x, bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < rows * kCols; ++i) x[i] = 1.0f;
  for (int i = 0; i < kD * kCols; ++i) W[i] = 0.001f * i;
  for (int i = 0; i < kCols; ++i) B[i] = 1.0f;
  for (int i = 0; i < kK * kD; ++i) A[i] = 0.5f;
  const int blocks = 200000;
  std::mt19937_64 g(1);
  std::vector<const char*> lines(static_cast<size_t>(blocks) * kLines);
  for (int b = 0; b < blocks; ++b)
    for (int e = 0; e < kK; ++e) {
      const size_t r = g() % rows;
      for (int l = 0; l < 9; ++l)  // 8 lines of the row; the ninth stands for the feature row
        lines[static_cast<size_t>(b) * kLines + e * 9 + l] =
            reinterpret_cast<const char*>(x + (l < 8 ? r : g() % rows) * kCols) + 64 * (l % 8);
    }
  alignas(64) static float out[kK * kCols];
  float s = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int b = 0; b < blocks; ++b) {
    const char* const* pf = lines.data() + static_cast<size_t>(b) * kLines;
    if (mode == 4) {
      for (int p = 0; p < np; ++p) __builtin_prefetch(pf[p], 0, 2);
      s += static_cast<float>(pf[0][0]);
    } else if (mode == 0) {
      for (int p = 0; p < np; ++p) __builtin_prefetch(pf[p], 0, 2);
      s += block<0>(pf, 0, out);
    } else if (mode == 1) {
      s += block<1>(pf, np, out);
    } else if (mode == 2) {
      s += block<2>(pf, np, out);
    } else {
      s += block<3>(pf, np, out);
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  std::printf("mode %d np %d: %.1f ns a block (%.1f ns an edge)  check %g\n", mode, np,
              std::chrono::duration<double, std::nano>(t1 - t0).count() / blocks,
              std::chrono::duration<double, std::nano>(t1 - t0).count() / blocks / kK, s);
  std::free(x);
  return 0;
}
