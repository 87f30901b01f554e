// gnncompile::fingerprint on the CPU: one parallel pass over an index tensor (see
// ../common/fingerprint.h); the structure cache compares it to notice edits of an edge_index
// that bypass its version counter.
#include <torch/library.h>

#include <atomic>

#include "../common/fingerprint.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

constexpr int64_t kFingerprintGrain = 1 << 16;  // elements per task: small inputs stay on one thread

at::Tensor fingerprint_cpu(const at::Tensor& index_in) {
  const char* op = "gnncompile.fingerprint";
  check_cpu(index_in, op, "index");
  const at::Tensor index = index_in.contiguous();
  const int64_t n = index.numel();
  std::atomic<uint64_t> total{0};
  GNN_DISPATCH_INDEX(index.scalar_type(), op, [&] {
    const index_t* v = index.const_data_ptr<index_t>();
    at::parallel_for(0, n, kFingerprintGrain, [&](int64_t begin, int64_t end) {
      total.fetch_add(fingerprint_sum(v, begin, end), std::memory_order_relaxed);
    });
  });
  at::Tensor out = at::empty({}, index.options().dtype(at::kLong));
  *out.data_ptr<int64_t>() = static_cast<int64_t>(fingerprint_final(total.load(), static_cast<uint64_t>(n)));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) { m.impl("fingerprint", &fingerprint_cpu); }

}  // namespace cpu
}  // namespace gnncompile
