"""Capture and rewrite for export: the model's graph through Dynamo, the gnncompile passes,
stateless structure ops, and ``torch.export`` with dynamic numbers of nodes and edges."""
from __future__ import annotations

import bisect
import contextlib
import operator
import warnings
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from torch.fx import GraphModule

from .. import passes
from ..ops import loops
from .._log import get_logger, log_fusions
from ..ops import targets
from ..ops.checks import INDEX_DTYPES, is_edge_index
from ..settings import Settings
from .diagnose import ExportError, fail
from .indices import guard_indices

_log = get_logger(__name__)


def _dynamic_shapes(args: Sequence[Any]):
    """The dynamic dims of every tensor input, in the structure of ``args`` (dicts kept)."""
    from torch.export import Dim

    def spec(a):
        if isinstance(a, dict):
            return {k: spec(v) for k, v in a.items()}
        if isinstance(a, torch.Tensor) and a.dim() >= 1:
            return {1: Dim.AUTO} if is_edge_index(a) else {0: Dim.AUTO}
        return None

    return tuple(spec(a) for a in args)


def key_name(key: Any) -> str:
    """A dict key as it appears in an input or output name: a string as it is, a tuple (an edge
    type) joined by ``__`` (``('author', 'writes', 'paper')`` -> ``author__writes__paper``, the
    spelling PyG's ``to_hetero`` gives its per-type layers)."""
    if isinstance(key, tuple):
        return "__".join(key_name(k) for k in key)
    return str(key)


def flat_inputs(args: Sequence[Any]):
    """``(position, key or None, tensor)`` of every tensor of ``args``, in the order torch.export
    flattens them: a dict (PyG's ``x_dict``, ``edge_index_dict``) gives one entry per key, in
    its order."""
    for i, a in enumerate(args):
        if isinstance(a, dict):
            for k, v in a.items():
                yield i, k, v
        else:
            yield i, None, a


def _check_inputs(args: Sequence[Any], dynamic: bool) -> None:
    for i, key, a in flat_inputs(args):
        what = f"example input {i}" + ("" if key is None else f" [{key!r}]")
        if isinstance(args[i], dict) and not (isinstance(key, str) or (
                isinstance(key, tuple) and all(isinstance(k, str) for k in key))):
            raise ExportError(f"gnncompile.export: {what}: dict keys must be strings or tuples of strings "
                              "(node and edge types)")
        if not isinstance(a, torch.Tensor):
            raise ExportError(f"gnncompile.export: {what} is a {type(a).__name__}; "
                              "pass tensors (x, edge_index, edge weights / attributes) or dicts of "
                              "tensors (x_dict, edge_index_dict)")
        if dynamic and a.dim() >= 1:
            d = a.size(1) if is_edge_index(a) else a.size(0)
            if d < 2:
                raise ExportError(
                    f"gnncompile.export: {what} has {d} rows: use an example with at "
                    "least 2 nodes and 2 edges (sizes 0 and 1 are specialized by torch.export)")


def _no_duck_shapes():
    """Without duck sizing, a number of nodes that equals the number of edges in the example
    does not merge their symbols (which would bake N == E into the program)."""
    try:
        from torch.fx.experimental import _config as fx_config

        return fx_config.patch(use_duck_shape=False)
    except (ImportError, AttributeError):  # pragma: no cover - older torch
        return contextlib.nullcontext()


# the position of the ``csc`` argument (a transposed structure, for the backward pass)
_CSC_ARG = {targets.MESSAGE_REDUCE: 10, targets.MESSAGE_EDGES: 11}


