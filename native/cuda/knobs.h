// Launch configuration of the CUDA kernels: the knob layout and the default rule. Host-only,
// torch-free, no CUDA types. The one copy of the rule: the CUDA glue (spmm.cu, edge_dot.cu,
// edge_softmax.cu) applies it at launch, and every build of the extension, the CPU-only one too,
// binds it for Python as gnncompile._C.launch_rule (native/common/launch_rule.cpp), which
// gnncompile/hardware/cuda_knobs.py wraps; tests/test_cuda_knobs.py checks it through that binding.
//
// knobs (the ops' `int[] knobs` on CUDA; 0 or missing = default):
//   [0] lanes_per_row  L: lanes of one warp that share a destination row, power of two <= 32
//   [1] rows_per_block   lane groups per thread block (block = L * rows_per_block threads,
//                      rounded to whole warps, at most 256 threads)
//   [2] vec_width      V: elements per lane load (float4 = 4 floats, 8 halves in 16 bytes, ...)
//   [3] items_per_group K: merge-path items (rows + edges) each group owns; the unit of load
//                      balance and of splitting heavy rows
//
// Default rule (F = features per node, C = features per weight column, b = bytes per element):
//   V = the widest compiled width w <= 16 / b with C % w == 0 and every row start aligned to
//       w * b bytes (compiled widths: 4, 2, 1 for float32; 2, 1 for float64; 8, 2, 1 for 16-bit)
//   L = next_pow2(ceil(F / V)), at most 32: one pass of the group covers the row's features;
//       wider rows are covered by ceil(F / (L * V)) feature tiles
//   rows_per_block = block / L with block = min(256, max_threads_per_sm / 4): at least four
//       resident blocks per SM (max_threads_per_sm from the compute capability: 1024 on 7.5,
//       1536 on 8.6 / 8.9, else 2048)
//   K = min(4096, max(32, K_deg, K_l2, K_fill)) where
//       K_deg  = 8 * (avg_degree + 1): a group writes >= 8 rows per row it cuts, so the partial
//                results of cut rows (2 slots per group) stay a small share of the output
//       K_l2   = 4 * (M + E) * slot_bytes / l2_bytes: the scratch slots (2 per group) fit in half
//                the L2, so the fix-up pass reads them from cache (slot_bytes = F * acc bytes,
//                + 8 F for max/min; 2 * H * acc bytes for edge_softmax; 0 for edge_dot)
//       K_fill = (M + E) * tiles / (4 * sm_count * groups_per_sm): the largest K that still
//                gives four waves of groups (groups_per_sm = max_threads_per_sm / L)
//   edge_softmax and its backward use one warp per group (L = 32, V = 1) and only K.
//
// Bounds on explicit knobs (a profile may hold anything): L is clamped to [1, 32] before
// rounding, rows_per_block to the block limit, V to 16 bytes; L is raised when F / (L * V)
// feature tiles would not fit the grid's y dimension (65535); an explicit K is clamped to
// [K_mem, max(2^20, K_mem)], where K_mem is the smallest K whose scratch for cut rows (two
// slots per group) fits max(64 MiB, one slot per output row): a K tuned on a small graph would
// otherwise ask for tens of GB on a large one.
#pragma once
#include <algorithm>
#include <cstdint>

