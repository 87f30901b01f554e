// The pooled loader's collation on the CPU (gnncompile.data.PooledLoader):
//
//   collate_rows(values, starts, sizes, idx, out, incs?)
//     out[o_b : o_b + sizes[idx[b]]] = values[starts[idx[b]] : ... + sizes[idx[b]]] (+ inc_b)
//     for b = 0..B-1, o_b = sizes[idx[0]] + ... + sizes[idx[b-1]], and with incs given
//     inc_b = incs[idx[0]] + ... + incs[idx[b-1]] (e.g. node offsets added to edge_index).
//   segment_ids(sizes, idx, out, ptr)
//     out[o_b : o_b + sizes[idx[b]]] = b (the `batch` vector), ptr = [0, o_1, ..., o_B].
//
// One pass of memcpy per graph instead of a dozen small torch ops per attribute; serial on
// purpose (a batch is tens of kilobytes: a parallel region costs more than the copy). This file
// checks the inputs; the copy loops are in collate_core.h.
#include <torch/library.h>

#include "collate_core.h"
#include "glue.h"

namespace gnncompile {
namespace cpu {
namespace {

void check_index_vectors(const at::Tensor& starts, const at::Tensor& sizes, const at::Tensor& idx,
                         const char* op) {
  TORCH_CHECK_TYPE(starts.scalar_type() == at::kLong && sizes.scalar_type() == at::kLong &&
                       idx.scalar_type() == at::kLong,
                   op, ": starts, sizes and idx must be int64");
  TORCH_CHECK_VALUE(starts.dim() == 1 && sizes.dim() == 1 && idx.dim() == 1 &&
                        starts.numel() == sizes.numel() && starts.is_contiguous() &&
                        sizes.is_contiguous() && idx.is_contiguous(),
                    op, ": starts and sizes must be contiguous 1-D of one length, idx 1-D");
}

// total + n for 0 <= total <= cap and n >= 0, raising when the sum exceeds cap. Compares n with
// cap - total (which cannot overflow) instead of forming total + n (which can, for sizes near
// 2^63, and would then pass the check and write past out).
int64_t add_within(int64_t total, int64_t n, int64_t cap, const char* op, const char* what) {
  TORCH_CHECK_VALUE(n <= cap - total, op, ": the batch needs more ", what, " than out holds (", cap,
                    "): ", total, " before a graph of ", n);
  return total + n;
}

void collate_rows_cpu(const at::Tensor& values, const at::Tensor& starts, const at::Tensor& sizes,
                      const at::Tensor& idx, at::Tensor out, const std::optional<at::Tensor>& incs) {
  const char* op = "gnncompile.collate_rows";
  check_cpu(values, op, "values");
  check_cpu(out, op, "out");
  check_index_vectors(starts, sizes, idx, op);
  TORCH_CHECK_VALUE(values.is_contiguous() && out.is_contiguous(), op,
                    ": values and out must be contiguous");
  TORCH_CHECK_TYPE(values.scalar_type() == out.scalar_type(), op, ": values and out differ in dtype");
  TORCH_CHECK_VALUE(values.dim() >= 1 && values.dim() == out.dim() &&
                        values.sizes().slice(1) == out.sizes().slice(1),
                    op, ": values and out must agree in every dimension but the first");
  const int64_t T = values.size(0);
  const int64_t cap = out.size(0);
  const int64_t row = T > 0 ? values.numel() / T : 0;
  const int64_t G = starts.numel();
  const int64_t B = idx.numel();
  const int64_t* st = starts.const_data_ptr<int64_t>();
  const int64_t* sz = sizes.const_data_ptr<int64_t>();
  const int64_t* id = idx.const_data_ptr<int64_t>();
  const int64_t* inc = nullptr;
  if (incs.has_value()) {
    TORCH_CHECK_TYPE(incs->scalar_type() == at::kLong && incs->dim() == 1 &&
                         incs->numel() == G && incs->is_contiguous(),
                     op, ": incs must be contiguous int64 with one entry per graph");
    inc = incs->const_data_ptr<int64_t>();
  }
  // validate everything before writing anything; no check forms a sum that can overflow
  int64_t total = 0, inc_sum = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t g = id[b];
    TORCH_CHECK_INDEX(g >= 0 && g < G, op, ": graph index ", g, " out of range for ", G, " graphs");
    TORCH_CHECK_INDEX(sz[g] >= 0 && st[g] >= 0 && sz[g] <= T && st[g] <= T - sz[g], op, ": graph ", g,
                      " spans rows [", st[g], ", ", st[g], " + ", sz[g], ") of ", T);
    total = add_within(total, sz[g], cap, op, "rows");
    // the running sum of incs over the graphs before b is added to graph b's values
    if (inc != nullptr && b + 1 < B) {
      TORCH_CHECK_VALUE(!__builtin_add_overflow(inc_sum, inc[g], &inc_sum), op,
                        ": the running sum of incs overflows int64 at graph ", g);
    }
  }
  const char* src = static_cast<const char*>(values.const_data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  if (inc == nullptr) {
    collate_copy(src, dst, st, sz, id, B, row, values.element_size());
    return;
  }
  AT_DISPATCH_ALL_TYPES(values.scalar_type(), "gnncompile.collate_rows", [&] {
    collate_add(values.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), st, sz, id, inc, B, row);
  });
}

void segment_ids_cpu(const at::Tensor& sizes, const at::Tensor& idx, at::Tensor out, at::Tensor ptr) {
  const char* op = "gnncompile.segment_ids";
  check_index_vectors(sizes, sizes, idx, op);
  TORCH_CHECK_TYPE(out.scalar_type() == at::kLong && ptr.scalar_type() == at::kLong, op,
                   ": out and ptr must be int64");
  TORCH_CHECK_VALUE(out.dim() == 1 && ptr.dim() == 1 && out.is_contiguous() && ptr.is_contiguous(),
                    op, ": out and ptr must be contiguous 1-D");
  const int64_t G = sizes.numel();
  const int64_t B = idx.numel();
  TORCH_CHECK_VALUE(ptr.numel() >= B + 1, op, ": ptr holds ", ptr.numel(), " entries, needs ", B + 1);
  const int64_t* sz = sizes.const_data_ptr<int64_t>();
  const int64_t* id = idx.const_data_ptr<int64_t>();
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK_INDEX(id[b] >= 0 && id[b] < G, op, ": graph index ", id[b], " out of range for ", G,
                      " graphs");
    TORCH_CHECK_INDEX(sz[id[b]] >= 0, op, ": negative size for graph ", id[b]);
    total = add_within(total, sz[id[b]], out.numel(), op, "ids");
  }
  fill_segment_ids(sz, id, B, out.data_ptr<int64_t>(), ptr.data_ptr<int64_t>());
}

}  // namespace

TORCH_LIBRARY_IMPL(gnncompile, CPU, m) {
  m.impl("collate_rows", &collate_rows_cpu);
  m.impl("segment_ids", &segment_ids_cpu);
}

}  // namespace cpu
}  // namespace gnncompile