def _pure_structures(gm: GraphModule) -> None:
    """Replaces the cached structure op ``cached_csr(edge_index, num_dst)`` with the pure
    ``pair_csr(edge_index[1], edge_index[0], num_dst)`` (no cache: a counting sort by
    ``gnncompile::build_csr`` on every call; its schema keeps ``num_dst`` symbolic, which
    ``build_csr``'s ``int`` arguments would specialize), the degree op with rowptr differences,
    ``gnncompile::gather`` with ``index_select``, and drop transposed structures and the
    arguments that pass them to the fused ops (export is inference)."""
    graph = gm.graph
    for n in list(graph.nodes):
        if n.op != "call_function":
            continue
        if n.target is targets.SPMM and len(n.args) > 7:
            n.args = tuple(n.args[:7])
        elif n.target in _CSC_ARG:  # the transposed structure only serves the backward pass
            i = _CSC_ARG[n.target]
            if len(n.args) > i and n.args[i]:
                n.update_arg(i, [])
        elif n.target is targets.GATHER:  # its own op only for its segment-sum gradient
            x, idx = n.args[:2]
            with graph.inserting_before(n):
                new = graph.call_function(torch.index_select, (x, 0, idx))
            new.meta = dict(n.meta)
            n.replace_all_uses_with(new)
            graph.erase_node(n)
        elif n.target is targets.CACHED_CSR:
            ei, num_dst = n.args[0], n.args[1]
            with graph.inserting_before(n):
                dst = graph.call_function(operator.getitem, (ei, 1))
                src = graph.call_function(operator.getitem, (ei, 0))
                new = graph.call_function(targets.PAIR_CSR, (dst, src, num_dst))
            new.meta = dict(n.meta)
            n.replace_all_uses_with(new)
            graph.erase_node(n)
        elif n.target is targets.CSR_DEGREE:
            rowptr, dtype = n.args
            with graph.inserting_before(n):
                hi = graph.call_function(operator.getitem, (rowptr, slice(1, None)))
                lo = graph.call_function(operator.getitem, (rowptr, slice(None, -1)))
                d = graph.call_function(operator.sub, (hi, lo))
                new = graph.call_method("to", (d, dtype))
            new.meta = dict(n.meta)
            n.replace_all_uses_with(new)
            graph.erase_node(n)
    for n in reversed(list(graph.nodes)):  # transposed structures are dead now
        if n.op == "call_function" and n.target in (targets.CACHED_CSC, targets.PAIR_CSC):
            for u in list(n.users):
                if not u.users:
                    graph.erase_node(u)
            if not n.users:
                graph.erase_node(n)
    # (no graph.eliminate_dead_code(): FX would drop in-place methods whose result is unused,
    # such as ``count.scatter_add_(...)``, which change the model)
    graph.lint()
    gm.recompile()


def _layers_of(graph) -> Dict[Any, Tuple[int, Any]]:
    """node -> (position, nn_module_stack) of every node (before the passes)."""
    return {n: (i, n.meta.get("nn_module_stack")) for i, n in enumerate(graph.nodes)}


def _carry_layers(graph, before: Dict[Any, Tuple[int, Any]]) -> None:
    """The nodes the passes inserted carry no ``nn_module_stack`` (torch.export would put them
    in no layer, and an error or the ONNX report could not name one): each gets the stack of the
    chain it replaced, the last node it removed between the original nodes around it (the
    chain's scatter), else that of the original node before it."""
    nodes = list(graph.nodes)
    stacks = {i: stack for i, stack in before.values()}
    alive = set(nodes)
    removed = sorted(i for n, (i, _) in before.items() if n not in alive)
    prev, last = [], -1
    for n in nodes:  # the position of the original node before each node
        prev.append(last)
        last = before[n][0] if n in before else last
    nxt, last = [0] * len(nodes), len(before)
    for k in range(len(nodes) - 1, -1, -1):  # and after it
        nxt[k] = last
        last = before[nodes[k]][0] if nodes[k] in before else last
    for k, n in enumerate(nodes):
        if n in before or n.op not in ("call_function", "call_method") or n.meta.get("nn_module_stack"):
            continue
        inside = removed[bisect.bisect_right(removed, prev[k]):bisect.bisect_left(removed, nxt[k])]
        for pos in inside[-1:] + ([prev[k]] if prev[k] >= 0 else []):
            if stacks.get(pos):
                n.meta["nn_module_stack"] = dict(stacks[pos])
                break


def settings_of(model) -> Settings:
    """A compiled model's own settings (``.gnncompile_settings``), else the configuration's."""
    settings = getattr(model, "gnncompile_settings", None)
    return settings if isinstance(settings, Settings) else Settings.from_config()


