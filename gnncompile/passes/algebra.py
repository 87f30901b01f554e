"""Phase 2, algebra: exact rewrites that move work from edges to nodes before matching.

A linear map applied per edge to gathered node rows is the same map applied to the nodes,
then gathered: ``linear(x[j]) = linear(x)[j]``: a GEMM over N rows instead of E. Per-edge
inputs built by concatenation are split first:

* ``linear(cat([p_1, ..., p_k], -1), W, b) = sum_i linear(p_i, W[:, o_i:o_i + d_i]) + b``
  (EdgeConv's ``[x_i, x_j - x_i]``, PointNetConv's ``[x_j, pos_j - pos_i]``, CGConv's and
  PNAConv's ``[x_i, x_j, e]``, ResGatedGraphConv's ``[x_i, e]``);
* ``linear(-a, W) = -linear(a, W)``;
* only with ``reassociate=True`` (``gnncompile.compile(model, reassociate=True)``):
  ``linear(a +- b, W) = linear(a, W) +- linear(b, W)``. Not by default: ``W a - W b`` cancels
  where ``a - b`` does not. Point coordinates that share a large offset (``pos_j - pos_i`` at
  5e5, UTM / LiDAR) lose every digit of the difference in float32, where eager keeps the
  difference exact and then applies ``W``; kept as written, the difference is an edge program
  (one pass) and ``W`` a GEMM over the edges on its (often narrow) width;
* ``cat(parts, -1)[:, i] = cat([p[:, i] for p in parts], -1)`` and
  ``x[j][:, i] = x[:, i][j]`` (PNAConv's towers);
* ``linear(linear(z, A, a), B, b) = linear(z, B A, B a + b)`` across row reshapes, where ``z``
  is narrower (PNA's edge encoder followed by the edge slice of its pre-NN).

Pieces that are not gathered (edge features) keep their own, narrower GEMM over the edges.
A rewrite is made only where it moves at least one gathered piece; the maps over the nodes
are computed once per distinct (tensor, weight slice). New nodes carry fake values (run on
the fake tensors Dynamo recorded), so that matching reads their shapes as it reads the rest.
Every rewrite reads its pieces at another place than the graph did: none is made where a
piece (or what a gather reads) is written in place, or is a call with an argument the
rewrite does not model (:mod:`.semantics`).
"""
from __future__ import annotations

import operator
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.fx import Node
from torch.fx.node import map_arg

from .._log import get_logger
from .canonical import argument, fake_tensor, layer_of, opname, same_size
from .match import gather_of
from .semantics import SIGNATURES, Writes, unmodelled


_log = get_logger(__name__)


def _fake_mode(graph):
    for n in graph.nodes:
        v = fake_tensor(n)
        if v is not None and hasattr(v, "fake_mode"):
            return v.fake_mode
    return None


class _Emitter:
    def __init__(self, graph, like: Node):
        self.graph = graph
        self.like = like
        self.mode = _fake_mode(graph)
        self.memo: Dict[Tuple, Node] = {}

    def call(self, kind: str, target, args: tuple, kwargs: Optional[dict] = None) -> Node:
        kwargs = kwargs or {}
        key = (kind, target, args, tuple(sorted(kwargs.items())))
        try:
            if key in self.memo:
                return self.memo[key]
        except TypeError:  # unhashable argument
            key = None
        fa = map_arg(args, lambda n: n.meta.get("example_value"))
        fk = map_arg(kwargs, lambda n: n.meta.get("example_value"))
        with self.mode, torch.enable_grad():
            val = target(*fa, **fk) if kind == "call_function" else getattr(fa[0], target)(*fa[1:], **fk)
        with self.graph.inserting_before(self.like):
            n = self.graph.create_node(kind, target, args, kwargs)
        n.meta["example_value"] = val
        for k in ("nn_module_stack", "stack_trace", "source_fn_stack"):
            if k in self.like.meta:
                n.meta[k] = self.like.meta[k]
        if key is not None:
            self.memo[key] = n
        return n


