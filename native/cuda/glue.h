// Shared helpers for the thin files that bind the torch-free CUDA cores to torch's dispatcher:
// dtype mapping, device checks, the structure validation every op runs before launching, and
// the device properties the default knobs are derived from. Host-only. The checks that the
// CPU glue shares are in ../common/torch_glue.h.
//
// Only light torch headers: ATen/ATen.h and c10/cuda (not ATen/cuda/CUDAContext.h, which pulls
// in cuBLAS / cuSPARSE headers).
#pragma once
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "../common/torch_glue.h"
#include "knobs.h"
#include "validate_core.cuh"

namespace gnncompile {
namespace gpu {

// Maps torch's storage types onto CUDA's (same bit layout).
template <typename T> struct cuda_type { using type = T; };
template <> struct cuda_type<at::Half> { using type = __half; };
template <> struct cuda_type<at::BFloat16> { using type = __nv_bfloat16; };

template <typename T> inline auto dev_ptr(at::Tensor& t) { return mapped_ptr<cuda_type, T>(t); }
template <typename T> inline auto dev_ptr(const at::Tensor& t) { return mapped_ptr<cuda_type, T>(t); }

// The torch dtype of a core accumulator type A (acc_t<T>: float, or double), for the scratch
// buffers the kernels keep partial results in.
template <typename A>
constexpr at::ScalarType acc_dtype() {
  return std::is_same<A, double>::value ? at::kDouble : at::kFloat;
}

inline void check_on(const at::Tensor& t, const at::Device& dev, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.device() == dev, op, ": ", name, " is on ", t.device(),
                    " but the other inputs are on ", dev);
}

// check_on as the device check the shared checks take (../common/attention_glue.h): every input
// on `dev` (x's device).
inline auto on_device(const at::Device& dev, const char* op) {
  return [dev, op](const at::Tensor& t, const char* name) { check_on(t, dev, op, name); };
}

// Properties the default knobs depend on, read once per device.
inline DeviceProps device_props(c10::DeviceIndex index) {
  static std::mutex mu;
  static std::unordered_map<int, DeviceProps> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(index);
  if (it != cache.end()) return it->second;
  DeviceProps d;
  int v = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, index));
  d.sm_count = v;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, index));
  d.l2_bytes = v;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, index));
  d.cc_major = v;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMinor, index));
  d.cc_minor = v;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxThreadsPerMultiProcessor, index));
  d.max_threads_per_sm = v;
  cache.emplace(index, d);
  return d;
}

// Largest power of two (at most 16) dividing the address: what vector loads may assume.
inline int64_t ptr_align(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 16;
  const uintptr_t low = a & (~a + 1);
  return static_cast<int64_t>(low < 16 ? low : 16);
}

// A structure handed to an op (not necessarily built by build_csr) is checked on the device
// before any kernel reads through it: rowptr spans [0, E] and never decreases, every col is a
// valid source row (col may be undefined: not read by the op), every perm an edge id. One
// fused reduction and one small device-to-host copy (a host wait); what passes is recorded per
// tensor (trust.h), and validate_once skips it from then on, as it skips build_csr's outputs.
inline void validate_structure(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                               int64_t num_src, const char* op) {
  const int64_t M = rowptr.numel() - 1;
  const int64_t E = perm.numel();
  count_validation();
  at::Tensor stats = at::empty({kNumStructStats}, rowptr.options().dtype(at::kLong));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int sms = device_props(rowptr.device().index()).sm_count;
  GNN_DISPATCH_INDEX(rowptr.scalar_type(), op, [&] {
    C10_CUDA_CHECK(structure_stats_launch<index_t>(
        rowptr.const_data_ptr<index_t>(), M, col.defined() ? col.const_data_ptr<index_t>() : nullptr,
        perm.const_data_ptr<index_t>(), E, reinterpret_cast<long long*>(stats.data_ptr<int64_t>()), sms,
        stream));
  });
  const at::Tensor h = stats.cpu();  // synchronises with the stream
  const int64_t* s = h.const_data_ptr<int64_t>();
  TORCH_CHECK_VALUE(s[kRowptrFirst] == 0 && s[kRowptrLast] == E, op,
                    ": rowptr must start at 0 and end at the number of edges (", E, ")");
  TORCH_CHECK_VALUE(s[kFirstDecrease] == LLONG_MAX, op, ": rowptr must be non-decreasing");
  if (E > 0 && col.defined()) {
    TORCH_CHECK_INDEX(s[kColMin] >= 0 && s[kColMax] < num_src, op, ": source index out of range [",
                      s[kColMin], ", ", s[kColMax], "] for ", num_src, " source nodes");
  }
  if (E > 0) {
    TORCH_CHECK_INDEX(s[kPermMin] >= 0 && s[kPermMax] < E, op, ": perm holds an edge id outside [0, ", E,
                      ")");
  }
  // bounds as found (an empty col or perm lies below any bound, 0 included)
  record_index_facts(rowptr, IndexFacts{-1, false, E});
  if (col.defined()) record_index_facts(col, IndexFacts{E > 0 ? s[kColMax] + 1 : 0, false, -1});
  record_index_facts(perm, IndexFacts{E, false, -1});
}

// The structure an op reads, validated unless the record vouches for each tensor of it.
inline void validate_once(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                          int64_t num_src, const char* op) {
  const int64_t E = perm.numel();
  const bool trusted = trusted_rowptr(rowptr, E) && trusted_ids(perm, E) &&
                       (!col.defined() || trusted_ids(col, num_src));
  if (!trusted) validate_structure(rowptr, col, perm, num_src, op);
}

// A backward's two structures validated before a kernel reads through them: the CSR (col: sources
// below num_src) and the CSC (col_t: destination rows below num_dst); the CSC returned contiguous.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> validated_csc(const at::Tensor& rowptr, const at::Tensor& col,
                                                                    const at::Tensor& perm, int64_t num_src,
                                                                    const at::Tensor& rowptr_t,
                                                                    const at::Tensor& col_t, const at::Tensor& perm_t,
                                                                    int64_t num_dst, const char* op) {
  at::Tensor rt = rowptr_t.contiguous(), ct = col_t.contiguous(), pt = perm_t.contiguous();
  validate_once(rowptr, col, perm, num_src, op);
  validate_once(rt, ct, pt, num_dst, op);
  return {rt, ct, pt};
}

}  // namespace gpu
}  // namespace gnncompile
