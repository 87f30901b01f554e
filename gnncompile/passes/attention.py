"""Part of phase 5 (rewrite): graph attention in one op.

After the rewrite, GATConv's attention is a chain of fused and plain ops over one CSR::

    raw    = a_src[src] + a_dst[dst] (+ a_edge)     gathers of [N, H] / [M, H] scores, an [E, H] term
    s      = leaky_relu(raw, slope)
    alpha  = gnncompile::edge_softmax(rowptr, perm, s)
    alpha  = dropout(alpha, p)                      (gnncompile::dropout or F.dropout, training)
    out    = gnncompile::spmm(rowptr, col, perm, alpha, x [N, H, C], 'sum', ..., csc)

which writes and reads four ``[E, H]`` tensors in edge order (through ``perm``: random access)
and runs the softmax, its backward and the gathers' segment sums as passes of their own.
:func:`fuse_attention` replaces the whole chain with one ``gnncompile::attention`` call (the
scores, the softmax and the dropout computed inside the aggregation's pass over each row;
native/cpu/attention_core.h), where every intermediate result has no other reader. What it
reads at the spmm's place (``a_src``, ``a_dst``, ``a_edge``) must not be written in place between
where the chain read it and there; the dropout keeps its mask distribution (its bits come from
the dropout op's counter-based generator, seeded from torch's, as ``canonical.fast_dropout``'s).

On CUDA the chain stays unless the settings opt in (``choices['cuda_unverified']`` names
attention, :func:`unfused_on`): the CUDA kernel gives one warp to each destination row and made
GAT's training step 19x slower than the chain on a power-law graph on an H200
(:data:`CUDA_STATUS`).

Settings: ``choices['attention']`` 'fused' (default) or 'chain' (the chain as above: A/B
measurements, and a model that needs a second derivative through the attention).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch.fx import Node

from ..ops import targets
from .canonical import argument, fake_tensor, opname, same_size
from .match import IndexRef, gather_of
from .report import Fused
from .semantics import Writes

_PASS_THROUGH = ("contiguous", "squeeze", "unsqueeze", "reshape", "view")


class _Skip(Exception):
    """The chain does not fuse; the message says why (kept for tests and debugging)."""


def _only_user(n: Node, of: Node) -> None:
    if len(n.users) != 1 or of not in n.users:
        raise _Skip(f"'{n.name}' has readers besides the attention chain")


def _through(n: Node, user: Node) -> Tuple[Node, List[Node]]:
    """Strips contiguous / squeeze(-1) / unsqueeze(-1) / reshape(-1) nodes (each read only by
    the next): the spmm's weight is the [E, H] coefficients, or [E] with one head."""
    chain = []
    while isinstance(n, Node) and opname(n) in _PASS_THROUGH:
        name = opname(n)
        if name in ("reshape", "view") and tuple(n.args[1:]) not in ((-1,), ((-1,),)):
            raise _Skip(f"'{n.name}' reshapes the coefficients")
        if name in ("squeeze", "unsqueeze") and argument(n, 1, "dim") not in (-1, 2):
            raise _Skip(f"'{n.name}' reshapes the coefficients")
        _only_user(n, user)
        chain.append(n)
        user, n = n, n.args[0]
    if not isinstance(n, Node):
        raise _Skip("the coefficients are not a tensor of the graph")
    _only_user(n, user)
    return n, chain


def _dropout(n: Node) -> Optional[Tuple[Node, float, Optional[Node]]]:
    """(input, p, seed node or None) of gnncompile::dropout or F.dropout(training=True)."""
    if n.op != "call_function":
        return None
    if n.target is targets.DROPOUT:
        return n.args[0], float(n.args[1]), n.args[2]
    if n.target is torch.nn.functional.dropout:
        p = argument(n, 1, "p", 0.5)
        if (not isinstance(p, float) or not 0.0 < p < 1.0 or argument(n, 2, "training", True) is not True
                or argument(n, 3, "inplace", False) is not False):
            raise _Skip("dropout with a p, training or inplace argument the fused op does not take")
        return n.args[0], p, None
    return None