def export_settings(settings: Settings, programs: bool = True) -> Tuple[Settings, bool]:
    """What the passes of an export run with, and whether message programs are on: programs
    'always' unless ``programs`` is False or the settings say 'never' ('auto' is a rule on the
    speed of the CPU interpreter of compiled models; an exported file runs the programs' ONNX
    functions or the op in another program). The opt-in bf16 precision is dropped: an exported
    file runs the spmm in float32 (``gnncompile::spmm_bf16`` has no translation to standard ops)."""
    use = programs and settings.programs != "never"
    if settings.precision != "fp32":
        settings = settings.replace(choices={k: v for k, v in settings.choices if k != "precision"})
    if use:
        settings = settings.replace(choices={**dict(settings.choices), "programs": "always"})
    return settings, use


def optimize(model, example_inputs: Sequence[Any], dynamic: bool = True, for_onnx: bool = False,
             settings: Optional[Settings] = None, programs: bool = True):
    """Captures ``model`` on ``example_inputs`` and returns ``(exported_program, pass_report)``:
    a ``torch.export`` program holding the fused gnncompile ops and pure structure ops.
    ``for_onnx``: the index of every op whose eager kernel rejects a negative index is guarded
    (:mod:`.indices`), since ONNX wraps it; a torch.export program needs no guard.
    ``settings``: what the passes run with (the kernel knobs baked into the fused calls);
    default: a compiled model's own (``.gnncompile_settings``), else the configuration's.
    ``programs``: messages that are more than a gathered feature fused as message programs
    (``gnncompile::message_reduce`` / ``message_edges``; see :func:`export_settings`)."""
    settings, programs = export_settings(settings_of(model) if settings is None else settings, programs)
    model = getattr(model, "model", model) if hasattr(model, "gnncompile_settings") else model
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    _check_inputs(args, dynamic)
    was_training = getattr(model, "training", False)
    if isinstance(model, torch.nn.Module):
        model.eval()
    try:
        # self loops as standard ops (nonzero, cat), which ONNX and torch.export know
        with torch.no_grad(), _no_duck_shapes(), warnings.catch_warnings(), loops.use_loop_ops(False):
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            try:
                gm, _guards = torch._dynamo.export(
                    model, aten_graph=False, assume_static_by_default=not dynamic)(*args)
            except Exception as e:
                raise fail(model, "graph capture (torch._dynamo.export)", e) from e
            layers = _layers_of(gm.graph)
            # a softmax aggregation stays edge_softmax + a message program (message_softmax has
            # no ONNX function: the chain's ops have, and a pt2 program keeps what ONNX gets)
            report = passes.run(gm, settings, programs=programs, softmax_programs=False)
            _carry_layers(gm.graph, layers)
            log_fusions(_log, f"export of {type(model).__name__}", report)
            _pure_structures(gm)
            if for_onnx:
                guard_indices(gm)
            try:
                ep = torch.export.export(
                    gm, args, dynamic_shapes=_dynamic_shapes(args) if dynamic else None, strict=False)
            except Exception as e:
                raise fail(model, "torch.export", e) from e
    finally:
        if isinstance(model, torch.nn.Module):
            model.train(was_training)
    if dynamic:
        _warn_specialized(ep)
    return ep, report


def user_dims(ep):
    """``(position, placeholder, dim)`` for every tensor input of ``ep`` the user passes: the
    dim that holds the number of edges (1, of a ``[2, E]`` integer tensor) or nodes (0)."""
    names = set(ep.graph_signature.user_inputs)
    user = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in names]
    for i, n in enumerate(user):
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dim() >= 1:
            rows = val.shape[0]  # a SymInt is never compared (that would add a guard)
            edge = val.dim() == 2 and val.dtype in INDEX_DTYPES and isinstance(rows, int) and rows == 2
            yield i, n, 1 if edge else 0


def _warn_specialized(ep) -> None:
    """Dim.AUTO lets torch.export fix a size the model's code depends on: say so."""
    for i, n, d in user_dims(ep):
        size = n.meta["val"].shape[d]
        if isinstance(size, int):
            warnings.warn(f"gnncompile.export: input {i} ({n.name}) dim {d} was specialized to "
                          f"{size} by the model's code; the export only accepts that size",
                          stacklevel=3)


__all__ = ["optimize", "user_dims", "flat_inputs", "key_name", "export_settings", "settings_of"]
