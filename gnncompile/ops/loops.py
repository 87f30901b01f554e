"""Self-loop handling as graph ops, so that a compiled model holds it as one graph-only step.

PyG's ``add_remaining_self_loops`` and ``remove_self_loops`` index ``edge_index`` with a
boolean mask (a data-dependent number of edges). Traced as written, every layer adds a
``nonzero`` and the per-edge features are indexed with the same mask again outside the
graph-only part, where each gets a size of its own. Here each is one op returning the new
``edge_index`` and, per output edge, the position of its attribute (``pos``); the attributes
follow by one gather, ``cat([edge_attr, loop_attr])[pos]``, so every per-edge tensor of the
layer has the one size the op declares, and the op (graph-only) is hoisted by
:mod:`gnncompile.passes.hoist` and computed once per graph.

* ``remaining_self_loops(edge_index, num_nodes) -> (edge_index', pos)``: the edges that are
  not self loops, in order, then one loop per node ``0..num_nodes-1``. ``pos`` is the edge's
  index in ``edge_index`` for a kept edge; for the loop of node ``v`` it is the index of the
  last existing loop ``v -> v`` (PyG keeps an existing loop's attribute), else
  ``E + v`` (row ``v`` of the fill attributes).
* ``remove_self_loops(edge_index) -> (edge_index', kept)``.
* ``loop_attr(edge_attr, loop_fill, edge_index, pos)``: ``cat([edge_attr, loop_fill])[pos]``,
  used where ``edge_attr`` needs a gradient. Its backward is PyG's: PyG writes the loop
  attributes with an indexed assignment, ``loop_attr[loop_nodes] = edge_attr[is_loop]``, whose
  backward hands the gradient of node ``v``'s loop to *every* existing loop ``v -> v``, the ones
  the assignment overwrote included; the plain gather's backward would give it to the last
  loop only (a different gradient wherever a node carries two loops).

:func:`install` registers Dynamo substitutions (``torch.compiler.substitute_in_graph``) of the
two PyG functions that call these ops for plain tensors; export turns them off
(:func:`use_loop_ops`), its graphs hold standard ops only.
"""
from __future__ import annotations

import contextlib
from typing import Tuple

import torch
from torch import Tensor

from .checks import check_edge_index

_ENABLED = [True]


@contextlib.contextmanager
def use_loop_ops(enabled: bool):
    """While active, the substitutions call these ops (``True``) or trace standard ops."""
    prev = _ENABLED[0]
    _ENABLED[0] = bool(enabled)
    try:
        yield
    finally:
        _ENABLED[0] = prev


@torch.library.custom_op("gnncompile::remaining_self_loops", mutates_args=())
def remaining_self_loops(edge_index: Tensor, num_nodes: int) -> Tuple[Tensor, Tensor]:
    check_edge_index(edge_index, "gnncompile::remaining_self_loops")
    n = int(num_nodes)
    src, dst = edge_index[0], edge_index[1]
    E = src.numel()
    is_loop = src == dst
    kept = (~is_loop).nonzero().view(-1)
    loops = is_loop.nonzero().view(-1)
    if loops.numel():
        lo, hi = int(src[loops].min()), int(src[loops].max())
        if lo < 0 or hi >= n:
            raise IndexError(f"gnncompile::remaining_self_loops: edge_index holds a self loop at node "
                             f"{lo if lo < 0 else hi}, out of range for num_nodes={n}")
    node = torch.arange(n, device=edge_index.device, dtype=edge_index.dtype)
    fill = torch.arange(E, E + n, device=edge_index.device)
    # the last existing loop of each node wins, as PyG's indexed assignment does on CPU
    loop_pos = fill.scatter_reduce(0, src[loops].long(), loops, reduce="amax", include_self=False) \
        if loops.numel() else fill
    out = torch.cat([edge_index.index_select(1, kept), node.view(1, -1).expand(2, -1)], dim=1)
    return out, torch.cat([kept, loop_pos])


@remaining_self_loops.register_fake
def _(edge_index, num_nodes):
    total = torch.library.get_ctx().new_dynamic_size(min=0)
    torch._check(total >= num_nodes)
    return edge_index.new_empty(2, total), edge_index.new_empty(total, dtype=torch.long)


@torch.library.custom_op("gnncompile::remove_self_loops", mutates_args=())
def remove_self_loops(edge_index: Tensor) -> Tuple[Tensor, Tensor]:
    check_edge_index(edge_index, "gnncompile::remove_self_loops")
    kept = (edge_index[0] != edge_index[1]).nonzero().view(-1)
    return edge_index.index_select(1, kept), kept


@remove_self_loops.register_fake
def _(edge_index):
    k = torch.library.get_ctx().new_dynamic_size(min=0)
    return edge_index.new_empty(2, k), edge_index.new_empty(k, dtype=torch.long)


@torch.library.custom_op("gnncompile::loop_attr", mutates_args=())
def loop_attr(edge_attr: Tensor, loop_fill: Tensor, edge_index: Tensor, pos: Tensor) -> Tensor:
    return torch.cat([edge_attr, loop_fill], dim=0).index_select(0, pos)


