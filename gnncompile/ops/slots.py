"""Per-edge tensors in CSR slot order, made once per (structure, tensor) and cached with the
structure: what lets the message kernels read an edge input in order (side ``slot``, or
``enc_slot`` for an edge encoder's features, ops/program.py) instead of at random through
``perm`` (issue 25: the edge encoder's kernel read its features through perm, 4-8 ms of a 60 ms
pass at 1M edges).

* ``gnncompile::slot_rows(a, perm)``: ``a[perm]`` (native/cpu/slot_rows.cpp; ``index_select``
  elsewhere), differentiable: its gradient is put back in the user's edge order
  (``g_a[perm[j]] = g[j]``, a copy: every element lands once, bit for bit).
* ``gnncompile::cached_slot_rows(edge_index, num_dst, a, copy, check)``: the same rows, from
  the cache of the structure of ``edge_index`` (:mod:`.structure`; ``Structure.extras``), made
  on a miss. The rewrite (passes/rewrite.py) inserts it only for an edge input that needs no
  gradient, is an input of the compiled graph (the same tensor step after step) and has at
  least :data:`SLOT_COPY_MIN_EDGES` edges.

The rule that keeps a copy from being served stale is the structure cache's identity rule
(:mod:`.identity`) applied to ``a``: the same tensor object (held weakly: the copy goes when
the tensor dies), the same version counter (any in-place change: ``a.add_(1)``, ``a[0] = 3``,
a write through a view), data pointer, shape, strides, dtype and device; and, where the check
mode asks (``check``, else the structure cache's mode; ``"cpu"`` by default), the same content
fingerprint of ``a``'s bytes (``gnncompile::fingerprint`` over them), which catches writes that
bypass the version counter (``.numpy()``, ``.data``). An inference tensor (no version counter)
is never cached: it is copied on every call. At most :data:`MAX_COPIES` copies per structure
(least recently used goes first).
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Optional

import torch
from torch import Tensor

from . import identity as _identity
from . import structure as _structure
from .registration import register_autograd
from .schemas import _lib, ops

MAX_COPIES = 4  # per structure
#: the fewest edges for which the rewrite reads an edge input through a cached copy: below it
#: the random reads through perm hit the cache anyway (benchmarks/results/codegen_encoder_s57*)
SLOT_COPY_MIN_EDGES = 100_000

_lock = threading.RLock()
_STATS = {"copies": 0, "hits": 0, "stale": 0, "uncached": 0}


# ----------------------------------------------------------------------------- slot_rows
def _slot_rows_reference(a: Tensor, perm: Tensor) -> Tensor:
    return a.index_select(0, perm.long())


_lib.impl("slot_rows", _slot_rows_reference, "CompositeExplicitAutograd")


@torch.library.register_fake("gnncompile::slot_rows")
def _slot_rows_fake(a, perm):
    return torch.empty_like(a, memory_format=torch.contiguous_format)


def edge_order(t: Tensor, perm: Tensor) -> Tensor:
    """``t`` (per CSR slot) in the user's edge order: ``out[perm[j]] = t[j]`` (a copy, differentiable)."""
    return t.new_empty(t.shape).index_copy(0, perm.long(), t)


def _slot_rows_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _slot_rows_backward(ctx, grad):
    (perm,) = ctx.saved_tensors
    return edge_order(grad, perm), None


register_autograd("gnncompile::slot_rows", _slot_rows_backward, setup_context=_slot_rows_setup)


# ----------------------------------------------------------------------------- the cache
def _state(a: Tensor):
    try:
        version = a._version
    except RuntimeError:  # an inference tensor: no version counter
        version = None
    return (version, a.data_ptr(), tuple(a.shape), a.stride(), a.dtype, a.device)


