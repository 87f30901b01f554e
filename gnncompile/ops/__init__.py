"""Fused message-passing ops with PyG semantics, and the only code of the package that names
``torch.ops.gnncompile`` (the rest goes through :mod:`.targets`).

* :mod:`.schemas`: the kernel ops' schemas, fake kernels and reference registrations
  (:mod:`.reference`); loading it loads the native kernels (:mod:`._native`).
* :mod:`.autograd`: their autograd formulas.
* :mod:`.structure`: graph structures (CSR / CSC), the one structure cache, and the structure
  ops that compiled graphs call.
* :mod:`.identity`: the one identity rule (is this still the same tensor, with the same
  content?) that the structure cache and the hoisted results (:mod:`.hoisted`) apply.
* :mod:`.functional`: the public functions :func:`spmm` and :func:`edge_softmax` (their
  ``knobs`` argument: the launch knobs, default the kernels' own rule), and the loader's
  collation ops.
* :mod:`.vendor`: ``gnncompile::spmm_sparse``, the vendor library's spmm (``torch.sparse.mm``
  on a CSR tensor), the spmm portfolio's second candidate.
* :mod:`.targets`: the op overloads that the passes insert and export translates.
"""
from __future__ import annotations

from . import reference, schemas  # noqa: F401  (schemas first: it defines the ops)
from . import autograd, loops, message, program, slots, structure, targets, vendor  # noqa: F401
from .functional import REDUCES, collate_rows, edge_softmax, segment_ids, spmm
from .structure import (cache_info, clear_cache, set_structure_check, structure_check, transpose_structure,
                        validation_count, validations_since)

__all__ = ["spmm", "edge_softmax", "collate_rows", "segment_ids", "REDUCES",
           "reference", "structure", "transpose_structure", "cache_info", "clear_cache", "set_structure_check",
           "structure_check", "validation_count", "validations_since"]