def _linear_args(n: Node) -> Optional[Tuple[Node, Node, Any]]:
    if opname(n) != "linear":
        return None
    x, w, b = argument(n, 0, "input"), argument(n, 1, "weight"), argument(n, 2, "bias")
    wv = fake_tensor(w)
    if not isinstance(x, Node) or wv is None or wv.dim() != 2 or not all(isinstance(s, int) for s in wv.shape):
        return None
    return x, w, b


def _tower_index(idx: Any) -> Optional[int]:
    """``i`` for a getitem index ``(slice(None), i)`` (PNAConv's ``h[:, i]``)."""
    if (isinstance(idx, tuple) and len(idx) == 2 and idx[0] == slice(None, None, None)
            and isinstance(idx[1], int)):
        return idx[1]
    return None


def _last_dim_cat(n: Node) -> Optional[List[Node]]:
    """The parts of ``cat(parts, dim=-1)`` (the last dim, however written), else None."""
    if opname(n) != "cat":
        return None
    parts, dim = argument(n, 0, "tensors"), argument(n, 1, "dim", 0)
    v = fake_tensor(n)
    if v is None or not isinstance(parts, (list, tuple)) or not isinstance(dim, int):
        return None
    if dim % v.dim() != v.dim() - 1 or not all(isinstance(p, Node) and fake_tensor(p) is not None for p in parts):
        return None
    return list(parts)


def _gathered(n: Any, reassociate: bool, depth: int = 0) -> bool:
    """Does ``n`` hold a gathered piece that a split would move to the nodes?"""
    if not isinstance(n, Node) or depth > 8:
        return False
    if gather_of(n) is not None:
        return True
    name = opname(n)
    if name in ("add", "sub") and len(n.args) == 2:
        return reassociate and any(_gathered(a, reassociate, depth + 1) for a in n.args)
    if name == "neg":
        return _gathered(n.args[0], reassociate, depth + 1)
    if name == "getitem" and _tower_index(n.args[1]) is not None:
        return _gathered(n.args[0], reassociate, depth + 1) or _last_dim_cat(n.args[0]) is not None and any(
            _gathered(p, reassociate, depth + 1) for p in _last_dim_cat(n.args[0]))
    return False


def _pieces(z: Any, depth: int = 0) -> List[Node]:
    """The nodes a split of ``linear(z)`` reads through (and, for gathers, what they read)."""
    if not isinstance(z, Node) or depth > 8:
        return []
    out = [z]
    g = gather_of(z)
    if g is not None:
        return out + list(g)
    name = opname(z)
    if name in ("add", "sub", "neg"):
        for a in z.args:
            out += _pieces(a, depth + 1)
    elif name == "getitem" and _tower_index(z.args[1]) is not None:
        out += _pieces(z.args[0], depth + 1)
    elif name == "cat":
        for p in _last_dim_cat(z) or ():
            out += _pieces(p, depth + 1)
    return out


def _unsafe(writes: Writes, nodes: List[Node]) -> Optional[str]:
    """Why a rewrite reading ``nodes`` elsewhere than the graph did is not exact, or None."""
    w = writes.clean(nodes)
    if w is not None:
        return f"'{w.name}' writes in place what it reads"
    for n in nodes:
        if opname(n) in SIGNATURES:
            why = unmodelled(n)
            if why is not None:
                return why
    return None


