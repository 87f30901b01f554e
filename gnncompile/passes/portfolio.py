"""The last step of the rewrite: each fused spmm runs the implementation of the portfolio
(:mod:`gnncompile.compiler.portfolio`) that its settings and this device's measurements choose.

For every ``gnncompile::spmm`` call left in the graph (after the attention fusions, which read
them), ``decide`` (the compiler's :func:`gnncompile.compiler.portfolio.decide`, handed down by
the backend: the passes themselves never launch kernels) names an implementation; where it is
``torch_sparse`` the call becomes ``gnncompile::spmm_sparse`` with the same structure, weight,
features, reduce, knobs and transposed structure. The chain's report line (:class:`~.report.Fused`)
records the decision (``impl``), which :func:`gnncompile.explain` prints. Without ``decide``
(export, and ``passes.run`` called directly) every spmm stays native.
"""
from __future__ import annotations

import math
import operator
from typing import Callable, Dict, Optional, Tuple

from torch.fx import Node

from ..ops import targets
from ..settings import Settings
from .canonical import fake_tensor, size_hint
from .report import Fused


def _meta(n) -> Optional[Tuple[tuple, object, object]]:
    """(shape, dtype, device) of an argument of the fused call: the fake tensor Dynamo recorded,
    through the ``contiguous`` / ``reshape(-1)`` / ``squeeze(-1)`` the rewrite put in front of it
    (those nodes are new, with no recorded value)."""
    v = fake_tensor(n)
    if v is not None:
        return tuple(v.shape), v.dtype, v.device
    if not isinstance(n, Node) or n.op != "call_method" or not n.args:
        return None
    inner = _meta(n.args[0])
    if inner is None:
        return None
    shape, dtype, device = inner
    if n.target == "contiguous":
        return inner
    if n.target == "reshape" and tuple(n.args[1:]) == (-1,):
        return (math.prod(shape),), dtype, device
    if n.target == "squeeze" and tuple(n.args[1:]) == (-1,):
        return (shape[:-1] if shape and shape[-1] == 1 else shape), dtype, device
    return None


def choose_implementations(graph, lines: Dict[Node, Fused], settings: Settings,
                           decide: Optional[Callable]) -> int:
    """Applies the portfolio to the spmm calls of ``graph`` (``lines``: the report line of each
    fused call); returns how many now run the vendor implementation."""
    if decide is None:
        return 0
    swapped = 0
    for n in [n for n in graph.nodes if n.op == "call_function" and n.target is targets.SPMM]:
        rowptr, col, perm, w, x, reduce, knobs = n.args[:7]
        t = tuple(n.args[7:10]) + (None,) * (3 - len(n.args[7:10]))
        xv, wv = _meta(x), (_meta(w) if w is not None else None)
        if xv is None or (w is not None and wv is None):
            continue
        width = math.prod(size_hint(s) or 1 for s in xv[0][1:])
        d = decide(xv[2], xv[1], width, reduce, None if wv is None else len(wv[0]),
                   settings.spmm_impl, settings.reassociate)
        line = lines.get(n)
        uses = list(n.users)
        if d.impl == "torch_sparse" and (len(n.args) > 10 or
                                        not all(u.target is operator.getitem and u.args[1] == 0 for u in uses)):
            d = type(d)("native", "the call reads the spmm's second output, which torch_sparse does not give")
        if line is not None:
            line.impl = str(d)
        if d.impl != "torch_sparse":
            continue
        with graph.inserting_before(n):
            new = graph.call_function(targets.SPMM_SPARSE, (rowptr, col, perm, w, x, reduce, knobs, *t))
        if uses and "val" in uses[0].meta:
            new.meta["val"] = uses[0].meta["val"]
        for u in uses:
            u.replace_all_uses_with(new)
            graph.erase_node(u)
        graph.erase_node(n)
        if line is not None:
            lines[new] = line
        swapped += 1
    return swapped


__all__ = ["choose_implementations"]