def content_fingerprint(a: Tensor):
    """The fingerprint (``gnncompile::fingerprint``) of ``a``'s bytes, read as 64-bit words where
    they split into them (half the terms of 32-bit ones), else as 32-bit words; dtypes of another
    size have none (None)."""
    if a.element_size() not in (4, 8):
        return None
    flat = a.detach().contiguous().reshape(-1)
    try:
        return _identity.fingerprint(flat.view(torch.int64))
    except RuntimeError:  # an odd number of 4-byte elements (or an unaligned start): 32-bit words
        return _identity.fingerprint(flat.view(torch.int32))


class _Copy:
    __slots__ = ("ref", "state", "fingerprint", "rows")

    def __init__(self, ref, state, fp, rows) -> None:
        self.ref, self.state, self.fingerprint, self.rows = ref, state, fp, rows


def _copies(s: _structure.Structure) -> "OrderedDict[int, _Copy]":
    return s.extras.setdefault("slot_rows", OrderedDict())


def slot_copy(s: _structure.Structure, a: Tensor, mode: str) -> Tensor:
    """``a[perm]`` for structure ``s``, from its cache (made on a miss; see the module)."""
    state = _state(a)
    fp_ok = a.element_size() in (4, 8)
    if state[0] is None or not fp_ok:  # no version counter (or no fingerprint): never cached
        with _lock:
            _STATS["uncached"] += 1
        return ops.slot_rows(a, s.perm)
    checked = _identity.checks(a, mode)
    copies = _copies(s)
    key = id(a)
    with _lock:
        c = copies.get(key)
        if c is not None and c.ref() is a and c.state == state:
            if not checked or _identity.same_fingerprint(c.fingerprint, content_fingerprint(a)):
                copies.move_to_end(key)
                _STATS["hits"] += 1
                return c.rows
            _STATS["stale"] += 1
        if c is not None:
            copies.pop(key, None)
    fp = content_fingerprint(a)  # of the content copied (before the copy)
    with _structure.outside_inference_mode():
        rows = ops.slot_rows(a.detach(), s.perm)
    dead = weakref.ref(copies)

    def forget(_r, key=key):
        d = dead()
        if d is not None:
            with _lock:
                cur = d.get(key)
                if cur is not None and cur.ref is _r:
                    d.pop(key, None)

    with _lock:
        copies[key] = _Copy(weakref.ref(a, forget), state, fp, rows)
        copies.move_to_end(key)
        while len(copies) > MAX_COPIES:
            copies.popitem(last=False)
        _STATS["copies"] += 1
    return rows


def info() -> dict:
    """``copies`` made, ``hits``, ``stale`` (refused: the fingerprint changed), ``uncached``
    (inference tensors, copied every call)."""
    with _lock:
        return dict(_STATS)


@torch.library.custom_op("gnncompile::cached_slot_rows", mutates_args=())
def cached_slot_rows(edge_index: Tensor, num_dst: int, a: Tensor, copy: bool = False, check: str = "") -> Tensor:
    """``a`` (``[E, ...]``, the user's edge order) in the CSR slot order of the structure of
    ``edge_index`` for ``num_dst`` destinations, from that structure's cache (see the module).
    ``copy=True`` hands out a clone (inner compilers that recycle an op's output buffers)."""
    if a.dim() < 1 or a.shape[0] != edge_index.shape[-1]:
        raise ValueError(f"gnncompile::cached_slot_rows: a has shape {list(a.shape)}, not [{edge_index.shape[-1]} "
                         f"edges, ...]")
    s = _structure.CACHE.get(edge_index, int(num_dst), share=True, check=check)
    rows = slot_copy(s, a, _structure._mode(check, _structure.CACHE.check))
    return rows.clone() if copy else rows


@cached_slot_rows.register_fake
def _(edge_index, num_dst, a, copy=False, check=""):
    return torch.empty_like(a, memory_format=torch.contiguous_format)


__all__ = ["cached_slot_rows", "slot_copy", "edge_order", "content_fingerprint", "info", "SLOT_COPY_MIN_EDGES",
           "MAX_COPIES"]
