"""Graph structure for an ``edge_index``: CSR by destination, CSC by source for backward, and
the one cache that the eager API (:func:`gnncompile.ops.spmm`, ...) and the compiled graphs
(through the structure ops below) share.

A structure is built with the native O(E) counting sort (``gnncompile::build_csr``) at most
once per distinct ``edge_index`` and number of destinations, and reused across calls, layers
and steps; the transposed structure (by source) is built on first need and kept with it.

The cache policy
----------------
* **Identity.** An entry belongs to one ``edge_index`` tensor, under the one identity rule of
  :mod:`gnncompile.ops.identity` (which the hoisted results follow too): held by a weak
  reference, valid while the tensor's version counter, data pointer, shape, strides, dtype and
  device are what they were when the structure was built from it. An in-place change
  (``ei[0, 0] = 3``, ``ei.add_(1)``, a write through a view) or an ``ei.data = ...`` swap is a
  miss and builds anew. When the tensor is freed, its entry goes (autograd keeps the structure
  tensors it saved, never the entry or the user's tensor).
* **Content check.** Writes through ``ei.numpy()``, ``ei.data`` or DLPack do not move the version
  counter, and inference tensors have none. So every entry also records a 64-bit content
  fingerprint of the ``edge_index`` it was built from (``gnncompile::fingerprint``: one parallel
  pass, 1.6 ms per 1M edges on 2 threads here, benchmarks/results/structure_check.md), and
  a hit by identity is confirmed by recomputing it when the check applies; a mismatch drops the
  tensor from its entry and builds anew (``cache_info()["stale"]`` counts those). The check
  applies to inference tensors always, and to other tensors per :func:`set_structure_check`
  (environment: ``GNNCOMPILE_STRUCTURE_CHECK``): ``"cpu"`` (default: CPU tensors; on CUDA
  comparing means a host wait per call, so CUDA trusts the version counter), ``"all"`` (CUDA
  too: the fingerprint is computed on the device, the comparison waits), ``"off"`` (the version
  counter only: writes that bypass it are missed). The state and fingerprint recorded are those
  of one look taken when the lookup starts, before the build.
* **Content, for the compiled graphs.** A lookup that asks for it (``share=True``, which the
  rewritten graphs do) also matches a cached ``edge_index`` of equal content (same shape,
  dtype and device, ``torch.equal``: an O(E) comparison, about 1 ms for 1M edges here, against
  about 30 ms for the sort and the transpose). Such an entry keeps a private copy of the
  ``edge_index`` it was built from, never the caller's tensor, and the last
  :data:`MAX_SHARED` of them outlive their tensor (least recently used goes first). This is
  what shares one structure between layers that each compute the same ``edge_index``
  (``add_remaining_self_loops`` in every GCNConv / GATConv) and between training steps. An
  edited tensor has other content, so it never matches a stale entry.
* **Prepared by a loader.** :meth:`StructureCache.prepare` (and :func:`prepare_structure`)
  builds the CSR and CSC of an ``edge_index`` before the model runs, and
  :meth:`StructureCache.adopt` enters a structure built elsewhere (a PooledLoader worker) with
  the fingerprint of the content it was built from. Either entry belongs to the tensor by
  identity, as above (an edit after it is a miss), is not shared by content (a batch's
  ``edge_index`` is gone after its step), and leaves with :meth:`StructureCache.discard` (the
  loader's slot handed out again) or when the tensor dies. ``cache_info()["prepared"]`` counts
  them.
* Structures are built outside inference mode, even for a call inside it: they are normal
  tensors (version counters, so the native code's record of validated structures keeps them;
  and they may be saved for backward by a later call with autograd).
* Inside a Dynamo trace the eager functions build without caching (the compiled graph has its
  own structure ops, which consult the cache when the graph runs).

The structure ops (``torch.ops.gnncompile.*``, Python custom ops, opaque to the compiler):

* ``cached_csr(edge_index, num_dst, copy)`` / ``cached_csc(edge_index, num_dst, num_src,
  copy)``: the CSR / CSC of an edge_index (row 0 sources, row 1 destinations) from the cache;
  ``copy=True`` hands out clones, for inner compilers that may reuse an op's output buffers.
* ``pair_csr(dst, src, num_dst)`` / ``pair_csc(rowptr, col, perm, num_src)``: the structure of
  two 1-D index tensors that are not the rows of one edge_index (no caching).
* ``csr_degree(rowptr, dtype)``: in-degrees as rowptr differences.

What the cache hands out is known valid to the native kernels (``build_csr``'s outputs, the CSC
made by ``gnncompile::transpose_structure``, the ``clone_structure`` copies of ``copy=True``, the
CPU structures a PooledLoader worker built, ``adopt_worker_structure``: native/common/trust.h), so the ops never validate them; :func:`validation_count` counts the
validations the native code does run.
"""
from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor

