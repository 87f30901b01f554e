"""``gnncompile::hoisted``: graph-only work computed once per graph, not once per call.

:mod:`gnncompile.passes.hoist` moves the nodes of a compiled graph whose inputs are only the
graph (integer index tensors such as ``edge_index``, and sizes) into a region: a small
``GraphModule`` registered here under a key derived from its code. The compiled graph calls
``hoisted(key, roots, sizes, copy)`` instead, which returns the region's outputs from a cache:

* **Validity.** A result belongs to the exact root tensors it was computed from, under the one
  identity rule of :mod:`gnncompile.ops.identity`, which the structure cache follows too, in
  its check mode: the same tensor objects (held by weak references), the same version
  counters, data pointers, shapes, strides, dtypes and devices, and, where
  :meth:`~gnncompile.ops.structure.StructureCache.checks` says so (CPU tensors by default,
  inference tensors always), the same content fingerprint; what is recorded is one look at
  each root taken before the region runs. Any change recomputes; a root that is freed drops
  its results. The sizes are part of the key.
* **What may be a root.** Only tensors that need no gradient and hold integers: nothing
  trainable and nothing computed from features can reach a region (the pass checks; see
  :mod:`gnncompile.passes.hoist`).
* ``copy=True`` hands out clones, for inner compilers that may reuse an op's output buffers
  (inductor), as the structure ops do: ``gnncompile::clone_structure`` copies, which keep what
  the native record knows of each output (a structure among them is not validated again).
* Outputs whose size depends on the data (``add_remaining_self_loops``: the number of edges
  kept) get one fresh unbacked size per distinct size expression in the fake implementation,
  so that a backward graph can bind them from the tensors it receives.
* **Lifetime.** The registry holds regions weakly. What calls a region holds it: the pass
  records it on the ``GraphModule`` it rewrote (:func:`hold`), and the backend hands it on to
  what the inner compiler made of that graph (:func:`pass_on`; ``"eager"`` returns
  ``gm.forward``, which holds it through ``gm``). A region, and the results cached for it, go
  when the last compiled graph calling its key does: a fresh compile per graph size does not
  leave one more region behind each time. Graphs with identical regions share one.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch
from torch import Tensor

from . import identity as _identity
from . import structure as _structure
from .schemas import ops

MAX_RESULTS = 16  # cached results kept (least recently used goes first)

# key -> region, held weakly: a region lives while something that calls it holds it (see HELD)
_REGIONS: "weakref.WeakValueDictionary[int, torch.fx.GraphModule]" = weakref.WeakValueDictionary()
_lock = threading.RLock()

#: The attribute under which a GraphModule, and the callable an inner compiler made of it,
#: hold the regions their graph calls.
HELD = "_gnncompile_regions"


def register(gm: torch.fx.GraphModule) -> Tuple[int, torch.fx.GraphModule]:
    """Registers region ``gm``; returns its key, a 63-bit hash of its code, the same in every
    process for the same region (so persistent compile caches that store the key stay valid),
    and the region registered under it: ``gm``, or an identical one registered earlier and
    still held. The registry holds it weakly: whatever calls the key must hold that region
    (:func:`hold`)."""
    key = int.from_bytes(hashlib.blake2b(gm.code.encode(), digest_size=8).digest(), "little") >> 1
    with _lock:
        held = _REGIONS.setdefault(key, gm)
        if held is gm:  # its cached results go with it
            weakref.finalize(gm, CACHE.drop_key, key).atexit = False
    return key, held


def region(key: int) -> torch.fx.GraphModule:
    try:
        return _REGIONS[key]
    except KeyError:
        raise RuntimeError(f"gnncompile::hoisted: no region {key} in this process; the compiled graph "
                           "calling it was freed, or was made by another process without its pass run") from None


def hold(gm: torch.fx.GraphModule, region: torch.fx.GraphModule) -> None:
    """``gm``, whose graph calls ``region``, holds it (in ``gm.<HELD>``)."""
    held = getattr(gm, HELD, None)
    if held is None:
        held = []
        setattr(gm, HELD, held)
    if not any(r is region for r in held):
        held.append(region)


def pass_on(gm: torch.fx.GraphModule, compiled):
    """Returns ``compiled`` (what an inner compiler made of ``gm``) holding the regions that
    ``gm`` holds, as an attribute: no wrapper, so a call costs what it did. ``gm.forward`` (the
    "eager" inner) holds them through ``gm``; a callable that takes no attributes is wrapped."""
    held = getattr(gm, HELD, None)
    if not held or getattr(compiled, "__self__", None) is gm:
        return compiled
    try:
        setattr(compiled, HELD, held)
        return compiled
    except (AttributeError, TypeError):
        pass

    @functools.wraps(compiled)
    def call(*args, **kwargs):
        return compiled(*args, **kwargs)

    call._boxed_call = getattr(compiled, "_boxed_call", False)  # Dynamo's calling convention
    setattr(call, HELD, held)
    return call


# ----------------------------------------------------------------------------- results cache
@dataclass
class _Result:
    roots: Tuple[_identity.Identity, ...]  # of each root, when the outputs were computed
    outputs: Tuple[Tensor, ...]


class HoistCache:
    def __init__(self) -> None:
        self._results: "OrderedDict[tuple, _Result]" = OrderedDict()
        self.computes = 0
        self.hits = 0
        self.stale = 0

    def _drop_root(self, rid: int) -> None:
        with _lock:
            for k in [k for k in self._results if rid in k[1]]:
                # pop with a default: a collector run inside this loop (the lock is re-entrant)
                # may have dropped k already, and this runs as a weakref callback
                self._results.pop(k, None)

    def drop_key(self, key: int) -> None:
        """Drops the results of region ``key`` (it was freed)."""
        with _lock:
            for k in [k for k in self._results if k[0] == key]:
                self._results.pop(k, None)

    def get(self, key: int, roots: List[Tensor], sizes: List[int], check: str = "") -> Tuple[Tensor, ...]:
        # the compiled model's check mode ("": the structure cache's process-wide one)
        mode = _structure._mode(check, _structure.CACHE.check)
        looks = [_identity.Look(r, mode) for r in roots]  # the one look at each root
        ck = (key, tuple(map(id, roots)), tuple(map(int, sizes)))
        with _lock:
            res = self._results.get(ck)
            if res is not None:
                for o, lk in zip(res.roots, looks):
                    if o.compare(lk) is not _identity.SAME:
                        self._results.pop(ck, None)
                        self.stale += 1
                        break
                else:
                    self._results.move_to_end(ck)
                    self.hits += 1
                    return res.outputs
        # recorded before the region runs: the state and content it computes from
        held = tuple(_identity.Identity(lk, self._drop_root) for lk in looks)
        outputs = self._compute(key, roots, sizes)
        with _lock:
            self.computes += 1
            self._results[ck] = _Result(held, outputs)
            while len(self._results) > MAX_RESULTS:
                self._results.popitem(last=False)
        return outputs

    @staticmethod
    def _compute(key: int, roots: List[Tensor], sizes: List[int]) -> Tuple[Tensor, ...]:
        gm = region(key)
        with torch.no_grad(), _structure.outside_inference_mode():
            outs = gm(*roots, *[int(s) for s in sizes])
            # contiguous, and never sharing memory with a root or another output (an op's
            # outputs must not alias its inputs or each other)
            seen = {r.untyped_storage().data_ptr() for r in roots if r.numel()}
            result = []
            for o in outs:
                ptr = o.untyped_storage().data_ptr() if o.numel() else None
                if not o.is_contiguous() or (ptr is not None and ptr in seen):
                    o = o.clone(memory_format=torch.contiguous_format)
                    ptr = o.untyped_storage().data_ptr() if o.numel() else None
                if ptr is not None:
                    seen.add(ptr)
                result.append(o)
            return tuple(result)

    def clear(self) -> None:
        with _lock:
            self._results.clear()
            self.computes = self.hits = self.stale = 0

    def info(self) -> dict:
        return {"results": len(self._results), "computes": self.computes, "hits": self.hits,
                "stale": self.stale, "regions": len(_REGIONS)}


CACHE = HoistCache()


def hoist_info() -> dict:
    """``results`` held, ``computes`` (region runs), ``hits``, ``stale`` (results refused
    because a root changed) and ``regions`` alive in this process (held by compiled graphs)."""
    return CACHE.info()


# ----------------------------------------------------------------------------- the op
@torch.library.custom_op("gnncompile::hoisted", mutates_args=())
def hoisted(key: int, roots: List[Tensor], sizes: List[int], copy: bool, check: str = "") -> List[Tensor]:
    for r in roots:
        if r.requires_grad or r.is_floating_point() or r.is_complex():
            raise TypeError("gnncompile::hoisted: roots must be integer tensors that need no gradient")
    outs = CACHE.get(int(key), list(roots), list(sizes), check)
    # copies that keep what the native code knows of the structures among the outputs
    return list(ops.clone_structure(list(outs))) if copy else list(outs)


@hoisted.register_fake
def _(key, roots, sizes, copy, check=""):
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    gm = region(int(key))
    ctx = torch.library.get_ctx()
    shape_env = getattr(ctx, "_shape_env", None)
    guard = shape_env.ignore_fresh_unbacked_symbols() if shape_env is not None else contextlib.nullcontext()
    with guard:  # the region's own data-dependent sizes are replaced below
        outs = gm(*roots, *sizes)
    fresh: Dict[str, torch.SymInt] = {}
    result = []
    for o in outs:
        shape = []
        for s in o.shape:
            if isinstance(s, torch.SymInt) and free_unbacked_symbols(s):
                k = str(s)
                if k not in fresh:
                    fresh[k] = ctx.new_dynamic_size()
                shape.append(fresh[k])
            else:
                shape.append(s)
        result.append(o.new_empty(shape))
    return result


__all__ = ["hoisted", "register", "region", "hold", "pass_on", "HELD", "hoist_info", "HoistCache", "CACHE",
           "MAX_RESULTS"]
