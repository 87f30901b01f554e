"""Part of phase 5 (rewrite): TransformerConv's dot-product attention in one op.

After the rewrite, TransformerConv's attention is a chain of fused and plain ops over one CSR::

    key_j  = k[src] (+ ee)                 ee = lin_edge(edge_attr).view(-1, H, C), lin_edge without bias
    s      = (q[dst] * key_j).sum(-1) / sqrt(C)
    alpha  = gnncompile::edge_softmax(rowptr, perm, s)
    alpha  = dropout(alpha, p)                      (gnncompile::dropout or F.dropout, training)
    out    = gnncompile::spmm(rowptr, col, perm, alpha, v, 'sum', ..., csc)          without ee
           | buffer.scatter_add_(0, dst, (v[src] + ee) * alpha.view(-1, H, 1))        with ee

which writes and reads several ``[E, H, C]`` tensors (the gathers, ee, key_j, the products, the
message) and ``[E, H]`` ones. :func:`fuse_attention_dot` replaces the chain with one
``gnncompile::attention_dot`` call (native/cpu/attention_dot_core.h): with W_h the head-h block
of lin_edge's weight, ``q . (k + W_h e) = q . k + (W_h^T q) . e`` and the aggregated message is
``sum a v + W_h (sum a e)``, so the op reads the raw edge features ``e`` [E, De] and ``qe = W_h^T q``
[M, H, De] (an einsum before the op) and returns ``sum a v`` and ``sum a e`` per head; ``out + W_h
out_e`` is an einsum after it. No ``[E, H, C]`` tensor is computed. Where the block-diagonal matrix
of the W_h is small (:data:`BLOCK_DIAGONAL_MAX` entries) the two einsums are one matrix product each
with it instead (``q.view(M, H C) @ W_bd`` and ``out_e.view(M, H De) @ W_bd^T``): H times the
multiplications, but one GEMM without the einsums' batched products and transposing copies, which
cost more at such widths (measured on a 2-core AMD EPYC, forward and backward: 0.41 against 0.63 ms
at 2,000 rows of 4 x 8 with 8 edge features, 3.9 against 5.1 ms at 30,000; 5.5 against 7.6 ms at
30,000 rows of 4 x 16 with 8; but 16.3 against 10.3 ms at 30,000 rows of 4 x 32 with 16, a 128 x 64
block-diagonal matrix: the einsums stay there).

The message with ee is left by the match phase for this pass (:func:`leave_for_attention_dot`:
not a message program) where the pass can fuse it; where the chain does not match here, it stays
the scatter as written and ``explain()`` says why. Every intermediate must have no other reader,
what the op reads must not be written in place between where the chain read it and the
aggregation, the features float32 or float64 on the CPU. attention_dot's CUDA kernel
(native/cuda/attention_dot_core.cuh) matched the CPU's on an H200 but is off by default there (one
warp per destination row, see :data:`.attention.CUDA_STATUS`): on CUDA the chain stays unless
``choices['cuda_unverified']`` ($GNNCOMPILE_CUDA_UNVERIFIED) names attention_dot, and the report
says so (:data:`UNVERIFIED`); on another device the chain stays.

Settings: ``choices['attention']`` 'fused' (default) or 'chain' (as for GATConv's attention).
"""
from __future__ import annotations

import math
import operator
from typing import Dict, List, Optional

import torch
from torch.fx import Node

from ..ops import targets
from .attention import _dropout, _erase_order, _gathered, _only_user, _Skip, unfused_on, unverified_note
from .canonical import argument, fake_tensor, layer_of, opname, same_size, size_key
from .match import IndexRef, read_scatter
from .report import Fused
from .semantics import Writes

UNVERIFIED = unverified_note("TransformerConv", "attention_dot")
LEFT = ("left for the fused dot-product attention (gnncompile::attention_dot), which did not take it: "
        "the chain as written")

_SHAPES = ("contiguous", "view", "reshape", "squeeze", "unsqueeze")

# the most entries (H C x H De) of lin_edge's block-diagonal weight for which qe and the edge term's
# output are matrix products with it rather than einsums (see the module's docstring)
BLOCK_DIAGONAL_MAX = 2048