from .. import config as _config
from ..config import CHECK_MODES
from . import identity as _identity
from .checks import check_edge_index
from .identity import fingerprint
from .schemas import ops
from . import _native  # after the schemas (schemas.py loads it)

MAX_SHARED = 4


# ----------------------------------------------------------------------------- structures
def outside_inference_mode():
    """Leaves torch.inference_mode() for a structure build (see the module docstring); a no-op
    outside it and inside a Dynamo trace."""
    if torch.is_inference_mode_enabled() and not torch.compiler.is_compiling():
        return torch.inference_mode(False)
    return contextlib.nullcontext()


def transpose_structure(rowptr, col, perm, num_src: int):
    """CSC (by source) from CSR (by destination), with perm_t in original edge ids
    (``gnncompile::transpose_structure``: the CSC of a CSR the native code knows to be valid is
    known to be valid too, and is not validated at its first use)."""
    return tuple(ops.transpose_structure(rowptr, col, perm, int(num_src)))


@dataclass
class Structure:
    """CSR of one edge_index for one number of destination nodes."""

    rowptr: Tensor
    col: Tensor
    perm: Tensor
    num_dst: int
    src_min: int
    src_max: int
    csc: Dict[int, Tuple[Tensor, Tensor, Tensor]] = field(default_factory=dict)
    # What other users derive from this structure once (e.g. the neighbor sampler's slot pairs);
    # dropped with it when edge_index changes.
    extras: Dict[str, Any] = field(default_factory=dict)

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
            with outside_inference_mode():
                t = transpose_structure(self.rowptr, self.col, self.perm, num_src)
            self.csc[num_src] = t
        return t


def build(edge_index: Tensor, num_dst: int) -> Structure:
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


# ----------------------------------------------------------------------------- the cache
def check_mode_from_env() -> str:
    """``GNNCOMPILE_STRUCTURE_CHECK`` (:mod:`gnncompile.config`): 0/off, 1/cpu (the default when
    unset), 2/all; any other value is a :class:`gnncompile.config.ConfigError`."""
    return _config.current().structure_check


@dataclass
class _Entry:
    by_num_dst: Dict[int, Structure] = field(default_factory=dict)
    # id(tensor) -> the identity (identity.py) of each edge_index tensor the entry belongs to
    owners: Dict[int, _identity.Identity] = field(default_factory=dict)
    content: Optional[Tensor] = None  # private copy, for entries shared by content
    fingerprint: object = None  # fingerprint() of the content it was built from
    # False for the entries a loader prepared (StructureCache.prepare / adopt): found by identity
    # only, never copied into the shared entries (a batch's edge_index is gone after its step)
    shareable: bool = True

    def verdict(self, look: _identity.Look) -> str:
        """The identity rule's verdict on ``look`` against the owner of its id (OTHER: none)."""
        o = self.owners.get(id(look.tensor))
        return _identity.OTHER if o is None else o.compare(look)

    def same_content(self, edge_index: Tensor) -> bool:
        c = self.content
        return (c is not None and c.shape == edge_index.shape and c.dtype == edge_index.dtype
                and c.device == edge_index.device and torch.equal(c, edge_index))


