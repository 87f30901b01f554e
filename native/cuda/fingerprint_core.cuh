// gnncompile::fingerprint on the device (the definition is native/common/fingerprint.h): one
// grid-stride pass, a warp sum of the terms and one 64-bit atomic add per warp (integer
// addition: the result does not depend on the order), then the final mix in place. The result
// stays on the device: nothing here waits for the host. Torch-free.
#pragma once
#include "../common/fingerprint.h"
#include "validate_core.cuh"

namespace gnncompile {
namespace gpu {

// The grid must be a whole number of warps (blockDim a multiple of 32).
template <typename I>
__global__ void __launch_bounds__(256) fingerprint_kernel(const I* v, int64_t n, unsigned long long* sum) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned long long acc = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc += fingerprint_term(static_cast<int64_t>(v[i]), static_cast<uint64_t>(i));
#pragma unroll
  for (int o = kWarpSize >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & (kWarpSize - 1)) == 0) atomicAdd(sum, acc);
}

template <typename Unused = void>
__global__ void __launch_bounds__(32) fingerprint_final_kernel(unsigned long long* sum, int64_t n) {
  if (threadIdx.x == 0) *sum = fingerprint_final(*sum, static_cast<uint64_t>(n));
}

// Writes the fingerprint of v[0, n) to *out (device memory) on `stream`.
template <typename I>
cudaError_t fingerprint_launch(const I* v, int64_t n, unsigned long long* out, int sm_count, cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(out, 0, sizeof(unsigned long long), stream);
  if (err != cudaSuccess) return err;
  if (n > 0) {
    fingerprint_kernel<I><<<reduction_blocks(n, sm_count), 256, 0, stream>>>(v, n, out);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  fingerprint_final_kernel<><<<1, 32, 0, stream>>>(out, n);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace gnncompile
