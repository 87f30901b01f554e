// Graph attention in one pass over a CSR-by-destination structure, on the GPU. Torch-free.
// Semantics as native/cpu/attention_core.h (see there for the formulas):
//
//   raw = a_src[src] + a_dst[dst] (+ a_edge[e]), s = leaky_relu(raw), alpha = PyG's softmax of s
//   over the row, w = alpha * keep(e, h) / (1 - p), out[i] = sum of w * x[src]
//
// alpha and w are rounded to the features' dtype as the CPU core's stored<> does (the unfused
// chain's rounding), so 16-bit results follow the chain; sums run in acc_t (float, double for
// double) in a lane-parallel order, so they agree with the CPU within rounding, not bit for bit.
// exp is acc_exp (expf / exp), as edge_softmax_core.cuh's: within 2 ulp of the CPU core's
// exp_approx / std::exp, where __expf's error grows with |s - max|; the kernels are bound by
// the gathers, not by the exps.
//
// Forward (attention_forward_kernel): one warp per destination row, rows grid-strided.
//   phase 1: lanes over (edge, head) as edge_softmax's (lane = e * Hp + hl, Hp = heads per
//     pass): per head the row's max of s (an all -inf row is shifted by 0) and the sum of
//     exp(s - max), both reduced across the lanes of a head; stats[row] = (max, 1 / (sum +
//     1e-16)), 0 for a row with no edge;
//   phase 2: lanes over features in the head-group layout below; every lane recomputes the
//     coefficient of its head for each edge (one exp) from stats (written by phase 1 of the
//     same warp: read back after __syncwarp, not through the read-only path), and accumulates
//     w * x[src, f] in registers; out[row] written once.
// Backward, with g = dL/dout:
//   attention_records_kernel (warp per destination row): rec[i] = [max, inv, D, a_dst] per
//     head, D[i, h] = <out[i, h, :], g[i, h, :]> reduced over the lanes of the head;
//   attention_source_kernel (warp per source row j of the CSC, head-group layout): per
//     out-edge (j -> i, edge e) the coefficient of the lane's head recomputed from rec[i];
//     gx[j, f] += w * g[i, f] in registers; dot = <x[j, h, :], g[i, h, :]> reduced over the
//     head's lanes; ds = alpha (dot * keep - D[i, h]), dr = ds * leaky_relu'(raw);
//     g_src[j, h] += dr in a register, d_edge[e, h] = dr (one writer per edge: perm_t is a
//     permutation, checked by the glue); gx[j] and g_src[j] written once;
//   attention_dst_kernel (thread per (row, head)): g_dst[i, h] = sum over the CSR row i of
//     d_edge[perm[j], h], in slot order.
// No atomics, every sum in a fixed order: results are the same on every run. A hub row is one
// warp's work (no split across warps, unlike spmm's merge path): not tuned on a GPU yet.
//
// Head-group layout (phase 2 and the backward): a head's C features are spread over cp =
// min(32, next_pow2(C)) consecutive lanes (lane cl holds features cl, cl + cp, ...), so a warp
// covers 32 / cp heads at once and each lane works for one head of each such block: one
// coefficient per block and edge, and the head's dot is a reduction over its cp lanes. A lane
// keeps up to kAttnSlots features (slots) in registers per pass over the row's edges: several
// head blocks when C <= cp * kAttnSlots, else one block's features in chunks of kAttnSlots
// (the dot then also reads the features past the first chunk in the first pass).
//
// The structures are validated by the glue before launch (validate_once: every col below the
// bound, every perm an edge id), so indices are not range-checked here.
#pragma once
#include "../common/counter_rng.h"
#include "common.cuh"

