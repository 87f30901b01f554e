// Torch-free instantiation of every CUDA kernel core, for `make cuda-check` (scripts/cuda_check.sh):
// compiles each template combination the glue can reach (storage type x index type x reduce
// kind x weight x vector width) for every target architecture without any torch header, so a
// machine with nvcc but no CUDA build of torch still proves the cores build. Not part of the
// extension (CMake globs native/cuda/*.cu, not this folder).
#include "../arg_route_core.cuh"
#include "../attention_core.cuh"
#include "../attention_dot_core.cuh"
#include "../attention_v2_core.cuh"
#include "../build_csr_core.cuh"
#include "../edge_dot_core.cuh"
#include "../edge_softmax_core.cuh"
#include "../fingerprint_core.cuh"
#include "../knobs.h"
#include "../spmm_core.cuh"
#include "../validate_core.cuh"

namespace gnncompile {
namespace gpu {

#define GNN_INSTANTIATE_FLOAT_INDEX(T, I)                                                                    \
  template cudaError_t spmm_launch<T, I>(const SpmmParams<T, I>&, const GroupConfig&, cudaStream_t);         \
  template cudaError_t edge_dot_launch<T, I>(const EdgeDotParams<T, I>&, const GroupConfig&, cudaStream_t);  \
  template cudaError_t edge_seg_launch<false, T, I>(const EdgeSegParams<T, I>&, cudaStream_t);               \
  template cudaError_t edge_seg_launch<true, T, I>(const EdgeSegParams<T, I>&, cudaStream_t);                \
  template cudaError_t arg_route_launch<T, I>(const ArgRouteParams<T, I>&, const GroupConfig&, cudaStream_t); \
  template cudaError_t arg_edge_dot_launch<T, I>(const ArgEdgeDotParams<T, I>&, cudaStream_t);               \
  template cudaError_t attention_forward_launch<T, I>(const AttentionParams<T, I>&, T*, acc_t<T>*,           \
                                                      cudaStream_t);                                         \
  template cudaError_t attention_backward_launch<T, I>(const AttentionParams<T, I>&, const T*, const T*,     \
                                                       const acc_t<T>*, acc_t<T>*, T*, T*, T*, acc_t<T>*,    \
                                                       cudaStream_t);                                         \
  template cudaError_t attention_v2_forward_launch<T, I>(const AttentionV2Params<T, I>&, T*, acc_t<T>*, acc_t<T>*, \
                                                         cudaStream_t);                                       \
  template cudaError_t attention_v2_backward_launch<T, I>(const AttentionV2Params<T, I>&, const T*, const T*,  \
                                                          const acc_t<T>*, acc_t<T>*, acc_t<T>*, uint32_t*,    \
                                                          acc_t<T>*, acc_t<T>*, T*, T*, T*, T*, cudaStream_t); \
  template cudaError_t attention_dot_forward_launch<T, I>(const AttentionDotParams<T, I>&, T*, T*, acc_t<T>*,  \
                                                          acc_t<T>*, cudaStream_t);                            \
  template cudaError_t attention_dot_backward_launch<T, I>(const AttentionDotParams<T, I>&, const T*, const T*, \
                                                           const T*, const T*, const acc_t<T>*, acc_t<T>*,      \
                                                           acc_t<T>*, T*, T*, T*, T*, T*, cudaStream_t);

#define GNN_INSTANTIATE_INDEX(I)                                                                             \
  GNN_INSTANTIATE_FLOAT_INDEX(float, I)                                                                      \
  GNN_INSTANTIATE_FLOAT_INDEX(double, I)                                                                     \
  GNN_INSTANTIATE_FLOAT_INDEX(__half, I)                                                                     \
  GNN_INSTANTIATE_FLOAT_INDEX(__nv_bfloat16, I)                                                              \
  template cudaError_t structure_stats_launch<I>(const I*, int64_t, const I*, const I*, int64_t, long long*, \
                                                 int, cudaStream_t);                                         \
  template cudaError_t edge_minmax_launch<I>(const I*, const I*, int64_t, long long*, int, cudaStream_t);    \
  template cudaError_t first_bad_edge_launch<I>(const I*, const I*, int64_t, int64_t, int64_t, long long*,   \
                                                int, cudaStream_t);                                          \
  template cudaError_t radix_hist_launch<I>(const I*, int64_t, int, int*, cudaStream_t);                     \
  template cudaError_t radix_scatter_launch<I>(const I*, const I*, I*, I*, const I*, I*, int64_t, int,       \
                                               const int64_t*, const int*, cudaStream_t);                    \
  template cudaError_t rowptr_from_sorted_launch<I>(const I*, int64_t, int64_t, I*, int, cudaStream_t);      \
  template cudaError_t identity_perm_launch<I>(const I*, int64_t, I*, I*, int, cudaStream_t);                \
  template cudaError_t fingerprint_launch<I>(const I*, int64_t, unsigned long long*, int, cudaStream_t);      \
  template cudaError_t invert_perm_launch<I>(const I*, int64_t, I*, int, cudaStream_t);

GNN_INSTANTIATE_INDEX(int32_t)
GNN_INSTANTIATE_INDEX(int64_t)

// The host-side knob rule compiles here too (every build of the extension binds it for Python:
// native/common/launch_rule.cpp, tested in tests/test_cuda_knobs.py).
LaunchKnobs check_knobs_compile(const DeviceProps& d) {
  return spmm_knobs(d, nullptr, 0, 1000, 10000, 128, 128, 4, 4, false, 16);
}

// knobs.h is host C++ without CUDA types, so it states what it assumes of the kernels by
// numbers; here, with the kernels' types at hand, those numbers are checked against them.
static_assert(kMaxBlock == kMaxBlockThreads, "knobs.h kMaxBlock != common.cuh kMaxBlockThreads");
template <typename T>
constexpr bool rule_knows_type() {
  constexpr int b = static_cast<int>(sizeof(T));
  return sizeof(acc_t<T>) == static_cast<size_t>(acc_bytes_for(b)) && VecSet<T>::w[0] == compiled_vec(b, 0) &&
         VecSet<T>::w[1] == compiled_vec(b, 1) && VecSet<T>::w[2] == compiled_vec(b, 2);
}
static_assert(rule_knows_type<float>() && rule_knows_type<double>() && rule_knows_type<__half>() &&
                  rule_knows_type<__nv_bfloat16>(),
              "knobs.h acc_bytes_for / compiled_vec disagree with acc_t / VecSet in common.cuh");

}  // namespace gpu
}  // namespace gnncompile
