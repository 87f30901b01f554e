// What is known about the index tensors of structures (rowptr, col, perm) handed to ops, so that
// validation (and, on CUDA, the host wait it needs) happens once per tensor instead of once per
// call.
//
// The record is kept per tensor, not per (rowptr, col, perm) combination: every fact here is a
// property of one tensor's values (rowptr is a valid offsets array ending at E; every entry of
// col lies below a bound; perm is a permutation), so one record of each tensor vouches for it in
// every combination an op reads it in: the CSR triple, rowptr + perm without col (edge_softmax),
// rowptr + perm + perm (the gather backward reads perm as its col), the CSC triple. What ties the
// tensors of one call together (rowptr ends at E = col.numel() = perm.numel()) is compared with
// the recorded values and the shapes, never by reading the device.
//
// Facts are recorded by build_csr (its outputs are valid by construction; also when it ran in one
// of the PooledLoader's worker processes, whose CPU structures the loader adopts with
// gnncompile::adopt_worker_structure, trust.cpp), by a successful
// validation, by transpose_structure (the CSC of a recorded CSR is valid by construction) and by
// clone_structure (each copy inherits its source's facts): every copy the compiled path makes of
// a structure (structure ops and hoisted regions with copy=True, for inductor) goes through it,
// so after a structure's first use nothing is validated again. They belong to the very tensors
// they were recorded for: an entry holds a weak reference to the TensorImpl and the version
// counter, data pointer, sizes, strides, dtype and device it had (the identity rule of
// gnncompile/ops/identity.py, less its fingerprint; its docstring says why the record applies it
// here), so a tensor that is freed, changed in place (its version moves) or given other storage
// (`t.data = other`) is unknown again, and validated again at its next use. Inference tensors
// have no version counter and are never recorded. Writing a structure through `.data[...]` or
// numpy bypasses the version counter: the CPU kernels still range-check every index they read;
// the CUDA kernels trust a recorded structure.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace gnncompile {

struct IndexFacts {
  int64_t bound = -1;        // every entry lies in [0, bound); -1: unknown
  bool distinct = false;     // no value occurs twice (with bound <= numel: a permutation of [0, numel))
  int64_t offsets_end = -1;  // an offsets array (rowptr): starts at 0, never decreases, ends at
                             // offsets_end; -1: unknown
};

// The facts recorded for exactly this tensor ({} for an undefined or unknown one).
IndexFacts index_facts(const at::Tensor& t);

// Records facts for this tensor, merged with what is already known of it.
void record_index_facts(const at::Tensor& t, const IndexFacts& facts);

// What the ops ask, from the record alone (nothing is read from the tensors' memory):
// rowptr is a valid offsets array over `num_edges` edges;
bool trusted_rowptr(const at::Tensor& rowptr, int64_t num_edges);
// every entry of ids lies in [0, bound);
bool trusted_ids(const at::Tensor& ids, int64_t bound);
// perm is a permutation of [0, perm.numel()).
bool trusted_permutation(const at::Tensor& perm);

// Records a structure that is valid by construction (build_csr's output): rowptr over
// col.numel() edges, col below num_src, perm a permutation.
void record_built_structure(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& perm,
                            int64_t num_src);

// The process-wide count of structure validations: each time native code reads a structure
// tensor's values to establish a fact about it (rowptr's ends and order, the range of col or
// perm, perm's uniqueness, the CUDA check that waits for the device), whatever the outcome.
// Not counted: the per-index checks of the CPU kernels as they read, which stay on every call.
// gnncompile._C.structure_validations() reads it (gnncompile.ops.structure.validation_count).
void count_validation();
int64_t structure_validations();

}  // namespace gnncompile
