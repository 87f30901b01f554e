// gnncompile::neighbor_sample on the CPU: multi-hop neighbor sampling from a CSC, for mini-batch
// training (gnncompile.data.NeighborSampler). Per hop, every frontier node draws its neighbors
// in parallel (neighbor_sample_core.h: a random stream per (seed, hop, node), so the result does
// not depend on the thread count), then one sequential pass gives new nodes their local index in
// order of first appearance. A hop whose draws cannot fit in the memory available is refused
// before anything is allocated (with replacement a fanout is not bounded by the degrees).
#include <torch/library.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>
#include <limits>
#include <optional>
#include <unordered_map>

#include "glue.h"
#include "neighbor_sample_core.h"

namespace gnncompile {
namespace cpu {
namespace {
constexpr const char* kOp = "gnncompile.neighbor_sample";

// Global node id -> local index. Not disjoint: one dense int32 array of N entries per thread,
// reset (only where it was written) when the call ends, even by an exception. Disjoint: a hash
// map keyed by (seed of the tree, node).
// This thread's dense map of at least n entries, all -1: 2 MiB-aligned and advised to use huge
// pages (it is read at random; with 4 KiB pages nearly every read is also a TLB miss).
int32_t* dense_storage(int64_t n) {
  struct Block {
    int32_t* p = nullptr;
    int64_t n = 0;
    ~Block() { std::free(p); }
  };
  thread_local Block b;
  if (b.n < n) {
    constexpr size_t kHuge = size_t(2) << 20;
    const size_t bytes = (static_cast<size_t>(n) * sizeof(int32_t) + kHuge - 1) / kHuge * kHuge;
    void* p = std::aligned_alloc(kHuge, bytes);
    TORCH_CHECK(p != nullptr, kOp, ": out of memory for a node map of ", n, " entries");
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    std::fill_n(static_cast<int32_t*>(p), bytes / sizeof(int32_t), -1);
    std::free(b.p);
    b.p = static_cast<int32_t*>(p);
    b.n = static_cast<int64_t>(bytes / sizeof(int32_t));
  }
  return b.p;
}

class NodeMap {
 public:
  NodeMap(int64_t num_nodes, bool disjoint) : n_(num_nodes), disjoint_(disjoint) {
    if (!disjoint_) d_ = dense_storage(n_);  // one thread-local lookup per call, not per access
  }
  ~NodeMap() {
    if (!disjoint_)
      for (int64_t v : written_) d_[v] = -1;
  }
  // The local index of (tree, v), or -1.
  int64_t find(int64_t tree, int64_t v) const {
    if (!disjoint_) return d_[v];
    auto it = hash_.find(tree * n_ + v);
    return it == hash_.end() ? -1 : it->second;
  }
  void insert(int64_t tree, int64_t v, int64_t local) {
    if (disjoint_) {
      hash_.emplace(tree * n_ + v, local);
    } else if (d_[v] < 0) {
      d_[v] = static_cast<int32_t>(local);
      written_.push_back(v);
    }
  }
  void prefetch(int64_t v) const {
    if (!disjoint_) __builtin_prefetch(d_ + v);
  }

