// The registry behind trust.h, and gnncompile::clone_structure (a copy that keeps its source's
// facts), registered for the CPU and CUDA keys: it only calls ATen.
#include "trust.h"

#include <torch/library.h>

#include <algorithm>
#include <list>
#include <mutex>
#include <optional>
#include <tuple>
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
  Ref rowptr, perm;
  std::optional<Ref> col;  // the col its col_bound is about
  StructureFacts facts;
};

constexpr size_t kMaxEntries = 256;  // least recently used go first

std::mutex mu;
std::list<Entry> entries;

std::list<Entry>::iterator find(const at::Tensor& rowptr, const at::Tensor& perm) {
  for (auto it = entries.begin(); it != entries.end(); ++it)
    if (it->rowptr.is(rowptr) && it->perm.is(perm)) return it;
  return entries.end();
}

}  // namespace

StructureFacts structure_facts(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = find(rowptr, perm);
  if (it == entries.end()) return {};
  entries.splice(entries.begin(), entries, it);
  StructureFacts f = it->facts;
  if (!col.defined() || !it->col || !it->col->is(col)) f.col_bound = -1;
  return f;
}

void record_structure_facts(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                            const StructureFacts& facts) {
  if (!Ref::recordable(rowptr) || !Ref::recordable(perm)) return;
  const bool with_col = Ref::recordable(col) && facts.col_bound >= 0;
  std::lock_guard<std::mutex> lock(mu);
  auto it = find(rowptr, perm);
  if (it == entries.end()) {
    entries.push_front(Entry{Ref::of(rowptr), Ref::of(perm), std::nullopt, StructureFacts{}});
    it = entries.begin();
    if (entries.size() > kMaxEntries) entries.pop_back();
  } else {
    entries.splice(entries.begin(), entries, it);
  }
  StructureFacts& f = it->facts;
  f.ranges_ok = f.ranges_ok || facts.ranges_ok;
  f.perm_unique = f.perm_unique || facts.perm_unique;
  if (with_col) {
    const bool same_col = it->col && it->col->is(col);
    f.col_bound = same_col && f.col_bound >= 0 ? std::min(f.col_bound, facts.col_bound) : facts.col_bound;
    it->col = Ref::of(col);
  }
}

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> clone_structure(const at::Tensor& rowptr, const at::Tensor& col,
                                                              const at::Tensor& perm) {
  const StructureFacts f = structure_facts(rowptr, col, perm);
  at::Tensor r = rowptr.clone(), c = col.clone(), p = perm.clone();
  if (f.ranges_ok || f.perm_unique) record_structure_facts(r, c, p, f);
  return {r, c, p};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) { m.impl("clone_structure", &clone_structure); }
#ifdef GNNCOMPILE_WITH_CUDA
#if GNNCOMPILE_WITH_CUDA
TORCH_LIBRARY_IMPL(gnncompile, CUDA, m) { m.impl("clone_structure", &clone_structure); }
#endif
#endif

}  // namespace gnncompile