def _terms(n: Node, user: Node, out: List[Tuple[Node, Node]], nodes: List[Node]) -> None:
    """The summands of a tree of adds (each add read only by its parent), with the add that
    reads each."""
    if opname(n) == "add" and len(n.args) == 2 and not n.kwargs and all(isinstance(a, Node) for a in n.args):
        _only_user(n, user)
        nodes.append(n)
        for a in n.args:
            _terms(a, n, out, nodes)
    else:
        out.append((n, user))


def _gathered(n: Node) -> Optional[Tuple[Node, Node]]:
    """(tensor, index) of a per-edge gather: gnncompile::gather or index_select / x[j]."""
    if n.op == "call_function" and n.target is targets.GATHER:
        return n.args[0], n.args[1]
    return gather_of(n)


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
    s, s_chain = _through(es.args[2], es)
    if opname(s) != "leaky_relu" or argument(s, 2, "inplace", False):
        raise _Skip(f"the scores come from '{opname(s)}', not leaky_relu")
    slope = argument(s, 1, "negative_slope", 0.01)
    if not isinstance(slope, (int, float)):
        raise _Skip("leaky_relu's slope is not a constant")
    raw = s.args[0]
    if not isinstance(raw, Node):
        raise _Skip("the scores are not a tensor of the graph")
    _only_user(raw, s)
    terms: List[Tuple[Node, Node]] = []
    adds: List[Node] = []
    _terms(raw, s, terms, adds)
    if not adds or len(adds) != len(terms) - 1:
        raise _Skip("the logits are not a sum")
    xv = fake_tensor(x.args[0] if opname(x) == "contiguous" else x)
    sv = fake_tensor(s)
    if xv is None or sv is None or xv.dim() != 3 or sv.dim() != 2 or not same_size(sv.shape[1], xv.shape[1]):
        raise _Skip("features are not [N, H, C] with one score per edge and head")
    src = dst = edge = None
    for t, parent in terms:
        g = _gathered(t)
        ref = IndexRef.of(g[1]) if g is not None else None
        if ref is not None and ref.tensor is edge_index and ref.row in (0, 1):
            if (ref.row == 0 and src is not None) or (ref.row == 1 and dst is not None):
                raise _Skip("two logits gathered by one end of the edges")
            _only_user(t, parent)
            if ref.row == 0:
                src = (g[0], t)
            else:
                dst = (g[0], t)
        elif edge is None:
            edge = (t, parent)
        else:
            raise _Skip("more than one per-edge logit term")
    if src is None or dst is None:
        raise _Skip("the logits are not a_src[source] + a_dst[destination]")
    dtype = xv.dtype
    for node in (src[0], dst[0]) + ((edge[0],) if edge is not None else ()):
        v = fake_tensor(node)
        if v is None or v.dim() != 2 or v.dtype != dtype or not same_size(v.shape[1], xv.shape[1]):
            raise _Skip(f"'{node.name}' is not an [*, H] score of the features' dtype")
    if not same_size(fake_tensor(src[0]).shape[0], xv.shape[0]):
        raise _Skip("a_src has not one row per source node")
    if edge is not None and not same_size(fake_tensor(edge[0]).shape[0], sv.shape[0]):
        raise _Skip("the third logit term is not one per edge")
    at = writes.pos[spmm]
    for value, reader in ((src[0], src[1]), (dst[0], dst[1])) + ((edge,) if edge is not None else ()):
        if writes.first_write(value, writes.pos[reader] - 1, at) is not None:
            raise _Skip(f"'{value.name}' is written in place before the aggregation")
    return dict(x=x, a_src=src[0], a_dst=dst[0], a_edge=None if edge is None else edge[0], slope=float(slope),
                p=p, seed=seed,
                removed=[es, s, raw, *adds, src[1], dst[1], *s_chain, *w_chain] + ([d_node] if d_node else []))