def _edge_term(n: Node):
    """(edge_attr, W) when ``n`` is linear(edge_attr, W, None).view / reshape(-1, H, C)."""
    if opname(n) not in ("view", "reshape") or not isinstance(n.args[0], Node):
        return None
    lin = n.args[0]
    if opname(lin) != "linear" or argument(lin, 2, "bias") is not None:
        return None
    ea, W = argument(lin, 0, "input"), argument(lin, 1, "weight")
    ev, wv, nv = fake_tensor(ea), fake_tensor(W), fake_tensor(n)
    if ev is None or wv is None or nv is None or ev.dim() != 2 or wv.dim() != 2 or nv.dim() != 3:
        return None
    if not same_size(wv.shape[1], ev.shape[1]) or not same_size(nv.shape[0], ev.shape[0]):
        return None
    if not same_size(wv.shape[0], nv.shape[1] * nv.shape[2]):
        return None
    return ea, W, lin


def _float_fusable(n: Node, cuda: bool) -> bool:
    """float32 / float64 on the CPU (or CUDA when ``cuda``), of static sizes: with symbolic sizes
    (export, or a graph Dynamo made dynamic) the rewrite reads the number of destinations off the
    softmax's internal buffers, which then keep reading the logits, so the chain would not fuse and
    the message is better read as a message program."""
    v = fake_tensor(n)
    return (v is not None and v.dtype in (torch.float32, torch.float64)
            and (v.device.type == "cpu" or cuda and v.device.type == "cuda")
            and all(isinstance(d, int) for d in v.shape))


def leave_for_attention_dot(message, stops, cuda: bool = False) -> bool:
    """Match phase: whether a scatter's message is TransformerConv's with an edge term, ``(x[src] +
    linear(e, W, None).view(-1, H, C)) * a.view(-1, H, 1)`` with ``a`` a fused softmax (one of
    ``stops``; (dropout of) its coefficients read by nothing else), float32 / float64 on the CPU
    (or on CUDA with ``cuda``: the settings opt in to attention_dot's unverified CUDA kernel): such
    a message is left to :func:`fuse_attention_dot` (not read as a message program)."""
    if not isinstance(message, Node) or opname(message) != "mul" or len(message.args) != 2 or message.kwargs:
        return False
    for val, w in (message.args, message.args[::-1]):
        if not isinstance(val, Node) or not isinstance(w, Node):
            continue
        a, reader, ok = w, message, True
        while ok and a not in stops:  # back to the softmax through shape nodes and a dropout
            ok = len(a.users) == 1 and len(a.args) > 0 and isinstance(a.args[0], Node) and (
                opname(a) in _SHAPES or a.target is targets.DROPOUT or a.target is torch.nn.functional.dropout)
            if ok:
                reader, a = a, a.args[0]
        if not ok or len(a.users) != 1 or reader not in a.users:  # the coefficients read elsewhere
            continue
        if opname(val) != "add" or len(val.args) != 2:
            continue
        for g, t in (val.args, val.args[::-1]):
            if isinstance(g, Node) and isinstance(t, Node) and _gathered(g) is not None and _edge_term(t) is not None:
                return _float_fusable(message, cuda)
    return False


def _erased(n) -> bool:
    return getattr(n, "_erased", False) or n.graph is None


def _strip(n):
    while isinstance(n, Node) and opname(n) == "contiguous":
        n = n.args[0]
    return n


def _forward_chain(n: Node) -> (Node, List[Node]):
    """From the coefficients, the single-reader shape nodes (view / reshape / squeeze / unsqueeze /
    contiguous) down to the node that uses them; returns (that user, the chain)."""
    chain = []
    while True:
        if len(n.users) != 1:
            raise _Skip(f"'{n.name}' has readers besides the attention chain")
        (u,) = n.users
        if opname(u) in _SHAPES and u.args[0] is n:
            chain.append(u)
            n = u
            continue
        return u, chain


