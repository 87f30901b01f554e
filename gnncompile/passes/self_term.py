"""A node's own term folded into its fused sum: ``spmm(x, 'sum') + s * x`` -> ``spmm_self``.

GINConv (and any layer written as ``propagate(x) + (1 + eps) * x``) adds each node's own
features, scaled, to its neighbours' sum. After the rewrite that is three ops over [N, F]: the
fused spmm, a mul and an add (and, backward, a mul and autograd's sum of two gradients).
``gnncompile::spmm_self`` computes the same in the spmm's pass over the rows, bit for bit: the
sum in CSR order, then ``round(s * x[i])`` added once, as the add of the two rounded tensors does
(native/cpu/spmm_core.h, ``add_self_term``: no fused multiply-add); its backward is the same op
over the transpose.

Folded only where nothing else can change: the spmm is the native ``sum`` with no edge weight
(not the vendor's, not bf16), its output and the product feed this add alone, the product's
tensor is the spmm's own input (itself or its ``.contiguous()``), ``s`` is a one-element tensor
(``1 + eps``, shape [1]: a buffer, or a parameter whose gradient the op computes), no
broadcasting (the three shapes alike), one dtype (float32 or float64) for ``s``, ``x`` and the
sum, on the CPU, and neither ``x`` nor ``s`` written in place between where the spmm or the
product read them and the add (the op reads both at the add). Anything else is left as the
rewrite wrote it.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from ..ops import targets
from .report import PassReport
from .semantics import Writes

_ADDS = (operator.add, torch.add)
_MULS = (operator.mul, torch.mul)


def _val(n):
    if not isinstance(n, Node):
        return None
    v = n.meta.get("val", n.meta.get("example_value"))
    return v if isinstance(v, torch.Tensor) else None


def _shape(n) -> tuple:
    v = _val(n)
    return tuple(str(d) for d in v.shape) if v is not None else ()


def _plain_binary(n: Node, fns) -> bool:
    return n.op == "call_function" and n.target in fns and len(n.args) == 2 and not n.kwargs


def _source(n: Node) -> Node:
    """``n`` without a ``.contiguous()`` around it."""
    if n.op == "call_method" and n.target == "contiguous" and len(n.args) == 1 and not n.kwargs:
        return n.args[0]
    return n


def _spmm_of(g) -> Node | None:
    """The spmm whose output 0 ``g`` is, when it is a plain native sum used through that output only."""
    if not (isinstance(g, Node) and g.op == "call_function" and g.target is operator.getitem and g.args[1] == 0):
        return None
    sp = g.args[0]
    if not (isinstance(sp, Node) and sp.op == "call_function" and sp.target is targets.SPMM):
        return None
    args = list(sp.args) + [None] * (10 - len(sp.args))
    if sp.kwargs or args[3] is not None or args[5] != "sum" or (len(sp.args) > 10 and sp.args[10]):
        return None
    if any(not (u.op == "call_function" and u.target is operator.getitem and u.args[1] == 0) for u in sp.users):
        return None
    return sp


def fuse_self_terms(graph: Graph, report: PassReport) -> int:
    """Every ``getitem(spmm, 0) + s * x`` of ``graph`` that the module docstring's conditions
    allow, replaced by one ``spmm_self`` call. Returns how many were folded (also in
    ``report.self_terms``, with a note)."""
    done = 0
    writes = Writes.of(graph)
    for n in list(graph.nodes):
        if not _plain_binary(n, _ADDS):
            continue
        for g, m in (n.args, n.args[::-1]):
            sp = _spmm_of(g)
            if sp is None or len(g.users) != 1 or not isinstance(m, Node) or not _plain_binary(m, _MULS):
                continue
            if len(m.users) != 1:
                continue
            x_arg = sp.args[4]
            x = _source(x_arg)
            for t, s in (m.args, m.args[::-1]):
                sv, tv = _val(s), _val(t)
                if tv is None or sv is None or (t is not x and t is not x_arg):
                    continue
                if any(str(d) != "1" for d in sv.shape) or tv.dtype not in (torch.float32, torch.float64) or tv.device.type != "cpu":
                    continue
                # no broadcasting: the sum's shape is the product's (the rewrite leaves the spmm's
                # output without a fake value; where one is there it must agree too)
                # one dtype throughout: a [1] float64 s times float32 x promotes to float64 in torch
                if sv.dtype != tv.dtype or _val(n) is None or _val(n).dtype != tv.dtype:
                    continue
                if sv.dtype not in (torch.float32, torch.float64) or not (_shape(n) == _shape(m) == _shape(t) != ()):
                    continue
                if _val(g) is not None and _shape(g) != _shape(n):
                    continue
                lo, hi = min(writes.pos[sp], writes.pos[m]), writes.pos[n]
                if any(writes.first_write(v, lo, hi) is not None for v in (x, x_arg, s)):
                    continue  # the op would read x or s after a write the separate ops did not see
                a = list(sp.args) + [None] * (10 - len(sp.args))
                with graph.inserting_before(n):
                    new = graph.call_function(targets.SPMM_SELF, (a[0], a[1], a[2], x_arg, s, a[6], a[7], a[8], a[9]))
                new.meta = dict(n.meta)
                n.replace_all_uses_with(new)
                for dead in (n, m, g, sp):
                    graph.erase_node(dead)
                done += 1
                break
            else:
                continue
            break
    if done:
        report.self_terms += done
        report.notes.append(f"spmm + s * x (a node's own term, GINConv's (1 + eps) * x): folded into "
                            f"gnncompile::spmm_self, {done} call(s)")
    return done


__all__ = ["fuse_self_terms"]