@loop_attr.register_fake
def _(edge_attr, loop_fill, edge_index, pos):
    return edge_attr.new_empty((pos.size(0), ) + tuple(edge_attr.shape[1:]))


def _loop_attr_setup(ctx, inputs, output):
    edge_attr, loop_fill, edge_index, pos = inputs
    ctx.save_for_backward(edge_index, pos)
    ctx.E, ctx.n = edge_attr.size(0), loop_fill.size(0)


def _loop_attr_backward(ctx, grad):
    """PyG's gradient: the gather's (each output row's gradient to the row it read), and in
    addition, for every existing self loop ``e`` of a node ``v``, the gradient of ``v``'s loop
    (output row ``K + v``, the loops follow the ``K`` kept edges in node order): what the
    backward of PyG's ``loop_attr[loop_nodes] = edge_attr[is_loop]`` gives each loop,
    overwritten or not."""
    edge_index, pos = ctx.saved_tensors
    E, n = ctx.E, ctx.n
    g = grad.new_zeros((E + n, ) + tuple(grad.shape[1:])).index_copy(0, pos, grad)
    g_edge, g_fill = g[:E], g[E:]
    loops = (edge_index[0] == edge_index[1]).nonzero().view(-1)  # (empty: nothing copied)
    rows = edge_index[0].index_select(0, loops).long() + (pos.size(0) - n)
    g_edge = g_edge.index_copy(0, loops, grad.index_select(0, rows))
    return g_edge, g_fill, None, None


torch.library.register_autograd("gnncompile::loop_attr", _loop_attr_backward, setup_context=_loop_attr_setup)


# ----------------------------------------------------------------------------- substitutions
def _plain(t) -> bool:
    return type(t) is torch.Tensor and t.layout == torch.strided


def install() -> None:
    """Registers the substitutions of PyG's two functions (once; a no-op without PyG)."""
    if getattr(install, "done", False):
        return
    install.done = True
    try:
        from torch_geometric.utils import loop as pyg_loop
    except ImportError:  # pragma: no cover - PyG is a dependency
        return
    from torch_geometric.utils.num_nodes import maybe_num_nodes

    orig_add, orig_remove = pyg_loop.add_remaining_self_loops, pyg_loop.remove_self_loops
    eager_add, eager_remove = torch._dynamo.disable(orig_add), torch._dynamo.disable(orig_remove)

    @torch.compiler.substitute_in_graph(orig_add, skip_signature_check=True)
    def add_remaining_self_loops(edge_index, edge_attr=None, fill_value=None, num_nodes=None):
        if not _ENABLED[0] or not _plain(edge_index) or not (edge_attr is None or _plain(edge_attr)):
            if not _ENABLED[0]:
                return _traced_add(edge_index, edge_attr, fill_value, num_nodes)
            return eager_add(edge_index, edge_attr, fill_value, num_nodes)
        n = maybe_num_nodes(edge_index, num_nodes)
        out, pos = torch.ops.gnncompile.remaining_self_loops(edge_index, n)
        if edge_attr is None:
            return out, None
        loop_attr = pyg_loop.compute_loop_attr(edge_index, edge_attr, n, False, fill_value)
        if edge_attr.requires_grad:  # PyG's gradient for nodes with several loops (loop_attr's docstring)
            return out, torch.ops.gnncompile.loop_attr(edge_attr, loop_attr, edge_index, pos)
        return out, torch.cat([edge_attr, loop_attr], dim=0).index_select(0, pos)

    @torch.compiler.substitute_in_graph(orig_remove, skip_signature_check=True)
    def remove_self_loops(edge_index, edge_attr=None):
        if not _plain(edge_index) or not (edge_attr is None or _plain(edge_attr)):
            return eager_remove(edge_index, edge_attr)
        if not _ENABLED[0]:
            mask = edge_index[0] != edge_index[1]
            return edge_index[:, mask], (None if edge_attr is None else edge_attr[mask])
        out, kept = torch.ops.gnncompile.remove_self_loops(edge_index)
        return out, (None if edge_attr is None else edge_attr.index_select(0, kept))

    def _traced_add(edge_index, edge_attr, fill_value, num_nodes):
        # standard ops only (export): the loops appended after the edges that are not loops
        n = maybe_num_nodes(edge_index, num_nodes)
        mask = edge_index[0] != edge_index[1]
        node = torch.arange(n, device=edge_index.device, dtype=edge_index.dtype)
        out = torch.cat([edge_index[:, mask], node.view(1, -1).repeat(2, 1)], dim=1)
        if edge_attr is None:
            return out, None
        loop_attr = pyg_loop.compute_loop_attr(edge_index, edge_attr, n, False, fill_value)
        is_loop = ~mask
        loop_attr[edge_index[0][is_loop]] = edge_attr[is_loop]
        return out, torch.cat([edge_attr[mask], loop_attr], dim=0)


__all__ = ["remaining_self_loops", "remove_self_loops", "loop_attr", "install", "use_loop_ops"]
