"""Readable names in an exported ONNX graph. torch.export names values after the FX nodes and
sizes after their symbols (``add_80``, ``s77``): the graph inputs are named after the
parameters of the model's ``forward``, the outputs ``out`` (``out_0``, ``out_1``, ... when
there are several), and the dynamic sizes ``num_nodes`` / ``num_edges`` (``<input>_dim<d>``
for further distinct ones), also inside size expressions such as ``num_edges + num_nodes``.

Dict inputs and outputs (a heterogeneous model: ``forward(x_dict, edge_index_dict)`` returning
a dict per node type) are flattened, one tensor per key in the dict's order, named
``<parameter>.<key>`` with an edge type's tuple joined by ``__``: ``x.paper``,
``edge_index.author__writes__paper``, and ``out.paper``; their sizes ``num_nodes.paper``,
``num_edges.author__writes__paper`` (:func:`flat_names`, :func:`output_names`)."""
from __future__ import annotations

import inspect
import re
from typing import Any, Dict, List, Optional, Sequence

import torch

from .capture import flat_inputs, key_name, user_dims

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def input_names(model, n: int) -> List[str]:
    """The names of ``model``'s first ``n`` positional parameters (``input_<i>`` past them)."""
    model = getattr(model, "_orig_mod", model)  # a compiled module: the model it wraps
    try:
        params = inspect.signature(getattr(model, "forward", model)).parameters.values()
    except (TypeError, ValueError):  # no signature (a builtin)
        params = []
    names = []
    for p in params:
        if p.kind not in _POSITIONAL:
            break
        names.append(p.name)
    return names[:n] + [f"input_{i}" for i in range(len(names), n)]


def flat_names(model, args: Sequence[Any]) -> List[str]:
    """The name of every tensor of ``args`` (the model's example inputs), in the order
    torch.export flattens them: the parameter's name, ``<parameter>.<key>`` inside a dict."""
    params = input_names(model, len(args))
    return [params[i] if key is None else f"{params[i]}.{key_name(key)}" for i, key, _ in flat_inputs(args)]


def output_names(ep) -> List[str]:
    """The name of every output of ``ep``, in its flattened order: ``out`` for one tensor,
    ``out_<i>`` for the items of a tuple or list, ``out.<key>`` for those of a dict (nested:
    ``out_0.paper``)."""
    from torch.utils import _pytree as pytree

    spec = ep.call_spec.out_spec
    if spec is None:
        return ["out"]
    n = spec.num_leaves
    if n == 1 and spec.is_leaf():
        return ["out"]
    paths, _ = pytree.tree_flatten_with_path(pytree.tree_unflatten(list(range(n)), spec))
    names = []
    for path, _ in paths:
        name = "out"
        for k in path:
            if isinstance(k, pytree.MappingKey):
                name += f".{key_name(k.key)}"
            elif isinstance(k, pytree.SequenceKey):
                name += f"_{k.idx}"
            else:  # a dataclass or namedtuple field
                name += f".{getattr(k, 'name', k)}"
        names.append(name)
    if n == 1 and names[0] == "out_0":  # a one-tensor tuple
        names = ["out"]
    return names


def dim_names(ep, inputs: List[str]) -> Dict[str, str]:
    """Symbol of ``ep`` (``'s77'``) -> readable name: ``num_edges`` for dim 1 of the first
    ``[2, E]`` input, ``num_nodes`` for dim 0 of the first other one, ``<input>_dim<d>`` for a
    further distinct symbol (``inputs``: the names of the user inputs); an input inside a dict
    (``x.paper``) names its own size ``num_nodes.paper`` / ``num_edges.<edge type>``."""
    sizes = [(d, n.meta["val"].shape[d], inputs[i]) for i, n, d in user_dims(ep)]
    names: Dict[str, str] = {}
    for edges, base in ((True, "num_edges"), (False, "num_nodes")):
        for d, size, inp in sizes:
            sym = str(size)
            if (d == 1) == edges and isinstance(size, torch.SymInt) and sym.isidentifier() \
                    and sym not in names:
                if "." in inp:
                    names[sym] = f"{base}.{inp.split('.', 1)[1]}"
                else:
                    names[sym] = base if base not in names.values() else f"{inp}_dim{d}"
    return names


def _rename(value, name: str, by_name: dict) -> None:
    """Names ``value`` ``name``; a value of the graph that holds that name already gets another."""
    other = by_name.get(name)
    if other is value:
        return
    if other is not None:
        k = 1
        while f"{name}_{k}" in by_name:
            k += 1
        by_name[f"{name}_{k}"] = other
        other.name = f"{name}_{k}"
    by_name.pop(value.name, None)
    value.name = name
    by_name[name] = value


def _values(graph):
    yield from graph.inputs
    yield from graph.initializers.values()
    for node in graph:
        yield from node.outputs


def readable_names(ir_model, ep, model, args: Optional[Sequence[Any]] = None) -> None:
    """Renames, in place, the inputs, outputs and dynamic sizes of ``ir_model`` (an onnx_ir
    model converted from ``ep``; ``args``: the example inputs, whose dicts name the tensors
    inside them)."""
    import onnx_ir as ir

    graph = ir_model.graph
    by_name = {v.name: v for v in _values(graph) if v.name}
    if args is None:
        inputs = input_names(model, len(graph.inputs))
    else:
        inputs = flat_names(model, args)
        inputs += [f"input_{i}" for i in range(len(inputs), len(graph.inputs))]
    for v, name in zip(graph.inputs, inputs):
        _rename(v, name, by_name)
    outs = output_names(ep)
    if len(outs) != len(graph.outputs):
        outs = ["out"] if len(graph.outputs) == 1 else [f"out_{i}" for i in range(len(graph.outputs))]
    for v, name in zip(graph.outputs, outs):
        if not v.is_graph_input() and not v.is_initializer():
            _rename(v, name, by_name)
    syms = dim_names(ep, inputs)
    if not syms:
        return
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, syms)) + r")\b")
    for v in {id(v): v for v in (*_values(graph), *graph.outputs)}.values():
        if v.shape is None:
            continue
        dims = [ir.SymbolicDim(pattern.sub(lambda m: syms[m.group(1)], d.value))
                if isinstance(d, ir.SymbolicDim) and d.value else d for d in v.shape.dims]
        v.shape = ir.Shape(dims)
