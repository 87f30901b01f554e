"""Find gather -> per-edge message -> scatter chains (and edge softmax, degree counts) in a
Dynamo FX graph and replace them with the fused gnncompile ops.

The pass works in three phases on one ``torch.fx.GraphModule``:

1. **match** (read only): every scatter-like node (:data:`canonical.SCATTERS`, any spelling)
   is explained either as part of a recognised plan or as *unfused, with a reason*:

   * ``Aggregate``: ``zeros.scatter_add_/scatter_reduce_/index_add_(0, I, msg)`` where
     ``msg = x[J]`` or ``x[J] * w`` (``w`` one scalar per edge, ``[E, 1..]``, or one per edge and
     head, ``[E, H, 1]`` against ``x: [N, H, C]``), reduce sum / mean / amax / amin
     (``include_self=False`` where it matters) -> ``gnncompile::spmm``;
   * ``Softmax``: PyG's inlined ``softmax(alpha, I)`` (segment max, sub, exp, segment sum,
     ``+ eps``, divide) -> ``gnncompile::edge_softmax``; the attention-weighted aggregation that
     follows it is an ``Aggregate`` with a per-head weight, so the ``E x F`` message never
     exists;
   * ``Degree``: ``zeros.scatter_add_(0, I, ones)`` (the count of ``scatter(reduce='mean')``,
     ``torch_geometric.utils.degree``) -> differences of the CSR ``rowptr`` when the graph piece
     holds a structure for the same index anyway.

2. **structures**: one CSR per distinct (edge_index, num_dst) — keyed by the graph node of the
   ``[2, E]`` edge_index (rows 0/1) and the printed size — and one CSC per (CSR, num_src) where a
   sum/mean gradient of ``x`` will be needed (the value's ``requires_grad``), inserted before
   the first plan that uses them and shared by all the others (all layers of the piece).

3. **rewrite**: each plan's replacement is inserted at its anchor, uses are redirected
   (including later readers of an in-place-mutated zeros buffer), and dead nodes are dropped.

Nothing here launches a kernel; the inserted ops run when the compiled graph runs.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.fx import GraphModule, Node

from . import runtime  # noqa: F401  (registers the structure ops)
from .canonical import (PURE, SCATTERS, arg, index_dim, is_one, key, layer_of, opname, same,
                        shape_key, tensor_val, val)

_INDEX_DTYPES = (torch.int32, torch.int64)
_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_REDUCE = {"sum": "sum", "add": "sum", "mean": "mean", "amax": "max", "amin": "min"}


# ----------------------------------------------------------------------------- report types
@dataclass
class Fused:
    kind: str  # 'spmm' | 'edge_softmax' | 'degree'
    reduce: str
    layer: str
    weighted: bool = False
    node: str = ""

    def __str__(self) -> str:
        what = self.kind if self.kind != "spmm" else f"spmm[{self.reduce}{', weighted' if self.weighted else ''}]"
        return f"{what:<26} in {self.layer}  (at {self.node})"


@dataclass
class Unfused:
    op: str
    layer: str
    reason: str
    node: str = ""

    def __str__(self) -> str:
        return f"{self.op:<16} in {self.layer}: {self.reason}  (at {self.node})"


@dataclass
class PassReport:
    fused: List[Fused] = field(default_factory=list)
    unfused: List[Unfused] = field(default_factory=list)
    structures: int = 0
    transposed: int = 0
    gathers: int = 0  # per-edge gathers given a segment-sum gradient

    @property
    def num_fused(self) -> int:
        return sum(1 for f in self.fused if f.kind != "degree")


class NoMatch(Exception):
    """A scatter that cannot be fused; the message is the reason reported by explain()."""


# ----------------------------------------------------------------------------- helpers
def _index_key(i: Node) -> Tuple:
    """('row', P, r) when ``i`` is row r of a [2, E] tensor P, else ('node', i)."""
    name = opname(i)
    if name == "getitem" and isinstance(i.args[1], int):
        p, r = i.args[0], i.args[1]
    elif name == "select" and arg(i, 1, "dim") == 0 and isinstance(arg(i, 2, "index"), int):
        p, r = i.args[0], arg(i, 2, "index")
    else:
        return ("node", i)
    pv = tensor_val(p)
    if pv is not None and pv.dim() == 2 and key(pv.shape[0]) == "2":
        return ("row", p, r % 2)
    return ("node", i)


def _strip_broadcast(idx: Any, like: torch.Tensor) -> Node:
    """The 1-D index under view(-1, 1..)/unsqueeze/expand(_as)/broadcast_to of a scatter index."""
    if not isinstance(idx, Node):
        raise NoMatch("index is not a tensor of the graph")
    top = tensor_val(idx)
    if top is None or shape_key(top) != shape_key(like):
        raise NoMatch("index shape differs from the message shape")
    E = like.shape[0]
    n = idx
    while True:
        v = tensor_val(n)
        if v is None or v.dtype not in _INDEX_DTYPES:
            raise NoMatch("index is not an int32/int64 tensor")
        if not same(v.shape[0], E):
            raise NoMatch("index is not a per-edge index broadcast along dim 0")
        if v.dim() == 1:
            # look through no-op 1-D views (view(-1), expand_as of an [E] tensor)
            while opname(n) in ("view", "reshape", "expand", "expand_as", "broadcast_to", "contiguous"):
                inner = n.args[0]
                iv = tensor_val(inner)
                if not isinstance(inner, Node) or iv is None or iv.dim() != 1 or not same(iv.shape[0], E):
                    break
                n = inner
            return n
        for d in range(1, v.dim()):
            if not (is_one(v.shape[d]) or (d < like.dim() and same(v.shape[d], like.shape[d]))):
                raise NoMatch("index is not a per-edge index broadcast along dim 0")
        if opname(n) not in ("expand", "expand_as", "broadcast_to", "view", "reshape", "unsqueeze",
                             "contiguous"):
            raise NoMatch(f"index built by '{opname(n) or n.op}', not a broadcast of a 1-D index")
        n = n.args[0]
        if not isinstance(n, Node):
            raise NoMatch("index is not a tensor of the graph")


def _gather(n: Any) -> Optional[Tuple[Node, Node]]:
    """(x, j) when ``n`` is x.index_select(0, j) or x[j] with a 1-D integer tensor j."""
    if not isinstance(n, Node):
        return None
    name = opname(n)
    if name == "index_select":
        x, d, j = arg(n, 0), arg(n, 1, "dim"), arg(n, 2, "index")
    elif name == "getitem":
        x, j, d = n.args[0], n.args[1], 0
    else:
        return None
    xv, jv = tensor_val(x), tensor_val(j)
    if xv is None or jv is None or not isinstance(j, Node) or jv.dim() != 1 or jv.dtype not in _INDEX_DTYPES:
        return None
    if xv.dim() < 1 or index_dim(n, d, xv.dim()) != 0:
        return None
    return x, j


def _zeros_base(base: Any) -> None:
    name = opname(base)
    if name in ("new_zeros", "zeros", "zeros_like"):
        return
    if name in ("new_full", "full"):
        fill = arg(base, 2, "fill_value") if name == "new_full" else arg(base, 1, "fill_value")
        if isinstance(fill, (int, float)) and fill == 0:
            return
    raise NoMatch(f"output buffer comes from '{name or getattr(base, 'op', base)}', not a fresh zeros")


def _ones(n: Any) -> bool:
    name = opname(n)
    if name in ("new_ones", "ones", "ones_like"):
        return True
    if name in ("new_full", "full"):
        fill = arg(n, 2, "fill_value") if name == "new_full" else arg(n, 1, "fill_value")
        return isinstance(fill, (int, float)) and fill == 1
    return False


def _node_index(graph) -> Dict[Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


# ----------------------------------------------------------------------------- plans
@dataclass
class _Scatter:
    node: Node
    base: Node
    index: Node  # the 1-D index under the broadcast
    src: Any
    reduce: str
    inplace: bool


@dataclass
class _Plan:
    kind: str
    anchor: Node
    ikey: Tuple
    index: Node
    mkey: str
    base: Node  # the zeros buffer whose size(0) is num_dst
    reduce: str = "sum"
    x: Optional[Node] = None
    jkey: Optional[Tuple] = None
    gather_index: Optional[Node] = None
    weight: Optional[Node] = None
    weight_kind: str = "none"
    inplace: bool = False
    scores: Optional[Node] = None
    need_t: bool = False
    group: Any = None


def _scatter_of(n: Node, order: Dict[Node, int]) -> _Scatter:
    name = opname(n)
    base, dim = arg(n, 0), arg(n, 1, "dim")
    if name.startswith("index_add"):
        index, src = arg(n, 2, "index"), arg(n, 3, "source")
        if arg(n, 4, "alpha", 1) != 1:
            raise NoMatch("index_add with alpha != 1")
        reduce = "sum"
    else:
        index, src = arg(n, 2, "index"), arg(n, 3, "src")
        if name.startswith("scatter_add"):
            reduce = "sum"
        else:
            r = arg(n, 4, "reduce")
            include_self = arg(n, 5, "include_self", True)
            if r not in _REDUCE:
                raise NoMatch(f"scatter_reduce with reduce={r!r} (only sum, mean, amax, amin fuse)")
            reduce = _REDUCE[r]
            if include_self and reduce != "sum":
                raise NoMatch(f"scatter_reduce '{r}' with include_self=True (the zeros take part)")
    bv, sv = tensor_val(base), tensor_val(src)
    if bv is None or sv is None:
        raise NoMatch("buffer or message is not a tensor")
    if bv.dtype not in _FLOAT_DTYPES or sv.dtype != bv.dtype:
        raise NoMatch(f"dtype {sv.dtype} scattered into {bv.dtype} (float buffers of the message dtype fuse)")
    if index_dim(n, dim, bv.dim()) != 0:
        raise NoMatch(f"scatter along dim {dim}, not the node dimension 0")
    if bv.dim() != sv.dim() or shape_key(bv)[1:] != shape_key(sv)[1:]:
        raise NoMatch("buffer and message shapes differ beyond dim 0")
    _zeros_base(base)
    for u in base.users:
        if u is not n and order[u] < order[n]:
            raise NoMatch("the zeros buffer is read before the scatter")
    if not name.endswith("_") and len(base.users) > 1:
        pass  # out-of-place: the buffer itself stays zeros for its other readers
    if name.startswith("index_add"):
        iv = tensor_val(index)
        if iv is None or iv.dim() != 1 or iv.dtype not in _INDEX_DTYPES or not same(iv.shape[0], sv.shape[0]):
            raise NoMatch("index_add index is not a 1-D per-edge index")
        idx1 = index
    else:
        idx1 = _strip_broadcast(index, sv)
    return _Scatter(n, base, idx1, src, reduce, name.endswith("_"))


def _aggregate_plan(sc: _Scatter) -> _Plan:
    src = sc.src
    g = _gather(src)
    weight, wkind = None, "none"
    if g is None:
        if opname(src) != "mul" or len(src.args) != 2 or src.kwargs:
            if opname(src) in ("new_ones", "ones", "ones_like") or _ones(src):
                raise NoMatch("degree count (scatter of ones): no gather-scatter on this index in this graph piece")
            raise NoMatch(f"message built by '{opname(src) or getattr(src, 'op', src)}', not x[j] or x[j] * w")
        a, b = src.args
        for gg, ww in ((a, b), (b, a)):
            g = _gather(gg)
            if g is not None:
                weight = ww
                break
        if g is None:
            raise NoMatch("message is a product without a gathered node tensor x[j]")
        gv, wv = tensor_val(g[0]), tensor_val(weight)
        if wv is None or not isinstance(weight, Node):
            raise NoMatch("message multiplies x[j] by a scalar constant, not a per-edge weight")
        mv = tensor_val(src)
        ev = tensor_val(gg)
        if wv.dtype != ev.dtype:
            raise NoMatch(f"edge weight dtype {wv.dtype} differs from the features' {ev.dtype}")
        if wv.dim() != ev.dim() or not same(wv.shape[0], ev.shape[0]) or shape_key(mv) != shape_key(ev):
            raise NoMatch(f"weight of shape {list(wv.shape)} is not one value per edge (or per edge and head)")
        rest = list(wv.shape[1:])
        if all(is_one(s) for s in rest):
            wkind = "edge"
        elif ev.dim() == 3 and same(rest[0], ev.shape[1]) and is_one(rest[1]):
            wkind = "head"
        else:
            raise NoMatch(f"weight of shape {list(wv.shape)} is not one value per edge (or per edge and head)")
    x, j = g
    xv = tensor_val(x)
    if xv.dtype not in _FLOAT_DTYPES:
        raise NoMatch(f"features of dtype {xv.dtype}")
    iv, jv = tensor_val(sc.index), tensor_val(j)
    if not same(iv.shape[0], jv.shape[0]) or iv.dtype != jv.dtype:
        raise NoMatch("gather and scatter indices differ in length or dtype")
    bv = tensor_val(sc.base)
    return _Plan("spmm", sc.node, _index_key(sc.index), sc.index, key(bv.shape[0]), sc.base,
                 reduce=sc.reduce, x=x, jkey=_index_key(j), gather_index=j, weight=weight,
                 weight_kind=wkind, inplace=sc.inplace,
                 need_t=sc.reduce in ("sum", "mean") and bool(xv.requires_grad))


def _gathered_by(n: Any) -> Optional[Tuple[Node, Node]]:
    g = _gather(n)
    return g


def _softmax_plan(d: Node, scatters: Dict[Node, _Scatter]) -> Tuple[_Plan, List[Node]]:
    """PyG's softmax(alpha, I) as inlined by Dynamo, anchored at the final division."""
    if opname(d) != "div" or len(d.args) != 2:
        return None
    ex, den = d.args
    if opname(ex) != "exp":
        return None
    g = _gathered_by(den)
    if g is None:
        return None
    sums, i1 = g
    if opname(sums) == "add" and len(sums.args) == 2:
        s0, s1 = sums.args
        if isinstance(s1, Node):
            s0, s1 = s1, s0
        if isinstance(s0, Node) and isinstance(s1, float) and 0 <= s1 <= 1e-10:
            sums = s0
    sc_sum = scatters.get(sums) or scatters.get(_inplace_result(sums, scatters))
    if sc_sum is None or sc_sum.reduce != "sum" or sc_sum.src is not ex:
        return None
    sub = ex.args[0]
    if opname(sub) != "sub" or len(sub.args) != 2:
        return None
    a, gm = sub.args
    g2 = _gathered_by(gm)
    if g2 is None:
        return None
    mx, i2 = g2
    sc_max = scatters.get(mx) or scatters.get(_inplace_result(mx, scatters))
    if sc_max is None or sc_max.reduce != "max":
        return None
    msrc = sc_max.src
    if opname(msrc) == "detach":
        msrc = msrc.args[0]
    if msrc is not a:
        return None
    keys = {_index_key(i) for i in (i1, i2, sc_sum.index, sc_max.index)}
    if len(keys) != 1:
        return None
    av = tensor_val(a)
    if av is None or av.dim() not in (1, 2) or av.dtype not in _FLOAT_DTYPES:
        return None
    if not same(tensor_val(sc_sum.base).shape[0], tensor_val(sc_max.base).shape[0]):
        return None
    plan = _Plan("edge_softmax", d, keys.pop(), sc_sum.index, key(tensor_val(sc_sum.base).shape[0]),
                 sc_sum.base, scores=a)
    return plan, [sc_sum.node, sc_max.node]