namespace gnncompile {
namespace gpu {

constexpr int kAttnWarps = 8;  // warps per block
constexpr int kAttnThreads = kAttnWarps * kWarpSize;
constexpr int kAttnSlots = 4;  // features a lane keeps in registers per pass

// Lane layout over the heads and features of one row (host-side, from H and C).
struct AttnLayout {
  int hp = 1;           // phase 1: heads per pass, min(32, next_pow2(H)); 32 / hp edges per pass
  int cp = 1;           // lanes per head, min(32, next_pow2(C))
  int groups = 32;      // heads per block, 32 / cp
  int mc = 1;           // slots per head block in one pass
  int blocks = 1;       // head blocks per pass
  int slots = 1;        // blocks * mc <= kAttnSlots
  int64_t nblk = 0;     // head blocks, ceil(H / groups)
  int64_t per_head = 0;  // features of a head per lane, ceil(C / cp)
  int64_t chunks = 1;   // passes over one head block's features, ceil(per_head / mc)
};

inline int64_t attn_pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

inline AttnLayout attention_layout(int64_t H, int64_t C) {
  AttnLayout L;
  L.hp = static_cast<int>(attn_pow2_at_least(H < 1 ? 1 : (H > kWarpSize ? kWarpSize : H)));
  L.cp = static_cast<int>(attn_pow2_at_least(C < 1 ? 1 : (C > kWarpSize ? kWarpSize : C)));
  L.groups = kWarpSize / L.cp;
  L.nblk = (H + L.groups - 1) / L.groups;
  L.per_head = (C + L.cp - 1) / L.cp;
  if (L.per_head <= kAttnSlots) {  // whole heads per pass, as many blocks as the slots hold
    L.mc = L.per_head > 0 ? static_cast<int>(L.per_head) : 1;  // C = 0: one (featureless) slot
    const int64_t b = kAttnSlots / L.mc;
    L.blocks = static_cast<int>(b < L.nblk ? b : (L.nblk > 0 ? L.nblk : 1));
    L.chunks = 1;
  } else {  // a head wider than the slots: one block per pass, its features in chunks
    L.mc = kAttnSlots;
    L.blocks = 1;
    L.chunks = (L.per_head + kAttnSlots - 1) / kAttnSlots;
  }
  L.slots = L.blocks * L.mc;
  return L;
}

// What the parameters of every attention core (this one, attention_v2_core.cuh,
// attention_dot_core.cuh) start with: the structures, the sizes, the dropout, the grid cap. A: the
// accumulator type.
template <typename A, typename I>
struct AttnBase {
  const I* rowptr = nullptr;    // CSR by destination [M + 1]
  const I* col = nullptr;       // [E] source of CSR slot j
  const I* perm = nullptr;      // [E] original edge id of CSR slot j
  const I* rowptr_t = nullptr;  // CSC by source [N + 1] (backward)
  const I* col_t = nullptr;     // [E] destination of CSC slot k
  const I* perm_t = nullptr;    // [E] original edge id of CSC slot k
  int64_t N = 0, M = 0, E = 0, H = 1, C = 1;
  bool dropout = false;
  uint64_t key = 0;        // splitmix64(seed)
  uint32_t threshold = 0;  // keep when the draw is >= threshold
  A scale = A(1);          // 1 / (1 - p)
  int max_blocks = 1;      // grid cap of the grid-strided kernels
};

template <typename T, typename I>
struct AttentionParams : AttnBase<acc_t<T>, I> {
  const T* x = nullptr;       // [N, H, C]
  const T* a_src = nullptr;   // [N, H]
  const T* a_dst = nullptr;   // [M, H]
  const T* a_edge = nullptr;  // [E, H] in original edge order, or nullptr
  acc_t<T> slope = acc_t<T>(0.2);
  AttnLayout lay;
};

// The CPU core's stored<>: a value rounded to the storage type, read back.
template <typename T>
__device__ __forceinline__ acc_t<T> attn_stored(acc_t<T> v) { return to_acc(from_acc<T>(v)); }

template <typename A>
__device__ __forceinline__ A attn_leaky(A raw, A slope) { return raw > A(0) ? raw : raw * slope; }

// The logit of (src, edge e, head h) with the destination's score `ad` already loaded, added
// in the features' dtype as the unfused chain adds: (a_src + a_dst) rounded, then + a_edge.
template <typename T, typename I>
__device__ __forceinline__ acc_t<T> attn_raw(const AttentionParams<T, I>& p, int64_t src, acc_t<T> ad, int64_t e,
                                             int64_t h) {
  acc_t<T> raw = attn_stored<T>(load_acc(p.a_src + src * p.H + h) + ad);
  if (p.a_edge != nullptr) raw = attn_stored<T>(raw + load_acc(p.a_edge + e * p.H + h));
  return raw;
}

// The dropout factor of coefficient (e, h): the dropout op's mask of the [E, H] tensor.
template <typename A, typename I>
__device__ __forceinline__ A attn_keep(const AttnBase<A, I>& p, int64_t e, int64_t h) {
  if (!p.dropout) return A(1);
  return draw(p.key, e * p.H + h) >= p.threshold ? p.scale : A(0);
}

// The row's max shifted by 0 when every score is -inf (or NaN), as the CPU core's.
template <typename A>
__device__ __forceinline__ A attn_guard(A m) { return m == neg_inf<A>() ? A(0) : m; }

__device__ __forceinline__ int attn_lane() { return static_cast<int>(threadIdx.x) & (kWarpSize - 1); }
__device__ __forceinline__ int64_t attn_warp() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
}
__device__ __forceinline__ int64_t attn_num_warps() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
}

