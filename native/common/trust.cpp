// The registry behind trust.h, and the two ops whose outputs inherit facts instead of being
// validated: gnncompile::clone_structure (copies that keep their sources' facts) and
// gnncompile::transpose_structure (the CSC of a CSR). Both are registered for the CPU and CUDA
// keys: they only call ATen and the dispatcher. A third, CPU only:
// gnncompile::adopt_worker_structure, the PooledLoader's record of structures its worker
// processes built.
#include "trust.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace gnncompile {
namespace {

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// One tensor as it was when its facts were recorded: the identity rule of the Python caches
// (gnncompile/ops/identity.py, whose docstring says why this record applies it separately)
// without the fingerprint. The same TensorImpl (a Python tensor wraps one; `.data = other`
// keeps it and swaps its storage and metadata), the same version counter, data pointer,
// sizes, strides, dtype and device.
struct Ref {
  WeakImpl impl;
  int64_t version = 0;
  const void* data = nullptr;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::ScalarType::Undefined;
  at::Device device = at::kCPU;

  static bool recordable(const at::Tensor& t) { return t.defined() && !t.is_inference(); }
  static Ref of(const at::Tensor& t) {
    return Ref{WeakImpl(t.getIntrusivePtr()), t._version(), t.const_data_ptr(), t.sizes().vec(),
               t.strides().vec(), t.scalar_type(), t.device()};
  }
  bool is(const at::Tensor& t) const {
    return t.defined() && !t.is_inference() && !impl.expired() &&
           impl._unsafe_get_target() == t.unsafeGetTensorImpl() && version == t._version() &&
           data == t.const_data_ptr() && t.sizes().equals(sizes) && t.strides().equals(strides) &&
           dtype == t.scalar_type() && device == t.device();
  }
};

struct Entry {
  Ref ref;
  IndexFacts facts;
};

// Tensors recorded, least recently used go first. A structure is three tensors, its CSC three
// more, and each copy the compiled path makes of them (inductor) three or six more per step
// until the copies are freed.
constexpr size_t kMaxEntries = 1024;

// Keyed by TensorImpl address: an entry's weak reference keeps that TensorImpl's memory
// allocated (c10 frees it only when no weak reference is left), so no other tensor can have
// the address while the entry exists.
std::mutex mu;
std::list<Entry> entries;
std::unordered_map<const c10::TensorImpl*, std::list<Entry>::iterator> by_impl;
std::atomic<int64_t> validations{0};

void erase(std::list<Entry>::iterator it) {
  by_impl.erase(it->ref.impl._unsafe_get_target());
  entries.erase(it);
}

// The entry of exactly this tensor (moved to the front), or end(); a stale entry of its
// TensorImpl (its version, storage or layout moved) is dropped.
std::list<Entry>::iterator find(const at::Tensor& t) {
  if (!t.defined()) return entries.end();
  auto m = by_impl.find(t.unsafeGetTensorImpl());
  if (m == by_impl.end()) return entries.end();
  auto it = m->second;
  if (!it->ref.is(t)) {
    erase(it);
    return entries.end();
  }
  entries.splice(entries.begin(), entries, it);
  return it;
}

bool known(const IndexFacts& f) { return f.bound >= 0 || f.distinct || f.offsets_end >= 0; }

}  // namespace

IndexFacts index_facts(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = find(t);
  return it == entries.end() ? IndexFacts{} : it->facts;
}

void record_index_facts(const at::Tensor& t, const IndexFacts& facts) {
  if (!Ref::recordable(t) || !known(facts)) return;
  std::lock_guard<std::mutex> lock(mu);
  auto it = find(t);
  if (it == entries.end()) {
    entries.push_front(Entry{Ref::of(t), IndexFacts{}});
    it = entries.begin();
    by_impl[t.unsafeGetTensorImpl()] = it;
    if (entries.size() > kMaxEntries) erase(std::prev(entries.end()));
  }
  IndexFacts& f = it->facts;
  // every recorded fact is true of the same values: keep the strongest of each
  if (facts.bound >= 0) f.bound = f.bound >= 0 ? std::min(f.bound, facts.bound) : facts.bound;
  f.distinct = f.distinct || facts.distinct;
  if (facts.offsets_end >= 0) f.offsets_end = facts.offsets_end;
}

bool trusted_rowptr(const at::Tensor& rowptr, int64_t num_edges) {
  return index_facts(rowptr).offsets_end == num_edges;
}

bool trusted_ids(const at::Tensor& ids, int64_t bound) {
  const IndexFacts f = index_facts(ids);
  return f.bound >= 0 && f.bound <= bound;
}

bool trusted_permutation(const at::Tensor& perm) {
  const IndexFacts f = index_facts(perm);
  return f.distinct && f.bound >= 0 && f.bound <= perm.numel();
}

void record_built_structure(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                            int64_t num_src) {
  const int64_t E = perm.numel();
  record_index_facts(rowptr, IndexFacts{-1, false, E});
  record_index_facts(col, IndexFacts{num_src, false, -1});
  record_index_facts(perm, IndexFacts{E, true, -1});
}

void count_validation() { validations.fetch_add(1, std::memory_order_relaxed); }
int64_t structure_validations() { return validations.load(std::memory_order_relaxed); }

