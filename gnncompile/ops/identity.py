"""The one identity rule of the compiled path's caches: "is this still the same tensor, with the
same content, as when I computed from it?"

The structure cache (:mod:`.structure`, keyed by ``edge_index``) and the cache of hoisted
graph-only results (:mod:`.hoisted`, keyed by the roots of a region) both ask it, through the
two classes here; neither keeps a copy of the rule.

The rule
--------
A lookup takes one :class:`Look` at a tensor: its **state** (version counter, data pointer,
shape, strides, dtype, device) and, when the check mode asks for it (:func:`checks`), its
content **fingerprint** (``gnncompile::fingerprint``, native/common/fingerprint.h). What was
computed from the tensor is recorded with an :class:`Identity` made from the look taken
*before* computing (the state and the fingerprint the result was computed from, never values
read afterwards). A later look is :data:`SAME` as the identity when

* it is the very tensor object (the identity holds it by a weak reference, so the cache never
  keeps it alive; an ``id`` or a data pointer reused after a free is another tensor);
* its state is equal: an in-place op (``ei[0, 0] = 3``, ``ei.add_(1)``, a write through a view,
  ``resize_``, ``set_``) moves the version counter; ``ei.data = other`` does not, but moves the
  data pointer, or, for a view of the same memory (``ei.data = ei.data[:, :k]``, a transpose,
  a reinterpreting ``view(dtype)``), the shape, strides or dtype; all of these are
  :data:`MOVED`;
* and, where the look carries a fingerprint, the fingerprints are equal: a write that moves
  nothing above (through ``.numpy()``, ``.data[...]``, DLPack, or any write to an inference
  tensor, which has no version counter) is :data:`REWRITTEN`.

When the check applies (:func:`checks`): always for an inference tensor (it has no version
counter, so its content is the only witness); for the others per the structure cache's mode
(:func:`gnncompile.ops.set_structure_check`, environment ``GNNCOMPILE_STRUCTURE_CHECK``):
``"cpu"`` CPU tensors, ``"all"`` every device (on CUDA comparing waits for the device),
``"off"`` none (such writes are then missed). An identity always records its fingerprint,
whatever the mode when it was made, so that a later look in a checking mode compares against
the content the result was computed from.

When the tensor dies its identity's ``on_death(key)`` runs (``key`` is the ``id`` the tensor
had), so the cache drops what it computed from it; dropping an identity first never runs it.

The native record of trusted structures (native/common/trust.h)
---------------------------------------------------------------
The native code keeps a third record, of the tensors of structures (``rowptr``, ``col``,
``perm``), each with what is known of its values (a valid rowptr over E edges, a bound on its
entries, a permutation), and applies the same components to each tensor: the same object (a weak reference to
its ``TensorImpl``, the object a Python tensor wraps; ``.data =`` keeps it and swaps what it
points to), the same version counter, data pointer, sizes, strides, dtype and device; and, as
here, an inference tensor (no version counter) is not trusted by its state alone: the native
record never holds one. It checks them itself, in C++, rather than receiving a look from here,
because

* it guards raw pointers at the kernel, for every caller of the kernel ops: the structure
  cache's outputs, their CSC (``transpose_structure``) and their ``clone_structure`` copies, but
  also a user's own ``build_csr`` output passed to ``torch.ops.gnncompile.spmm`` /
  ``edge_softmax`` / ``edge_dot``, an exported program, a C++ caller; none of these passes through a Python cache, so there is no
  look to hand down (and handing one down would put it in every op's schema);
* it is about other tensors: the structure tensors an op reads, not the ``edge_index`` or the
  roots these caches are keyed by;
* it has no fingerprint step: confirming a structure by a pass over it costs what the
  validation it saves costs (on CUDA the same host wait). A write behind the version counter
  leaves a structure trusted; the CPU kernels still range-check every index they read (a perm
  made non-unique that way is not noticed), the CUDA kernels do not (trust.h).
"""
from __future__ import annotations

import weakref
from typing import Callable, Optional

import torch
from torch import Tensor

from .schemas import ops

#: Verdicts of :meth:`Identity.compare`.
SAME = "same"  # the same tensor, content unchanged as far as the look can tell
MOVED = "moved"  # the same tensor object, but its version, data pointer or layout changed
REWRITTEN = "rewritten"  # the same object and state, but the fingerprint differs
OTHER = "other"  # another tensor (or the recorded one is dead)


def fingerprint(t: Tensor):
    """The content fingerprint (``gnncompile::fingerprint``) of ``t``: an int for a CPU tensor,
    a 0-d tensor on its device otherwise (computing it does not wait for the device, comparing
    it does)."""
    fp = ops.fingerprint.default(t)
    return fp.item() if t.is_cpu else fp


def same_fingerprint(a, b) -> bool:
    return a == b if isinstance(a, int) else bool(torch.equal(a, b))


def checks(t: Tensor, mode: str) -> bool:
    """Whether a look at ``t`` under check ``mode`` ("off", "cpu", "all") carries its fingerprint:
    always for an inference tensor, else per the mode."""
    return t.is_inference() or mode == "all" or (mode == "cpu" and t.is_cpu)


class Look:
    """One look at a tensor: its state and, when ``checks(t, mode)``, its fingerprint
    (``checked``). A lookup takes one look and uses it throughout: to compare, and on a miss
    (after :meth:`settle`) to record what is computed from the tensor."""

    __slots__ = ("tensor", "state", "fingerprint", "checked")

    def __init__(self, t: Tensor, mode: str) -> None:
        try:
            version = t._version
        except RuntimeError:  # an inference tensor: no version counter
            version = None
        self.tensor = t
        self.state = (version, t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)
        if version is None or mode == "all" or (mode == "cpu" and t.is_cpu):
            self.checked, self.fingerprint = True, fingerprint(t)
        else:
            self.checked, self.fingerprint = False, None

    def settle(self) -> "Look":
        """Computes the fingerprint if the look did not carry it, for an identity to record
        (whatever the mode: a later look in a checking mode compares against it). Call it
        before computing from the tensor, so that both describe the same content."""
        if self.fingerprint is None:
            self.fingerprint = fingerprint(self.tensor)
        return self


class Identity:
    """What a result was computed from: the tensor (weakly), its state, its fingerprint.

    Make it from the look taken before computing, settled (:meth:`Look.settle`) before
    computing too. ``content_fingerprint`` is the content's fingerprint when the caller knows it
    without computing it (an entry matched by equal content); otherwise the look's (computed
    now if the look was not settled). ``on_death(key)`` runs when the tensor dies; ``key`` is
    ``id`` of the tensor."""

    __slots__ = ("key", "ref", "state", "fingerprint")

    def __init__(self, look: Look, on_death: Optional[Callable[[int], None]] = None,
                 content_fingerprint=None) -> None:
        t = look.tensor
        self.key = key = id(t)
        self.ref = weakref.ref(t, None if on_death is None else (lambda _r: on_death(key)))
        self.state = look.state
        if content_fingerprint is None:
            content_fingerprint = look.settle().fingerprint
        self.fingerprint = content_fingerprint

    def compare(self, look: Look) -> str:
        """:data:`SAME`, :data:`MOVED`, :data:`REWRITTEN` or :data:`OTHER` (see the module)."""
        if self.ref() is not look.tensor:
            return OTHER
        if self.state != look.state:
            return MOVED
        if look.checked and not same_fingerprint(self.fingerprint, look.fingerprint):
            return REWRITTEN
        return SAME


__all__ = ["Look", "Identity", "checks", "fingerprint", "same_fingerprint", "SAME", "MOVED", "REWRITTEN",
           "OTHER"]
