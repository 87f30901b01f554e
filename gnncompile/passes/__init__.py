"""Graph rewrites on the torch-level FX graph that Dynamo captures (before AOTAutograd).

``run(gm)`` canonicalizes spellings (:mod:`.canonical`), finds gather -> message -> scatter
chains, edge softmax and degree counts, and replaces them with the gnncompile custom ops
(:mod:`.fuse`). Passes never launch kernels; the structure ops they insert live in
:mod:`.runtime`.
"""
from __future__ import annotations

from torch.fx import GraphModule

from . import runtime
from .canonical import drop_identity_dropout
from .fuse import Fused, PassReport, Unfused, fuse


def run(gm: GraphModule, copy_structures: bool = False) -> PassReport:
    """Rewrites ``gm`` in place and returns the report of what was fused. ``copy_structures``:
    the cached graph structure is copied per call (for inner compilers that recycle buffers)."""
    drop_identity_dropout(gm.graph)
    return fuse(gm, copy_structures=copy_structures)  # recompiles gm


__all__ = ["run", "fuse", "PassReport", "Fused", "Unfused", "runtime"]
