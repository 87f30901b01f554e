// An edge encoder's values (gnncompile/ops/program.py, side enc) for one edge and a run of
// columns, shared by the message interpreter (message_core.h) and the generated message kernels
// (gnncompile/codegen/emit.py); for kEncodeBlock edges at once in the generated reductions
// (encode_block, EncoderBlock: the same sums). Torch-free.
//
//   out[i] = b[i] + a[0] * w[i] + a[1] * w[W + i] + ... + a[D-1] * w[(D-1) W + i],  i < n
//
// summed in that order, each product rounded before its sum (the files that include this are
// compiled with -ffp-contract=off: no multiply-add), so every column is the reference's
// program.encode_edges bit for bit, whichever of the paths below computes it. The columns go
// in blocks of 8 vectors (GCC / Clang vector extensions; 512 bits with AVX-512, else 256:
// GNNCOMPILE_ENCODER_VEC_BYTES) kept in registers over the D features: one load of w, one
// product and one sum per vector and feature (the sum over the features of one column is a chain
// of dependent adds; 8 independent chains hide their latency). Then blocks of 4 and 2, single
// vectors, a 256-bit vector, scalars.
#pragma once
#include <cstdint>
#include <cstring>

namespace gnncompile {
namespace cpu {

// The width of encode_run's vectors: 512 bits where the target has AVX-512 (the generated
// kernels' tile loops are vectorized at that width by -march=native there, so each vector that
// encode_run stores is loaded back whole, not by a wider load that straddles two stores, which
// store-to-load forwarding cannot serve; and half the broadcasts of a feature per column),
// 256 bits elsewhere; the columns short of one wide vector by 256-bit vectors. The width does not
// change a bit: every column's sum is the same chain whichever vector holds it.
#if defined(__AVX512F__)
#define GNNCOMPILE_ENCODER_VEC_BYTES 64
#else
#define GNNCOMPILE_ENCODER_VEC_BYTES 32
#endif

#if defined(__GNUC__) || defined(__clang__)
// NV vectors of type vec (V columns each) from column i: r[v] = b + a[0] w[0] + ..., in registers
// over the D features.
template <typename T, typename vec, int NV>
inline void encode_vectors(const T* a, int64_t D, const T* w, int64_t W, const T* b, int i, T* out) {
  constexpr int V = static_cast<int>(sizeof(vec) / sizeof(T));
  vec r[NV];
  for (int v = 0; v < NV; ++v) std::memcpy(&r[v], b + i + v * V, sizeof(vec));
  for (int64_t d = 0; d < D; ++d) {
    const T ad = a[d];
    const T* wd = w + d * W + i;
    for (int v = 0; v < NV; ++v) {
      vec y;
      std::memcpy(&y, wd + v * V, sizeof(vec));
      r[v] = r[v] + ad * y;
    }
  }
  for (int v = 0; v < NV; ++v) std::memcpy(out + i + v * V, &r[v], sizeof(vec));
}
#endif

template <typename T>
inline void encode_run(const T* a, int64_t D, const T* w, int64_t W, const T* b, int n, T* out) {
  int i = 0;
#if defined(__GNUC__) || defined(__clang__)
  typedef T vec __attribute__((vector_size(GNNCOMPILE_ENCODER_VEC_BYTES)));
  typedef T vec256 __attribute__((vector_size(32)));
  constexpr int V = static_cast<int>(sizeof(vec) / sizeof(T));
  constexpr int V256 = static_cast<int>(sizeof(vec256) / sizeof(T));
  for (; i + 8 * V <= n; i += 8 * V) encode_vectors<T, vec, 8>(a, D, w, W, b, i, out);
  for (; i + 4 * V <= n; i += 4 * V) encode_vectors<T, vec, 4>(a, D, w, W, b, i, out);
  for (; i + 2 * V <= n; i += 2 * V) encode_vectors<T, vec, 2>(a, D, w, W, b, i, out);
  for (; i + V <= n; i += V) encode_vectors<T, vec, 1>(a, D, w, W, b, i, out);
  for (; i + V256 <= n; i += V256) encode_vectors<T, vec256, 1>(a, D, w, W, b, i, out);
#endif
  for (; i < n; ++i) {
    T v = b[i];
    for (int64_t d = 0; d < D; ++d) v = v + a[d] * w[d * W + i];
    out[i] = v;
  }
}

// The edges a generated reduction's encoder computes at once (EncoderBlock below): K edges share
// each load of Wt, their K x NV vectors of 256 bits held in registers over the D features. 5 x 4
// (20 accumulators) where the target has 32 vector registers (AVX-512), 2 x 4 with 16. Measured
// alone on a 2-core AMD EPYC (Zen 4), D = 16, 128 columns, float32, ns per edge: one edge at a
// time (encode_run) 65-72, K x NV = 5 x 4 40, 6 x 4 41, 8 x 2 43, 2 x 8 63, 4 x 4 65-70 (GCC 12.2;
// benchmarks/results/README.md, "The encoder by blocks of edges"). Vectors of 512 bits lose there (a product
// feeding a sum reaches 0.74 per cycle in 512 bits, 2 per cycle in 256).
#if defined(__AVX512F__)
constexpr int kEncodeBlock = 5;
#else
constexpr int kEncodeBlock = 2;
#endif
constexpr int kEncodeBlockVectors = 4;

#if defined(__GNUC__) || defined(__clang__)
// Columns [0, n) of K edges (a[k]: edge k's D features) into out + k * stride, every column the
// same sum as encode_run's, in the same order (b, then each product in feature order, each
// product rounded): the block changes which edges share a load, not a bit. Columns past the last
// whole pass of NV vectors: encode_run, edge by edge. Out of line: inlined into a kernel's row walk
// it lost registers to the walk's values (a spill per feature: the kernel 16% slower on Zen 4).
template <typename T, int K>
__attribute__((noinline)) void encode_block(const T* const* a, int64_t D, const T* w, int64_t W, const T* b, int n, T* out,
                         int64_t stride) {
  typedef T vec __attribute__((vector_size(32)));
  constexpr int NV = kEncodeBlockVectors;
  constexpr int L = static_cast<int>(sizeof(vec) / sizeof(T));
  int c0 = 0;
#pragma GCC unroll 1
  for (; c0 + L * NV <= n; c0 += L * NV) {
    vec r[K][NV];
#pragma GCC unroll 64
    for (int k = 0; k < K; ++k)
#pragma GCC unroll 64
      for (int i = 0; i < NV; ++i) std::memcpy(&r[k][i], b + c0 + L * i, sizeof(vec));
#pragma GCC unroll 1
    for (int64_t d = 0; d < D; ++d) {
      vec y[NV];
#pragma GCC unroll 64
      for (int i = 0; i < NV; ++i) std::memcpy(&y[i], w + d * W + c0 + L * i, sizeof(vec));
#pragma GCC unroll 64
      for (int k = 0; k < K; ++k) {
        const T ad = a[k][d];
#pragma GCC unroll 64
        for (int i = 0; i < NV; ++i) r[k][i] = r[k][i] + ad * y[i];
      }
    }
#pragma GCC unroll 64
    for (int k = 0; k < K; ++k)
#pragma GCC unroll 64
      for (int i = 0; i < NV; ++i) std::memcpy(out + k * stride + c0 + L * i, &r[k][i], sizeof(vec));
  }
  if (c0 < n)
    for (int k = 0; k < K; ++k) encode_run(a[k], D, w + c0, W, b + c0, n - c0, out + k * stride + c0);
}
#else
template <typename T, int K>
inline void encode_block(const T* const* a, int64_t D, const T* w, int64_t W, const T* b, int n, T* out,
                         int64_t stride) {
  for (int k = 0; k < K; ++k) encode_run(a[k], D, w, W, b, n, out + k * stride);
}
#endif

// An edge encoder's values in a generated reduction (gnncompile/codegen/emit.py), computed for
// kEncodeBlock edges at once: the edges of CSR slots [j, j + K) (their feature rows idx[j + k]:
// idx is perm, or for features stored per CSR slot the traversal's slot array, nullptr on the
// CSR itself, where row j + k is read: in order, not through perm; up to `jlim`,
// the row's end or, where one tile covers the row, the chunk's last slot: a block crosses rows),
// columns [c0, c0 + nc) (at most COLS), kept until the walk leaves them. get(j) is edge j's row of
// values. Each value is encode_run's, bit for bit (encode_block). A slot whose perm entry lies
// outside [0, E) ends the block before it, unread: the walk's own check raises it on reaching it.
template <typename T, typename index_t, int COLS>
struct EncoderBlock {
  int64_t j0 = 0, j1 = 0, c0 = -1;
  int nc = 0;
  alignas(64) T v[kEncodeBlock * COLS];

