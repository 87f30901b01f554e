"""Part of phase 5 (rewrite): GATv2's attention in one op.

After the rewrite, GATv2Conv's attention is a chain of fused and plain ops over one CSR::

    z      = x_r[dst] + x_l[src] (+ e_term)        gathers of [M, H, C] / [N, H, C] rows, an [E, H, C] term
    s      = (leaky_relu(z, slope) * att).sum(-1)
    alpha  = gnncompile::edge_softmax(rowptr, perm, s)
    alpha  = dropout(alpha, p)                      (gnncompile::dropout or F.dropout, training)
    out    = gnncompile::spmm(rowptr, col, perm, alpha, x_l, 'sum', ..., csc)

which writes and reads several ``[E, H, C]`` tensors (the gathers, z, leaky_relu(z), the product)
and ``[E, H]`` ones. :func:`fuse_attention_v2` replaces the chain with one
``gnncompile::attention_v2`` call (z recomputed per edge inside the aggregation's pass over each
row, never stored; native/cpu/attention_v2_core.h) where every intermediate result has no other
reader, what the op reads (x_l, x_r, att, e_term) is not written in place between where the chain
read it and the aggregation, and the features are on the CPU. attention_v2's CUDA kernel
(native/cuda/attention_v2_core.cuh) matched the CPU's on an H200 but is off by default there (one
warp per destination row, the design that made GAT's 19x slower than its chain, see
:data:`.attention.CUDA_STATUS`): on CUDA the chain stays unless
``choices['cuda_unverified']`` ($GNNCOMPILE_CUDA_UNVERIFIED) names attention_v2, and the spmm's
report line says so (its note, :data:`UNVERIFIED`); on another device the chain stays.

Settings: ``choices['attention']`` 'fused' (default) or 'chain' (as for GATConv's attention).
"""
from __future__ import annotations

from typing import Dict, List

import torch
from torch.fx import Node

from ..ops import targets
from .attention import _dropout, _erase_order, _gathered, _only_user, _Skip, _terms, _through, unfused_on, \
    unverified_note
from .canonical import argument, fake_tensor, opname, same_size
from .match import IndexRef
from .report import Fused
from .semantics import Writes

UNVERIFIED = unverified_note("GATv2", "attention_v2")


def _strip_contiguous(n):
    return n.args[0] if opname(n) == "contiguous" else n


def _match(spmm: Node, edge_index: Node, writes: Writes) -> dict:
    rowptr, col, perm, w, x, reduce = spmm.args[:6]
    if reduce != "sum" or w is None or len(spmm.args) > 10 and spmm.args[10]:
        raise _Skip("not a weighted sum")
    core, w_chain = _through(w, spmm)
    drop = _dropout(core)
    p, seed, d_node = 0.0, None, None
    if drop is not None:
        d_node = core
        core, p, seed = drop
        _only_user(core, d_node)
    if core.op != "call_function" or core.target is not targets.EDGE_SOFTMAX:
        raise _Skip("the weight is not an edge softmax")
    if core.args[0] is not rowptr or core.args[1] is not perm:
        raise _Skip("the softmax groups the edges by another structure")
    es = core
    ssum, s_chain = _through(es.args[2], es)
    if opname(ssum) != "sum" or argument(ssum, 1, "dim") not in (-1, 2, [-1], [2], (-1,), (2,)) \
            or argument(ssum, 2, "keepdim", False) or "dtype" in ssum.kwargs:
        raise _Skip(f"the scores come from '{opname(ssum)}', not a sum over the channels")
    prod = ssum.args[0]
    if opname(prod) != "mul" or len(prod.args) != 2 or prod.kwargs:
        raise _Skip("the scores are not a sum of att * leaky_relu(z)")
    _only_user(prod, ssum)
    lr, att = prod.args
    if opname(lr) != "leaky_relu":
        lr, att = att, lr
    if opname(lr) != "leaky_relu" or argument(lr, 2, "inplace", False) or not isinstance(att, Node):
        raise _Skip("the scores are not a sum of att * leaky_relu(z)")
    _only_user(lr, prod)
    slope = argument(lr, 1, "negative_slope", 0.01)
    if not isinstance(slope, (int, float)):
        raise _Skip("leaky_relu's slope is not a constant")
    z = lr.args[0]
    if not isinstance(z, Node):
        raise _Skip("z is not a tensor of the graph")
    _only_user(z, lr)
    terms, adds = [], []
    _terms(z, lr, terms, adds)
    if not adds or len(adds) != len(terms) - 1:
        raise _Skip("z is not a sum")
    x_node = _strip_contiguous(x)
    xv, sv = fake_tensor(x_node), fake_tensor(ssum)
    if xv is None or sv is None or xv.dim() != 3 or sv.dim() != 2 or not same_size(sv.shape[1], xv.shape[1]):
        raise _Skip("features are not [N, H, C] with one score per edge and head")
    src = dst = edge = None
    for t, parent in terms:
        g = _gathered(t)
        ref = IndexRef.of(g[1]) if g is not None else None
        if ref is not None and ref.tensor is edge_index and ref.row in (0, 1):
            if (ref.row == 0 and src is not None) or (ref.row == 1 and dst is not None):
                raise _Skip("two terms of z gathered by one end of the edges")
            _only_user(t, parent)
            if ref.row == 0:
                src = (g[0], t)
            else:
                dst = (g[0], t)
        elif edge is None:
            edge = (t, parent)
        else:
            raise _Skip("more than one per-edge term of z")
    if src is None or dst is None:
        raise _Skip("z is not x_l[source] + x_r[destination]")
    if _strip_contiguous(src[0]) is not x_node:
        raise _Skip("the aggregated features are not those gathered by the source into z")
    dtype = xv.dtype
    if dtype not in (torch.float32, torch.float64):
        raise _Skip("features neither float32 nor float64")
    for node in (dst[0],) + ((edge[0],) if edge is not None else ()):
        v = fake_tensor(node)
        if v is None or v.dim() != 3 or v.dtype != dtype or not same_size(v.shape[1], xv.shape[1]) \
                or not same_size(v.shape[2], xv.shape[2]):
            raise _Skip(f"'{node.name}' is not an [*, H, C] term of the features' dtype")
    if edge is not None and not same_size(fake_tensor(edge[0]).shape[0], sv.shape[0]):
        raise _Skip("the third term of z is not one per edge")
    av = fake_tensor(att)
    if av is None or av.dtype != dtype or av.dim() not in (2, 3) or av.dim() == 3 and str(av.shape[0]) != "1" \
            or not same_size(av.shape[-1], xv.shape[2]) or not same_size(av.shape[-2], xv.shape[1]):
        raise _Skip("att is not an [H, C] (or [1, H, C]) tensor of the features' dtype")
    at = writes.pos[spmm]
    reads = [(src[0], src[1]), (dst[0], dst[1]), (att, prod)] + ([edge] if edge is not None else [])
    for value, reader in reads:
        if writes.first_write(value, writes.pos[reader] - 1, at) is not None:
            raise _Skip(f"'{value.name}' is written in place before the aggregation")
    return dict(x=x, x_r=dst[0], att=att, e_term=None if edge is None else edge[0], slope=float(slope), p=p,
                seed=seed, device=xv.device,
                removed=[es, ssum, prod, lr, z, *adds, src[1], dst[1], *s_chain, *w_chain]
                + ([d_node] if d_node else []))