def _match(es: Node, b, writes: Writes, order) -> dict:
    rowptr, perm = es.args[0], es.args[1]
    edge_index = b.shared.edge_index
    if rowptr is not b.csr[0] or perm is not b.csr[2]:
        raise _Skip("the softmax groups the edges by another structure")
    # logits: (q[dst] * (k[src] (+ ee))).sum(-1) / c (or * c)
    s = es.args[2]
    s_chain = []
    while opname(s) == "contiguous":
        _only_user(s, s_chain[-1] if s_chain else es)
        s_chain.append(s)
        s = s.args[0]
    _only_user(s, s_chain[-1] if s_chain else es)
    if opname(s) not in ("truediv", "div", "mul") or len(s.args) != 2 or s.kwargs:
        raise _Skip("the scores are not a sum scaled by a constant")
    ssum, c = s.args
    if opname(s) == "mul" and not isinstance(ssum, Node):
        ssum, c = c, ssum
    if not isinstance(ssum, Node) or isinstance(c, bool) or not isinstance(c, (int, float)) \
            or not math.isfinite(c) or c == 0:
        raise _Skip("the scores are not a sum scaled by a constant")
    scale = 1.0 / float(c) if opname(s) in ("truediv", "div") else float(c)
    if opname(ssum) != "sum" or argument(ssum, 1, "dim") not in (-1, 2, [-1], [2], (-1,), (2,)) \
            or argument(ssum, 2, "keepdim", False) or "dtype" in ssum.kwargs:
        raise _Skip(f"the scores come from '{opname(ssum)}', not a sum over the channels")
    _only_user(ssum, s)
    prod = ssum.args[0]
    if opname(prod) != "mul" or len(prod.args) != 2 or prod.kwargs:
        raise _Skip("the scores are not a sum of q * k")
    _only_user(prod, ssum)

    def by_row(t, row):
        g = _gathered(t) if isinstance(t, Node) else None
        ref = IndexRef.of(g[1]) if g is not None else None
        return g[0] if ref is not None and ref.tensor is edge_index and ref.row == row else None

    q = k = ee = k_add = None
    qi = kj = None
    for a, other in (prod.args, prod.args[::-1]):
        if by_row(a, 1) is not None:
            q, qi = by_row(a, 1), a
            if by_row(other, 0) is not None:
                k, kj = by_row(other, 0), other
            elif opname(other) == "add" and len(other.args) == 2:
                for g, t in (other.args, other.args[::-1]):
                    if by_row(g, 0) is not None and isinstance(t, Node) and _edge_term(t) is not None:
                        k, kj, ee, k_add = by_row(g, 0), g, t, other
                        break
            break
    if q is None or k is None:
        raise _Skip("the scores are not q[destination] * k[source] (+ an edge term)")
    _only_user(qi, prod)
    if k_add is not None:
        _only_user(k_add, prod)
        _only_user(kj, k_add)
    else:
        _only_user(kj, prod)
    # the coefficients' way to the aggregation
    first, d_node, p, seed = es, None, 0.0, None
    if len(es.users) == 1:
        (u,) = es.users
        drop = _dropout(u)
        if drop is not None:
            if drop[0] is not es:
                raise _Skip("the dropout reads something else")
            d_node, (_, p, seed) = u, drop
            first = u
    user, w_chain = _forward_chain(first)
    last = w_chain[-1] if w_chain else first
    removed = [es, *s_chain, s, ssum, prod, qi, kj] + ([k_add] if k_add is not None else []) + w_chain \
        + ([d_node] if d_node is not None else [])
    scatter = spmm = None
    if user.op == "call_function" and user.target is targets.SPMM:
        spmm = user
        if ee is not None:
            raise _Skip("an edge term in the logits but an aggregation of v alone")
        if spmm.args[0] is not rowptr or spmm.args[2] is not perm or spmm.args[3] is not last \
                or spmm.args[5] != "sum" or len(spmm.args) > 10 and spmm.args[10]:
            raise _Skip("the aggregation is not a sum weighted by the coefficients over the same structure")
        v = spmm.args[4]
        if opname(v) == "contiguous":
            _only_user(v, spmm)
            removed.append(v)
        v = _strip(v)
        terminal = spmm
        csc = tuple(spmm.args[7:10]) if len(spmm.args) >= 10 else (None, None, None)
    elif opname(user) == "mul" and len(user.args) == 2 and not user.kwargs and last in user.args:
        msg = user.args[1] if user.args[0] is last else user.args[0]
        if not isinstance(msg, Node):
            raise _Skip("the message is not a tensor of the graph")
        scat = [u for u in user.users if opname(u) in ("scatter_add_", "scatter_add", "index_add_", "index_add",
                                                          "scatter_reduce_", "scatter_reduce")]
        if len(scat) != 1:
            raise _Skip("the weighted message is not scattered once")
        sc = read_scatter(scat[0], order)
        if sc.message is not user or sc.reduce != "sum":
            raise _Skip("the weighted message is not summed per destination")
        ref = IndexRef.of(sc.index)
        if ref.tensor is not edge_index or ref.row != 1:
            raise _Skip("the message is not scattered to the destinations")
        if set(sc.buffer.users) != {sc.node}:
            raise _Skip("the zeros buffer has other readers")
        for u in user.users:
            if u is not sc.node and (opname(u) not in ("new_zeros", "expand_as", "size")
                                     or any(uu is not sc.node for uu in u.users)):
                raise _Skip(f"the weighted message is read by '{u.name}'")
        if ee is not None:
            if opname(msg) != "add" or len(msg.args) != 2 or ee not in msg.args:
                raise _Skip("the message is not v[source] + the logits' edge term")
            vj = msg.args[1] if msg.args[0] is ee else msg.args[0]
            _only_user(msg, user)
            removed.append(msg)
        else:
            vj = msg
        v = by_row(vj, 0)
        if v is None:
            raise _Skip("the message is not v[source] (+ the edge term)")
        _only_user(vj, msg if ee is not None else user)
        removed += [vj, user, sc.node, sc.buffer] + [u for u in user.users if u is not sc.node]
        scatter, terminal, csc = sc.node, sc.node, None
    else:
        raise _Skip(f"the coefficients feed '{opname(user)}', not an aggregation")
    if ee is not None:
        ee_users = set(ee.users)
        if not ee_users <= set(removed):
            raise _Skip("the edge term has readers besides the attention chain")
        ea, W, lin = _edge_term(ee)
        eev, kv0 = fake_tensor(ee), fake_tensor(k)
        if kv0 is None or not (same_size(eev.shape[1], kv0.shape[1]) and same_size(eev.shape[2], kv0.shape[2])):
            raise _Skip("the edge term is not [E, H, C] as k")
        removed += [ee, lin]
    else:
        ea = W = None
    kv, qv, vv = fake_tensor(k), fake_tensor(q), fake_tensor(v)
    if kv is None or qv is None or vv is None or kv.dim() != 3 or qv.dim() != 3 or vv.dim() != 3:
        raise _Skip("q, k and v are not [*, H, C]")
    if not (same_size(kv.shape[1], qv.shape[1]) and same_size(kv.shape[2], qv.shape[2])
            and same_size(kv.shape[0], vv.shape[0]) and same_size(kv.shape[1], vv.shape[1])
            and same_size(kv.shape[2], vv.shape[2])):
        raise _Skip("q, k and v do not share heads and channels (or k and v their rows)")
    dtype = kv.dtype
    if dtype not in (torch.float32, torch.float64):
        raise _Skip("features neither float32 nor float64")
    for t in (q, v) + ((ea, W) if ea is not None else ()):
        if fake_tensor(t).dtype != dtype:
            raise _Skip(f"'{t.name}' has another dtype than k")
    at = writes.pos[terminal] if terminal in writes.pos else None
    reads = [(q, qi), (k, kj)] + ([(ea, lin), (W, lin)] if ea is not None else [])
    if at is not None:
        for value, reader in reads:
            if writes.first_write(value, writes.pos[reader] - 1, at) is not None:
                raise _Skip(f"'{value.name}' is written in place before the aggregation")
    return dict(q=q, k=k, v=v, ea=ea, W=W, scale=scale, p=p, seed=seed, spmm=spmm, scatter=scatter,
                terminal=terminal, csc=csc, device=kv.device, removed=removed)