namespace {

// Copies of `tensors` (any dtype, strides kept, as Tensor.clone), each recorded with the facts
// known of its source: what the compiled path hands out where an inner compiler may reuse an
// op's output buffers (ops/structure.py, ops/hoisted.py).
std::vector<at::Tensor> clone_structure(at::TensorList tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    const IndexFacts f = index_facts(t);
    out.push_back(t.clone());
    record_index_facts(out.back(), f);
  }
  return out;
}

// The CSC (by source, num_src rows) of a CSR (by destination), perm_t in original edge ids:
// build_csr of the CSR's (col, row) pairs in slot order, so that within a source the edges keep
// their CSR order, and perm_t = perm[slot]. rowptr_t and col_t are build_csr's (recorded by it);
// perm_t holds values of perm, so it keeps perm's bound, and, picked once each by a permutation
// (slot), is a permutation where perm is one.
std::tuple<at::Tensor, at::Tensor, at::Tensor> transpose_structure(const at::Tensor& rowptr, const at::Tensor& col,
                                                                  const at::Tensor& perm, int64_t num_src) {
  using BuildCsr = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, int64_t,
                                                                  int64_t);
  static const auto build_csr =
      c10::Dispatcher::singleton().findSchemaOrThrow("gnncompile::build_csr", "").typed<BuildCsr>();
  TORCH_CHECK_VALUE(rowptr.dim() == 1 && rowptr.numel() >= 1 && col.dim() == 1 && perm.dim() == 1 &&
                        col.numel() == perm.numel(),
                    "gnncompile.transpose_structure: rowptr must be 1-D with num_rows + 1 entries, col and perm "
                    "1-D of one length");
  const int64_t M = rowptr.numel() - 1;
  const at::Tensor deg = rowptr.slice(0, 1) - rowptr.slice(0, 0, M);
  const at::Tensor rows = at::repeat_interleave(at::arange(M, rowptr.options()), deg.to(at::kLong));
  auto [rowptr_t, col_t, slot] = build_csr.call(col, rows, num_src, M);
  at::Tensor perm_t = perm.index_select(0, slot);
  IndexFacts pf = index_facts(perm);
  pf.offsets_end = -1;
  pf.distinct = pf.distinct && trusted_permutation(slot);  // picked once each: no value repeats
  record_index_facts(perm_t, pf);                          // values of perm: below its bound
  return {rowptr_t, col_t, perm_t};
}

// A structure that build_csr (and transpose_structure) built in one of the PooledLoader's own
// worker processes (gnncompile/data/loader.py), in a slot buffer shared with this process: the
// worker's record of it is its own, so this process records it here without validating it,
// with build_csr's facts (rowptr over E edges, col below num_src, perm a permutation). CPU
// tensors only: the CPU kernels still range-check every index they read, so a wrong structure
// recorded this way can give wrong results but never reads out of bounds; the CUDA kernels,
// which trust a recorded structure, never see one (the loader prepares structures for CPU
// targets only). The cheap facts are checked here: the shapes and one dtype, rowptr[0] == 0 and
// rowptr[-1] == E (two reads). Not for other callers: anything else is validated at first use.
void adopt_worker_structure(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                            int64_t num_src) {
  TORCH_CHECK_VALUE(rowptr.device().is_cpu() && col.device().is_cpu() && perm.device().is_cpu(),
                    "gnncompile.adopt_worker_structure: CPU tensors only");
  TORCH_CHECK_VALUE(rowptr.dim() == 1 && rowptr.numel() >= 1 && col.dim() == 1 && perm.dim() == 1 &&
                        col.numel() == perm.numel() && rowptr.is_contiguous() && col.is_contiguous() &&
                        perm.is_contiguous(),
                    "gnncompile.adopt_worker_structure: rowptr must be 1-D with num_rows + 1 entries, col and "
                    "perm 1-D of one length, all contiguous");
  TORCH_CHECK_TYPE(rowptr.scalar_type() == at::kLong && col.scalar_type() == at::kLong &&
                       perm.scalar_type() == at::kLong,
                   "gnncompile.adopt_worker_structure: int64 tensors only");
  TORCH_CHECK_VALUE(num_src >= 0, "gnncompile.adopt_worker_structure: num_src must be >= 0");
  const int64_t* rp = rowptr.const_data_ptr<int64_t>();
  TORCH_CHECK_VALUE(rp[0] == 0 && rp[rowptr.numel() - 1] == col.numel(),
                    "gnncompile.adopt_worker_structure: rowptr must run from 0 to the number of edges");
  record_built_structure(rowptr, col, perm, num_src);
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("clone_structure", &clone_structure);
  m.impl("transpose_structure", &transpose_structure);
  m.impl("adopt_worker_structure", &adopt_worker_structure);
}
#ifdef GNNCOMPILE_WITH_CUDA
#if GNNCOMPILE_WITH_CUDA
TORCH_LIBRARY_IMPL(gnncompile, CUDA, m) {
  m.impl("clone_structure", &clone_structure);
  m.impl("transpose_structure", &transpose_structure);
}
#endif
#endif

}  // namespace gnncompile
