"""Graph structure for an ``edge_index``: CSR by destination, and CSC by source for backward.

Built with the native O(E) counting sort (``gnncompile::build_csr``) at most once per distinct
``edge_index`` and reused across calls, layers and steps. The cache

* notices an in-place change of ``edge_index`` (its version counter and data pointer),
* holds only a weak reference to ``edge_index``: the entry goes when the tensor goes,
* never keeps the user's tensors alive, only the structure tensors it built.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import torch

from .ops._library import ops
from .ops.reference import check_range


@dataclass
class Structure:
    """CSR of one edge_index for one number of destination nodes."""

    rowptr: torch.Tensor
    col: torch.Tensor
    perm: torch.Tensor
    num_dst: int
    src_min: int
    src_max: int
    csc: Dict[int, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    def check_sources(self, num_src: int) -> None:
        if self.num_edges and self.src_max >= num_src:
            raise IndexError(
                f"edge_index[0] (source) holds index {self.src_max}, out of range for "
                f"{num_src} source nodes (x.size(0))"
            )

    def transposed(self, num_src: int):
        """(rowptr_t, col_t, perm_t): the edges sorted by source, for the backward pass."""
        t = self.csc.get(num_src)
        if t is None:
            t = _build_transposed(self, num_src)
            self.csc[num_src] = t
        return t


def _build_transposed(s: Structure, num_src: int):
    # Sorting the original edges by source gives perm_t in original edge ids directly.
    from .ops._library import transpose_structure

    return transpose_structure(s.rowptr, s.col, s.perm, num_src)


def build(edge_index: torch.Tensor, num_dst: int) -> Structure:
    """Builds the CSR structure, validating every index."""
    src, dst = edge_index[0], edge_index[1]
    if src.numel():
        lo, hi = torch.aminmax(src)
        src_min, src_max = int(lo), int(hi)
        if src_min < 0:
            raise IndexError(
                f"edge_index[0] (source) holds the negative index {src_min}; node indices must be >= 0"
            )
    else:
        src_min, src_max = 0, -1
    rowptr, col, perm = ops.build_csr(dst, src, num_dst, src_max + 1)
    return Structure(rowptr, col, perm, num_dst, src_min, src_max)


@dataclass
class _Entry:
    ref: "weakref.ReferenceType[torch.Tensor]"
    version: int
    data_ptr: int
    by_num_dst: Dict[int, Structure] = field(default_factory=dict)


class StructureCache:
    def __init__(self) -> None:
        self._entries: Dict[int, _Entry] = {}
        self._lock = threading.RLock()  # a weakref callback may run inside
        self.builds = 0
        self.hits = 0

    def _drop(self, key: int) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def get(self, edge_index: torch.Tensor, num_dst: int) -> Structure:
        key = id(edge_index)
        version, ptr = edge_index._version, edge_index.data_ptr()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and (
                entry.ref() is not edge_index or entry.version != version or entry.data_ptr != ptr
            ):
                entry = None  # changed in place, or a new tensor reusing the id
            if entry is not None and num_dst in entry.by_num_dst:
                self.hits += 1
                return entry.by_num_dst[num_dst]
        s = build(edge_index, num_dst)
        with self._lock:
            self.builds += 1
            entry = self._entries.get(key)
            if entry is None or entry.ref() is not edge_index or entry.version != version:
                ref = weakref.ref(edge_index, lambda _r, k=key: self._drop(k))
                entry = _Entry(ref, version, ptr)
                self._entries[key] = entry
            entry.by_num_dst[num_dst] = s
        return s

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.builds = 0
            self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def info(self) -> dict:
        return {"entries": len(self._entries), "builds": self.builds, "hits": self.hits}


CACHE = StructureCache()


def structure(edge_index: torch.Tensor, num_dst: int) -> Structure:
    """The cached structure of ``edge_index`` for ``num_dst`` destination nodes."""
    if torch.compiler.is_compiling():
        return build(edge_index, num_dst)
    return CACHE.get(edge_index, num_dst)


def cache_info() -> dict:
    return CACHE.info()


def clear_cache() -> None:
    CACHE.clear()


__all__ = ["Structure", "build", "structure", "cache_info", "clear_cache", "check_range"]