def fuse_attention_dot(graph, built, settings, lines: Dict[Node, Fused], fused: List[Fused], report=None,
                       copy: bool = False) -> int:
    """Every TransformerConv attention chain over a structure of ``built`` (rewrite's) on the CPU
    in one op; ``lines`` as :func:`.attention.fuse_attention`'s; ``report``: the pass report, whose
    unfused line of a scattered message this takes over; ``copy``: the structure ops' copy flag
    (for a CSC inserted here). A chain on another device stays, its report line noting why.
    Returns how many fused."""
    from .rewrite import _size0, _unpack, node_order

    by_rowptr = {b.csr[0]: b for b in built if b.shared.edge_index is not None}
    done = 0
    for es in [n for n in graph.nodes if n.op == "call_function" and n.target is targets.EDGE_SOFTMAX]:
        b = by_rowptr.get(es.args[0])
        if b is None:
            continue
        try:
            m = _match(es, b, Writes.of(graph), node_order(graph))
        except _Skip:
            continue
        terminal = m["terminal"]
        why = unfused_on(m["device"], "attention_dot", "TransformerConv", settings)
        if why is not None:
            line = lines.get(terminal)
            if line is not None:
                line.note = why
            elif report is not None:
                for u in report.unfused:
                    if u.node == terminal.name:
                        u.reason = why
            continue
        knobs = settings.knobs_for(m["device"], "attention")
        with graph.inserting_before(terminal):
            csr = list(b.csr)
            if _erased(csr[1]):  # col: dropped as dead when only the softmax and the gathers read the CSR
                csr[1] = graph.call_function(operator.getitem, (csr[0].args[0], 1))
                b.csr = tuple(csr)
            csc = m["csc"]
            if csc is None:
                nkey = size_key(fake_tensor(m["k"]).shape[0])
                if nkey not in b.csc or any(_erased(t) for t in b.csc[nkey]):
                    num_src = _size0(graph, m["k"])
                    b.csc[nkey] = _unpack(graph, graph.call_function(
                        targets.CACHED_CSC, (b.shared.edge_index, b.num_dst, num_src, copy, b.check)))
                    if report is not None:
                        report.transposed += 1
                csc = b.csc[nkey]
            seed = m["seed"]
            if m["p"] > 0 and seed is None:
                seed = graph.call_function(torch.randint, (0, 1 << 62, ()), {"dtype": torch.int64})
            q, k, v = (graph.call_method("contiguous", (m[t],)) for t in ("q", "k", "v"))
            qe = ea = Wv = Wbd = None
            if m["ea"] is not None:
                kv = fake_tensor(m["k"])
                H, C = kv.shape[1], kv.shape[2]
                De = fake_tensor(m["ea"]).shape[1]
                Wv = graph.call_method("view", (m["W"], H, C, -1))
                Wbd = None
                if H * C * H * De <= BLOCK_DIAGONAL_MAX:
                    heads = graph.call_method("unbind", (Wv, 0))
                    Wbd = graph.call_function(torch.block_diag, tuple(
                        graph.call_function(operator.getitem, (heads, h)) for h in range(H)))
                    qe = graph.call_method("view", (graph.call_function(torch.matmul, (
                        graph.call_method("view", (q, -1, H * C)), Wbd)), -1, H, De))
                else:
                    qe = graph.call_function(torch.einsum, ("mhc,hcd->mhd", q, Wv))
                ea = graph.call_method("contiguous", (m["ea"],))
            call = graph.call_function(targets.ATTENTION_DOT, (
                csr[0], csr[1], csr[2], q, k, v, qe, ea, m["scale"], m["p"], seed, knobs, *csc))
            if m["scatter"] is not None:
                out = graph.call_function(operator.getitem, (call, 0))
                if Wv is not None:
                    oe = graph.call_function(operator.getitem, (call, 1))
                    if Wbd is not None:
                        term = graph.call_method("view", (graph.call_function(torch.matmul, (
                            graph.call_method("view", (oe, -1, H * De)), graph.call_method("t", (Wbd,)))), -1, H, C))
                    else:
                        term = graph.call_function(torch.einsum, ("mhd,hcd->mhc", oe, Wv))
                    out = graph.call_function(operator.add, (out, term))
        if m["scatter"] is not None:
            m["scatter"].replace_all_uses_with(out)
        else:
            m["spmm"].replace_all_uses_with(call)  # its users read [0] (the output): the op's too
        es = m["removed"][0]
        layer = layer_of(terminal)
        for n in _erase_order([terminal] + m["removed"]):
            if not n.users:
                graph.erase_node(n)
        detail = ("logits, softmax, " + ("dropout, " if m["p"] > 0 else "") + "sum"
                  + (" (edge features)" if m["ea"] is not None else ""))
        line = lines.pop(terminal, None)
        if line is None:
            line = Fused("attention_dot", "sum", layer, node=terminal.name)
            fused.append(line)
            if report is not None:
                report.unfused = [u for u in report.unfused if u.node != terminal.name]
        line.kind, line.reduce, line.detail = "attention_dot", "sum", detail
        lines[call] = line
        soft = lines.pop(es, None)
        if soft is not None and soft in fused:
            fused.remove(soft)
        done += 1
    return done


__all__ = ["fuse_attention_dot", "leave_for_attention_dot", "UNVERIFIED", "LEFT", "BLOCK_DIAGONAL_MAX"]