// The slots of one pass (head blocks from hb0, feature chunk mk) for lane (gi, cl): per slot
// the head (-1: none of the call's) and the feature offset h * C + c in the row (-1: none), as
// 32-bit values (the glue checks F = H * C < 2^31), and the warp-uniform masks of the slots that
// open and close a head block.
struct AttnSlots {
  int h[kAttnSlots];
  int off[kAttnSlots];
  unsigned first = 0, last = 0;
};

__device__ __forceinline__ AttnSlots attn_slots(const AttnLayout& L, int64_t hb0, int64_t mk, int gi, int cl,
                                                int64_t H, int64_t C) {
  AttnSlots r;
#pragma unroll
  for (int s = 0; s < kAttnSlots; ++s) {
    const int b = s / L.mc, mm = s - b * L.mc;
    const int64_t h = (hb0 + b) * L.groups + gi;
    const int64_t c = cl + static_cast<int64_t>(L.cp) * (mk * L.mc + mm);
    const bool hv = s < L.slots && h < H;
    r.h[s] = hv ? static_cast<int>(h) : -1;
    r.off[s] = hv && c < C ? static_cast<int>(h * C + c) : -1;
    if (s < L.slots && mm == 0) r.first |= 1u << s;
    if (s < L.slots && mm == L.mc - 1) r.last |= 1u << s;
  }
  return r;
}

