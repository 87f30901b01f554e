// An edge encoder's values (gnncompile/ops/program.py, side enc) for one edge and a run of
// columns, shared by the message interpreter (message_core.h) and the generated message kernels
// (gnncompile/codegen/emit.py). Torch-free.
//
//   out[i] = b[i] + a[0] * w[i] + a[1] * w[W + i] + ... + a[D-1] * w[(D-1) W + i],  i < n
//
// summed in that order, each product rounded before its sum (the files that include this are
// compiled with -ffp-contract=off: no multiply-add), so every column is the reference's
// program.encode_edges bit for bit, whichever of the paths below computes it. The columns go
// in blocks of 8 vectors of 256 bits (GCC / Clang vector extensions) kept in registers over the
// D features: one load of w, one product and one sum per vector and feature (the sum over the
// features of one column is a chain of dependent adds; 8 independent chains hide their latency).
// Then single vectors, then scalars.
#pragma once
#include <cstdint>
#include <cstring>

namespace gnncompile {
namespace cpu {

template <typename T>
inline void encode_run(const T* a, int64_t D, const T* w, int64_t W, const T* b, int n, T* out) {
  int i = 0;
#if defined(__GNUC__) || defined(__clang__)
  typedef T vec __attribute__((vector_size(32)));
  constexpr int V = static_cast<int>(32 / sizeof(T));
  auto load = [](const T* p) {
    vec v;
    std::memcpy(&v, p, sizeof(vec));
    return v;
  };
  for (; i + 8 * V <= n; i += 8 * V) {
    vec r0 = load(b + i), r1 = load(b + i + V), r2 = load(b + i + 2 * V), r3 = load(b + i + 3 * V);
    vec r4 = load(b + i + 4 * V), r5 = load(b + i + 5 * V), r6 = load(b + i + 6 * V), r7 = load(b + i + 7 * V);
    for (int64_t d = 0; d < D; ++d) {
      const T ad = a[d];
      const T* wd = w + d * W + i;
      r0 = r0 + ad * load(wd);
      r1 = r1 + ad * load(wd + V);
      r2 = r2 + ad * load(wd + 2 * V);
      r3 = r3 + ad * load(wd + 3 * V);
      r4 = r4 + ad * load(wd + 4 * V);
      r5 = r5 + ad * load(wd + 5 * V);
      r6 = r6 + ad * load(wd + 6 * V);
      r7 = r7 + ad * load(wd + 7 * V);
    }
    std::memcpy(out + i, &r0, sizeof(vec));
    std::memcpy(out + i + V, &r1, sizeof(vec));
    std::memcpy(out + i + 2 * V, &r2, sizeof(vec));
    std::memcpy(out + i + 3 * V, &r3, sizeof(vec));
    std::memcpy(out + i + 4 * V, &r4, sizeof(vec));
    std::memcpy(out + i + 5 * V, &r5, sizeof(vec));
    std::memcpy(out + i + 6 * V, &r6, sizeof(vec));
    std::memcpy(out + i + 7 * V, &r7, sizeof(vec));
  }
  for (; i + V <= n; i += V) {
    vec r = load(b + i);
    for (int64_t d = 0; d < D; ++d) r = r + a[d] * load(w + d * W + i);
    std::memcpy(out + i, &r, sizeof(vec));
  }
#endif
  for (; i < n; ++i) {
    T v = b[i];
    for (int64_t d = 0; d < D; ++d) v = v + a[d] * w[d * W + i];
    out[i] = v;
  }
}

// The encoder's backward for one edge (gnncompile::message_encoder_grad), shared by the
// interpreter (message_core.h) and the generated kernels: v [W] is the gradient of the edge's
// encoder values (the derivative program's value, grouped to W columns); a [D] its features.
//
//   dwt[d * W + c] += a[d] * v[c],   db[c] += v[c]   (a chunk's accumulators, elementwise)
//   da[d] = sum_c v[c] * wt[d * W + c]               (when da is not null)
//
// da's sum runs in lanes: vector lane l sums the columns c = l (mod V) of the whole vectors in
// column order, the lanes are then added in lane order, then the columns past the last whole
// vector in order: a fixed order, the same in every file that includes this (compiled with
// -ffp-contract=off), so the interpreter and the generated kernels agree bit for bit.
template <typename T>
inline void encode_grad_edge(const T* a, int64_t D, const T* v, const T* wt, int64_t W, T* dwt, T* db, T* da) {
  for (int64_t c = 0; c < W; ++c) db[c] = db[c] + v[c];
  for (int64_t d = 0; d < D; ++d) {
    const T ad = a[d];
    T* g = dwt + d * W;
    for (int64_t c = 0; c < W; ++c) g[c] = g[c] + ad * v[c];
  }
  if (da == nullptr) return;
  for (int64_t d = 0; d < D; ++d) {
    const T* w = wt + d * W;
    int64_t c = 0;
    T s = T(0);
#if defined(__GNUC__) || defined(__clang__)
    typedef T vec __attribute__((vector_size(32)));
    constexpr int V = static_cast<int>(32 / sizeof(T));
    if (W >= V) {
      vec r, x, y;
      std::memset(&r, 0, sizeof(vec));
      for (; c + V <= W; c += V) {
        std::memcpy(&x, v + c, sizeof(vec));
        std::memcpy(&y, w + c, sizeof(vec));
        r = r + x * y;
      }
      for (int l = 0; l < V; ++l) s = s + r[l];
    }
#endif
    for (; c < W; ++c) s = s + v[c] * w[c];
    da[d] = s;
  }
}

}  // namespace cpu
}  // namespace gnncompile
