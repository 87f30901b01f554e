// The CPU attention cores alone (native/cpu/attention_dot_core.h, attention_v2_core.h), torch-free,
// on one thread: forward, the backward's CSR pass and its CSC pass, on a power-law graph (the
// generator's scheme: endpoints drawn with probability ~ (rank + 1)^-0.8 over shuffled ranks),
// the large buffers huge-page advised as the compiled step's are (gnncompile.hardware.memory).
// NO_EDGE_GRAD=1: the backward without the edge features' gradient (as for a model's input
// features). Best of 5 (or $REPEATS) in ms, and a checksum of the outputs (equal checksums: the same results to its
// printed digits). Used to compare two versions of a core: build it against each tree's headers.
//
//   g++ -O3 -march=native -fno-trapping-math -std=c++17 -I native/cpu \
//       benchmarks/native/attention_cores.cpp -o /tmp/attention_cores
//   /tmp/attention_cores [dot|v2] [nodes, default 100000] [edges, 1000000] [heads, 4] [channels, 32]
//                        [edge features (dot), 16]
//
// Defaults: dot: H = 4, C = 32, edge features De = 16 (TransformerConv(edge_dim=16)'s first layer
// in benchmarks/models.py); v2: H = 4, C = 32, no edge term (GATv2's first layer there). The zoo's
// TransformerConv-edge: dot 2000 16000 4 8 8.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "attention_dot_core.h"
#include "attention_v2_core.h"

using namespace gnncompile::cpu;

template <class T>
struct HugeAlloc {
  using value_type = T;
  HugeAlloc() = default;
  template <class U>
  HugeAlloc(const HugeAlloc<U>&) {}
  T* allocate(size_t n) {
    const size_t page = size_t(2) << 20, bytes = (n * sizeof(T) + page - 1) / page * page;
    void* p = aligned_alloc(page, bytes);
    if (p == nullptr) throw std::bad_alloc();
    madvise(p, bytes, MADV_HUGEPAGE);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { free(p); }
};
template <class T, class U>
bool operator==(const HugeAlloc<T>&, const HugeAlloc<U>&) { return true; }
template <class T, class U>
bool operator!=(const HugeAlloc<T>&, const HugeAlloc<U>&) { return false; }
template <class T>
using vec = std::vector<T, HugeAlloc<T>>;

struct Graph {
  int64_t N = 0, E = 0;
  vec<int64_t> rp, col, perm, rpt, colt, permt;
};

static Graph power_law(int64_t N, int64_t E, std::mt19937_64& rng) {
  std::vector<double> w(N);
  for (int64_t i = 0; i < N; ++i) w[i] = std::pow(i + 1.0, -0.8);
  std::discrete_distribution<int64_t> pick(w.begin(), w.end());
  std::vector<int64_t> rs(N), rd(N), src(E), dst(E);
  std::iota(rs.begin(), rs.end(), 0);
  std::iota(rd.begin(), rd.end(), 0);
  std::shuffle(rs.begin(), rs.end(), rng);
  std::shuffle(rd.begin(), rd.end(), rng);
  for (int64_t e = 0; e < E; ++e) {
    src[e] = rs[pick(rng)];
    dst[e] = rd[pick(rng)];
  }
  Graph g;
  g.N = N;
  g.E = E;
  auto build = [&](const std::vector<int64_t>& key, const std::vector<int64_t>& other, vec<int64_t>& rp,
                   vec<int64_t>& col, vec<int64_t>& perm) {
    rp.assign(N + 1, 0);
    for (int64_t k : key) rp[k + 1]++;
    for (int64_t i = 0; i < N; ++i) rp[i + 1] += rp[i];
    std::vector<int64_t> pos(rp.begin(), rp.end() - 1);
    col.resize(E);
    perm.resize(E);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t p = pos[key[e]]++;
      col[p] = other[e];
      perm[p] = e;
    }
  };
  build(dst, src, g.rp, g.col, g.perm);
  build(src, dst, g.rpt, g.colt, g.permt);
  return g;
}

template <class F>
static double best_ms(F f) {
  const char* env = getenv("REPEATS");  // best of REPEATS (default 5); more for a sampling profiler
  const int repeats = env != nullptr && atoi(env) > 0 ? atoi(env) : 5;
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto t = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
  }
  return best;
}

template <class V>
static double total(const V& v) {
  double s = 0;
  for (auto x : v) s += x;
  return s;
}

