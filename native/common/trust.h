// What is known about a structure (rowptr, col, perm) handed to an op, so that validation (and,
// on CUDA, the host wait it needs) happens once per structure instead of once per call.
//
// Facts are recorded by build_csr (its outputs are valid by construction), by a successful
// validation, and by clone_structure (a copy inherits its source's facts). They belong to the
// very tensors they were recorded for: an entry holds weak references to their TensorImpls and
// the version counters, data pointers, sizes, strides, dtypes and devices they had (the identity
// rule of gnncompile/ops/identity.py, less its fingerprint; its docstring says why the record
// applies it here), so a tensor that is freed, changed in place (its version moves) or given
// other storage (`t.data = other`) is unknown again. Inference tensors have no version counter
// and are never recorded. Writing a structure through `.data[...]` or numpy bypasses the version
// counter: the CPU kernels still range-check every index they read; the CUDA kernels trust a
// recorded structure.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace gnncompile {

struct StructureFacts {
  bool ranges_ok = false;    // rowptr runs from 0 to E without decreasing; every perm in [0, E)
  int64_t col_bound = -1;    // every col entry lies in [0, col_bound); -1: unknown
  bool perm_unique = false;  // perm is a permutation of [0, E)
};

// The facts recorded for exactly these tensors. `col` may be undefined (an op that does not
// read it): the facts about rowptr and perm still apply, col_bound is -1.
StructureFacts structure_facts(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm);

// Records facts for these tensors, merged with what is already known of them.
void record_structure_facts(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                            const StructureFacts& facts);

}  // namespace gnncompile