  const T* get(int64_t j, int64_t jlim, const index_t* idx, int64_t num_edges, const T* in, int64_t D, const T* wt,
               int64_t W, const T* bias, int64_t c0_, int nc_) {
    if (j >= j0 && j < j1 && c0_ == c0 && nc_ == nc) return v + (j - j0) * COLS;
    const T* p[kEncodeBlock];
    int k = 0;
    for (; k < kEncodeBlock && j + k < jlim; ++k) {
      const int64_t e = idx != nullptr ? static_cast<int64_t>(idx[j + k]) : j + k;
      if (static_cast<uint64_t>(e) >= static_cast<uint64_t>(num_edges)) break;
      p[k] = in + e * D;
    }
    if (k == 0) {  // the caller checked idx[j]; a block always holds edge j
      p[0] = in + (idx != nullptr ? static_cast<int64_t>(idx[j]) : j) * D;
      k = 1;
    }
    for (int i = k; i < kEncodeBlock; ++i) p[i] = p[k - 1];  // the block's unused rows: a copy, not read
    encode_block<T, kEncodeBlock>(p, D, wt + c0_, W, bias + c0_, nc_, v, COLS);
    j0 = j;
    j1 = j + k;
    c0 = c0_;
    nc = nc_;
    return v;
  }
};

// The encoder's backward for up to kEncoderGradBlock edges at once (gnncompile::
// message_encoder_grad), shared by the interpreter (message_core.h) and the generated kernels:
// edge k's features a[k] [D], the gradient of its encoder values vb + k W [W] (the derivative
// program's value, grouped to W columns), its features' gradient da[k] [D] (or nullptr):
//
//   dwt[d * W + c] += a[k][d] * vb[k W + c],  db[c] += vb[k W + c]   (k in order: a chunk's sums)
//   da[k][d] = sum_c vb[k W + c] * wt[d * W + c]
//
// Every element of dwt and db gets the edges' terms one after the other in edge order, as one
// edge at a time would add them (the block only keeps the sum in a register over its edges
// instead of storing and loading it per edge; the block's edges share the loads of Wt for da).
// da's sum runs in lanes: lane l sums the columns c = l (mod V) of the whole vectors in column
// order, the lanes are then added in lane order, then the columns past the last whole vector in
// order. A fixed order, in every file that includes this (compiled with -ffp-contract=off), so
// the interpreter and the generated kernels agree bit for bit whenever they flush the same
// blocks: both flush after every kEncoderGradBlock edges of a chunk's walk and at its end.
constexpr int kEncoderGradBlock = 4;

template <typename T>
inline void encode_grad_edges(const T* const* a, T* const* da, int K, int64_t D, const T* vb, const T* wt, int64_t W,
                              T* dwt, T* db) {
  for (int64_t c = 0; c < W; ++c) {
    T s = db[c];
    for (int k = 0; k < K; ++k) s = s + vb[k * W + c];
    db[c] = s;
  }
#if defined(__GNUC__) || defined(__clang__)
  typedef T vec __attribute__((vector_size(32)));
  constexpr int V = static_cast<int>(32 / sizeof(T));
  auto load = [](const T* p) {
    vec v;
    std::memcpy(&v, p, sizeof(vec));
    return v;
  };
#endif
  for (int64_t d = 0; d < D; ++d) {
    T* g = dwt + d * W;
    T ad[kEncoderGradBlock];
    for (int k = 0; k < K; ++k) ad[k] = a[k][d];
    int64_t c = 0;
#if defined(__GNUC__) || defined(__clang__)
    for (; c + V <= W; c += V) {
      vec r = load(g + c);
      for (int k = 0; k < K; ++k) r = r + ad[k] * load(vb + k * W + c);
      std::memcpy(g + c, &r, sizeof(vec));
    }
#endif
    for (; c < W; ++c) {
      T r = g[c];
      for (int k = 0; k < K; ++k) r = r + ad[k] * vb[k * W + c];
      g[c] = r;
    }
  }
  bool any = false;
  for (int k = 0; k < K; ++k) any = any || da[k] != nullptr;
  if (!any) return;
  for (int64_t d = 0; d < D; ++d) {
    const T* w = wt + d * W;
    T s[kEncoderGradBlock];
    int64_t c = 0;
    for (int k = 0; k < K; ++k) s[k] = T(0);
#if defined(__GNUC__) || defined(__clang__)
    if (W >= V) {
      vec r[kEncoderGradBlock];
      for (int k = 0; k < K; ++k) std::memset(&r[k], 0, sizeof(vec));
      for (; c + V <= W; c += V) {
        const vec y = load(w + c);
        for (int k = 0; k < K; ++k) r[k] = r[k] + load(vb + k * W + c) * y;
      }
      for (int k = 0; k < K; ++k)
        for (int l = 0; l < V; ++l) s[k] = s[k] + r[k][l];
    }
#endif
    for (int k = 0; k < K; ++k) {
      T t = s[k];
      for (int64_t i = c; i < W; ++i) t = t + vb[k * W + i] * w[i];
      if (da[k] != nullptr) da[k][d] = t;
    }
  }
}

}  // namespace cpu
}  // namespace gnncompile