int main(int argc, char** argv) {
  const std::string op = argc > 1 ? argv[1] : "dot";
  const int64_t N = argc > 2 ? atoll(argv[2]) : 100000, E = argc > 3 ? atoll(argv[3]) : 1000000,
                H = argc > 4 ? atoll(argv[4]) : 4, C = argc > 5 ? atoll(argv[5]) : 32, F = H * C,
                De = argc > 6 ? atoll(argv[6]) : 16;
  if (op != "dot" && op != "v2") {
    fprintf(stderr, "usage: %s [dot|v2] [nodes] [edges] [heads] [channels] [edge features]\n", argv[0]);
    return 2;
  }
  std::mt19937_64 rng(0);
  Graph g = power_law(N, E, rng);
  auto rnd = [&](int64_t n) {
    vec<float> v(n);
    std::normal_distribution<float> nd;
    for (auto& x : v) x = nd(rng);
    return v;
  };
  double tf = 0, tb = 0, ts = 0, cs = 0;
  if (op == "dot") {
    auto q = rnd(N * F), k = rnd(N * F), v = rnd(N * F), qe = rnd(N * H * De), ea = rnd(E * De);
    auto gr = rnd(N * F), ge = rnd(N * H * De);
    AttentionDotArgs<float, int64_t> a;
    a.rowptr = g.rp.data(); a.col = g.col.data(); a.perm = g.perm.data();
    a.rowptr_t = g.rpt.data(); a.col_t = g.colt.data(); a.perm_t = g.permt.data();
    a.q = q.data(); a.k = k.data(); a.v = v.data(); a.qe = qe.data(); a.ea = ea.data();
    a.N = N; a.M = N; a.E = E; a.H = H; a.C = C; a.De = De; a.logit_scale = 1.0f / std::sqrt(float(C));
    vec<float> out(N * F), oe(N * H * De), stats(N * 2 * H), gq(N * F), gk(N * F), gv(N * F), gqe(N * H * De),
        gea(E * De);
    vec<char> rec(E * dot_record_bytes<float>(H) + 64);
    char* r = rec.data() + (64 - reinterpret_cast<uintptr_t>(rec.data()) % 64) % 64;
    tf = best_ms([&] { attention_dot_rows<float, int64_t>(a, out.data(), oe.data(), stats.data(), 0, N); });
    tb = best_ms([&] {
      attention_dot_dst_rows<float, int64_t>(a, out.data(), oe.data(), gr.data(), ge.data(), stats.data(), gq.data(),
                                             gqe.data(), getenv("NO_EDGE_GRAD") ? nullptr : gea.data(), r, 0, N);
    });
    ts = best_ms([&] { attention_dot_source_rows<float, int64_t>(a, gr.data(), r, gk.data(), gv.data(), 0, N); });
    cs = total(out) + total(gq) + total(gk) + total(gv) + total(gea);
  } else {
    auto xl = rnd(N * F), xr = rnd(N * F), att = rnd(F), gr = rnd(N * F);
    AttentionV2Args<float, int64_t> a;
    a.rowptr = g.rp.data(); a.col = g.col.data(); a.perm = g.perm.data();
    a.rowptr_t = g.rpt.data(); a.col_t = g.colt.data(); a.perm_t = g.permt.data();
    a.xl = xl.data(); a.xr = xr.data(); a.att = att.data(); a.N = N; a.M = N; a.E = E; a.H = H; a.C = C;
    vec<float> out(N * F), stats(N * 2 * H), gxr(N * F), gxl(N * F), gatt(F);
    vec<char> rec(E * record_bytes<float>(H, F) + 64);
    char* r = rec.data() + (64 - reinterpret_cast<uintptr_t>(rec.data()) % 64) % 64;
    tf = best_ms([&] { attention_v2_rows<float, int64_t>(a, out.data(), stats.data(), 0, N); });
    tb = best_ms([&] {
      std::fill(gatt.begin(), gatt.end(), 0.0f);
      attention_v2_dst_rows<float, int64_t>(a, out.data(), gr.data(), stats.data(), gxr.data(), gatt.data(), r,
                                            nullptr, 0, N);
    });
    ts = best_ms([&] { attention_v2_source_rows<float, int64_t>(a, gr.data(), r, gxl.data(), 0, N); });
    cs = total(out) + total(gxr) + total(gxl) + total(gatt);
  }
  printf("%s nodes=%lld edges=%lld H=%lld C=%lld De=%lld: forward %.1f ms, CSR pass %.1f ms, CSC pass %.1f ms (one thread, best of REPEATS); "
         "checksum %.6g\n",
         op.c_str(), static_cast<long long>(N), static_cast<long long>(E), static_cast<long long>(H),
         static_cast<long long>(C), static_cast<long long>(De), tf, tb, ts, cs);
  return 0;
}