def fuse_attention(graph, built, settings, lines: Dict[Node, Fused], fused: List[Fused]) -> int:
    """Every attention chain over a structure of ``built`` (rewrite's) in one op; ``lines``:
    the report line of each fused op call (the spmm's becomes the attention's, the softmax's is
    taken out of ``fused``). Returns how many."""
    by_rowptr = {b.csr[0]: b for b in built if b.shared.edge_index is not None}
    done = 0
    for spmm in [n for n in graph.nodes if n.op == "call_function" and n.target is targets.SPMM]:
        b = by_rowptr.get(spmm.args[0])
        if b is None:
            continue
        writes = Writes.of(graph)
        try:
            m = _match(spmm, b.shared.edge_index, writes)
        except _Skip:
            continue
        device = fake_tensor(m["a_src"]).device
        why = unfused_on(device, "attention", "GAT", settings)
        if why is not None:
            line = lines.get(spmm)
            if line is not None:
                line.note = why
            continue
        knobs = settings.knobs_for(device, "attention")
        csc = tuple(spmm.args[7:10]) if len(spmm.args) >= 10 else (None, None, None)
        with graph.inserting_before(spmm):
            seed = m["seed"]
            if m["p"] > 0 and seed is None:
                seed = graph.call_function(torch.randint, (0, 1 << 62, ()), {"dtype": torch.int64})
            call = graph.call_function(targets.ATTENTION, (
                spmm.args[0], spmm.args[1], spmm.args[2], m["x"], m["a_src"], m["a_dst"], m["a_edge"],
                m["slope"], m["p"], seed, knobs, *csc))
        spmm.replace_all_uses_with(call)  # its users read [0] (the output): the attention's too
        es = m["removed"][0]
        graph.erase_node(spmm)
        for n in _erase_order(m["removed"]):
            if not n.users:
                graph.erase_node(n)
        line = lines.pop(spmm, None)
        if line is not None:
            line.kind, line.reduce = "attention", "sum"
            line.detail = "logits, softmax, " + ("dropout, " if m["p"] > 0 else "") + "sum"
            lines[call] = line
        soft = lines.pop(es, None)
        if soft is not None and soft in fused:
            fused.remove(soft)
        done += 1
    return done


#: why each fused attention op's CUDA kernel is off by default (gnncompile.config.CUDA_UNVERIFIED_OPS)
CUDA_STATUS = {
    "attention": "its CUDA kernel (one warp per destination row) made GAT's training step 19x slower than "
                 "this chain on an H200 (power-law graph, 1M nodes, hub rows of 133k edges)",
    "attention_v2": "its CUDA kernel (one warp per destination row) matched the CPU's on an H200 but is not yet "
                    "timed; GAT's kernel of that design was 19x slower than the chain there",
    "attention_dot": "its CUDA kernel (one warp per destination row) matched the CPU's on an H200 but is not yet "
                     "timed; GAT's kernel of that design was 19x slower than the chain there",
}


def unverified_note(what: str, op: str) -> str:
    """The report's note on a chain left unfused on CUDA because ``op``'s CUDA kernel is off by
    default there (:data:`CUDA_STATUS` says why; ``what``: the layer's attention, for the reader)."""
    return (f"{what} attention left as a chain on CUDA: gnncompile::{op}: {CUDA_STATUS[op]} "
            f"(GNNCOMPILE_CUDA_UNVERIFIED={op} fuses it)")


def unfused_on(device, op: str, what: str, settings) -> Optional[str]:
    """Why the chain ``op`` would replace stays on ``device`` (None: it fuses): the CPU always
    fuses; CUDA only where the settings opt in to the op's kernel, off by default there
    (:data:`gnncompile.config.CUDA_UNVERIFIED_OPS`, :data:`CUDA_STATUS`); another device has no
    kernel."""
    if device.type == "cpu" or device.type == "cuda" and op in settings.cuda_unverified:
        return None
    if device.type == "cuda":
        return unverified_note(what, op)
    return f"{what} attention left as a chain: gnncompile::{op} has no kernel for {device.type}"


def _erase_order(nodes: List[Node]) -> List[Node]:
    """Users before what they read: the chain's nodes from the aggregation back to the gathers."""
    pos = {n: i for i, n in enumerate(nodes[0].graph.nodes)} if nodes else {}
    return sorted(set(nodes), key=lambda n: -pos[n])


__all__ = ["fuse_attention"]