// ------------------------------------------------------------------------------ forward
template <typename T, typename I>
__global__ void __launch_bounds__(kAttnThreads) attention_forward_kernel(const AttentionParams<T, I> p, T* out,
                                                                         acc_t<T>* stats) {
  using A = acc_t<T>;
  const AttnLayout& L = p.lay;
  const int lane = attn_lane();
  const int el = lane / L.hp, hl = lane & (L.hp - 1), pe = kWarpSize / L.hp;  // phase 1
  const int gi = lane / L.cp, cl = lane & (L.cp - 1);                       // phase 2
  const int64_t H = p.H, C = p.C, F = H * C;
  const int64_t nw = attn_num_warps();
  for (int64_t row = attn_warp(); row < p.M; row += nw) {  // warp-uniform
    const int64_t begin = static_cast<int64_t>(p.rowptr[row]), end = static_cast<int64_t>(p.rowptr[row + 1]);
    A* st = stats + row * 2 * H;

    // Phase 1: max and sum of exp per head, reduced over the lanes of a head (xor >= hp).
    for (int64_t h0 = 0; h0 < H; h0 += L.hp) {
      const int64_t h = h0 + hl;
      const bool hv = h < H;
      const A ad = hv ? load_acc(p.a_dst + row * H + h) : A(0);
      A m = neg_inf<A>();
      if (hv)
        for (int64_t j = begin + el; j < end; j += pe) {
          const int64_t src = static_cast<int64_t>(__ldg(p.col + j)), e = static_cast<int64_t>(__ldg(p.perm + j));
          m = max_keep(m, attn_leaky(attn_raw(p, src, ad, e, h), p.slope));
        }
      for (int o = kWarpSize >> 1; o >= L.hp; o >>= 1) m = max_keep(m, __shfl_xor_sync(0xffffffffu, m, o));
      const A mg = attn_guard(m);
      A sum = A(0);
      if (hv)
        for (int64_t j = begin + el; j < end; j += pe) {
          const int64_t src = static_cast<int64_t>(__ldg(p.col + j)), e = static_cast<int64_t>(__ldg(p.perm + j));
          sum += acc_exp(attn_leaky(attn_raw(p, src, ad, e, h), p.slope) - mg);
        }
      for (int o = kWarpSize >> 1; o >= L.hp; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (hv && el == 0) {
        const bool any = end > begin;  // a row with no edge keeps zeros, as the CPU core's
        st[h] = any ? mg : A(0);
        st[H + h] = any ? A(1) / (sum + A(1e-16)) : A(0);
      }
    }
    __syncwarp();  // phase 2 reads every head's statistics, written by other lanes

    // Phase 2: the weighted sum of the gathered rows, kAttnSlots features a lane per pass.
    for (int64_t hb0 = 0; hb0 < L.nblk; hb0 += L.blocks) {
      for (int64_t mk = 0; mk < L.chunks; ++mk) {
        const AttnSlots sl = attn_slots(L, hb0, mk, gi, cl, H, C);
        A acc[kAttnSlots], mx[kAttnSlots], iv[kAttnSlots], ad[kAttnSlots];
#pragma unroll
        for (int s = 0; s < kAttnSlots; ++s) {
          const bool opens = (sl.first >> s & 1u) && sl.h[s] >= 0;  // only a block's first slot reads them
          acc[s] = A(0);
          mx[s] = opens ? st[sl.h[s]] : A(0);  // plain loads: written by this kernel
          iv[s] = opens ? st[H + sl.h[s]] : A(0);
          ad[s] = opens ? load_acc(p.a_dst + row * H + sl.h[s]) : A(0);
        }
        // The row's slots 32 at a time: sources and edge ids read with one coalesced load
        // each and broadcast by shuffle.
        for (int64_t base = begin; base < end; base += kWarpSize) {
          const int n = static_cast<int>(end - base < kWarpSize ? end - base : kWarpSize);
          I my_col = 0, my_perm = 0;
          if (lane < n) {
            my_col = __ldg(p.col + base + lane);
            my_perm = __ldg(p.perm + base + lane);
          }
          for (int t = 0; t < n; ++t) {
            const int64_t src = static_cast<int64_t>(__shfl_sync(0xffffffffu, my_col, t));
            const int64_t e = static_cast<int64_t>(__shfl_sync(0xffffffffu, my_perm, t));
            const T* xr = p.x + src * F;
            A w = A(0);
#pragma unroll
            for (int s = 0; s < kAttnSlots; ++s) {
              if ((sl.first >> s & 1u) && sl.h[s] >= 0) {  // the coefficient of this block's head
                const int64_t h = sl.h[s];
                const A alpha =
                    attn_stored<T>(acc_exp(attn_leaky(attn_raw(p, src, ad[s], e, h), p.slope) - mx[s]) * iv[s]);
                w = p.dropout ? attn_stored<T>(alpha * attn_keep(p, e, h)) : alpha;
              }
              if (sl.off[s] >= 0) acc[s] += w * load_acc(xr + sl.off[s]);
            }
          }
        }
#pragma unroll
        for (int s = 0; s < kAttnSlots; ++s)
          if (sl.off[s] >= 0) out[row * F + sl.off[s]] = from_acc<T>(acc[s]);
      }
    }
  }
}

// ------------------------------------------------------------------------------ backward
// rec[i] = [max (H), inv (H), D (H), a_dst (H)] per destination row, in acc_t.
template <typename T, typename I>
__global__ void __launch_bounds__(kAttnThreads) attention_records_kernel(const AttentionParams<T, I> p, const T* out,
                                                                         const T* grad, const acc_t<T>* stats,
                                                                         acc_t<T>* rec) {
  using A = acc_t<T>;
  const AttnLayout& L = p.lay;
  const int lane = attn_lane();
  const int gi = lane / L.cp, cl = lane & (L.cp - 1);
  const int64_t H = p.H, C = p.C, F = H * C;
  const int64_t nw = attn_num_warps();
  for (int64_t row = attn_warp(); row < p.M; row += nw) {
    A* r = rec + row * 4 * H;
    for (int64_t k = lane; k < 2 * H; k += kWarpSize) r[k] = stats[row * 2 * H + k];
    for (int64_t h = lane; h < H; h += kWarpSize) r[3 * H + h] = load_acc(p.a_dst + row * H + h);
    for (int64_t hb = 0; hb < L.nblk; ++hb) {
      const int64_t h = hb * L.groups + gi;
      A d = A(0);
      if (h < H)
        for (int64_t c = cl; c < C; c += L.cp)
          d += load_acc(out + row * F + h * C + c) * load_acc(grad + row * F + h * C + c);
      for (int o = L.cp >> 1; o >= 1; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      if (h < H && cl == 0) r[2 * H + h] = d;
    }
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(kAttnThreads) attention_source_kernel(const AttentionParams<T, I> p,
                                                                        const acc_t<T>* rec, const T* grad, T* gx,
                                                                        T* g_src, acc_t<T>* d_edge) {
  using A = acc_t<T>;
  const AttnLayout& L = p.lay;
  const int lane = attn_lane();
  const int gi = lane / L.cp, cl = lane & (L.cp - 1);
  const int64_t H = p.H, C = p.C, F = H * C;
  const int64_t nw = attn_num_warps();
  for (int64_t j = attn_warp(); j < p.N; j += nw) {  // warp-uniform
    const int64_t begin = static_cast<int64_t>(p.rowptr_t[j]), end = static_cast<int64_t>(p.rowptr_t[j + 1]);
    for (int64_t hb0 = 0; hb0 < L.nblk; hb0 += L.blocks) {
      for (int64_t mk = 0; mk < L.chunks; ++mk) {
        const bool dots = mk == 0;  // the first chunk's pass also takes the heads' dots
        const AttnSlots sl = attn_slots(L, hb0, mk, gi, cl, H, C);
        A acc[kAttnSlots], xs[kAttnSlots], as[kAttnSlots], gs[kAttnSlots];
#pragma unroll
        for (int s = 0; s < kAttnSlots; ++s) {
          acc[s] = A(0);
          gs[s] = A(0);
          xs[s] = sl.off[s] >= 0 ? load_acc(p.x + j * F + sl.off[s]) : A(0);
          as[s] = (sl.first >> s & 1u) && sl.h[s] >= 0 ? load_acc(p.a_src + j * H + sl.h[s]) : A(0);
        }
        for (int64_t base = begin; base < end; base += kWarpSize) {
          const int n = static_cast<int>(end - base < kWarpSize ? end - base : kWarpSize);
          I my_dst = 0, my_eid = 0;
          if (lane < n) {
            my_dst = __ldg(p.col_t + base + lane);
            my_eid = __ldg(p.perm_t + base + lane);
          }
          for (int t = 0; t < n; ++t) {
            const int64_t i = static_cast<int64_t>(__shfl_sync(0xffffffffu, my_dst, t));
            const int64_t e = static_cast<int64_t>(__shfl_sync(0xffffffffu, my_eid, t));
            const A* ri = rec + i * 4 * H;
            const T* gr = grad + i * F;
            A raw = A(0), alpha = A(0), ks = A(1), w = A(0), D = A(0), dot = A(0);
#pragma unroll
            for (int s = 0; s < kAttnSlots; ++s) {
              if (sl.first >> s & 1u) {
                dot = A(0);
                if (sl.h[s] >= 0) {  // the coefficient of this block's head, from the row's record
                  const int64_t h = sl.h[s];
                  raw = attn_stored<T>(as[s] + __ldg(ri + 3 * H + h));
                  if (p.a_edge != nullptr) raw = attn_stored<T>(raw + load_acc(p.a_edge + e * H + h));
                  alpha = attn_stored<T>(acc_exp(attn_leaky(raw, p.slope) - __ldg(ri + h)) * __ldg(ri + H + h));
                  ks = attn_keep(p, e, h);
                  w = p.dropout ? attn_stored<T>(alpha * ks) : alpha;
                  D = __ldg(ri + 2 * H + h);
                }
              }
              if (sl.off[s] >= 0) {
                const A gv = load_acc(gr + sl.off[s]);
                acc[s] += w * gv;
                if (dots) dot += xs[s] * gv;
              }
              if (dots && (sl.last >> s & 1u)) {     // warp-uniform: the head's dot is complete
                if (L.chunks > 1 && sl.h[s] >= 0) {  // the features past the first chunk
                  const int64_t h = sl.h[s];
                  for (int64_t m = L.mc; m < L.per_head; ++m) {
                    const int64_t c = cl + static_cast<int64_t>(L.cp) * m;
                    if (c < C) dot += load_acc(p.x + j * F + h * C + c) * load_acc(gr + h * C + c);
                  }
                }
                for (int o = L.cp >> 1; o >= 1; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                if (sl.h[s] >= 0) {
                  const A ds = alpha * (dot * ks - D);
                  const A dr = raw > A(0) ? ds : ds * p.slope;
                  gs[s] += dr;
                  if (cl == 0) d_edge[e * H + sl.h[s]] = dr;
                }
              }
            }
          }
        }
#pragma unroll
        for (int s = 0; s < kAttnSlots; ++s) {
          if (sl.off[s] >= 0) gx[j * F + sl.off[s]] = from_acc<T>(acc[s]);
          if (dots && (sl.last >> s & 1u) && sl.h[s] >= 0 && cl == 0) g_src[j * H + sl.h[s]] = from_acc<T>(gs[s]);
        }
      }
    }
  }
}

// g_dst[i, h] = sum over the CSR row i of d_edge[perm[j], h], in slot order (as the CPU core).
template <typename T, typename I>
__global__ void __launch_bounds__(kAttnThreads) attention_dst_kernel(const AttentionParams<T, I> p,
                                                                     const acc_t<T>* d_edge, T* g_dst) {
  using A = acc_t<T>;
  const int64_t total = p.M * p.H;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t row = idx / p.H, h = idx - row * p.H;
    const int64_t end = static_cast<int64_t>(p.rowptr[row + 1]);
    A s = A(0);
    for (int64_t j = static_cast<int64_t>(p.rowptr[row]); j < end; ++j)
      s += __ldg(d_edge + static_cast<int64_t>(__ldg(p.perm + j)) * p.H + h);
    g_dst[idx] = from_acc<T>(s);
  }
}

inline unsigned attn_grid(int64_t units, int64_t per_block, int max_blocks) {
  const int64_t b = ceil_div(units, per_block);
  const int64_t cap = max_blocks > 0 ? max_blocks : 1;
  return static_cast<unsigned>(b < cap ? (b > 0 ? b : 1) : cap);
}

// Forward on `stream`: out [M, H * C], stats [M, 2 * H]. The caller has validated the CSR
// (col < N, perm entries in [0, E)), filled p.lay (attention_layout) and handled M = 0.
template <typename T, typename I>
cudaError_t attention_forward_launch(const AttentionParams<T, I>& p, T* out, acc_t<T>* stats, cudaStream_t stream) {
  if (p.M == 0) return cudaSuccess;
  attention_forward_kernel<T, I><<<attn_grid(p.M, kAttnWarps, p.max_blocks), kAttnThreads, 0, stream>>>(p, out, stats);
  return cudaGetLastError();
}

// Backward on `stream`: the records, the pass over the CSC (gx [N, H * C], g_src [N, H],
// d_edge [E, H]), then g_dst [M, H]. The caller has validated both structures (col_t < M) and
// checked perm_t to be a permutation (each d_edge row written once), and sized rec [M, 4 * H].
template <typename T, typename I>
cudaError_t attention_backward_launch(const AttentionParams<T, I>& p, const T* out, const T* grad,
                                      const acc_t<T>* stats, acc_t<T>* rec, T* gx, T* g_src, T* g_dst,
                                      acc_t<T>* d_edge, cudaStream_t stream) {
  if (p.M > 0) {
    attention_records_kernel<T, I>
        <<<attn_grid(p.M, kAttnWarps, p.max_blocks), kAttnThreads, 0, stream>>>(p, out, grad, stats, rec);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (p.N > 0) {
    attention_source_kernel<T, I>
        <<<attn_grid(p.N, kAttnWarps, p.max_blocks), kAttnThreads, 0, stream>>>(p, rec, grad, gx, g_src, d_edge);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (p.M * p.H > 0) {
    attention_dst_kernel<T, I>
        <<<attn_grid(p.M * p.H, kAttnThreads, p.max_blocks), kAttnThreads, 0, stream>>>(p, d_edge, g_dst);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace gpu
}  // namespace gnncompile