namespace gnncompile {
namespace gpu {

struct DeviceProps {
  int sm_count = 1;
  int64_t l2_bytes = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int max_threads_per_sm = 0;  // 0: derived from the compute capability
};

struct LaunchKnobs {
  int lanes = 32;           // L
  int rows_per_block = 8;   // groups per block
  int vec = 1;              // V
  int64_t items = 32;       // K
};

// The knob layout: the index of each entry of the ops' `int[] knobs` and its name.
enum Knob : int { kLanesKnob = 0, kRowsPerBlockKnob = 1, kVecKnob = 2, kItemsKnob = 3, kNumKnobs = 4 };
inline constexpr const char* kKnobNames[kNumKnobs] = {"lanes_per_row", "rows_per_block", "vec_width",
                                                      "items_per_group"};

constexpr int kMaxLanes = 32;
constexpr int64_t kMinItems = 32;
constexpr int64_t kMaxItems = 4096;
constexpr int kWaves = 4;
constexpr int kMaxBlock = 256;  // = kMaxBlockThreads in common.cuh (the kernels' launch bounds)
constexpr int64_t kMaxGridY = 65535;
// The most features per node spmm takes: its feature tiles and fix-up chunks go on gridDim.y,
// at most kMaxGridY of kMaxLanes or more features each.
constexpr int64_t kMaxSpmmFeatures = kMaxGridY * kMaxLanes;
constexpr int64_t kMaxExplicitVec = 16;  // an explicit vec_width is capped here before picking a width
constexpr int64_t kMaxExplicitItems = int64_t{1} << 20;
constexpr int64_t kScratchFloorBytes = int64_t{64} << 20;

// The largest explicit value of each knob that the rule does not clamp further (lanes and rows
// per block are clamped to these before rounding, vec_width to kMaxExplicitVec, items_per_group
// to [K_mem, max(2^20, K_mem)]): a device profile's knobs are clamped to them when it is loaded.
inline constexpr int64_t kExplicitKnobMax[kNumKnobs] = {kMaxLanes, kMaxBlock, kMaxExplicitVec, kMaxExplicitItems};

// Bytes of the accumulator the kernels keep for an element of `elem_bytes` (acc_t in
// common.cuh: float for 16-bit and float32, double for float64).
constexpr int acc_bytes_for(int elem_bytes) { return elem_bytes == 8 ? 8 : 4; }

// Whether the rule's int64 arithmetic is exact for these sizes: M, E and `width` (features, or
// heads for edge_softmax) >= 0, and 4 * (M + E) * slot_bytes plus an L2 size of up to 2^31
// bytes within int64 for the widest slot (16 bytes per feature or head). Far beyond any graph a
// device holds; the binding (native/common/launch_rule.cpp) refuses larger sizes.
inline bool sizes_fit_rule(int64_t M, int64_t E, int64_t width) {
  constexpr int64_t cap = INT64_MAX / 128;
  if (M < 0 || E < 0 || width < 0 || M > cap || E > cap - M) return false;
  return M + E <= cap / std::max<int64_t>(width, 1);
}

inline int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

inline int64_t prev_pow2(int64_t v) {  // largest power of two <= v (v >= 1)
  int64_t p = 1;
  while (p * 2 <= v) p <<= 1;
  return p;
}

inline int threads_per_sm(const DeviceProps& d) {
  if (d.max_threads_per_sm > 0) return d.max_threads_per_sm;
  if (d.cc_major == 7 && d.cc_minor == 5) return 1024;
  if (d.cc_major == 8 && (d.cc_minor == 6 || d.cc_minor == 7 || d.cc_minor == 9)) return 1536;
  return 2048;
}

inline int block_threads(const DeviceProps& d) { return std::min(256, threads_per_sm(d) / 4); }

// Compiled vector widths for an element size, widest first (see VecSet in common.cuh).
constexpr int compiled_vec(int elem_bytes, int i) {
  constexpr int w4[3] = {4, 2, 1}, w8[3] = {2, 1, 1}, w2[3] = {8, 2, 1};
  if (elem_bytes == 8) return w8[i];
  if (elem_bytes == 2) return w2[i];
  return w4[i];
}

// The widest compiled width <= `wanted` that divides `width` and keeps rows aligned
// (align_bytes: the largest power of two dividing every base address involved).
inline int pick_vec(int wanted, int elem_bytes, int64_t width, int64_t align_bytes) {
  for (int i = 0; i < 3; ++i) {
    const int w = compiled_vec(elem_bytes, i);
    if (w > wanted) continue;
    if (width % w != 0) continue;
    if (align_bytes % (static_cast<int64_t>(w) * elem_bytes) != 0) continue;
    return w;
  }
  return 1;
}

inline int default_lanes(int64_t F, int vec) {
  const int64_t per_row = (F + vec - 1) / vec;
  return static_cast<int>(std::min<int64_t>(kMaxLanes, next_pow2(std::max<int64_t>(per_row, 1))));
}

// K. slot_bytes: scratch bytes per slot (see above); tiles: feature tiles per group.
inline int64_t default_items(const DeviceProps& d, int64_t M, int64_t E, int lanes, int64_t tiles,
                             int64_t slot_bytes) {
  const double avg_degree = M > 0 ? static_cast<double>(E) / static_cast<double>(M) : 0.0;
  const int64_t work = M + E;
  const int64_t k_deg = slot_bytes > 0 ? static_cast<int64_t>(8.0 * (avg_degree + 1.0)) : 0;
  const int64_t k_l2 =
      (slot_bytes > 0 && d.l2_bytes > 0) ? (4 * work * slot_bytes + d.l2_bytes - 1) / d.l2_bytes : 0;
  const int64_t groups_per_sm = std::max(1, threads_per_sm(d) / std::max(lanes, 1));
  const int64_t resident = static_cast<int64_t>(std::max(d.sm_count, 1)) * groups_per_sm * kWaves;
  const int64_t k_fill = work * std::max<int64_t>(tiles, 1) / resident;
  return std::min(kMaxItems, std::max({kMinItems, k_deg, k_l2, k_fill}));
}

inline int64_t knob(const int64_t* knobs, int64_t n, int i) { return (i < n && knobs[i] > 0) ? knobs[i] : 0; }

// Smallest L (power of two, at most 32) whose feature tiles of L * V fit the grid's y dimension.
inline int64_t min_lanes_for_grid(int64_t F, int vec) {
  const int64_t per_tile = (F + kMaxGridY - 1) / kMaxGridY;  // features each tile must cover
  return std::min<int64_t>(kMaxLanes, next_pow2(std::max<int64_t>((per_tile + vec - 1) / vec, 1)));
}

// An explicit K, bounded (see the header). slot_bytes: scratch bytes per slot (0: none).
inline int64_t bound_items(int64_t K, int64_t M, int64_t E, int64_t slot_bytes) {
  int64_t k_mem = 1;
  if (slot_bytes > 0) {
    const int64_t budget = std::max(kScratchFloorBytes, std::max<int64_t>(M, 1) * slot_bytes);
    k_mem = std::max<int64_t>(1, (2 * (M + E) * slot_bytes + budget - 1) / budget);
  }
  return std::min(std::max(K, k_mem), std::max(kMaxExplicitItems, k_mem));
}

// lanes: requested L clamped to [1, 32] and rounded down to a power of two, then raised to
// min_lanes; rows_per_block rounded so the block is a whole number of warps and at most
// kMaxBlock threads.
inline void finish_layout(const DeviceProps& d, int64_t want_lanes, int64_t want_rpb, int64_t min_lanes,
                          LaunchKnobs& k) {
  const int64_t lanes = prev_pow2(std::min<int64_t>(kMaxLanes, std::max<int64_t>(want_lanes, 1)));
  k.lanes = static_cast<int>(std::max(lanes, min_lanes));
  int64_t rpb = want_rpb > 0 ? std::min<int64_t>(want_rpb, kMaxBlock) : block_threads(d) / k.lanes;
  const int64_t per_warp = kMaxLanes / k.lanes;            // groups per warp
  rpb = (std::max<int64_t>(rpb, 1) + per_warp - 1) / per_warp * per_warp;
  rpb = std::min<int64_t>(rpb, kMaxBlock / k.lanes);
  k.rows_per_block = static_cast<int>(rpb);
}

// spmm. C = features per weight column (F when there is no per-head weight).
inline LaunchKnobs spmm_knobs(const DeviceProps& d, const int64_t* knobs, int64_t n, int64_t M, int64_t E,
                              int64_t F, int64_t C, int elem_bytes, int acc_bytes, bool arg,
                              int64_t align_bytes) {
  LaunchKnobs k;
  const int64_t want_vec = knob(knobs, n, kVecKnob) ? knob(knobs, n, kVecKnob) : 16 / elem_bytes;
  k.vec = pick_vec(static_cast<int>(std::min<int64_t>(want_vec, kMaxExplicitVec)), elem_bytes, C, align_bytes);
  const int64_t want_lanes = knob(knobs, n, kLanesKnob) ? knob(knobs, n, kLanesKnob) : default_lanes(F, k.vec);
  finish_layout(d, want_lanes, knob(knobs, n, kRowsPerBlockKnob), min_lanes_for_grid(F, k.vec), k);
  const int64_t tiles = (F + static_cast<int64_t>(k.lanes) * k.vec - 1) / (static_cast<int64_t>(k.lanes) * k.vec);
  const int64_t slot_bytes = F * (acc_bytes + (arg ? 8 : 0));
  k.items = knob(knobs, n, kItemsKnob) ? bound_items(knob(knobs, n, kItemsKnob), M, E, slot_bytes)
                                       : default_items(d, M, E, k.lanes, tiles, slot_bytes);
  return k;
}

// edge_dot: lanes cover the F features of one edge; no scratch.
inline LaunchKnobs edge_dot_knobs(const DeviceProps& d, const int64_t* knobs, int64_t n, int64_t M, int64_t E,
                                  int64_t F, int64_t C, int elem_bytes, int64_t align_bytes) {
  LaunchKnobs k;
  const int64_t want_vec = knob(knobs, n, kVecKnob) ? knob(knobs, n, kVecKnob) : 16 / elem_bytes;
  k.vec = pick_vec(static_cast<int>(std::min<int64_t>(want_vec, kMaxExplicitVec)), elem_bytes, C, align_bytes);
  const int64_t want_lanes = knob(knobs, n, kLanesKnob) ? knob(knobs, n, kLanesKnob) : default_lanes(F, k.vec);
  finish_layout(d, want_lanes, knob(knobs, n, kRowsPerBlockKnob), 1, k);
  k.items = knob(knobs, n, kItemsKnob) ? bound_items(knob(knobs, n, kItemsKnob), M, E, 0)
                                       : default_items(d, M, E, k.lanes, 1, 0);
  return k;
}

// Lanes per head dot in edge_dot: enough to cover C / V, at most the group.
inline int edge_dot_head_lanes(int lanes, int64_t C, int vec) {
  const int64_t per_head = (C + vec - 1) / vec;
  return static_cast<int>(std::min<int64_t>(lanes, next_pow2(std::max<int64_t>(per_head, 1))));
}

// edge_softmax / backward: one warp per group.
inline LaunchKnobs edge_softmax_knobs(const DeviceProps& d, const int64_t* knobs, int64_t n, int64_t M,
                                      int64_t E, int64_t H, int acc_bytes) {
  LaunchKnobs k;
  k.lanes = kMaxLanes;
  k.rows_per_block = 8;
  k.vec = 1;
  k.items = knob(knobs, n, kItemsKnob) ? bound_items(knob(knobs, n, kItemsKnob), M, E, 2 * H * acc_bytes)
                                       : default_items(d, M, E, kMaxLanes, 1, 2 * H * acc_bytes);
  return k;
}

inline int softmax_head_lanes(int64_t H) {
  return static_cast<int>(std::min<int64_t>(kMaxLanes, next_pow2(std::max<int64_t>(H, 1))));
}

}  // namespace gpu
}  // namespace gnncompile