class StructureCache:
    """See the module docstring for the policy."""

    def __init__(self) -> None:
        self._live: Dict[int, _Entry] = {}  # id(edge_index) -> entry, while the tensor lives
        self._shared: "OrderedDict[int, _Entry]" = OrderedDict()  # id(entry) -> entry, LRU
        self._lock = threading.RLock()  # a weakref callback may run inside
        self.check = check_mode_from_env()
        self.builds = 0
        self.identity_hits = 0
        self.content_hits = 0
        self.stale = 0
        self.prepared = 0

    def _forget(self, key: int) -> None:
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None:
                entry.owners.pop(key, None)

    def checks(self, edge_index: Tensor) -> bool:
        """Whether a hit by identity on ``edge_index`` is confirmed by its fingerprint
        (:func:`gnncompile.ops.identity.checks` under this cache's mode)."""
        return _identity.checks(edge_index, self.check)

    def _find(self, look: _identity.Look, share: bool) -> Tuple[Optional[_Entry], str]:
        """The entry of the tensor of ``look``: by identity, else, with ``share``, by content."""
        edge_index = look.tensor
        key = id(edge_index)
        entry = self._live.get(key)
        if entry is not None:
            owner = entry.owners.get(key)
            verdict = _identity.OTHER if owner is None else owner.compare(look)
            if verdict is _identity.SAME:
                return entry, "identity"
            if verdict is _identity.REWRITTEN:
                # written behind its version counter: the entry still describes its old content
                entry.owners.pop(key, None)
                del self._live[key]
                self.stale += 1
        if share:
            for k, cand in self._shared.items():
                if cand.same_content(edge_index):
                    self._shared.move_to_end(k)
                    return cand, "content"
        return None, ""

    def _adopt(self, entry: Optional[_Entry], look: _identity.Look, share: bool, owned: bool = False) -> _Entry:
        """Makes ``entry`` (a new one when None, of the look's settled fingerprint) the entry of
        the tensor of ``look`` (``owned``: it is already, found by identity); with ``share``, one
        of the shared entries too."""
        edge_index = look.tensor
        entry = _Entry(fingerprint=look.settle().fingerprint) if entry is None else entry
        if not owned and entry.verdict(look) is not _identity.SAME:
            # the content is the entry's (built from it, or matched by torch.equal): its fingerprint
            o = _identity.Identity(look, self._forget, content_fingerprint=entry.fingerprint)
            entry.owners[o.key] = o
            self._live[o.key] = entry
        if share and entry.shareable:
            if entry.content is None:
                entry.content = edge_index.detach().clone()
            self._shared[id(entry)] = entry
            self._shared.move_to_end(id(entry))
            while len(self._shared) > MAX_SHARED:
                self._shared.popitem(last=False)
        return entry

    def get(self, edge_index: Tensor, num_dst: int, share: bool = False, check: str = "") -> Structure:
        """The structure of ``edge_index`` for ``num_dst`` destinations, built on a miss.
        ``check``: the check mode of this lookup (a compiled model's own, baked into its graph);
        "" for this cache's mode (:func:`set_structure_check`)."""
        look = _identity.Look(edge_index, _mode(check, self.check))  # the one look of this lookup
        with self._lock:
            entry, how = self._find(look, share)
            if entry is not None and num_dst in entry.by_num_dst:
                if how == "identity":
                    self.identity_hits += 1
                else:
                    self.content_hits += 1
                if share:
                    self._adopt(entry, look, share, owned=how == "identity")
                return entry.by_num_dst[num_dst]
        look.settle()  # the fingerprint recorded with the structure, whatever the mode, before it
        with outside_inference_mode():
            s = build(edge_index, num_dst)  # outside the lock: may raise for a bad edge_index
        with self._lock:
            self.builds += 1
            entry, how = self._find(look, share)
            self._adopt(entry, look, share, owned=how == "identity").by_num_dst[num_dst] = s
        return s

    # ------------------------------------------------------------------ prepared ahead (loaders)
    def prepare(self, edge_index: Tensor, num_dst: int, num_src: Optional[int] = None) -> Structure:
        """Builds (or finds, by identity) the CSR of ``edge_index`` for ``num_dst`` destinations
        and its CSC for ``num_src`` sources (default ``num_dst``), ahead of the compiled model's
        ``cached_csr`` / ``cached_csc``, which then hit by identity (under the usual rule: an
        in-place edit after this call is a miss). What a loader calls off the training step
        (:class:`gnncompile.data.PooledLoader` with ``structures``,
        :func:`gnncompile.data.prefetch_structures`). A new entry is found by identity only
        (not shared by content, see the module docstring). Raises as a lookup does for a bad
        ``edge_index``."""
        check_edge_index(edge_index, "gnncompile.ops.structure.prepare")
        num_src = int(num_dst if num_src is None else num_src)
        look = _identity.Look(edge_index, "off")  # the state; settled below, before the build
        with self._lock:
            entry, how = self._find(look, False)
            if entry is not None and int(num_dst) in entry.by_num_dst:
                s = entry.by_num_dst[int(num_dst)]
                s.check_sources(num_src)
                s.transposed(num_src)
                return s
        look.settle()
        with outside_inference_mode():
            s = build(edge_index, int(num_dst))
            s.check_sources(num_src)
            s.transposed(num_src)
        with self._lock:
            self.prepared += 1  # (not in builds: those are the lookups')
            entry, how = self._find(look, False)
            if entry is None:
                entry = _Entry(fingerprint=look.fingerprint, shareable=False)
            self._adopt(entry, look, False, owned=how == "identity").by_num_dst[int(num_dst)] = s
        return s

    def adopt(self, edge_index: Tensor, s: Structure, content_fingerprint: int) -> None:
        """Makes ``s`` (its CSC included) the structure of ``edge_index`` for ``s.num_dst``, by
        identity: built elsewhere (a PooledLoader worker) from content whose fingerprint is
        ``content_fingerprint`` (an int: CPU tensors), the content ``edge_index`` holds now.
        Replaces any entry of the tensor. Builds nothing, validates nothing: the caller vouches
        for ``s`` (native/common/trust.cpp's adopt_worker_structure)."""
        look = _identity.Look(edge_index, "off")
        look.fingerprint = content_fingerprint
        entry = _Entry(fingerprint=content_fingerprint, shareable=False)
        entry.by_num_dst[s.num_dst] = s
        with self._lock:
            old = self._live.pop(id(edge_index), None)
            if old is not None:
                old.owners.pop(id(edge_index), None)
            self._adopt(entry, look, False)
            self.prepared += 1

    def discard(self, edge_index: Tensor) -> None:
        """Drops the entry of ``edge_index`` (this very tensor) if it was prepared for it: a
        loader calls it when the slot that holds the batch is handed out again."""
        with self._lock:
            key = id(edge_index)
            entry = self._live.get(key)
            if entry is None or entry.shareable:
                return
            owner = entry.owners.get(key)
            if owner is not None and owner.ref() is edge_index:
                entry.owners.pop(key, None)
                del self._live[key]

    def clear(self) -> None:
        with self._lock:
            self._live.clear()
            self._shared.clear()
            self.builds = self.identity_hits = self.content_hits = self.stale = self.prepared = 0

    def __len__(self) -> int:
        """Live edge_index tensors with an entry."""
        return len(self._live)

    def info(self) -> dict:
        return {"entries": len(self._live), "shared": len(self._shared), "builds": self.builds,
                "hits": self.identity_hits + self.content_hits, "identity_hits": self.identity_hits,
                "content_hits": self.content_hits, "stale": self.stale, "prepared": self.prepared,
                "check": self.check}