def _inplace_result(buf: Node, scatters: Dict[Node, _Scatter]) -> Optional[Node]:
    """For a buffer mutated by an in-place scatter, that scatter node."""
    for u in getattr(buf, "users", ()):
        if u in scatters and scatters[u].base is buf and scatters[u].inplace:
            return u
    return None


def _degree_plan(sc: _Scatter) -> Optional[_Plan]:
    sv, bv = tensor_val(sc.src), tensor_val(sc.base)
    if bv.dim() != 1 or not _ones(sc.src) or sc.reduce != "sum":
        return None
    return _Plan("degree", sc.node, _index_key(sc.index), sc.index, key(bv.shape[0]), sc.base,
                 inplace=sc.inplace)


# ----------------------------------------------------------------------------- the pass
def fuse(gm: GraphModule, knobs_for=None, copy_structures: bool = False) -> PassReport:
    """Rewrites ``gm`` in place; returns what was fused and what was left (with reasons)."""
    from ..ops import get_knobs

    knobs_for = knobs_for or get_knobs
    graph = gm.graph
    report = PassReport()
    order = _node_index(graph)

    # ---- 1. match
    scatters: Dict[Node, _Scatter] = {}
    reasons: Dict[Node, str] = {}
    for n in graph.nodes:
        if opname(n) in SCATTERS:
            try:
                scatters[n] = _scatter_of(n, order)
            except NoMatch as e:
                reasons[n] = str(e)
    plans: List[_Plan] = []
    claimed: Dict[Node, _Plan] = {}
    for n in graph.nodes:
        if opname(n) == "div":
            r = _softmax_plan(n, scatters)
            if r is not None:
                plan, nodes = r
                plans.append(plan)
                for s in nodes:
                    claimed[s] = plan
    pending_degree: List[Tuple[_Scatter, _Plan]] = []
    for n, sc in scatters.items():
        if n in claimed:
            continue
        dp = _degree_plan(sc)
        if dp is not None:
            pending_degree.append((sc, dp))
            continue
        try:
            plans.append(_aggregate_plan(sc))
        except NoMatch as e:
            reasons[n] = str(e)

    # ---- 2. structures
    groups: Dict[Tuple, dict] = {}

    def group_key(p: _Plan) -> Optional[Tuple]:
        if p.ikey[0] == "row" and p.ikey[2] == 1:
            if p.kind == "spmm" and not (p.jkey[0] == "row" and p.jkey[1] is p.ikey[1] and p.jkey[2] == 0):
                return ("pair", p.ikey, p.jkey, p.mkey)
            return ("ei", p.ikey[1], p.mkey)
        if p.kind == "spmm":
            return ("pair", p.ikey, p.jkey, p.mkey)
        return None

    for p in plans:
        gk = group_key(p)
        if gk is None:  # softmax over a non-edge_index index: pair it with an aggregation below
            continue
        groups.setdefault(gk, {"plans": []})["plans"].append(p)
    for p in plans:
        if group_key(p) is None:
            for gk, g in groups.items():
                if gk[0] == "pair" and gk[1] == p.ikey and gk[3] == p.mkey:
                    g["plans"].append(p)
                    break
            else:
                gk = ("pair", p.ikey, p.ikey, p.mkey)
                groups.setdefault(gk, {"plans": []})["plans"].append(p)
                p.gather_index = p.index
    for sc, dp in pending_degree:
        for gk, g in groups.items():
            if gk[0] == "ei" and dp.ikey[0] == "row" and dp.ikey[1] is gk[1] and dp.ikey[2] == 1 and gk[2] == dp.mkey:
                g["plans"].append(dp)
                plans.append(dp)
                break
            if gk[0] == "pair" and gk[1] == dp.ikey and gk[3] == dp.mkey:
                g["plans"].append(dp)
                plans.append(dp)
                break
        else:
            reasons[sc.node] = ("degree count (scatter of ones): no gather-scatter on this index in this "
                                "graph piece; left as an O(E) scalar scatter")

    for gk, g in groups.items():
        gplans = sorted(g["plans"], key=lambda p: order[p.anchor])
        first = gplans[0]
        with graph.inserting_before(first.anchor):
            mval = _size0(graph, first.base)
            if gk[0] == "ei":
                csr = graph.call_function(torch.ops.gnncompile.cached_csr.default,
                                          (gk[1], mval, copy_structures))
            else:
                jp = next((p for p in gplans if p.kind == "spmm"), first)
                csr = graph.call_function(torch.ops.gnncompile.pair_csr.default,
                                          (first.index, jp.gather_index, mval))
            parts = tuple(graph.call_function(_getitem, (csr, i)) for i in range(3))
        report.structures += 1
        g["csr"] = parts
        g["csr_node"] = csr
        g["mval"] = mval
        g["csc"] = {}
        for p in gplans:
            p.group = g
            if p.need_t:
                nkey = key(tensor_val(p.x).shape[0])
                if nkey not in g["csc"]:
                    with graph.inserting_before(p.anchor):
                        nval = _size0(graph, p.x)
                        if gk[0] == "ei":
                            csc = graph.call_function(torch.ops.gnncompile.cached_csc.default,
                                                      (gk[1], g["mval"], nval, copy_structures))
                        else:
                            csc = graph.call_function(torch.ops.gnncompile.pair_csc.default, (*parts, nval))
                        g["csc"][nkey] = tuple(graph.call_function(_getitem, (csc, i)) for i in range(3))
                    report.transposed += 1

    # ---- 3. rewrite
    outs = []
    for p in sorted(plans, key=lambda p: order[p.anchor]):
        g = p.group
        rowptr, col, perm = g["csr"]
        layer = layer_of(p.anchor)
        with graph.inserting_before(p.anchor):
            if p.kind == "spmm":
                xv = tensor_val(p.x)
                x = graph.call_method("contiguous", (p.x,))
                w = None
                if p.weight is not None:
                    w = graph.call_method("reshape", (p.weight, -1)) if p.weight_kind == "edge" \
                        else graph.call_method("squeeze", (p.weight, -1))
                    w = graph.call_method("contiguous", (w,))
                t = g["csc"].get(key(xv.shape[0]), (None, None, None)) if p.need_t else (None, None, None)
                call = graph.call_function(
                    torch.ops.gnncompile.spmm.default,
                    (rowptr, col, perm, w, x, p.reduce, list(knobs_for(xv.device)), *t))
                out = graph.call_function(_getitem, (call, 0))
                report.fused.append(Fused("spmm", p.reduce, layer, p.weight is not None, p.anchor.name))
            elif p.kind == "edge_softmax":
                sv = tensor_val(p.scores)
                s = graph.call_method("contiguous", (p.scores,))
                out = graph.call_function(torch.ops.gnncompile.edge_softmax.default,
                                          (rowptr, perm, s, list(knobs_for(sv.device))))
                report.fused.append(Fused("edge_softmax", "softmax", layer, False, p.anchor.name))
            else:  # degree
                out = graph.call_function(torch.ops.gnncompile.csr_degree.default,
                                          (rowptr, tensor_val(p.base).dtype))
                report.fused.append(Fused("degree", "count", layer, False, p.anchor.name))
        outs.append((p, out))
    # replace only now: plans may read other plans' anchors (a hop's output feeds the next)
    new_order = _node_index(graph)
    for p, out in outs:
        _replace(graph, p, out, new_order)
    for n, why in reasons.items():
        report.unfused.append(Unfused(opname(n), layer_of(n), why, n.name))
    _dce(graph, set(claimed))
    report.gathers = _rewrite_edge_gathers(graph, groups, knobs_for)
    graph.lint()
    gm.recompile()
    return report


