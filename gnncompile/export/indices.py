"""Index guards for ONNX: an index that eager rejects must make the ONNX file fail too.

Eager ``index_select``, ``gather``, ``scatter`` / ``scatter_add`` / ``scatter_reduce``,
``index_add`` / ``index_copy`` / ``index_reduce`` (in place or not) and ``F.embedding`` raise on
any index outside ``[0, size)``. Their ONNX translations (Gather, GatherElements,
ScatterElements, ScatterND) accept ``-size <= i < 0`` and wrap it to ``i + size``, so a ``-1`` in
``edge_index`` would give numbers where eager PyG raises. :func:`guard_indices` rewrites the
index ``i`` of every such op of the torch-level graph to ``where((i < 0) | (i >= size), size, i)``
(``size``: the indexed dim of the data, symbolic or not), which onnxruntime rejects ("indices
element out of data bounds"); valid indices are unchanged.

Not guarded, because ONNX already matches eager there:

* advanced indexing ``x[idx]`` / ``x[idx] = v`` (``index_put``) and ``index_fill``: torch wraps
  ``-size <= i < 0`` too and raises outside ``[-size, size)``; their translations (GatherND,
  ScatterND) wrap and reject the same;
* the fused ops (:mod:`.onnx_functions`): their bodies map their own indices (``in_range``);
* an index that is the ``perm`` of a structure op (``pair_csr`` & co.: a permutation of the
  edges, in range by construction): message programs read a per-edge tensor in CSR order
  through it.

An index that reaches its op through value-preserving reshapes used by that op only (PyG's
``broadcast``: ``index.view(-1, 1).expand_as(src)``) is guarded before them, once per edge
rather than per element; one guarded value serves every op that indexes a dim of the same
size with the same index.
"""
from __future__ import annotations

import operator
from typing import Any, Dict, Optional, Tuple

import torch
from torch.fx import GraphModule, Node

from .._log import get_logger
from ..ops import targets
from ..passes.canonical import argument, fake_tensor, index_dim, opname, size_key

_log = get_logger(__name__)

# (self, dim, index) at positions 0, 1, 2; eager raises on an index outside [0, self.size(dim))
GUARDED = frozenset({
    "index_select", "gather", "scatter", "scatter_", "scatter_add", "scatter_add_",
    "scatter_reduce", "scatter_reduce_", "index_add", "index_add_", "index_copy", "index_copy_",
    "index_reduce", "index_reduce_",
})
# reshapes that keep the index values (what PyG's ``broadcast`` does to a scatter index)
_RESHAPES = frozenset({"view", "reshape", "expand", "expand_as", "broadcast_to", "unsqueeze",
                       "contiguous"})
_META = ("nn_module_stack", "stack_trace", "source_fn_stack")


def _index_site(n: Node) -> Optional[Tuple[Any, Any, int, str]]:
    """``(data, dim, position, keyword)`` of the index argument of a guarded op, else None."""
    name = opname(n)
    if name in GUARDED:
        return argument(n, 0, "input", n.kwargs.get("self")), argument(n, 1, "dim"), 2, "index"
    if n.op == "call_function" and n.target is torch.nn.functional.embedding:
        return argument(n, 1, "weight"), 0, 0, "input"
    return None


def _chain(index: Node, op: Node):
    """``(root, reshapes)``: ``index`` followed up through the reshapes that only ``op`` uses,
    nearest first."""
    reshapes = []
    user = op
    while (opname(index) in _RESHAPES and len(index.users) == 1 and user in index.users
           and index.args and isinstance(index.args[0], Node)):
        reshapes.append(index)
        user, index = index, index.args[0]
    return index, reshapes


_STRUCTURES = (targets.PAIR_CSR, targets.BUILD_CSR, targets.CACHED_CSR)


def _is_perm(index: Node) -> bool:
    """Is ``index`` the ``perm`` output (item 2) of a structure op?"""
    return (index.op == "call_function" and index.target is operator.getitem and len(index.args) == 2
            and index.args[1] == 2 and isinstance(index.args[0], Node)
            and index.args[0].op == "call_function" and index.args[0].target in _STRUCTURES)


def _size(data: Node, dim: Any) -> Tuple[Any, Any]:
    """``(size, key)``: ``data.size(dim)`` as a literal when Dynamo recorded it static (else
    None: read it in the graph), and what identifies it for sharing guards (its printed
    expression when Dynamo recorded a shape)."""
    fake = fake_tensor(data)
    d = index_dim(dim, fake.dim()) if fake is not None else None
    if d is None:
        return None, (data, size_key(dim))
    size = fake.shape[d]
    return (size if isinstance(size, int) else None), size_key(size)


def _guard(graph, root: Node, data: Node, dim: Any, size: Any) -> Node:
    """``root.masked_fill((root < 0) | (root >= size), size)``, at the graph's insert point."""
    if size is None:
        size = graph.call_method("size", (data, dim))
    bad = graph.call_function(operator.or_, (graph.call_function(operator.lt, (root, 0)),
                                             graph.call_function(operator.ge, (root, size))))
    return graph.call_method("masked_fill", (root, bad, size))


def guard_indices(gm: GraphModule) -> int:
    """Guards, in place, the index of every op of :data:`GUARDED` (and ``F.embedding``) in the
    torch-level graph ``gm``; returns how many guards it inserted."""
    graph = gm.graph
    guards: Dict[Tuple[Node, Any], Node] = {}
    for n in list(graph.nodes):
        site = _index_site(n) if n.op in ("call_function", "call_method") else None
        if site is None:
            continue
        data, dim, pos, kw = site
        index = argument(n, pos, kw)
        if not isinstance(data, Node) or not isinstance(index, Node):
            continue
        root, reshapes = _chain(index, n)
        if _is_perm(root):
            continue
        size, key = _size(data, dim)
        guarded = guards.get((root, key))
        if guarded is None:
            first = n.prev
            with graph.inserting_before(n):
                guarded = guards[(root, key)] = _guard(graph, root, data, dim, size)
            m = first.next
            while m is not n:  # the new nodes belong to the op's layer (error messages)
                m.meta.update({k: n.meta[k] for k in _META if k in n.meta})
                m = m.next
        if reshapes:  # they move after the guard, just before their op
            for r in reversed(reshapes):
                n.prepend(r)
            reshapes[-1].replace_input_with(root, guarded)
        elif pos < len(n.args):
            n.update_arg(pos, guarded)
        else:
            n.update_kwarg(kw, guarded)
    if guards:
        graph.lint()
        gm.recompile()
    _log.debug("index guards: %d", len(guards))
    return len(guards)


__all__ = ["guard_indices", "GUARDED"]
