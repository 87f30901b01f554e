// gnncompile::neighbor_sample on the CPU: multi-hop neighbor sampling from a CSC, for mini-batch
// training (gnncompile.data.NeighborSampler). Per hop, every frontier node draws its neighbors
// in parallel (neighbor_sample_core.h: a random stream per (seed, hop, node), so the result does
// not depend on the thread count), then one sequential pass gives new nodes their local index in
// order of first appearance.
#include <torch/library.h>

#include <unordered_map>

#include "glue.h"
#include "neighbor_sample_core.h"

namespace gnncompile {
namespace cpu {
namespace {

constexpr const char* kOp = "gnncompile.neighbor_sample";

// Global node id -> local index. Not disjoint: one dense array of N entries per thread, reset
// (only where it was written) when the call ends, even by an exception. Disjoint: a hash map
// keyed by (seed of the tree, node).
class NodeMap {
 public:
  NodeMap(int64_t num_nodes, bool disjoint) : n_(num_nodes), disjoint_(disjoint) {
    if (!disjoint_ && static_cast<int64_t>(dense().size()) < n_) dense().resize(n_, -1);
  }
  ~NodeMap() {
    if (!disjoint_)
      for (int64_t v : written_) dense()[v] = -1;
  }
  // The local index of (tree, v), or -1.
  int64_t find(int64_t tree, int64_t v) const {
    if (!disjoint_) return dense()[v];
    auto it = hash_.find(tree * n_ + v);
    return it == hash_.end() ? -1 : it->second;
  }
  void insert(int64_t tree, int64_t v, int64_t local) {
    if (disjoint_) {
      hash_.emplace(tree * n_ + v, local);
    } else if (dense()[v] < 0) {
      dense()[v] = local;
      written_.push_back(v);
    }
  }

 private:
  static std::vector<int64_t>& dense() {
    thread_local std::vector<int64_t> d;
    return d;
  }
  int64_t n_;
  bool disjoint_;
  std::vector<int64_t> written_;
  std::unordered_map<int64_t, int64_t> hash_;
};

struct Csc {
  const int64_t* colptr;
  const int64_t* row;
  int64_t num_nodes, num_slots;
  // The slot range of node v's in-edges; a malformed colptr raises.
  std::pair<int64_t, int64_t> range(int64_t v) const {
    const int64_t b = colptr[v], e = colptr[v + 1];
    TORCH_CHECK_VALUE(0 <= b && b <= e && e <= num_slots, kOp, ": colptr must be non-decreasing within [0, ",
                      num_slots, "], but node ", v, " spans [", b, ", ", e, ")");
    return {b, e};
  }
  int64_t source(int64_t slot) const {
    const int64_t u = row[slot];
    TORCH_CHECK_INDEX(0 <= u && u < num_nodes, kOp, ": row holds node ", u, " at slot ", slot,
                      ", out of range for ", num_nodes, " nodes");
    return u;
  }
};

struct Sample {
  std::vector<int64_t> node, batch, row, col, edge, num_nodes, num_edges;
};

// One hop from the frontier [begin, end) of s.node: returns the number of sampled edges.
int64_t sample_hop(const Csc& g, Sample& s, NodeMap& map, int64_t begin, int64_t end, int64_t hop,
                   int64_t k, bool replace, bool disjoint, int64_t seed) {
  const int64_t F = end - begin;
  std::vector<int64_t> off(F + 1, 0);
  std::vector<std::pair<int64_t, int64_t>> span(F);
  for (int64_t f = 0; f < F; ++f) {  // ranges checked here, on one thread, so errors raise
    span[f] = g.range(s.node[begin + f]);
    off[f + 1] = off[f] + draw_count(span[f].second - span[f].first, k, replace);
  }
  std::vector<int64_t> slot(off[F]);
  at::parallel_for(0, F, 1024, [&](int64_t f0, int64_t f1) {
    for (int64_t f = f0; f < f1; ++f) {
      NodeStream rng(seed, hop, begin + f);
      int64_t* out = slot.data() + off[f];
      draw_offsets(rng, span[f].second - span[f].first, k, replace, out);
      for (int64_t t = 0; t < off[f + 1] - off[f]; ++t) out[t] += span[f].first;
    }
  });
  for (int64_t f = 0; f < F; ++f) {
    const int64_t dst = begin + f;
    const int64_t tree = disjoint ? s.batch[dst] : 0;
    for (int64_t t = off[f]; t < off[f + 1]; ++t) {
      const int64_t u = g.source(slot[t]);
      int64_t local = map.find(tree, u);
      if (local < 0) {
        local = static_cast<int64_t>(s.node.size());
        map.insert(tree, u, local);
        s.node.push_back(u);
        if (disjoint) s.batch.push_back(tree);
      }
      s.row.push_back(local);
      s.col.push_back(dst);
      s.edge.push_back(slot[t]);
    }
  }
  return off[F];
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

at::Tensor to_tensor(const std::vector<int64_t>& v) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
  if (!v.empty()) std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
  return t;
}

void check_inputs(const at::Tensor& colptr, const at::Tensor& row, const at::Tensor& seeds,
                  c10::IntArrayRef num_neighbors, bool directed, bool disjoint) {
  check_cpu(colptr, kOp, "colptr");
  check_cpu(row, kOp, "row");
  check_cpu(seeds, kOp, "seeds");
  TORCH_CHECK_TYPE(colptr.scalar_type() == at::kLong && row.scalar_type() == at::kLong &&
                       seeds.scalar_type() == at::kLong,
                   kOp, ": colptr, row and seeds must be int64");
  TORCH_CHECK_VALUE(colptr.dim() == 1 && colptr.numel() >= 1 && row.dim() == 1 && seeds.dim() == 1, kOp,
                    ": colptr (num_nodes + 1 entries), row and seeds must be 1-D");
  for (int64_t k : num_neighbors)
    TORCH_CHECK_VALUE(k >= -1, kOp, ": num_neighbors entries must be >= 0, or -1 for all, got ", k);
  TORCH_CHECK_VALUE(directed || !disjoint, kOp, ": directed=False (the induced subgraph) is not "
                    "supported with disjoint=True");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
neighbor_sample_cpu(const at::Tensor& colptr_in, const at::Tensor& row_in, const at::Tensor& seeds_in,
                    c10::IntArrayRef num_neighbors, bool replace, bool directed, bool disjoint, int64_t seed) {
  check_inputs(colptr_in, row_in, seeds_in, num_neighbors, directed, disjoint);
  const at::Tensor colptr = colptr_in.contiguous(), row = row_in.contiguous(), seeds = seeds_in.contiguous();
  const Csc g{colptr.const_data_ptr<int64_t>(), row.const_data_ptr<int64_t>(), colptr.numel() - 1, row.numel()};
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
    s.num_edges.push_back(sample_hop(g, s, map, begin, end, h, num_neighbors[h], replace, disjoint, seed));
    s.num_nodes.push_back(static_cast<int64_t>(s.node.size()) - end);
    begin = end;
  }
  if (!directed) induced_edges(g, s, map);
  return {to_tensor(s.node), to_tensor(s.row), to_tensor(s.col), to_tensor(s.edge), to_tensor(s.batch),
          to_tensor(s.num_nodes), to_tensor(s.num_edges)};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) { m.impl("neighbor_sample", &neighbor_sample_cpu); }

}  // namespace cpu
}  // namespace gnncompile