class _Splitter:
    def __init__(self, em: _Emitter, reassociate: bool):
        self.em = em
        self.reassociate = reassociate

    def slice_w(self, w: Node, off: int, width: int, total: int) -> Node:
        if off == 0 and width == total:
            return w
        return self.em.call("call_function", torch.narrow, (w, 1, off, width))

    def lin(self, p: Node, w: Node, tower: Optional[int] = None) -> Node:
        """``linear(p[:, tower] if tower is not None else p, w)`` with gathers moved out."""
        em = self.em
        g = gather_of(p)
        if g is not None:
            x, j = g
            if tower is not None:
                x = em.call("call_function", operator.getitem, (x, (slice(None, None, None), tower)))
            y = em.call("call_function", torch.nn.functional.linear, (x, w))
            return em.call("call_method", "index_select", (y, 0, j))
        name = opname(p)
        pv = fake_tensor(p)
        if self.reassociate and name in ("add", "sub") and len(p.args) == 2 and not p.kwargs and all(
                isinstance(a, Node) and fake_tensor(a) is not None and fake_tensor(a).shape == pv.shape
                for a in p.args) and _gathered(p, True):
            a, b = (self.lin(x, w, tower) for x in p.args)
            return em.call("call_function", operator.add if name == "add" else operator.sub, (a, b))
        if name == "neg" and _gathered(p, self.reassociate):
            return em.call("call_function", operator.neg, (self.lin(p.args[0], w, tower),))
        if name == "getitem" and tower is None and _tower_index(p.args[1]) is not None:
            inner, t = p.args[0], _tower_index(p.args[1])
            parts = _last_dim_cat(inner)
            if parts is not None:
                return self.cat(parts, w, None, tower=t)
            if gather_of(inner) is not None:
                return self.lin(inner, w, tower=t)
        if tower is not None:
            p = em.call("call_function", operator.getitem, (p, (slice(None, None, None), tower)))
        return em.call("call_function", torch.nn.functional.linear, (p, w))

    def cat(self, parts: List[Node], w: Node, b: Any, tower: Optional[int] = None) -> Optional[Node]:
        total = fake_tensor(w).shape[1]
        widths = [fake_tensor(p).shape[-1] for p in parts]
        if not all(isinstance(d, int) for d in widths) or sum(widths) != total:
            return None
        out, off = None, 0
        for p, d in zip(parts, widths):
            term = self.lin(p, self.slice_w(w, off, d, total), tower)
            out = term if out is None else self.em.call("call_function", operator.add, (out, term))
            off += d
        if b is not None:
            out = self.em.call("call_function", operator.add, (out, b))
        return out


def _kept_difference(z: Node, parts: Optional[List[Node]]) -> bool:
    """Would ``reassociate=True`` have moved a sum or difference of gathered rows under ``z``?"""
    pieces = parts if parts is not None else [z]
    return any(opname(p) in ("add", "sub") and _gathered(p, True) for p in pieces)


def _rewrite_linear(graph, n: Node, writes: Writes, reassociate: bool, notes: Optional[List[str]] = None) -> bool:
    la = _linear_args(n)
    if la is None:
        return False
    z, w, b = la
    zv = fake_tensor(z)
    if zv is None or zv.dim() < 2:
        return False
    why = _unsafe(writes, [w] + ([b] if isinstance(b, Node) else []) + _pieces(z))
    if why is not None:
        _log.debug("algebra: %s left as it is (%s)", n.name, why)
        return False
    em = _Emitter(graph, n)
    sp = _Splitter(em, reassociate)
    new = None
    g = gather_of(z)
    if g is not None:
        x, j = g
        xv = fake_tensor(x)
        if isinstance(xv.shape[0], int) and isinstance(zv.shape[0], int) and zv.shape[0] < xv.shape[0]:
            return False  # fewer edges than nodes: the per-edge GEMM is the smaller one
        y = em.call("call_function", torch.nn.functional.linear, (x, w, b))
        new = em.call("call_method", "index_select", (y, 0, j))
    else:
        parts, tower = _last_dim_cat(z), None
        if parts is None and opname(z) == "getitem" and _tower_index(z.args[1]) is not None:
            parts, tower = _last_dim_cat(z.args[0]), _tower_index(z.args[1])
            if parts is not None and any(fake_tensor(p).dim() != 3 for p in parts):
                parts = None
        if not reassociate and notes is not None and _kept_difference(z, parts):
            notes.append(f"{layer_of(n)}: linear map of a sum or difference of gathered rows kept per edge "
                         "(exact); gnncompile.compile(..., reassociate=True) moves it to the nodes")
        if parts is not None and any(_gathered(p, reassociate) for p in parts):
            new = sp.cat(parts, w, b, tower)
        elif reassociate and opname(z) in ("add", "sub") and _gathered(z, True):
            new = sp.lin(z, w)
            if new is not None and b is not None:
                new = em.call("call_function", operator.add, (new, b))
    if new is None:
        return False
    nv = fake_tensor(new)
    if nv is None or tuple(str(s) for s in nv.shape) != tuple(str(s) for s in fake_tensor(n).shape):
        return False  # (the unused new nodes are dropped with the rest of the dead code)
    n.replace_all_uses_with(new)
    graph.erase_node(n)
    return True