_getitem = operator.getitem


def _size0(graph, n: Node):
    v = tensor_val(n).shape[0]
    if isinstance(v, int):
        return v
    return graph.call_method("size", (n, 0))


def _replace(graph, p: _Plan, out: Node, order: Dict[Node, int]) -> None:
    anchor = p.anchor
    if p.inplace:
        # later readers of the mutated zeros buffer see the result
        pos = order[anchor]
        for u in list(p.base.users):
            if u is not anchor and u in order and order[u] > pos:
                u.replace_input_with(p.base, out)
    anchor.replace_all_uses_with(out)
    graph.erase_node(anchor)


def _dce(graph, scatters=()) -> None:
    """Drops unused pure nodes, and the claimed scatters (softmax internals) once nothing reads
    them or the zeros buffer they fill."""
    scatters = set(scatters)
    changed = True
    while changed:
        changed = False
        for n in reversed(list(graph.nodes)):
            if n.op not in ("call_function", "call_method") or n.users:
                continue
            if opname(n) in PURE:
                graph.erase_node(n)
                changed = True
            elif n in scatters and all(u is n for u in n.args[0].users):
                scatters.discard(n)
                graph.erase_node(n)
                changed = True


def _rewrite_edge_gathers(graph, groups: Dict[Tuple, dict], knobs_for) -> int:
    """Per-edge gathers of a row of edge_index that are still in the graph after the fusion
    (GAT's attention logits ``alpha_src[j] + alpha_dst[i]``, GATv2's ``x[j]``) become
    ``gnncompile::gather``, whose gradient is a parallel segment sum over the structure already
    built for that edge_index instead of a serial E-row index_add. Only where the gathered
    tensor needs a gradient and a structure grouping the edges by that index exists."""
    done = 0
    for n in list(graph.nodes):
        g = _gather(n)
        if g is None:
            continue
        x, idx = g
        xv = tensor_val(x)
        if xv is None or not xv.requires_grad or xv.dtype not in _FLOAT_DTYPES:
            continue
        ik = _index_key(idx)
        if ik[0] != "row":
            continue
        nkey = key(xv.shape[0])
        structure = None
        for gk, grp in groups.items():
            if gk[0] != "ei" or gk[1] is not ik[1] or "csr" not in grp:
                continue
            if ik[2] == 1 and gk[2] == nkey:            # grouped by destination: the CSR
                structure = (grp["csr"][0], grp["csr"][2])
            elif ik[2] == 0 and nkey in grp["csc"]:    # grouped by source: the CSC
                structure = (grp["csc"][nkey][0], grp["csc"][nkey][2])
            if structure is not None:
                break
        if structure is None:
            continue
        # the structure nodes must come before the gather in the graph: move them up if their
        # inputs allow it (else leave this gather as it is)
        if not _hoist_structure(graph, structure[0].args[0], n):
            continue
        with graph.inserting_before(n):
            new = graph.call_function(torch.ops.gnncompile.gather.default,
                                      (x, idx, structure[0], structure[1], list(knobs_for(xv.device))))
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        done += 1
    return done


def _hoist_structure(graph, call: Node, before: Node) -> bool:
    """Moves a structure op ``call`` (and its getitem outputs) before ``before`` when it comes
    later. Its size arguments may be size nodes of tensors defined after ``before``: they are
    replaced by the size of an earlier tensor with the same (possibly symbolic) dim 0."""
    order = _node_index(graph)
    if order[call] < order[before]:
        return True
    new_args = list(call.args)
    for i, a in enumerate(call.args):
        if not isinstance(a, Node) or order[a] < order[before]:
            continue
        if opname(a) != "size":
            return False
        want = key(tensor_val(a.args[0]).shape[0]) if tensor_val(a.args[0]) is not None else None
        sub = None
        for m in graph.nodes:
            if m is before:
                break
            mv = tensor_val(m)
            if isinstance(mv, torch.Tensor) and mv.dim() >= 1 and key(mv.shape[0]) == want:
                sub = m
                break
        if sub is None:
            return False
        with graph.inserting_before(before):
            new_args[i] = graph.call_method("size", (sub, 0))
    call.args = tuple(new_args)
    outs = sorted((u for u in call.users if opname(u) == "getitem"), key=lambda u: order[u])
    before.prepend(call)
    for u in outs:
        before.prepend(u)
    return True