 private:
  int32_t* d_ = nullptr;
  int64_t n_;
  bool disjoint_;
  std::vector<int64_t> written_;
  std::unordered_map<int64_t, int64_t> hash_;
};

constexpr int64_t kAhead = 48;  // prefetch distance of the gathers, in items

struct Csc {
  const int64_t* colptr;
  const int64_t* row;    // slot -> source (nullptr when pairs are given)
  const int64_t* perm;   // slot -> edge id, or nullptr (edge = slot)
  const int32_t* pairs;  // or (source, edge id) of each slot side by side: one cache line, not two
  int64_t num_nodes, num_slots;
  int64_t source_at(int64_t slot) const { return pairs ? pairs[2 * slot] : row[slot]; }
  bool has_ids() const { return pairs != nullptr || perm != nullptr; }
  int64_t id_at(int64_t slot) const { return pairs ? pairs[2 * slot + 1] : perm[slot]; }
  const void* line_of(int64_t slot) const { return pairs ? static_cast<const void*>(pairs + 2 * slot) : row + slot; }
  bool span_ok(int64_t b, int64_t e) const { return 0 <= b && b <= e && e <= num_slots; }
  [[noreturn]] void bad_span(int64_t v) const {
    TORCH_CHECK_VALUE(false, kOp, ": colptr must be non-decreasing within [0, ", num_slots, "], but node ", v,
                      " spans [", colptr[v], ", ", colptr[v + 1], ")");
    TORCH_INTERNAL_ASSERT(false);
  }
  // The slot range of node v's in-edges; a malformed colptr raises.
  std::pair<int64_t, int64_t> range(int64_t v) const {
    if (!span_ok(colptr[v], colptr[v + 1])) bad_span(v);
    return {colptr[v], colptr[v + 1]};
  }
  [[noreturn]] void bad_source(int64_t slot) const {
    TORCH_CHECK_INDEX(false, kOp, ": row holds node ", source_at(slot), " at slot ", slot, ", out of range for ",
                      num_nodes, " nodes");
    TORCH_INTERNAL_ASSERT(false);
  }
  int64_t source(int64_t slot) const {
    const int64_t u = source_at(slot);
    if (u < 0 || u >= num_nodes) bad_source(slot);
    return u;
  }
};

// A vector whose resize leaves new elements uninitialised (every one is written before it is
// read): no memset of buffers that the sampler fills anyway.
template <typename T>
struct NoInit : std::allocator<T> {
  template <typename U> struct rebind { using other = NoInit<U>; };
  template <typename U, typename... Args> void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) ::new (static_cast<void*>(p)) U; else ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using Index = std::vector<int64_t, NoInit<int64_t>>;

struct Sample {
  Index node, batch, row, col, edge, num_nodes, num_edges;
};

// Bytes this process may still allocate: the kernel's MemAvailable (/proc/meminfo; the free
// pages where it cannot be read), and at most what the address-space limit (RLIMIT_AS,
// `ulimit -v`) leaves above the current size. gnncompile/ops/reference.py reads the same.
int64_t available_bytes() {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t avail = 0;
  bool known = false;
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kb = 0;
    while (!known && std::fgets(line, sizeof line, f))
      known = std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
    std::fclose(f);
    avail = kb * 1024;
  }
  if (!known) avail = static_cast<uint64_t>(sysconf(_SC_AVPHYS_PAGES)) * page;
  rlimit lim{};
  if (getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    unsigned long long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%llu", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    const uint64_t cur = lim.rlim_cur, used = pages * page;
    avail = std::min<uint64_t>(avail, cur > used ? cur - used : 0);
  }
  return static_cast<int64_t>(std::min<uint64_t>(avail, std::numeric_limits<int64_t>::max()));
}

// Hops that need less than this are not checked (no /proc read per batch): failing to allocate
// it is an exception (std::bad_alloc), never a run to the OOM killer.
constexpr int64_t kCheckBytes = int64_t(64) << 20;

// What the op keeps per sampled edge while a hop runs: the sample's row, col and edge, the drawn
// source, a slot in node (and in batch, disjoint) for a new node, and the edge id when there are ids.
int64_t bytes_per_edge(const Csc& g, bool disjoint) {
  return static_cast<int64_t>(sizeof(int64_t)) * (5 + (g.has_ids() ? 1 : 0) + (disjoint ? 1 : 0));
}

// Raises for a hop of `total` draws (-1: past int64) that cannot fit in the memory available,
// before the hop allocates anything.
void check_hop_fits(int64_t hop, int64_t k, bool replace, int64_t F, int64_t total, int64_t per_edge) {
  const char* how = replace ? " with replacement" : "";
  TORCH_CHECK_VALUE(total >= 0, kOp, ": hop ", hop, " would sample more than 2^63 - 1 edges (fanout ", k, how,
                    ", frontier of ", F, " nodes)");
  if (total <= kCheckBytes / per_edge) return;
  const int64_t avail = available_bytes();
  TORCH_CHECK_VALUE(total <= avail / per_edge, kOp, ": hop ", hop, " would sample ", total, " edges (fanout ", k,
                    how, ", frontier of ", F, " nodes): ", total, " x ", per_edge, " bytes, but ", avail,
                    " bytes are available");
}

// The first item of [0, n) for which bad(i) holds, or -1 (for the error after a parallel pass).
template <typename Bad>
int64_t first_bad(int64_t n, const Bad& bad) {
  for (int64_t i = 0; i < n; ++i)
    if (bad(i)) return i;
  return -1;
}

// Pass 1 of a hop (parallel): each frontier node's slot span and draw count, then their prefix
// sum in off; returns the hop's draws, or -1 when their sum overflows int64.
int64_t hop_spans(const Csc& g, const Index& nodes, int64_t begin, int64_t F, int64_t k, bool replace,
                  std::vector<std::pair<int64_t, int64_t>>& span, std::vector<int64_t>& off) {
  std::atomic<bool> bad{false};
  at::parallel_for(0, F, 2048, [&](int64_t f0, int64_t f1) {
    for (int64_t f = f0; f < f1; ++f) {
      if (f + kAhead < f1) __builtin_prefetch(g.colptr + nodes[begin + f + kAhead]);
      const int64_t v = nodes[begin + f], b = g.colptr[v], e = g.colptr[v + 1];
      if (!g.span_ok(b, e)) { bad = true; continue; }
      span[f] = {b, e};
      off[f + 1] = draw_count(e - b, k, replace);
    }
  });
  if (bad) {
    const int64_t f = first_bad(F, [&](int64_t i) {
      const int64_t v = nodes[begin + i];
      return !g.span_ok(g.colptr[v], g.colptr[v + 1]);
    });
    g.bad_span(nodes[begin + f]);
  }
  for (int64_t f = 0; f < F; ++f)
    if (__builtin_add_overflow(off[f + 1], off[f], &off[f + 1])) return -1;
  return off[F];
}

// Where one hop reads its frontier and writes its draws. The frontier is dst[begin, end); new
// sources are appended to src (the same list as dst on a homogeneous graph), their local index
// kept in the node map under map_base + node id (one map holds every node type, each at its own
// base); batch (disjoint only) is the tree of each node of src.
struct Hop {
  const Index& dst;
  Index& src;
  Index& row;
  Index& col;
  Index& edge;
  Index* batch;
  int64_t map_base;
};

// One hop from the frontier: returns the number of sampled edges.
int64_t sample_hop(const Csc& g, Hop s, NodeMap& map, int64_t begin, int64_t end, int64_t hop,
                   int64_t k, bool replace, bool disjoint, int64_t seed) {
  const int64_t F = end - begin;
  std::vector<int64_t> off(F + 1, 0);
  std::vector<std::pair<int64_t, int64_t>> span(F);
  const int64_t total = hop_spans(g, s.dst, begin, F, k, replace, span, off);
  check_hop_fits(hop, k, replace, F, total, bytes_per_edge(g, disjoint));
  const int64_t base = static_cast<int64_t>(s.edge.size());
  s.row.resize(base + total);
  s.col.resize(base + total);
  s.edge.resize(base + total);
  Index src(total), eid(g.has_ids() ? total : 0);
  std::atomic<bool> bad{false};
  // Pass 2 (parallel): draws, then the sources and edge ids of the drawn slots.
  at::parallel_for(0, F, 1024, [&](int64_t f0, int64_t f1) {
    for (int64_t f = f0; f < f1; ++f) {  // the draws (slots) first
      NodeStream rng(seed, hop, begin + f);
      int64_t* slot = s.edge.data() + base + off[f];
      draw_offsets(rng, span[f].second - span[f].first, k, replace, slot);
      for (int64_t t = 0; t < off[f + 1] - off[f]; ++t) {
        slot[t] += span[f].first;
        s.col[base + off[f] + t] = begin + f;
      }
    }
    // then the gathers of the drawn slots' sources and edge ids, prefetched ahead
    const int64_t* slot = s.edge.data() + base;
    bool chunk_bad = false;
    for (int64_t t = off[f0]; t < off[f1]; ++t) {
      if (t + kAhead < off[f1]) {
        __builtin_prefetch(g.line_of(slot[t + kAhead]));
        if (g.perm != nullptr) __builtin_prefetch(g.perm + slot[t + kAhead]);
      }
      const int64_t u = g.source_at(slot[t]);
      chunk_bad |= u < 0 || u >= g.num_nodes;
      if (g.has_ids()) eid[t] = g.id_at(slot[t]);
      src[t] = u;
    }
    if (chunk_bad) bad = true;
  });
  if (bad) g.bad_source(s.edge[base + first_bad(total, [&](int64_t t) {
    const int64_t u = src[t];
    return u < 0 || u >= g.num_nodes;
  })]);
  if (g.has_ids()) std::copy(eid.begin(), eid.end(), s.edge.begin() + base);
  // Pass 3 (sequential): local indices in order of first appearance. (s.dst may be s.src: it
  // is not read from here on, when push_back may move it.)
  s.src.reserve(s.src.size() + total);
  for (int64_t t = 0; t < total; ++t) {
    if (t + kAhead < total) map.prefetch(s.map_base + src[t + kAhead]);
    const int64_t dst = s.col[base + t];
    const int64_t tree = disjoint ? (*s.batch)[dst] : 0;
    int64_t local = map.find(tree, s.map_base + src[t]);
    if (local < 0) {
      local = static_cast<int64_t>(s.src.size());
      map.insert(tree, s.map_base + src[t], local);
      s.src.push_back(src[t]);
      if (disjoint) s.batch->push_back(tree);
    }
    s.row[base + t] = local;
  }
  return total;
}

// directed = false: every edge of the graph between sampled nodes (the induced subgraph).
void induced_edges(const Csc& g, Sample& s, const NodeMap& map) {
  s.row.clear(); s.col.clear(); s.edge.clear();
  for (int64_t i = 0; i < static_cast<int64_t>(s.node.size()); ++i) {
    const auto [b, e] = g.range(s.node[i]);
    for (int64_t p = b; p < e; ++p) {
      const int64_t local = map.find(0, g.source(p));
      if (local < 0) continue;
      s.row.push_back(local);
      s.col.push_back(i);
      s.edge.push_back(p);
    }
  }
  s.num_edges.assign(1, static_cast<int64_t>(s.edge.size()));
}

// Hands a vector's buffer to a tensor without copying it.
at::Tensor to_tensor(Index&& v) {
  auto* owner = new Index(std::move(v));
  return at::from_blob(owner->data(), {static_cast<int64_t>(owner->size())},
                       [owner](void*) { delete owner; }, at::TensorOptions().dtype(at::kLong));
}

void check_inputs(const at::Tensor& colptr, const at::Tensor& row, const at::Tensor& seeds,
                  c10::IntArrayRef num_neighbors, bool directed, bool disjoint) {
  check_cpu(colptr, kOp, "colptr");
  check_cpu(row, kOp, "row");
  check_cpu(seeds, kOp, "seeds");
  const bool pairs = row.dim() == 2;
  TORCH_CHECK_TYPE(colptr.scalar_type() == at::kLong && seeds.scalar_type() == at::kLong &&
                       row.scalar_type() == (pairs ? at::kInt : at::kLong),
                   kOp, ": colptr and seeds must be int64, row int64 (or int32 pairs [E, 2])");
  TORCH_CHECK_VALUE(colptr.dim() == 1 && colptr.numel() >= 1 && seeds.dim() == 1 &&
                        (row.dim() == 1 || (pairs && row.size(1) == 2)),
                    kOp, ": colptr (num_nodes + 1 entries) and seeds must be 1-D, row [E] or pairs [E, 2]");
  for (int64_t k : num_neighbors)
    TORCH_CHECK_VALUE(k >= -1, kOp, ": num_neighbors entries must be >= 0, or -1 for all, got ", k);
  TORCH_CHECK_VALUE(directed || !disjoint, kOp, ": directed=False (the induced subgraph) is not "
                    "supported with disjoint=True");
}

// Slots -> edge ids through perm (parallel gather), in place.
void slots_to_edge_ids(const Csc& g, Index& edge) {
  if (!g.has_ids()) return;
  at::parallel_for(0, static_cast<int64_t>(edge.size()), 8192, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) edge[t] = g.id_at(edge[t]);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
neighbor_sample_cpu(const at::Tensor& colptr_in, const at::Tensor& row_in, const at::Tensor& seeds_in,
                    c10::IntArrayRef num_neighbors, bool replace, bool directed, bool disjoint, int64_t seed,
                    const std::optional<at::Tensor>& perm_in) {
  check_inputs(colptr_in, row_in, seeds_in, num_neighbors, directed, disjoint);
  const at::Tensor colptr = colptr_in.contiguous(), row = row_in.contiguous(), seeds = seeds_in.contiguous();
  at::Tensor perm;
  if (perm_in.has_value() && perm_in->defined()) {
    check_cpu(*perm_in, kOp, "perm");
    TORCH_CHECK_VALUE(perm_in->scalar_type() == at::kLong && perm_in->dim() == 1 && perm_in->numel() == row.size(0),
                      kOp, ": perm must be int64 with one entry per slot of row");
    perm = perm_in->contiguous();
  }
  const bool pairs = row.dim() == 2;
  TORCH_CHECK_VALUE(!(pairs && perm.defined()), kOp, ": give edge ids either in the pairs or as perm");
  const Csc g{colptr.const_data_ptr<int64_t>(), pairs ? nullptr : row.const_data_ptr<int64_t>(),
              perm.defined() ? perm.const_data_ptr<int64_t>() : nullptr,
              pairs ? row.const_data_ptr<int32_t>() : nullptr, colptr.numel() - 1, row.size(0)};
  TORCH_CHECK_VALUE(seeds.numel() < std::numeric_limits<int32_t>::max(), kOp, ": too many seeds");
  const int64_t S = seeds.numel();
  Sample s;
  s.node.assign(seeds.const_data_ptr<int64_t>(), seeds.const_data_ptr<int64_t>() + S);
  NodeMap map(g.num_nodes, disjoint);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t v = s.node[i];
    TORCH_CHECK_INDEX(0 <= v && v < g.num_nodes, kOp, ": seed node ", v, " (position ", i,
                      ") is out of range for a graph of ", g.num_nodes, " nodes");
    if (disjoint) s.batch.push_back(i);
    map.insert(disjoint ? i : 0, v, i);
  }
  s.num_nodes.push_back(S);
  int64_t begin = 0;
  for (int64_t h = 0; h < static_cast<int64_t>(num_neighbors.size()); ++h) {
    const int64_t end = static_cast<int64_t>(s.node.size());
    s.num_edges.push_back(sample_hop(g, Hop{s.node, s.node, s.row, s.col, s.edge, &s.batch, 0}, map, begin, end,
                                     h, num_neighbors[h], replace, disjoint, seed));
    s.num_nodes.push_back(static_cast<int64_t>(s.node.size()) - end);
    TORCH_CHECK_VALUE(s.node.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()), kOp,
                      ": the sample exceeds 2^31 nodes");
    begin = end;
  }
  if (!directed) {
    induced_edges(g, s, map);
    slots_to_edge_ids(g, s.edge);
  }
  return {to_tensor(std::move(s.node)), to_tensor(std::move(s.row)), to_tensor(std::move(s.col)),
          to_tensor(std::move(s.edge)), to_tensor(std::move(s.batch)), to_tensor(std::move(s.num_nodes)),
          to_tensor(std::move(s.num_edges))};
}

// The per-edge-type seed of hetero_neighbor_sample: the streams of edge type t are those of a
// homogeneous sample with this seed (gnncompile/ops/reference.py: edge_type_seed).
int64_t edge_type_seed(int64_t seed, int64_t t) {
  return static_cast<int64_t>(mix64(static_cast<uint64_t>(seed) ^ (static_cast<uint64_t>(t + 1) * 0xD6E8FEB86659FD93ull)) >> 1);
}

// Heterogeneous multi-hop sampling. Edge type t has its own CSC (colptr over its destination
// type's nodes, row/pairs = sources of its source type). Hop h: for each edge type in order, the
// nodes of its destination type added by hop h - 1 (hop 0: the seeds, of input_type) draw
// num_neighbors[t * num_hops + h] of their in-edges of that type; new sources join their type's
// list in order of first appearance (across edge types, in edge-type order). Directed, not disjoint.
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
           at::Tensor, at::Tensor>
hetero_neighbor_sample_cpu(at::TensorList colptrs, at::TensorList rows, const c10::List<std::optional<at::Tensor>>& perms,
                           c10::IntArrayRef edge_src, c10::IntArrayRef edge_dst, c10::IntArrayRef num_nodes,
                           const at::Tensor& seeds_in, int64_t input_type, c10::IntArrayRef num_neighbors,
                           int64_t num_hops, bool replace, int64_t seed) {
  constexpr const char* op = "gnncompile.hetero_neighbor_sample";
  const int64_t T = static_cast<int64_t>(colptrs.size()), NT = static_cast<int64_t>(num_nodes.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(rows.size()) == T && static_cast<int64_t>(perms.size()) == T &&
                        static_cast<int64_t>(edge_src.size()) == T && static_cast<int64_t>(edge_dst.size()) == T,
                    op, ": colptrs, rows, perms, edge_src and edge_dst need one entry per edge type");
  TORCH_CHECK_VALUE(num_hops >= 0 && static_cast<int64_t>(num_neighbors.size()) == T * num_hops, op,
                    ": num_neighbors must hold num_hops entries per edge type");
  TORCH_CHECK_VALUE(0 <= input_type && input_type < NT, op, ": input_type ", input_type, " is not a node type");
  std::vector<int64_t> base(NT + 1, 0);
  for (int64_t n = 0; n < NT; ++n) {
    TORCH_CHECK_VALUE(num_nodes[n] >= 0, op, ": node type ", n, " has a negative node count");
    base[n + 1] = base[n] + num_nodes[n];
  }
  std::vector<at::Tensor> keep;  // contiguous copies, alive while the Csc views point into them
  std::vector<Csc> g;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = edge_src[t], d = edge_dst[t];
    TORCH_CHECK_VALUE(0 <= s && s < NT && 0 <= d && d < NT, op, ": edge type ", t, " joins unknown node types");
    const at::Tensor seeds_dummy = at::empty({0}, at::kLong);
    check_inputs(colptrs[t], rows[t], seeds_dummy, num_neighbors.slice(t * num_hops, num_hops), true, false);
    TORCH_CHECK_VALUE(colptrs[t].numel() == num_nodes[d] + 1, op, ": the colptr of edge type ", t, " has ",
                      colptrs[t].numel(), " entries for ", num_nodes[d], " destination nodes");
    const at::Tensor colptr = colptrs[t].contiguous(), row = rows[t].contiguous();
    const bool pairs = row.dim() == 2;
    at::Tensor perm;
    const std::optional<at::Tensor> p = perms.get(t);
    if (p.has_value() && p->defined()) {
      check_cpu(*p, op, "perm");
      TORCH_CHECK_VALUE(!pairs && p->scalar_type() == at::kLong && p->dim() == 1 && p->numel() == row.size(0), op,
                        ": perm of edge type ", t, " must be int64 with one entry per slot of row (and no pairs)");
      perm = p->contiguous();
    }
    keep.insert(keep.end(), {colptr, row, perm});
    g.push_back(Csc{colptr.const_data_ptr<int64_t>(), pairs ? nullptr : row.const_data_ptr<int64_t>(),
                    perm.defined() ? perm.const_data_ptr<int64_t>() : nullptr,
                    pairs ? row.const_data_ptr<int32_t>() : nullptr, num_nodes[s], row.size(0)});
  }
  check_cpu(seeds_in, op, "seeds");
  TORCH_CHECK_TYPE(seeds_in.scalar_type() == at::kLong && seeds_in.dim() == 1, op, ": seeds must be 1-D int64");
  const at::Tensor seeds = seeds_in.contiguous();
  const int64_t S = seeds.numel();
  std::vector<Index> node(NT), row(T), col(T), edge(T);
  std::vector<int64_t> n_nodes(NT * (num_hops + 1), 0), n_edges(T * num_hops, 0);
  NodeMap map(base[NT], false);
  node[input_type].assign(seeds.const_data_ptr<int64_t>(), seeds.const_data_ptr<int64_t>() + S);
  for (int64_t i = 0; i < S; ++i) {
    const int64_t v = node[input_type][i];
    TORCH_CHECK_INDEX(0 <= v && v < num_nodes[input_type], op, ": seed node ", v, " (position ", i,
                      ") is out of range for ", num_nodes[input_type], " nodes of the input type");
    map.insert(0, base[input_type] + v, i);
  }
  n_nodes[input_type * (num_hops + 1)] = static_cast<int64_t>(node[input_type].size());
  std::vector<int64_t> begin(NT, 0), end(NT);
  for (int64_t h = 0; h < num_hops; ++h) {
    for (int64_t n = 0; n < NT; ++n) end[n] = static_cast<int64_t>(node[n].size());
    for (int64_t t = 0; t < T; ++t) {
      const int64_t s = edge_src[t], d = edge_dst[t];
      // on a type's own edges (s == d) dst and src are one list: Hop reads the frontier first
      n_edges[t * num_hops + h] =
          sample_hop(g[t], Hop{node[d], node[s], row[t], col[t], edge[t], nullptr, base[s]}, map, begin[d], end[d], h,
                     num_neighbors[t * num_hops + h], replace, false, edge_type_seed(seed, t));
    }
    for (int64_t n = 0; n < NT; ++n) {
      n_nodes[n * (num_hops + 1) + h + 1] = static_cast<int64_t>(node[n].size()) - end[n];
      TORCH_CHECK_VALUE(node[n].size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()), op,
                        ": the sample exceeds 2^31 nodes of one type");
      begin[n] = end[n];
    }
  }
  std::vector<at::Tensor> node_out, row_out, col_out, edge_out;
  for (int64_t n = 0; n < NT; ++n) node_out.push_back(to_tensor(std::move(node[n])));
  for (int64_t t = 0; t < T; ++t) {
    row_out.push_back(to_tensor(std::move(row[t])));
    col_out.push_back(to_tensor(std::move(col[t])));
    edge_out.push_back(to_tensor(std::move(edge[t])));
  }
  auto counts = [](std::vector<int64_t>& v, int64_t r, int64_t c) {
    return at::tensor(v, at::kLong).reshape({r, c});
  };
  return {node_out, row_out, col_out, edge_out, counts(n_nodes, NT, num_hops + 1), counts(n_edges, T, num_hops)};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("neighbor_sample", &neighbor_sample_cpu);
  m.impl("hetero_neighbor_sample", &hetero_neighbor_sample_cpu);
}

}  // namespace cpu
}  // namespace gnncompile