def fuse_attention_v2(graph, built, settings, lines: Dict[Node, Fused], fused: List[Fused]) -> int:
    """Every GATv2 attention chain over a structure of ``built`` (rewrite's) on the CPU (and on
    CUDA where the settings opt in, :func:`.attention.unfused_on`) in one op; ``lines`` as
    :func:`.attention.fuse_attention`'s. A chain left on its device stays, its spmm's line noting
    why. Returns how many fused."""
    by_rowptr = {b.csr[0]: b for b in built if b.shared.edge_index is not None}
    done = 0
    for spmm in [n for n in graph.nodes if n.op == "call_function" and n.target is targets.SPMM]:
        b = by_rowptr.get(spmm.args[0])
        if b is None:
            continue
        try:
            m = _match(spmm, b.shared.edge_index, Writes.of(graph))
        except _Skip:
            continue
        why = unfused_on(m["device"], "attention_v2", "GATv2", settings)
        if why is not None:
            line = lines.get(spmm)
            if line is not None:
                line.note = why
            continue
        knobs = settings.knobs_for(m["device"], "attention")
        csc = tuple(spmm.args[7:10]) if len(spmm.args) >= 10 else (None, None, None)
        with graph.inserting_before(spmm):
            seed = m["seed"]
            if m["p"] > 0 and seed is None:
                seed = graph.call_function(torch.randint, (0, 1 << 62, ()), {"dtype": torch.int64})
            call = graph.call_function(targets.ATTENTION_V2, (
                spmm.args[0], spmm.args[1], spmm.args[2], m["x"], m["x_r"], m["att"], m["e_term"],
                m["slope"], m["p"], seed, knobs, *csc))
        spmm.replace_all_uses_with(call)  # its users read [0] (the output): the op's too
        es = m["removed"][0]
        graph.erase_node(spmm)
        for n in _erase_order(m["removed"]):
            if not n.users:
                graph.erase_node(n)
        line = lines.pop(spmm, None)
        if line is not None:
            line.kind, line.reduce = "attention_v2", "sum"
            line.detail = ("z, logits, softmax, " + ("dropout, " if m["p"] > 0 else "") + "sum"
                           + (" (edge term)" if m["e_term"] is not None else ""))
            lines[call] = line
        soft = lines.pop(es, None)
        if soft is not None and soft in fused:
            fused.remove(soft)
        done += 1
    return done


__all__ = ["fuse_attention_v2", "UNVERIFIED"]
