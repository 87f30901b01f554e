"""Phase 6, hoist: the work of a graph piece that depends only on the graph runs once per
graph, not once per call and layer.

A node is *graph-invariant* when every tensor it reads is a root or another invariant node,
and it is neither random nor a reader of anything else. Roots are the piece's inputs that are
integer tensors needing no gradient (``edge_index``, ``batch``, ``ptr``); sizes (symbolic or
not) may be read freely. In PyG's layers this is ``add_remaining_self_loops``, degree counts,
``deg^-1/2``, GCN's per-edge normalization, the structure ops of :mod:`.rewrite`, masks and
permutations: everything between ``edge_index`` and the first node that reads features or
parameters.

The invariant nodes become one region (:func:`gnncompile.ops.hoisted.register`), called
through ``gnncompile::hoisted``, which caches its outputs on the identity, version and content
of the roots (:mod:`gnncompile.ops.hoisted`). Correctness rules:

* nothing that needs a gradient, nothing random, nothing reading a float input is hoisted;
* an invariant value that the rest of the graph mutates in place is not (the cached copy
  would be overwritten), nor is anything after an in-place write to a root;
* views and sizes of roots stay where they are (cheap, and a cached output must not alias an
  input); scalars read from a tensor's data (``int(batch.max()) + 1``, the number of graphs
  PyG's pooling infers) stay too, with what reads them;
* a region must hold real work (not only views, sizes and cached structure ops).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Dict, List, Optional, Set

import torch
from torch.fx import Graph, GraphModule, Node

from ..ops import targets
from ..ops.checks import INDEX_DTYPES
from .canonical import fake_value, opname
from .rewrite import _earlier_size

_RANDOM = {"dropout", "dropout_", "feature_alpha_dropout", "alpha_dropout", "rand", "randn", "randint",
           "rand_like", "randn_like", "randint_like", "randperm", "bernoulli", "bernoulli_", "multinomial",
           "normal", "normal_", "uniform_", "exponential_", "poisson", "manual_seed", "seed"}
_VIEWS = {"getitem", "select", "view", "reshape", "unsqueeze", "squeeze", "t", "transpose", "expand",
          "expand_as", "narrow", "flatten", "unflatten", "permute", "contiguous", "detach", "view_as",
          "split", "chunk", "unbind"}
_SIZES = {"size", "dim", "numel", "sym_size", "sym_numel", "stride"}
_TRIVIAL = _VIEWS | _SIZES | {"to", "long", "int"}


@dataclass
class HoistReport:
    regions: int = 0
    nodes: int = 0
    outputs: int = 0


def _name(n: Node) -> str:
    name = opname(n)
    if name is not None:
        return name
    t = n.target
    if t is operator.setitem:
        return "setitem"
    if isinstance(t, torch._ops.OpOverload):
        return t._opname  # 'sym_size' for aten.sym_size.int
    return getattr(t, "__name__", None) or str(t)


def _is_size_value(v) -> bool:
    return isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool)


def _tensors_in(v) -> List[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors_in(x)]
    return []


_TUPLES = ("cached_csr", "cached_csc", "pair_csr", "pair_csc", "spmm", "hoisted", "neighbor_sample")


def _is_tensor_node(n: Node) -> bool:
    """Whether ``n`` gives one tensor: by its recorded value, or, for a node a pass inserted
    (no value recorded), by what it calls."""
    v = fake_value(n)
    if v is not None or "example_value" in n.meta:
        return isinstance(v, torch.Tensor)
    name = _name(n)
    return name not in _SIZES and not any(name.startswith(t) for t in _TUPLES)


def _reads_scalar(n: Node) -> bool:
    """``n`` reads a Python scalar out of a tensor's data (``int(batch.max())``, ``.item()``:
    an unbacked symbolic size or value). It stays in the graph: a region hands out tensors."""
    v = fake_value(n)
    if not isinstance(v, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return False
    return any(isinstance(fake_value(a), torch.Tensor) for a in n.all_input_nodes)


def _is_root(n: Node) -> bool:
    v = fake_value(n)
    return (n.op == "placeholder" and isinstance(v, torch.Tensor) and v.dtype in INDEX_DTYPES
            and not v.requires_grad)


def _mutates(n: Node) -> bool:
    """An in-place op: writes its first argument."""
    if n.op not in ("call_function", "call_method"):
        return False
    name = _name(n)
    if name == "setitem":
        return True
    return name.endswith("_") and not name.startswith("_") and name not in ("requires_grad_",)


def _base(n: Node, views: Set[Node]) -> Node:
    while n in views and n.args and isinstance(n.args[0], Node):
        n = n.args[0]
    return n


def _mutated(nodes: List[Node], views: Set[Node]) -> Set[Node]:
    """Every node written in place (through any chain of views) somewhere in the graph."""
    out: Set[Node] = set()
    for n in nodes:
        if _mutates(n) and n.args and isinstance(n.args[0], Node):
            m = n.args[0]
            out.add(m)
            while m in views and m.args and isinstance(m.args[0], Node):
                m = m.args[0]
                out.add(m)
    return out


def find_invariant(graph: Graph, exclude: Set[Node] = frozenset()) -> Optional[tuple]:
    """(roots, free, consts, invariant): root placeholders, free nodes (sizes, views of roots),
    constants built from sizes alone that invariant nodes read, and the invariant nodes, in
    graph order; None when nothing may be hoisted. Nodes in ``exclude`` are never invariant."""
    roots: List[Node] = []
    free: Set[Node] = set()  # readable by a region without being in it
    root_views: Set[Node] = set()
    consts: Dict[Node, None] = {}  # zeros, arange, ones(E'): copied into a region that reads them
    inv: Dict[Node, None] = {}
    inv_sizes: Set[Node] = set()
    views: Set[Node] = set()
    nodes = list(graph.nodes)
    for n in nodes:
        if n.op == "placeholder":
            if _is_root(n):
                roots.append(n)
            elif _is_size_value(fake_value(n)):
                free.add(n)
            continue
        if n.op not in ("call_function", "call_method"):
            continue
        name = _name(n)
        if name in _VIEWS:
            views.add(n)
        if _mutates(n) and isinstance(n.args[0], Node):
            target = _base(n.args[0], views)
            if target in roots or target in root_views:
                return None  # the model writes its graph: leave everything as it is
        if name in _SIZES and (_is_size_value(fake_value(n)) or "example_value" not in n.meta):
            free.add(n)  # (a size node a pass inserted has no recorded value)
            if any(a in inv for a in n.all_input_nodes):
                inv_sizes.add(n)  # a size of an invariant tensor: reading it makes a node invariant
            continue
        ins = list(n.all_input_nodes)
        if name in _RANDOM or any(t.requires_grad for t in _tensors_in(fake_value(n))):
            continue
        if _reads_scalar(n) or n in exclude:
            continue  # a value read from a tensor's data (.item()), or left out by hoist(): the graph keeps it
        if name in _VIEWS and ins and all(a in roots or a in root_views or a in free for a in ins) \
                and any(a in roots or a in root_views for a in ins):
            root_views.add(n)
            continue
        if not all(a in inv or a in roots or a in root_views or a in free or a in consts for a in ins):
            continue
        if not any(a in inv or a in roots or a in root_views or a in inv_sizes for a in ins):
            consts[n] = None  # built from sizes only: hoisted only with a reader
            continue
        inv[n] = None
    if not roots or not inv:
        return None
    mutated = _mutated(nodes, views)
    # an invariant value the rest of the graph writes in place must not be cached, and a
    # constant both the region and the rest read must not be written by either (it is copied)
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if n in inv or not _mutates(n) or not isinstance(n.args[0], Node):
                continue
            target = _base(n.args[0], views)
            if target in inv:
                _drop_with_dependents(target, inv)
                changed = True
        for c in consts:
            inside = [u for u in c.users if u in inv]
            if inside and len(inside) != len(c.users) and c in mutated:
                for u in inside:
                    _drop_with_dependents(u, inv)
                changed = changed or bool(inside)
    if not any(_name(n) not in _TRIVIAL and n.target not in (targets.CACHED_CSR, targets.CACHED_CSC)
               for n in inv):
        return None
    return roots, free | root_views, consts, list(inv)


def dedupe(graph: Graph, inv: List[Node], mutated: Set[Node]) -> List[Node]:
    """Merges invariant nodes that compute the same thing from the same inputs (every layer of a
    GCN computes the same self loops and structure); nodes written in place, and the writes,
    stay apart. Returns the invariant nodes left."""
    seen: Dict[tuple, Node] = {}
    kept = []
    for n in inv:
        if n in mutated or _mutates(n):
            kept.append(n)
            continue
        try:
            key = (n.op, n.target, _freeze(_canon_sizes(n.args)), _freeze(_canon_sizes(n.kwargs)))
            hash(key)
        except TypeError:
            kept.append(n)
            continue
        rep = seen.get(key)
        if rep is None:
            seen[key] = n
            kept.append(n)
        else:
            n.replace_all_uses_with(rep)
            graph.erase_node(n)
    return kept


def _size_expr(a: Node) -> Optional[str]:
    """The printed value of a size node (x.size(d)), recorded or read from its tensor."""
    v = fake_value(a)
    if _is_size_value(v):
        return str(v)
    t = fake_value(a.args[0]) if a.args and isinstance(a.args[0], Node) else None
    d = a.args[1] if len(a.args) > 1 else None
    if isinstance(t, torch.Tensor) and isinstance(d, int) and -t.dim() <= d < t.dim():
        return str(t.shape[d])
    return None


def _canon_sizes(v):
    """Arguments with size nodes replaced by their printed value (equal sizes read from
    different tensors are the same argument)."""
    if isinstance(v, Node):
        e = _size_expr(v) if _name(v) in _SIZES else None
        return ("size", e) if e is not None else v
    if isinstance(v, (list, tuple)):
        return type(v)(_canon_sizes(x) for x in v)
    if isinstance(v, dict):
        return {k: _canon_sizes(x) for k, x in v.items()}
    return v


def _freeze(v):
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_freeze(x) for x in v))
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, slice):
        return ("slice", _freeze(v.start), _freeze(v.stop), _freeze(v.step))
    if isinstance(v, torch.Tensor):
        raise TypeError("a constant tensor argument")
    return v


def _drop_with_dependents(n: Node, inv: Dict[Node, None]) -> None:
    stack = [n]
    while stack:
        m = stack.pop()
        if m in inv:
            del inv[m]
            stack.extend(m.users)


def hoist(gm: GraphModule, copy: bool = False, check: str = "") -> HoistReport:
    """Moves the graph-invariant nodes of ``gm`` into one cached region (see the module
    docstring); ``copy``: the region's outputs are handed out as clones. Returns what moved."""
    exclude: Set[Node] = set()
    while True:
        late = _hoist_once(gm, copy, check, exclude)
        if not isinstance(late, set):
            return late
        exclude |= late  # region nodes that read a size the graph defines too late: leave them