_SAME_ROWS = ("view", "reshape", "repeat", "getitem", "unsqueeze", "squeeze", "contiguous")


def _merge_linears(graph, n: Node, writes: Writes, reassociate: bool = False, notes=None) -> bool:
    """``linear(r(linear(z, A, a)), B, b) = linear(z, B A, B a + b)`` where ``r`` only reshapes
    each row (view, a repeat by ones, a select of a size-1 dim: PNA's towers of one) and ``z``
    is narrower than the inner output: the GEMM over the edges runs at ``z``'s width once
    (PNA's edge encoder followed by the edge slice of its pre-NN)."""
    la = _linear_args(n)
    if la is None:
        return False
    y, B, b = la
    yv = fake_tensor(y)
    if yv is None or yv.dim() != 2:
        return False
    width = yv.shape[-1]
    cur = y
    while opname(cur) in _SAME_ROWS:
        if len(cur.users) != 1:
            return False
        cv = fake_tensor(cur)
        if opname(cur) == "repeat" and any(r != 1 for r in cur.args[1:]):
            return False
        if opname(cur) == "getitem" and _tower_index(cur.args[1]) is None:
            return False
        inner = cur.args[0]
        iv = fake_tensor(inner)
        if iv is None or cv is None or iv.numel() != cv.numel() or not same_size(iv.shape[0], cv.shape[0]):
            return False
        cur = inner
    inner = _linear_args(cur)
    if inner is None or cur is y or len(cur.users) != 1:
        return False
    z, A, a = inner
    read = [y, cur, z, A, B] + [v for v in (a, b) if isinstance(v, Node)]
    c = y
    while c is not cur:
        read.append(c)
        c = c.args[0]
    if _unsafe(writes, read) is not None:
        return False
    zv, Av = fake_tensor(z), fake_tensor(A)
    if zv is None or zv.dim() != 2 or not same_size(zv.shape[0], yv.shape[0]) or Av.shape[0] != width \
            or zv.shape[-1] >= width:
        return False
    em = _Emitter(graph, n)
    w = em.call("call_function", torch.mm, (B, A))
    bias = b
    if a is not None:
        ba = em.call("call_function", torch.mv, (B, a))
        bias = ba if b is None else em.call("call_function", operator.add, (ba, b))
    new = em.call("call_function", torch.nn.functional.linear, (z, w, bias))
    if tuple(str(s) for s in fake_tensor(new).shape) != tuple(str(s) for s in yv.shape[:-1]) + (str(fake_tensor(n).shape[-1]),):
        return False
    n.replace_all_uses_with(new)
    graph.erase_node(n)
    return True


def push_linear_to_nodes(graph, reassociate: bool = False, notes: Optional[List[str]] = None) -> int:
    """Applies the rewrites above to every ``linear`` of per-edge gathered rows, then merges
    stacked linear maps of narrow edge features; returns how many linear nodes were rewritten.
    ``reassociate``: also distribute linear maps over sums and differences (module docstring);
    ``notes``: where that would have applied, a line for explain() is appended."""
    from .rewrite import drop_dead

    done = 0
    for rule in (_rewrite_linear, _merge_linears):
        if rule is _merge_linears and done:
            drop_dead(graph)  # what the first rewrites replaced no longer counts as a user
        writes = Writes.of(graph)  # positions are not used: any write to what a rewrite reads stops it
        for n in list(graph.nodes):
            if n.graph is graph and opname(n) == "linear":
                try:
                    done += rule(graph, n, writes, reassociate, notes)
                except Exception as e:  # a fake-tensor failure leaves the node as it is
                    _log.debug("algebra: %s left %s as it is (%s: %s)", rule.__name__, n.name, type(e).__name__, e)
    return done


__all__ = ["push_linear_to_nodes"]
