"""Phase 3, match (read only): explain every scatter-like node of a Dynamo FX graph either as
part of a fusable chain or as unfused, with a reason.

Every scatter (:data:`canonical.SCATTERS`, any spelling) is read as a :class:`Scatter`, then

* :class:`Softmax`: PyG's inlined ``softmax(alpha, I)`` (segment max, sub, exp, segment sum,
  ``+ eps``, divide), anchored at the division -> ``gnncompile::edge_softmax``; it claims its
  two scatters;
* :class:`Degree`: ``zeros.scatter_add_(0, I, ones)`` (the count of ``scatter(reduce='mean')``,
  ``torch_geometric.utils.degree``) -> rowptr differences, when a structure for ``I`` exists
  anyway (decided by :mod:`.plan`);
* :class:`Aggregate`: ``zeros.scatter_add_/scatter_reduce_/index_add_(0, I, msg)`` where
  ``msg = x[J]`` or ``x[J] * w`` (``w`` one scalar per edge, ``[E, 1..]``, or one per edge and
  head, ``[E, H, 1]`` against ``x: [N, H, C]``), reduce sum / mean / amax / amin
  (``include_self=False`` where it matters) -> ``gnncompile::spmm``. The attention-weighted
  aggregation after a softmax is an Aggregate with a per-head weight, so the ``E x F`` message
  never exists.

Indices are described by :class:`IndexRef` (row r of a ``[2, E]`` edge_index node, or the
index node itself), sizes by their printed expression (:func:`canonical.size_key`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.fx import Node

from ..ops.checks import FLOAT_DTYPES, INDEX_DTYPES
from .canonical import (SCATTERS, argument, fake_tensor, index_dim, is_one, opname, same_size,
                        shape_key, size_hint, size_key)
from .semantics import Writes, describe_write, unmodelled

_REDUCE = {"sum": "sum", "add": "sum", "mean": "mean", "amax": "max", "amin": "min"}
_BROADCASTS = ("expand", "expand_as", "broadcast_to", "view", "reshape", "unsqueeze", "contiguous")


class NoMatch(Exception):
    """A scatter that cannot be fused; the message is the reason reported by explain()."""


# ----------------------------------------------------------------------------- records
@dataclass(frozen=True)
class IndexRef:
    """A 1-D index: row ``row`` (0 = sources, 1 = destinations) of the ``[2, E]`` tensor
    ``tensor``, or, with ``row`` None, the index node ``tensor`` itself."""

    tensor: Node
    row: Optional[int] = None

    @staticmethod
    def of(i: Node) -> "IndexRef":
        name = opname(i)
        if name == "getitem" and isinstance(i.args[1], int):
            p, r = i.args[0], i.args[1]
        elif name == "select" and argument(i, 1, "dim") == 0 and isinstance(argument(i, 2, "index"), int):
            p, r = i.args[0], argument(i, 2, "index")
        else:
            return IndexRef(i)
        pv = fake_tensor(p)
        if pv is not None and pv.dim() == 2 and size_key(pv.shape[0]) == "2":
            return IndexRef(p, r % 2)
        return IndexRef(i)

    def is_row(self, row: int, of: Optional[Node] = None) -> bool:
        return self.row == row and (of is None or self.tensor is of)


@dataclass
class Scatter:
    """A scatter-like node in canonical form: ``buffer[index[e]] (+)= message[e]``."""

    node: Node
    buffer: Node
    index: Node  # the 1-D index under any broadcast
    message: Any
    reduce: str
    inplace: bool


@dataclass
class Match:
    """What every fusable chain has: the node it replaces, its destination index, and the zeros
    buffer whose dim 0 is the number of destinations (``num_dst``, as a size key)."""

    anchor: Node
    dst: IndexRef
    dst_index: Node
    num_dst: str
    buffer: Node
    inplace: bool = False


@dataclass
class Aggregate(Match):
    reduce: str = "sum"
    x: Optional[Node] = None  # gathered node features
    src: Optional[IndexRef] = None
    src_index: Optional[Node] = None
    weight: Optional[Node] = None
    weight_kind: str = "none"  # 'none' | 'edge' ([E, 1..]) | 'head' ([E, H, 1])
    needs_csc: bool = False  # a sum/mean gradient of x flows back: the CSC is needed
    relu_input: bool = False  # max / min of x = relu(h) without weight: gradients at 0 are dropped anyway
    # the message [E, H, C] was flattened to [E, H * C] before the scatter (HANConv's
    # ``(x_j * alpha.view(-1, H, 1)).view(-1, H * C)``): the fused result is flattened likewise
    flat: bool = False


@dataclass
class Softmax(Match):
    scores: Optional[Node] = None
    internals: Tuple[Node, ...] = ()  # the segment-sum and segment-max scatters it replaces


@dataclass
class Degree(Match):
    pass


@dataclass
class Matches:
    aggregates: List[Aggregate] = field(default_factory=list)
    softmaxes: List[Softmax] = field(default_factory=list)
    degrees: List[Tuple[Degree, Node]] = field(default_factory=list)  # (match, scatter node)
    unfused: Dict[Node, str] = field(default_factory=dict)  # node -> reason
    claimed: List[Node] = field(default_factory=list)  # scatters a softmax replaces
    notes: List[str] = field(default_factory=list)  # why a chain was matched in a smaller form


# ----------------------------------------------------------------------------- helpers
def _strip_broadcast(idx: Any, like) -> Node:
    """The 1-D index under view(-1, 1..)/unsqueeze/expand(_as)/broadcast_to of a scatter index."""
    if not isinstance(idx, Node):
        raise NoMatch("index is not a tensor of the graph")
    top = fake_tensor(idx)
    if top is None or shape_key(top) != shape_key(like):
        raise NoMatch("index shape differs from the message shape")
    E = like.shape[0]
    n = idx
    while True:
        v = fake_tensor(n)
        if v is None or v.dtype not in INDEX_DTYPES:
            raise NoMatch("index is not an int32/int64 tensor")
        if not same_size(v.shape[0], E):
            raise NoMatch("index is not a per-edge index broadcast along dim 0")
        if v.dim() == 1:
            return _through_1d_views(n, E)
        for d in range(1, v.dim()):
            if not (is_one(v.shape[d]) or (d < like.dim() and same_size(v.shape[d], like.shape[d]))):
                raise NoMatch("index is not a per-edge index broadcast along dim 0")
        if opname(n) not in _BROADCASTS:
            raise NoMatch(f"index built by '{opname(n) or n.op}', not a broadcast of a 1-D index")
        n = n.args[0]
        if not isinstance(n, Node):
            raise NoMatch("index is not a tensor of the graph")


def _through_1d_views(n: Node, E) -> Node:
    """Looks through no-op 1-D views (view(-1), expand_as of an [E] tensor)."""
    while opname(n) in ("view", "reshape", "expand", "expand_as", "broadcast_to", "contiguous"):
        inner = n.args[0]
        iv = fake_tensor(inner)
        if not isinstance(inner, Node) or iv is None or iv.dim() != 1 or not same_size(iv.shape[0], E):
            break
        n = inner
    return n


def gather_of(n: Any) -> Optional[Tuple[Node, Node]]:
    """(x, j) when ``n`` is x.index_select(0, j) or x[j] with a 1-D integer tensor j."""
    if not isinstance(n, Node):
        return None
    name = opname(n)
    if name not in ("index_select", "getitem") or unmodelled(n) is not None:
        return None
    if name == "index_select":
        x, d, j = argument(n, 0), argument(n, 1, "dim"), argument(n, 2, "index")
    elif name == "getitem":
        x, j, d = n.args[0], n.args[1], 0
    else:
        return None
    xv, jv = fake_tensor(x), fake_tensor(j)
    if xv is None or jv is None or not isinstance(j, Node) or jv.dim() != 1 or jv.dtype not in INDEX_DTYPES:
        return None
    if xv.dim() < 1 or index_dim(d, xv.dim()) != 0:
        return None
    return x, j


def _fill_value(n: Any) -> Optional[float]:
    """The fill of a fresh constant tensor (zeros / ones / full spellings), else None."""
    name = opname(n)
    if name in ("new_zeros", "zeros", "zeros_like"):
        return 0
    if name in ("new_ones", "ones", "ones_like"):
        return 1
    if name in ("new_full", "full"):
        fill = argument(n, 2, "fill_value") if name == "new_full" else argument(n, 1, "fill_value")
        if isinstance(fill, (int, float)):
            return fill
    return None


def check_moves(writes: Writes, anchor: Node, values=(), leaves=(), indices=(), allow=()) -> None:
    """Raises NoMatch unless a fused op placed at ``anchor`` reads what the nodes it replaces
    read (:mod:`.semantics`): ``values`` are nodes whose result it recomputes (nothing may write
    them after they are computed), ``leaves`` are ``(node, reader)`` pairs it reads at the anchor
    where ``reader`` read them (nothing may write them from there on), ``indices`` may not be
    written anywhere in the graph (the structure is built elsewhere, or hoisted). Writes by
    ``allow`` (the scatters being replaced, which fill their buffers) do not count."""
    at = writes.pos[anchor]
    for n in values:
        w = writes.first_write(n, writes.pos[n], at, allow)
        if w is not None:
            raise NoMatch(describe_write(w, n))
    for n, reader in leaves:
        w = writes.first_write(n, writes.pos[reader] - 1, at)
        if w is not None:
            raise NoMatch(describe_write(w, n) + " after it is read")
    w = writes.clean(indices)
    if w is not None:
        raise NoMatch(describe_write(w, next(i for i in indices if writes.writes_of(i))))


# ----------------------------------------------------------------------------- scatters
def _scatter_reduce(n: Node, name: str) -> Tuple[Any, Any, str]:
    """(index, message, reduce) of a scatter node."""
    if name.startswith("index_add"):
        if argument(n, 4, "alpha", 1) != 1:
            raise NoMatch("index_add with alpha != 1")
        return argument(n, 2, "index"), argument(n, 3, "source"), "sum"
    index, src = argument(n, 2, "index"), argument(n, 3, "src")
    if name.startswith("scatter_add"):
        return index, src, "sum"
    r = argument(n, 4, "reduce")
    if r not in _REDUCE:
        raise NoMatch(f"scatter_reduce with reduce={r!r} (only sum, mean, amax, amin fuse)")
    if argument(n, 5, "include_self", True) and _REDUCE[r] != "sum":
        raise NoMatch(f"scatter_reduce '{r}' with include_self=True (the zeros take part)")
    return index, src, _REDUCE[r]


def read_scatter(n: Node, order: Dict[Node, int]) -> Scatter:
    """``n`` (a scatter-like node) as a :class:`Scatter`; raises NoMatch saying why not."""
    name = opname(n)
    why = unmodelled(n)
    if why is not None:
        raise NoMatch(why)
    base, dim = argument(n, 0), argument(n, 1, "dim")
    index, src, reduce = _scatter_reduce(n, name)
    bv, sv = fake_tensor(base), fake_tensor(src)
    if bv is None or sv is None:
        raise NoMatch("buffer or message is not a tensor")
    if bv.dtype not in FLOAT_DTYPES or sv.dtype != bv.dtype:
        raise NoMatch(f"dtype {sv.dtype} scattered into {bv.dtype} (float buffers of the message dtype fuse)")
    if index_dim(dim, bv.dim()) != 0:
        raise NoMatch(f"scatter along dim {dim}, not the node dimension 0")
    if bv.dim() != sv.dim() or shape_key(bv)[1:] != shape_key(sv)[1:]:
        raise NoMatch("buffer and message shapes differ beyond dim 0")
    if _fill_value(base) != 0 or bv.layout != torch.strided:
        raise NoMatch(f"output buffer comes from '{opname(base) or getattr(base, 'op', base)}', not a fresh zeros")
    if any(u is not n and order[u] < order[n] for u in base.users):
        raise NoMatch("the zeros buffer is read before the scatter")
    if name.startswith("index_add"):
        iv = fake_tensor(index)
        if iv is None or iv.dim() != 1 or iv.dtype not in INDEX_DTYPES or not same_size(iv.shape[0], sv.shape[0]):
            raise NoMatch("index_add index is not a 1-D per-edge index")
        idx1 = index
    else:
        idx1 = _strip_broadcast(index, sv)
    return Scatter(n, base, idx1, src, reduce, name.endswith("_"))


def _inplace_result(buf: Node, scatters: Dict[Node, Scatter]) -> Optional[Node]:
    """For a buffer mutated by an in-place scatter, that scatter node."""
    for u in getattr(buf, "users", ()):
        if u in scatters and scatters[u].buffer is buf and scatters[u].inplace:
            return u
    return None


def _scatter_behind(n: Node, scatters: Dict[Node, Scatter]) -> Optional[Scatter]:
    """The scatter whose result ``n`` is (the scatter itself, or its in-place buffer)."""
    return scatters.get(n) or scatters.get(_inplace_result(n, scatters))


# ----------------------------------------------------------------------------- chains
def _weighted_gather(src: Node) -> Tuple[Tuple[Node, Node], Node, str]:
    """((x, j), weight, weight_kind) of a message ``x[j] * w``; raises NoMatch otherwise."""
    if opname(src) != "mul" or len(src.args) != 2 or unmodelled(src) is not None:
        if _fill_value(src) == 1:
            raise NoMatch("degree count (scatter of ones): no gather-scatter on this index in this graph piece")
        raise NoMatch(f"message built by '{opname(src) or getattr(src, 'op', src)}', not x[j] or x[j] * w")
    a, b = src.args
    for gathered, weight in ((a, b), (b, a)):
        g = gather_of(gathered)
        if g is not None:
            break
    else:
        raise NoMatch("message is a product without a gathered node tensor x[j]")
    wv, ev, mv = fake_tensor(weight), fake_tensor(gathered), fake_tensor(src)
    if wv is None or not isinstance(weight, Node):
        raise NoMatch("message multiplies x[j] by a scalar constant, not a per-edge weight")
    if wv.dtype != ev.dtype:
        raise NoMatch(f"edge weight dtype {wv.dtype} differs from the features' {ev.dtype}")
    per_edge = f"weight of shape {list(wv.shape)} is not one value per edge (or per edge and head)"
    if wv.dim() != ev.dim() or not same_size(wv.shape[0], ev.shape[0]) or shape_key(mv) != shape_key(ev):
        raise NoMatch(per_edge)
    rest = list(wv.shape[1:])
    if all(is_one(s) for s in rest):
        return g, weight, "edge"
    if ev.dim() == 3 and same_size(rest[0], ev.shape[1]) and is_one(rest[1]):
        return g, weight, "head"
    raise NoMatch(per_edge)


def _flattened_heads(msg: Node) -> Optional[Node]:
    """``m`` when ``msg`` is ``m.view(-1, H * C)`` (or reshape / flatten(1)) of a per-edge
    ``m`` of shape [E, H, C]: the message, per head, before its heads were put side by side."""
    if opname(msg) not in ("view", "reshape", "flatten") or unmodelled(msg) is not None or not msg.args:
        return None
    inner = msg.args[0]
    iv, mv = fake_tensor(inner), fake_tensor(msg)
    if not isinstance(inner, Node) or iv is None or mv is None or iv.dim() != 3 or mv.dim() != 2:
        return None
    if not same_size(iv.shape[0], mv.shape[0]) or size_key(mv.shape[1]) != size_key(iv.shape[1] * iv.shape[2]):
        return None
    return inner


def match_aggregate(sc: Scatter, writes: Writes) -> Aggregate:
    message, flat = sc.message, False
    inner = _flattened_heads(message) if isinstance(message, Node) else None
    if inner is not None and (gather_of(inner) is not None or opname(inner) == "mul"):
        message, flat = inner, True
    g = gather_of(message)
    weight, kind = None, "none"
    if g is None:
        g, weight, kind = _weighted_gather(message)
        gathered = next(a for a in message.args if gather_of(a) == g)
        check_moves(writes, sc.node, values=(gathered, message, sc.message),
                    leaves=((g[0], gathered), (weight, message)), indices=(sc.index, g[1]))
    else:
        check_moves(writes, sc.node, values=(message, sc.message), leaves=((g[0], message),),
                    indices=(sc.index, g[1]))
    x, j = g
    xv = fake_tensor(x)
    if xv.dtype not in FLOAT_DTYPES:
        raise NoMatch(f"features of dtype {xv.dtype}")
    iv, jv = fake_tensor(sc.index), fake_tensor(j)
    if not same_size(iv.shape[0], jv.shape[0]) or iv.dtype != jv.dtype:
        raise NoMatch("gather and scatter indices differ in length or dtype")
    return Aggregate(sc.node, IndexRef.of(sc.index), sc.index, size_key(fake_tensor(sc.buffer).shape[0]),
                     sc.buffer, sc.inplace, reduce=sc.reduce, x=x, src=IndexRef.of(j), src_index=j,
                     weight=weight, weight_kind=kind,
                     needs_csc=sc.reduce in ("sum", "mean") and bool(xv.requires_grad),
                     relu_input=sc.reduce in ("max", "min") and weight is None and opname(x) == "relu"
                     and unmodelled(x) is None, flat=flat)


def match_degree(sc: Scatter) -> Optional[Degree]:
    bv = fake_tensor(sc.buffer)
    if bv.dim() != 1 or _fill_value(sc.message) != 1 or sc.reduce != "sum":
        return None
    return Degree(sc.node, IndexRef.of(sc.index), sc.index, size_key(bv.shape[0]), sc.buffer, sc.inplace)


def _without_eps(sums: Node) -> Node:
    """``s`` for ``s + eps`` with a literal 0 <= eps <= 1e-10 (PyG's softmax denominator)."""
    if opname(sums) == "add" and len(sums.args) == 2:
        s0, s1 = sums.args
        if isinstance(s1, Node):
            s0, s1 = s1, s0
        if isinstance(s0, Node) and isinstance(s1, float) and 0 <= s1 <= 1e-10:
            return s0
    return sums


def match_softmax(d: Node, scatters: Dict[Node, Scatter], writes: Writes) -> Optional[Softmax]:
    """PyG's softmax(alpha, I) as inlined by Dynamo, anchored at the final division."""
    if opname(d) != "div" or len(d.args) != 2 or opname(d.args[0]) != "exp":
        return None
    sm = _softmax(d, scatters)
    if sm is None:
        return None
    ex, den = d.args
    sub = ex.args[0]
    a, gm = sub.args
    sc_sum, sc_max = (scatters[n] for n in sm.internals)
    eps = _without_eps(gather_of(den)[0])
    pattern = [d, ex, sub, den, gm, gather_of(den)[0], sc_sum.node, sc_max.node, sc_max.message]
    if any(unmodelled(n) is not None for n in pattern):
        return None
    try:
        check_moves(writes, d, values=[n for n in pattern[1:] if n is not a] + [eps],
                    leaves=((a, sub), (a, sc_max.node)),
                    indices=(sc_sum.index, sc_max.index, gather_of(den)[1], gather_of(gm)[1]),
                    allow=(sc_sum.node, sc_max.node))
    except NoMatch:
        return None
    return sm


def _softmax(d: Node, scatters: Dict[Node, Scatter]) -> Optional[Softmax]:
    ex, den = d.args
    g_sum, sub = gather_of(den), ex.args[0]
    if g_sum is None or opname(sub) != "sub" or len(sub.args) != 2:
        return None
    sc_sum = _scatter_behind(_without_eps(g_sum[0]), scatters)
    if sc_sum is None or sc_sum.reduce != "sum" or sc_sum.message is not ex:
        return None
    a, gm = sub.args
    g_max = gather_of(gm)
    sc_max = _scatter_behind(g_max[0], scatters) if g_max is not None else None
    if sc_max is None or sc_max.reduce != "max":
        return None
    msrc = sc_max.message.args[0] if opname(sc_max.message) == "detach" else sc_max.message
    if msrc is not a:
        return None
    refs = {IndexRef.of(i) for i in (g_sum[1], g_max[1], sc_sum.index, sc_max.index)}
    av = fake_tensor(a)
    if len(refs) != 1 or av is None or av.dim() not in (1, 2) or av.dtype not in FLOAT_DTYPES:
        return None
    num_dst = fake_tensor(sc_sum.buffer).shape[0]
    if not same_size(num_dst, fake_tensor(sc_max.buffer).shape[0]):
        return None
    return Softmax(d, refs.pop(), sc_sum.index, size_key(num_dst), sc_sum.buffer, scores=a,
                   internals=(sc_sum.node, sc_max.node))


# When message programs pay (Settings.choices['programs'] == 'auto'), by what runs them.
# The CPU interpreter (GNNCOMPILE_CODEGEN=off, or no working compiler) costs more per edge and
# feature than torch's gather / scatter ops, and wins by what it does not store and by reading
# each source row once per destination: with many edges and a high degree. Measured with a
# GINEConv layer (F = 64, edge features 8), forward + backward, gnncompile with and without
# programs against eager, 2 threads, AMD EPYC (Zen 5): degree 2 loses at every size up to 200k
# edges (6.6k: 5.4-6.7 vs 3.8 ms without programs; 200k: 206-210 vs 169-186 ms); degree 4 loses
# at 6.6k and 60k edges (46 vs 33 ms) and wins at 200k (176 vs 198 ms); degree 10 loses at 6.6k
# (3.1 vs 1.4 ms) and wins at 60k (23 vs 30 ms) and 200k (140 vs 213 ms).
INTERPRETER_MIN_EDGES = ((150_000, 4.0), (30_000, 8.0))  # (edges at least, average degree at least)
# Generated kernels (gnncompile.codegen, the default) with GINE's edge encoder inside: the same
# layer, the speed guard off, AMD EPYC (Zen 2), 2026-12-03: programs / without 0.85-0.95 at 12k
# edges and 0.48-0.88 from 20k edges, at degrees 2, 4 and 10; at 6.6k edges 0.93 (degree 2),
# 1.04 (4), 1.03 (10). Reproduce: python -m benchmarks program_rule --edges
# 6600,12000,20000,60000,200000. But that layer's message is cheap (relu): with a rule of 10k
# edges the zoo (2000 nodes / 16k edges, F 32) lost CGConv (sigmoid * softplus: the kernels call
# libm per feature and edge, not vectorized; compiled step 78 ms against eager's 17 ms, guard
# off; with native/cpu/vmath.h, 2026-12-04, programs forced: 14.0 against 11.7 ms, main 42.5
# against 12.7 in the same session: benchmarks/results/vmath.md), AttentiveFP and PNAConv (1.29x, 1.10x and 1.33x eager before, 0.98-0.99x after: the guard
# kept eager). Until a rule per message measures those, generated kernels keep the interpreter's.
GENERATED_MIN_EDGES = INTERPRETER_MIN_EDGES
# ... except where that measurement applies: a message with an edge encoder inside and only cheap
# elementwise operators (no exp, log, tanh, sigmoid, softplus, erf, pow, sqrt: vectorized now, still
# several times relu's cost) pays from 10k edges at any degree under generated kernels. Zoo
# (2000 nodes / 16k edges, degree 8, F 32, guard on), GINEConv: 1.32x eager [1.24, 1.41] with its
# encoder inside under the 10k rule (HISTORY section 30) against 0.98x [0.93, 1.03] as written
# under the interpreter's rule (section 31).
# The 10k counts every such message of a graph piece together, each of at least
# ENCODED_MIN_EDGES_EACH edges: what a fused op saves (the edge tensors as written, their autograd
# records) adds up over the layers of a piece, while what it costs once a piece (the message
# kernels' fixed cost) does not. The figures below were taken while the backend's 'auto' gave a
# small training piece with fused ops to aot_eager; with the "eager" inner compiler 'auto' keeps
# now (backend.AUTO_SMALL_FUSED_TRAINING) the rule still pays: three layers at 5k / 7k edges,
# degree 2, 1.17x / 1.28x eager with programs against 1.08x / 1.13x without (`python -m benchmarks
# small_steps gine 5000,7000 2 eager,eager+never,eager+always --layers 3 --width 32`, one run). Issue 24 (benchmarks/results/small_steps.md; `python -m
# benchmarks small_steps gine ...`: GINEConv, edge features 8, 2 threads, variants interleaved in
# one process, AMD EPYC Zen 4), programs forced against the ops as written, ratios to eager: one
# layer alone at 5k / 7k edges 0.87x / 0.90x against 0.86x / 0.92x (degree 2), 0.80x / 0.86x
# against 0.94x / 0.93x (degree 8); three layers in one piece 1.20x / 1.42x against 1.00x / 1.06x
# (degree 2), 1.06x / 1.36x against 1.02x / 1.01x (degree 8), and at 3k edges a layer 0.93x against
# 1.07x, 0.94x against 0.98x (a loss: the floor); the molecule batches' GINE (3 x 6.4k edges,
# degree 2.1), model alone with Adam, 1.05-1.18x eager against 0.96-0.99x.
ENCODED_MIN_EDGES = 10_000
ENCODED_MIN_EDGES_EACH = 5_000
CHEAP_OPS = frozenset({"add", "sub", "mul", "neg", "relu", "leaky_relu", "clamp", "abs"})


def encoded_cheap(prog) -> bool:
    """Whether ``prog`` is a message the encoded rule covers: generated kernels run it, an edge
    encoder is inside it and every operator is in CHEAP_OPS."""
    from ..ops import program as P

    return (_generated() and any(lf.side == P.ENC for lf in getattr(prog, "leaves", ()))
            and set(getattr(prog, "ops", ())) <= CHEAP_OPS)


def encoded_cheap_pays(prog, edges) -> bool:
    """Whether ``prog`` (a message program over ``edges`` edges) takes :data:`ENCODED_MIN_EDGES`
    on its own: :func:`encoded_cheap` and at least that many edges (:func:`match` also counts
    the piece's such messages together, see ENCODED_MIN_EDGES_EACH)."""
    e = size_hint(edges)
    return e is not None and e >= ENCODED_MIN_EDGES and encoded_cheap(prog)


def encoded_note(total: int, count: int) -> str:
    """What the reason of an encoded cheap message left as written adds: the piece rule."""
    return (f"; a cheap message with its edge encoder inside fuses where the graph piece's such messages "
            f"(each of >= {ENCODED_MIN_EDGES_EACH} edges) scatter >= {ENCODED_MIN_EDGES} edges together: "
            f"here {count} of them, {total} edges")


PROGRAM_MIN_EDGES = INTERPRETER_MIN_EDGES  # (the name before generated kernels: the interpreter's)


def gathered_pays(edges, rows) -> bool:
    """Whether ``edges`` edges into ``rows`` rows (sizes, maybe symbolic: hints read) reach
    :data:`GATHERED_MIN_EDGES` (for a message :func:`gathered_cheap` covers)."""
    e, r = size_hint(edges), size_hint(rows)
    if e is None or r is None:
        return False
    return any(e >= min_e and e / max(1, r) >= min_d for min_e, min_d in GATHERED_MIN_EDGES)


# ... and where a message reads nothing per edge but node rows: every input is gathered by the
# edge's source or destination index (x_j, x_i; parameters too), at least two such gathers, only
# CHEAP_OPS. As written such a message stores at least three E x F tensors (the gathers and each
# operator's result) and their autograd records, and the fused kernels store none; a message that
# reads an E x F tensor computed outside (PNAConv's, GATEConv's, GMMConv's, RGATConv's) saves
# little and loses at this size. Zoo graph (F 32), speed guard off, one process per size, 50
# interleaved training steps, programs forced ('always') against none ('never'), AMD EPYC Zen 4
# (family 25 model 17), 2 threads, 2026-12-04 (`python -m benchmarks gathered_rule`,
# benchmarks/results/gathered_rule.md), never / always for LEConv (a_j - b_i) and FiLMConv
# (relu(gamma_i * x_j + beta_i)): 16k edges at degree 8 1.06x / 2.05x, at degree 4 1.00x / 1.40x,
# at degree 2 0.91x / 1.03x; 24k edges at degree 8 1.07x / 2.22x; 12k at degree 8 1.11x / 1.57x;
# 10k at degree 4 1.19x / 1.28x, at degree 2 0.87x / 1.00x. An earlier run of the same (a script
# then, another process state: LEConv's eager step 3.6 ms instead of 1.75) read LEConv 1.83x at
# 16k edges of degree 8, 1.27x at degree 4, 0.99x at degree 2, and lost LEConv at 10k edges of
# degree 4 (0.89x) and 12k of degree 8 (0.89x): hence 16k edges at degree >= 4. Per-edge inputs
# at 16k edges, degree 8, eager / compiled with programs forced against 'auto': PNAConv 0.89x
# against 1.20x, AttentiveFP 0.99x against 1.11x, GMMConv 0.76x against 0.92x, RGATConv 0.92x
# against 0.96x (one run).
# Paired against main in the zoo (`python -m benchmarks zoo_ab --base b96dfa6 --only
# LEConv,FiLMConv,PNA --rounds 3 --name zoo_ab_gathered_rule`): LEConv 1.00x -> 1.87x eager,
# FiLMConv 0.99x -> 2.33x, PNA unchanged (its message has several readers: _sole_reader).
GATHERED_MIN_EDGES = ((16_000, 4.0),)  # (edges at least, average degree at least)


def gathered_cheap(prog) -> bool:
    """Whether ``prog`` is a message the gathered rule covers (:data:`GATHERED_MIN_EDGES`):
    generated kernels run it, a sum aggregation (the zoo's PNA, whose max aggregation of
    ``x_i W + x_j W' + b`` it also took, ran at 0.82x [0.46, 1.47] of main's compiled step in a
    paired A/B: benchmarks/results/zoo_ab_gathered_rule_pna.md), every input that is not a
    parameter is a node row gathered by an edge index (side ``col`` or ``row``), at least two of
    them, and every operator is in CHEAP_OPS (the sizes are :func:`gathered_pays`'s)."""
    from ..ops import program as P

    data = [lf for lf in getattr(prog, "leaves", ()) if not lf.role and lf.side != P.CONST]
    return (_generated() and getattr(prog, "reduce", "sum") == "sum" and getattr(prog, "gathers", 0) >= 2 and bool(data)
            and all(lf.side in (P.COL, P.ROW) for lf in data)
            and set(getattr(prog, "ops", ())) <= CHEAP_OPS)


def _sole_reader(sc: "Scatter") -> bool:
    """Whether the scatter ``sc`` is the only reader of its message (through views): where
    others read it too (PNA's sum, max, min and std of one message), the E x F message is stored
    anyway and a program saves nothing (the zoo's PNA with its sum fused by the gathered rule:
    0.79x [0.58, 1.06] of main's compiled step, benchmarks/results/zoo_ab_gathered_rule_sum.md)."""
    from .messages import reads_value  # (messages imports this module)

    n, seen = sc.message, 0
    while isinstance(n, Node) and seen <= 8:
        readers = [u for u in n.users if u is not sc.node and reads_value(u, n)]
        if not readers:
            return True
        if len(readers) > 1 or opname(readers[0]) not in _VIEWS:
            return False
        n, seen = readers[0], seen + 1
    return not isinstance(n, Node)


_VIEWS = frozenset({"view", "reshape", "expand", "unsqueeze", "squeeze", "flatten", "_unsafe_view"})


def _generated() -> bool:
    from .. import codegen  # (codegen imports ops, which the passes import: not at module level)

    return codegen.enabled()


def programs_pay(edges, rows, generated: Optional[bool] = None) -> Tuple[bool, str]:
    """Whether a message program over ``edges`` edges into ``rows`` destination rows (sizes, maybe
    symbolic: their hints are read, nothing is specialised) is expected to be faster than the
    ops as written (:data:`GENERATED_MIN_EDGES` where generated kernels run them, ``generated``
    None: as gnncompile.codegen is set, else :data:`INTERPRETER_MIN_EDGES`), and the reason when
    it is not. A size with no hint (data-dependent: the number of graphs a pooling reads from
    ``batch``) leaves the rule to the other size; with neither known, the program is used (the
    behaviour before the rule)."""
    generated = _generated() if generated is None else generated
    rule = GENERATED_MIN_EDGES if generated else INTERPRETER_MIN_EDGES
    e, r = size_hint(edges), size_hint(rows)
    few = min(min_e for min_e, _ in rule)
    if e is None or (r is None and e >= few):
        return True, ""
    if r is not None:
        degree = e / max(1, r)
        if any(e >= min_e and degree >= min_d for min_e, min_d in rule):
            return True, ""
    into = ("a number of rows read from the data" if r is None
            else f"{r} rows (average degree {e / max(1, r):.1f})")
    said = " or ".join(f"edges >= {min_e // 1000}k" + (f" at degree >= {min_d:g}" if min_d > 1 else "")
                       for min_e, min_d in rule)
    runs = "generated kernels beat" if generated else "the interpreter beats"
    return False, (f"message program not used: {e} scattered rows (edges; nodes in a readout) into {into} "
                   f"is below the measured rule where {runs} the ops as written ({said}); "
                   f"settings={{'choices': {{'programs': 'always'}}}} fuses it anyway")


def _program_pays(sc: "Scatter") -> Tuple[bool, str]:
    index, buffer = fake_tensor(sc.index), fake_tensor(sc.buffer)
    if index is None or buffer is None or index.dim() == 0 or buffer.dim() == 0:
        return True, ""
    return programs_pay(index.shape[0], buffer.shape[0])


# gnncompile::message_softmax (one pass per row: every edge's message and two exps per feature)
# against the chain as written (edge_softmax over the E x F scores, a program for the weighted
# sum): below this many edges, with programs 'auto' under generated kernels, the chain stays as
# written (where the one pass's fixed costs, its kernels built at compile time and the backward's
# CSC, are not repaid). A first estimate, not measured by the change that introduced it; what was
# measured: the zoo's GENConv (16k edges) 2.64x eager with it (benchmarks/results/zoo_genconv.md).
SOFTMAX_MIN_EDGES = 5_000


def softmax_pays(sc: "Scatter", program_mode: str) -> Tuple[bool, str]:
    """Whether a softmax aggregation over ``sc``'s edges runs as one message_softmax
    (:data:`SOFTMAX_MIN_EDGES` under generated kernels, with programs 'auto'), and why not."""
    index = fake_tensor(sc.index)
    e = size_hint(index.shape[0]) if index is not None and index.dim() > 0 else None
    if program_mode != "auto" or e is None or e >= SOFTMAX_MIN_EDGES or not _generated():
        return True, ""
    return False, (f"{e} edges is below SOFTMAX_MIN_EDGES ({SOFTMAX_MIN_EDGES}) under generated kernels "
                   "(settings={'choices': {'programs': 'always'}} fuses it anyway)")


def match(graph, order: Dict[Node, int], programs: bool = True, program_mode: str = "always",
          attention: bool = False, attention_cuda: bool = False, encoders: "bool | str" = True,
          softmax_programs: bool = True) -> Matches:
    """Every scatter of ``graph`` explained (``order``: the position of every node; ``programs``:
    read the messages that are not ``x[j]`` / ``x[j] * w`` as message programs, where
    ``program_mode`` ('always', 'auto': where :func:`programs_pay`, 'never') says so;
    ``attention``: TransformerConv's message with an edge term is left to the fused attention,
    :func:`.attention_dot.leave_for_attention_dot`; on CUDA too with ``attention_cuda``;
    ``encoders``: linear maps of narrow edge features inside the message programs, by
    ``Settings.edge_encoder`` ('auto', 'inside', 'outside'; True / False: 'inside' / 'outside'),
    :mod:`.messages`; ``softmax_programs``: a softmax aggregation of a message program as one
    ``message_softmax``, :func:`.messages.match_softmax_program`, else the chain edge_softmax +
    program, with a note)."""
    programs = programs and program_mode != "never"
    m = Matches()
    writes = Writes.of(graph)
    scatters: Dict[Node, Scatter] = {}
    for n in graph.nodes:
        if opname(n) in SCATTERS:
            try:
                scatters[n] = read_scatter(n, order)
            except NoMatch as e:
                m.unfused[n] = str(e)
    for n in graph.nodes:
        sm = match_softmax(n, scatters, writes)
        if sm is not None:
            m.softmaxes.append(sm)
            m.claimed += list(sm.internals)
    encoded: list = []  # (node, program, reason, edges): cheap encoded messages the general rule declines
    for n, sc in scatters.items():
        if n in m.claimed:
            continue
        deg = match_degree(sc)
        if deg is not None:
            w = writes.clean([sc.index])
            if w is not None:
                m.unfused[n] = describe_write(w, sc.index)
            else:
                m.degrees.append((deg, n))
            continue
        try:
            m.aggregates.append(match_aggregate(sc, writes))
        except NoMatch as first:
            if not programs:
                m.unfused[n] = str(first)
                continue
            from .messages import match_program  # a message program: any elementwise message

            stops = {sm.anchor for sm in m.softmaxes}  # fused softmaxes are read, not re-derived
            if attention and stops:  # (TransformerConv's message reads a fused softmax: one of stops)
                from .attention_dot import LEFT, leave_for_attention_dot

                if leave_for_attention_dot(sc.message, stops, attention_cuda):
                    m.unfused[n] = LEFT
                    continue
            sm = next((s for s in m.softmaxes if s.anchor in getattr(sc.message, "args", ())), None)
            if sm is not None:  # the sum of a softmax aggregation: one message_softmax, where it pays
                from .messages import NotSoftmaxAggregation, match_softmax_program

                try:
                    prog = match_softmax_program(sc, sm, writes, stops - {sm.anchor}, encoders)
                    pays, why = softmax_pays(sc, program_mode) if softmax_programs else (
                        False, "export (gnncompile::message_softmax has no ONNX form)")
                    if pays:
                        m.aggregates.append(prog)
                        m.softmaxes.remove(sm)
                        m.claimed += list(sm.internals)
                        continue
                    m.notes.append(f"'{n.name}': softmax aggregation kept as edge_softmax + program: {why}")
                except NotSoftmaxAggregation:
                    pass
                except NoMatch as e:
                    m.notes.append(f"'{n.name}': softmax aggregation not fused into one pass: {e}")
            try:
                prog = match_program(sc, IndexRef.of(sc.index), writes, stops, encoders)
            except NoMatch as e:
                m.unfused[n] = f"message program: {e}"
                continue
            pays, why = _program_pays(sc) if program_mode == "auto" else (True, "")
            if not pays and gathered_cheap(prog) and _sole_reader(sc):
                if gathered_pays(fake_tensor(sc.index).shape[0], fake_tensor(sc.buffer).shape[0]):
                    pays = True
                else:
                    said = " or ".join(f"{e // 1000}k edges at degree >= {d:g}" for e, d in GATHERED_MIN_EDGES)
                    why += f" (and below GATHERED_MIN_EDGES, {said}, for a cheap message of gathered node rows)"
            if not pays and encoded_cheap(prog):
                e = size_hint(fake_tensor(sc.index).shape[0])
                if e is not None and e >= ENCODED_MIN_EDGES_EACH:
                    encoded.append((n, prog, why, e))  # decided with the piece's others below
                    continue
                if e is not None:
                    why += f" (and below ENCODED_MIN_EDGES_EACH, {ENCODED_MIN_EDGES_EACH} edges, for a cheap encoded message)"
            if pays:
                m.aggregates.append(prog)
            else:
                m.unfused[n] = why
    total = sum(e for *_, e in encoded)
    for n, prog, why, _ in encoded:  # ENCODED_MIN_EDGES over the piece's cheap encoded messages
        if total >= ENCODED_MIN_EDGES:
            m.aggregates.append(prog)
        else:
            m.unfused[n] = why + encoded_note(total, len(encoded))
    if programs:
        from .messages import match_edge_programs

        shared = [(a.dst, a.num_dst, a.dst_index) for a in m.aggregates
                  if a.dst.row == 1 and a.src is not None and a.src.is_row(0, of=a.dst.tensor)]
        seen, structures = set(), []
        for s in shared:
            if (s[0], s[1]) not in seen:
                seen.add((s[0], s[1]))
                structures.append(s)
        for ep in match_edge_programs(graph, structures, writes, {sm.anchor for sm in m.softmaxes}, encoders):
            edges, rows = fake_tensor(ep.anchor), fake_tensor(ep.buffer)
            pays, why = (programs_pay(edges.shape[0], rows.shape[0])
                         if program_mode == "auto" and edges is not None and rows is not None else (True, ""))
            if pays:
                m.aggregates.append(ep)
            else:
                m.unfused[ep.anchor] = why
    return m


__all__ = ["SOFTMAX_MIN_EDGES", "softmax_pays", "PROGRAM_MIN_EDGES", "GATHERED_MIN_EDGES", "gathered_cheap", "gathered_pays", "INTERPRETER_MIN_EDGES", "GENERATED_MIN_EDGES", "ENCODED_MIN_EDGES", "ENCODED_MIN_EDGES_EACH", "encoded_cheap", "encoded_cheap_pays", "programs_pay", "NoMatch", "IndexRef", "Scatter", "Match", "Aggregate", "Softmax", "Degree", "Matches",
           "gather_of", "read_scatter", "match_aggregate", "match_degree", "match_softmax", "match"]
