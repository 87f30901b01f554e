"""Graph-structure ops that the rewritten graphs call (opaque to the compiler).

The passes never launch kernels: they insert calls to the two Python custom ops below, which
run when the compiled graph runs.

``gnncompile::cached_csr(edge_index, num_dst)`` returns the CSR (by destination) of a
``[2, E]`` edge_index whose row 0 holds sources and row 1 destinations, and
``gnncompile::cached_csc(edge_index, num_dst, num_src)`` the transposed structure (by source)
that the backward of sum/mean needs. Both consult :data:`STRUCTURES`, a small cache that

* first matches by tensor identity + version counter + data pointer (the identity survives
  through Dynamo, AOTAutograd and inductor: the compiled graph receives the caller's tensor
  object; tests/test_compile.py checks the identity hits),
* then by content: a tensor of the same shape, dtype and device that is ``torch.equal`` to a
  cached one (an O(E) sequential compare, ~1 ms for 1M edges on this CPU, against ~30 ms for
  the counting sort + transpose). This is what shares one structure between layers that each
  compute their own ``edge_index`` (``add_remaining_self_loops`` in every GCNConv / GATConv)
  and across training steps.

An entry holds a strong reference to the edge_index it was built from and its version at build
time, so an in-place change of either tensor is noticed (its version moves) and the entry is
rebuilt. At most :data:`MAX_ENTRIES` entries are kept (least recently used goes first).

``gnncompile::pair_csr(dst, src, num_dst)`` / ``gnncompile::pair_csc(...)`` build the
structure of two 1-D index tensors that are not the rows of one edge_index (no caching).

The structure ops return tensors that the cache keeps: the rewritten graphs only ever read
them (they feed the ``gnncompile::spmm`` / ``edge_softmax`` structure arguments).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Tuple

import torch
from torch import Tensor

from .. import graph as _graph
from ..ops import transpose_structure

MAX_ENTRIES = 4


class _StructureCache:
    def __init__(self) -> None:
        self._entries: "OrderedDict[int, tuple]" = OrderedDict()  # key -> (ei, version, ptr, {num_dst: Structure})
        self._lock = threading.Lock()
        self._next = 0
        self.builds = 0
        self.identity_hits = 0
        self.content_hits = 0

    def _valid(self, ent) -> bool:
        ei, version, ptr, _ = ent
        return ei._version == version and ei.data_ptr() == ptr

    def _find(self, edge_index: Tensor):
        # identity first
        for key, ent in self._entries.items():
            if ent[0] is edge_index and self._valid(ent):
                self._entries.move_to_end(key)
                return ent, "identity"
        for key, ent in self._entries.items():
            ei = ent[0]
            if (ei.shape == edge_index.shape and ei.dtype == edge_index.dtype
                    and ei.device == edge_index.device and self._valid(ent)
                    and torch.equal(ei, edge_index)):
                self._entries.move_to_end(key)
                return ent, "content"
        return None, None

    def get(self, edge_index: Tensor, num_dst: int) -> _graph.Structure:
        with self._lock:
            ent, how = self._find(edge_index)
            if ent is not None and num_dst in ent[3]:
                if how == "identity":
                    self.identity_hits += 1
                else:
                    self.content_hits += 1
                return ent[3][num_dst]
        s = _graph.build(edge_index, num_dst)
        with self._lock:
            self.builds += 1
            if ent is None or not self._valid(ent):
                ent = (edge_index, edge_index._version, edge_index.data_ptr(), {})
                self._entries[self._next] = ent
                self._next += 1
                while len(self._entries) > MAX_ENTRIES:
                    self._entries.popitem(last=False)
            ent[3][num_dst] = s
        return s

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.builds = self.identity_hits = self.content_hits = 0

    def info(self) -> dict:
        return {"entries": len(self._entries), "builds": self.builds,
                "identity_hits": self.identity_hits, "content_hits": self.content_hits}


STRUCTURES = _StructureCache()


def clear_cache() -> None:
    STRUCTURES.clear()


def cache_info() -> dict:
    return STRUCTURES.info()


def _check_edge_index(edge_index: Tensor, fn: str) -> None:
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"{fn}: edge_index must have shape [2, E], got {list(edge_index.shape)}")
    if edge_index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{fn}: edge_index must be int64 or int32, got {edge_index.dtype}")


# ----------------------------------------------------------------------------- ops
@torch.library.custom_op("gnncompile::cached_csr", mutates_args=())
def cached_csr(edge_index: Tensor, num_dst: int, copy: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    _check_edge_index(edge_index, "gnncompile::cached_csr")
    s = STRUCTURES.get(edge_index, int(num_dst))
    return _maybe_copy((s.rowptr, s.col, s.perm), copy)


def _maybe_copy(ts, copy: bool):
    # copy=True for code-generating inner compilers (inductor), which may recycle the storage of
    # an op's output once the graph no longer reads it: the cache's tensors must not be handed out.
    return tuple(t.clone() for t in ts) if copy else tuple(ts)


@cached_csr.register_fake
def _(edge_index, num_dst, copy=False):
    E = edge_index.shape[1]
    return (edge_index.new_empty(num_dst + 1), edge_index.new_empty(E), edge_index.new_empty(E))


@torch.library.custom_op("gnncompile::cached_csc", mutates_args=())
def cached_csc(edge_index: Tensor, num_dst: int, num_src: int, copy: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    _check_edge_index(edge_index, "gnncompile::cached_csc")
    s = STRUCTURES.get(edge_index, int(num_dst))
    s.check_sources(int(num_src))
    return _maybe_copy(s.transposed(int(num_src)), copy)


@cached_csc.register_fake
def _(edge_index, num_dst, num_src, copy=False):
    E = edge_index.shape[1]
    return (edge_index.new_empty(num_src + 1), edge_index.new_empty(E), edge_index.new_empty(E))


@torch.library.custom_op("gnncompile::pair_csr", mutates_args=())
def pair_csr(dst: Tensor, src: Tensor, num_dst: int) -> Tuple[Tensor, Tensor, Tensor]:
    if dst.dim() != 1 or src.shape != dst.shape or src.dtype != dst.dtype:
        raise ValueError("gnncompile::pair_csr: dst and src must be 1-D index tensors of one shape and dtype")
    s = _graph.build(torch.stack([src, dst]), int(num_dst))
    return s.rowptr, s.col, s.perm


@pair_csr.register_fake
def _(dst, src, num_dst):
    E = dst.shape[0]
    return (dst.new_empty(num_dst + 1), dst.new_empty(E), dst.new_empty(E))


@torch.library.custom_op("gnncompile::pair_csc", mutates_args=())
def pair_csc(rowptr: Tensor, col: Tensor, perm: Tensor, num_src: int) -> Tuple[Tensor, Tensor, Tensor]:
    if col.numel():
        hi = int(col.max())
        if hi >= num_src:
            raise IndexError(f"source index {hi} out of range for {int(num_src)} source nodes (x.size(0))")
    return transpose_structure(rowptr, col, perm, int(num_src))


@pair_csc.register_fake
def _(rowptr, col, perm, num_src):
    E = col.shape[0]
    return (rowptr.new_empty(num_src + 1), col.new_empty(E), perm.new_empty(E))


@torch.library.custom_op("gnncompile::csr_degree", mutates_args=())
def csr_degree(rowptr: Tensor, dtype: torch.dtype) -> Tensor:
    """In-degree of every destination (rowptr differences), as ``dtype``."""
    return (rowptr[1:] - rowptr[:-1]).to(dtype)


@csr_degree.register_fake
def _(rowptr, dtype):
    return rowptr.new_empty(rowptr.shape[0] - 1, dtype=dtype)


__all__ = ["STRUCTURES", "cached_csr", "cached_csc", "pair_csr", "pair_csc", "csr_degree",
           "clear_cache", "cache_info", "MAX_ENTRIES"]
