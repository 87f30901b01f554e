// Graph-structure build on the host: a stable O(E) counting sort of edges by destination.
// Torch-free: plain pointers, templated on the index type.
#pragma once
#include <cstdint>
#include <vector>

#include "../common/macros.h"

namespace gnncompile {
namespace cpu {

struct CsrError {
  Status status = Status::Ok;
  int64_t edge = -1;   // offending edge id
  int64_t value = 0;   // offending index value
};

// Validates every index, counts edges per destination and writes rowptr (num_dst + 1 entries,
// exclusive prefix sum). Returns the first bad edge, if any.
template <typename index_t>
CsrError count_and_scan(const index_t* dst, const index_t* src, int64_t num_edges, int64_t num_dst,
                        int64_t num_src, index_t* rowptr) {
  CsrError err;
  for (int64_t r = 0; r <= num_dst; ++r) rowptr[r] = 0;
  for (int64_t e = 0; e < num_edges; ++e) {
    const int64_t d = static_cast<int64_t>(dst[e]);
    const int64_t s = static_cast<int64_t>(src[e]);
    // One unsigned compare covers both negative and too-large indices.
    if (static_cast<uint64_t>(d) >= static_cast<uint64_t>(num_dst)) {
      err.status = Status::DstOutOfRange; err.edge = e; err.value = d;
      return err;
    }
    if (static_cast<uint64_t>(s) >= static_cast<uint64_t>(num_src)) {
      err.status = Status::SrcOutOfRange; err.edge = e; err.value = s;
      return err;
    }
    ++rowptr[d + 1];
  }
  for (int64_t r = 0; r < num_dst; ++r) rowptr[r + 1] += rowptr[r];
  return err;
}

// Stable placement: edges keep their original relative order inside each row, so results
// are deterministic and identical to a stable sort by destination.
//   perm[j] = original edge id of CSR slot j,  col[j] = src[perm[j]].
template <typename index_t>
void place(const index_t* dst, const index_t* src, int64_t num_edges, int64_t num_dst,
           const index_t* rowptr, index_t* col, index_t* perm) {
  std::vector<index_t> cursor(rowptr, rowptr + num_dst);
  for (int64_t e = 0; e < num_edges; ++e) {
    const index_t pos = cursor[dst[e]]++;
    perm[pos] = static_cast<index_t>(e);
    col[pos] = src[e];
  }
}

}  // namespace cpu
}  // namespace gnncompile