def _hoist_once(gm: GraphModule, copy: bool, check: str, exclude: Set[Node]):
    """One try of :func:`hoist`: its report, or the invariant nodes to leave out when the region
    would read a size defined after the region's call (the number of graphs PyG's pooling reads
    from ``batch`` late in the graph, say)."""
    from ..ops import hoisted as _hoisted

    report = HoistReport()
    graph = gm.graph
    found = find_invariant(graph, exclude)
    if found is None:
        return report
    roots, free, consts, inv_list = found
    views = {n for n in graph.nodes if _name(n) in _VIEWS}
    order = {n: i for i, n in enumerate(graph.nodes)}
    frees = [f for f in free if f.op != "placeholder"]
    kept = set(dedupe(graph, sorted({*frees, *consts, *inv_list}, key=order.__getitem__),
                      _mutated(list(graph.nodes), views)))
    free = {f for f in free if f.op == "placeholder" or f in kept}
    inv_list = [n for n in inv_list if n in kept]
    consts = {c: None for c in consts if c in kept}
    inv = set(inv_list)
    order = {n: i for i, n in enumerate(graph.nodes)}

    # region inputs: roots and free nodes read by region members (free views of roots are
    # copied in, reading the roots; sizes of region tensors too)
    # size nodes read only by the region go with it
    region_sizes = {f for f in free if f.op != "placeholder" and f.users and all(u in inv for u in f.users)}
    outputs = [n for n in inv_list if any(u not in inv and u not in region_sizes for u in n.users)]
    if not outputs or not all(_is_tensor_node(n) for n in outputs):
        return report
    # a value the region writes in place after the rest of the graph may have read it
    for n in inv_list:
        if _mutates(n) and isinstance(n.args[0], Node):
            base = _base(n.args[0], views)
            if any(o is base or _base(o, views) is base for o in outputs if o is not n):
                return report
    used_free: List[Node] = []
    copied_in: List[Node] = []

    def visit_free(f: Node) -> None:
        if f in used_free or f in copied_in:
            return
        if f.op == "placeholder" or not any(a in inv or a in roots or a in free for a in f.all_input_nodes):
            used_free.append(f)  # a size placeholder, or a size of a tensor outside the region
            return
        if all(a in roots or a in inv or a in free for a in f.all_input_nodes) and \
                any(a in roots or a in inv for a in f.all_input_nodes):
            for a in f.all_input_nodes:
                if a in free:
                    visit_free(a)
            copied_in.append(f)
        else:
            used_free.append(f)

    def visit_const(c: Node) -> None:
        if c in copied_in:
            return
        for a in c.all_input_nodes:
            if a in consts:
                visit_const(a)
            elif a in free:
                visit_free(a)
        copied_in.append(c)

    for n in inv_list:
        for a in n.all_input_nodes:
            if a in free:
                visit_free(a)
            elif a in consts:
                visit_const(a)
    size_inputs = [f for f in used_free if _is_size_value(fake_value(f)) or
                   (_name(f) in _SIZES and "example_value" not in f.meta)]
    if len(size_inputs) != len(used_free):
        return report  # a free tensor that is not a view of a root: leave the graph alone
    used_roots = [r for r in roots if any(r in n.all_input_nodes for n in inv_list + copied_in)]
    if not used_roots:
        return report

    # the call goes after its inputs and before the first reader of an output
    first_reader = min((u for o in outputs for u in o.users if u not in inv and u not in region_sizes),
                       key=order.__getitem__)
    late, call_sizes = set(), list(size_inputs)  # the call passes call_sizes: earlier reads of the same sizes
    for i, f in enumerate(size_inputs):
        if order[f] >= order[first_reader]:  # a size defined later: the same size, read earlier
            sub = _earlier_size(graph, f, first_reader) if _name(f) == "size" else None
            if sub is None:
                late |= {u for u in f.users if u in inv}
            else:
                call_sizes[i] = sub
    if late:
        return late

    # the region's graph
    rg = Graph()
    env: Dict[Node, Node] = {}
    for r in used_roots:
        env[r] = rg.placeholder(f"root_{len(env)}")
    for f in size_inputs:
        env[f] = rg.placeholder(f"size_{len(env)}")
    for n in sorted(set(inv_list) | set(copied_in), key=order.__getitem__):
        env[n] = rg.node_copy(n, lambda a: env[a])
    rg.output(tuple(env[o] for o in outputs))
    key, region = _hoisted.register(GraphModule(torch.nn.Module(), rg))

    with graph.inserting_before(first_reader):
        call = graph.call_function(targets.HOISTED, (key, list(used_roots), call_sizes, copy, check))
        got = [graph.call_function(operator.getitem, (call, i)) for i in range(len(outputs))]
    for o, g in zip(outputs, got):
        o.replace_all_uses_with(g, delete_user_cb=lambda u: u not in inv)
    for n in sorted(set(inv_list) | region_sizes, key=order.__getitem__, reverse=True):
        if not n.users:
            graph.erase_node(n)
    _hoisted.hold(gm, region)  # the registry holds regions weakly: gm, which calls it, holds it
    report.regions, report.nodes, report.outputs = 1, len(inv_list), len(outputs)
    return report


__all__ = ["hoist", "find_invariant", "HoistReport"]