CACHE = StructureCache()


def _mode(check: str, default: str) -> str:
    if not check:
        return default
    if check not in CHECK_MODES:
        raise ValueError(f"gnncompile: structure check mode must be one of {', '.join(CHECK_MODES)}, got {check!r}")
    return check


def structure(edge_index: Tensor, num_dst: int) -> Structure:
    """The cached structure of ``edge_index`` for ``num_dst`` destination nodes (identity only)."""
    if torch.compiler.is_compiling():
        return build(edge_index, num_dst)
    return CACHE.get(edge_index, num_dst)


def cache_info() -> dict:
    """``entries`` (live edge_index tensors), ``shared`` (entries matched by content), ``builds``,
    ``hits`` (= ``identity_hits`` + ``content_hits``), ``stale`` (identity hits refused because the
    content fingerprint changed), ``prepared`` (structures prepared ahead by a loader: built by
    :func:`prepare_structure`, or adopted from a PooledLoader worker; ``builds`` counts the
    lookups' builds only)
    and ``check`` (the mode, see :func:`set_structure_check`)."""
    return CACHE.info()


def prepare_structure(edge_index: Tensor, num_nodes: Optional[int] = None, num_src: Optional[int] = None) -> Structure:
    """Builds the CSR (by destination, ``num_nodes`` of them; default ``edge_index.max() + 1``)
    and the CSC (``num_src`` sources, default ``num_nodes``) of ``edge_index`` into the cache
    now, so that a compiled model's structure ops later find them by identity (no build, no
    validation in its step): :meth:`StructureCache.prepare`. Pass the batch's ``num_nodes``
    (``x.size(0)``, what the model's layers use) for a hit."""
    if num_nodes is None:
        num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 0
    return CACHE.prepare(edge_index, int(num_nodes), num_src)


