// Torch-side helpers shared by the CPU and the CUDA glue files (not by the torch-free cores):
// dtype dispatch over the feature and index types the kernels support, and the reduce names.
#pragma once
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>

#include "macros.h"

// Calls the lambda with `scalar_t` bound to the torch storage type of `dtype`; each backend
// maps it onto its own core type (cpu::core_type, gpu::cuda_type).
#define GNN_DISPATCH_FLOAT(dtype, NAME, ...)                                      \
  [&] {                                                                           \
    switch (dtype) {                                                              \
      case at::kFloat: { using scalar_t = float; return __VA_ARGS__(); }          \
      case at::kDouble: { using scalar_t = double; return __VA_ARGS__(); }        \
      case at::kHalf: { using scalar_t = at::Half; return __VA_ARGS__(); }        \
      case at::kBFloat16: { using scalar_t = at::BFloat16; return __VA_ARGS__(); } \
      default:                                                                    \
        TORCH_CHECK_TYPE(false, NAME, ": unsupported feature dtype ", dtype,      \
                         " (expected float32, float64, float16 or bfloat16)");    \
    }                                                                             \
  }()

#define GNN_DISPATCH_INDEX(dtype, NAME, ...)                                      \
  [&] {                                                                           \
    switch (dtype) {                                                              \
      case at::kInt: { using index_t = int32_t; return __VA_ARGS__(); }           \
      case at::kLong: { using index_t = int64_t; return __VA_ARGS__(); }          \
      default:                                                                    \
        TORCH_CHECK_TYPE(false, NAME, ": unsupported index dtype ", dtype,        \
                         " (expected int32 or int64)");                           \
    }                                                                             \
  }()

namespace gnncompile {

inline Reduce parse_reduce(c10::string_view reduce) {
  if (reduce == "sum" || reduce == "add") return Reduce::Sum;
  if (reduce == "mean") return Reduce::Mean;
  if (reduce == "max" || reduce == "amax") return Reduce::Max;
  if (reduce == "min" || reduce == "amin") return Reduce::Min;
  TORCH_CHECK_VALUE(false, "gnncompile.spmm: unknown reduce '", std::string(reduce),
                    "' (expected sum, mean, max or min)");
}

}  // namespace gnncompile