def set_structure_check(mode: str) -> None:
    """When a hit by identity is confirmed by the content fingerprint (inference tensors: always):
    ``"cpu"`` (the default) for CPU tensors, ``"all"`` for every device (on CUDA one host wait per
    lookup), ``"off"`` never (an edit through ``.numpy()`` / ``.data`` is then missed). The
    environment variable ``GNNCOMPILE_STRUCTURE_CHECK`` (0/off, 1/cpu, 2/all) sets the default.

    This is the process-wide mode: what the eager API (:func:`gnncompile.ops.spmm`, ...) uses,
    and what a model compiled from now on records in its settings. A compiled model keeps the
    mode it was compiled with (an argument of its structure ops, ``settings.structure_check``)."""
    if mode not in CHECK_MODES:
        raise ValueError(f"gnncompile.ops.set_structure_check: mode must be one of {', '.join(CHECK_MODES)}, "
                         f"got {mode!r}")
    CACHE.check = mode


def structure_check() -> str:
    """The current mode of :func:`set_structure_check`."""
    return CACHE.check


def validation_count() -> int:
    """How many times the native code has validated a structure's contents in this process
    (native/common/trust.h: rowptr's ends and order, the range of col or perm, perm's
    uniqueness, the CUDA check that waits for the device), whatever the outcome; 0 without the
    native module. A structure built by ``build_csr``, derived from one (its CSC, its copies) or
    validated once is recorded and not validated again until it changes, so in a training loop
    this stops moving after the first step. The per-index checks the CPU kernels make as they
    read are not counted. See :func:`validations_since`."""
    return int(_native._C.structure_validations()) if _native._C is not None else 0


def validations_since(mark: int) -> int:
    """The validations since ``mark``, an earlier :func:`validation_count`:
    ``mark = validation_count(); step(); assert validations_since(mark) == 0``."""
    return validation_count() - mark


def clear_cache() -> None:
    """Drops every cached structure, and the graph-only results computed from them
    (:mod:`gnncompile.ops.hoisted`)."""
    from . import hoisted

    CACHE.clear()
    hoisted.CACHE.clear()


# ----------------------------------------------------------------------------- structure ops
def _maybe_copy(ts, copy: bool):
    # copy=True for code-generating inner compilers (inductor), which may recycle the storage of
    # an op's output once the graph no longer reads it: the cache's tensors must not be handed out.
    # clone_structure keeps what the native code knows of them (no validation of the copies).
    return tuple(ops.clone_structure(list(ts))) if copy else tuple(ts)


@torch.library.custom_op("gnncompile::cached_csr", mutates_args=())
def cached_csr(edge_index: Tensor, num_dst: int, copy: bool = False,
               check: str = "") -> Tuple[Tensor, Tensor, Tensor]:
    check_edge_index(edge_index, "gnncompile::cached_csr")
    s = CACHE.get(edge_index, int(num_dst), share=True, check=check)
    return _maybe_copy((s.rowptr, s.col, s.perm), copy)


@cached_csr.register_fake
def _(edge_index, num_dst, copy=False, check=""):
    E = edge_index.shape[1]
    return (edge_index.new_empty(num_dst + 1), edge_index.new_empty(E), edge_index.new_empty(E))


@torch.library.custom_op("gnncompile::cached_csc", mutates_args=())
def cached_csc(edge_index: Tensor, num_dst: int, num_src: int, copy: bool = False,
               check: str = "") -> Tuple[Tensor, Tensor, Tensor]:
    check_edge_index(edge_index, "gnncompile::cached_csc")
    s = CACHE.get(edge_index, int(num_dst), share=True, check=check)
    s.check_sources(int(num_src))
    return _maybe_copy(s.transposed(int(num_src)), copy)


@cached_csc.register_fake
def _(edge_index, num_dst, num_src, copy=False, check=""):
    E = edge_index.shape[1]
    return (edge_index.new_empty(num_src + 1), edge_index.new_empty(E), edge_index.new_empty(E))


@torch.library.custom_op("gnncompile::pair_csr", mutates_args=())
def pair_csr(dst: Tensor, src: Tensor, num_dst: int) -> Tuple[Tensor, Tensor, Tensor]:
    if dst.dim() != 1 or src.shape != dst.shape or src.dtype != dst.dtype:
        raise ValueError("gnncompile::pair_csr: dst and src must be 1-D index tensors of one shape and dtype")
    s = build(torch.stack([src, dst]), int(num_dst))
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


__all__ = ["Structure", "StructureCache", "CACHE", "MAX_SHARED", "CHECK_MODES", "build", "structure",
           "cache_info", "clear_cache", "set_structure_check", "prepare_structure", "structure_check", "fingerprint",
           "validation_count", "validations_since",
           "outside_inference_mode", "transpose_structure", "cached_csr", "cached_csc", "pair_csr",
           "pair_csc", "csr_degree"]
