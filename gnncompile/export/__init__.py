"""``gnncompile.export(model, example_inputs, path, format="onnx" | "pt2")``: the optimized
graph of a PyG model as an ONNX file or a ``torch.export`` program.

Pipeline (:mod:`.capture`, then :mod:`.onnx_export` for ONNX):

1. **capture**: ``torch._dynamo.export`` (full graph, torch-level FX, no duck sizing so that
   N and E stay distinct symbols), with the model in eval mode and gradients off;
2. **rewrite**: :func:`gnncompile.passes.run` fuses message passing into
   ``gnncompile::spmm`` / ``edge_softmax`` and, for messages that are more than a gathered
   feature (edge features, per-edge MLP inputs, gates: GINEConv, PNAConv, EdgeConv, CGConv,
   ...), message programs ``gnncompile::message_reduce`` / ``message_edges`` (unless
   ``programs=False`` or the settings' programs choice is 'never'); then the structure ops
   that keep a process-wide cache (``cached_csr`` & co.) are swapped for the pure
   ``gnncompile::pair_csr`` (a ``gnncompile::build_csr`` counting sort on every call) and
   plain slicing for ``csr_degree``, so that the program holds no state; for ONNX, the index
   of every standard op whose eager kernel rejects a negative index is guarded
   (:mod:`.indices`), since ONNX's Gather / ScatterElements wrap it;
3. **export**: ``torch.export.export`` (non-strict) of the rewritten graph, with dynamic
   numbers of nodes (dim 0 of every feature tensor) and edges (dim 1 of every ``[2, E]``
   integer tensor). ``format="pt2"`` saves that program (``torch.export.load`` runs it once
   ``gnncompile`` is imported); ``format="onnx"`` converts it with torch.onnx's dynamo
   exporter at opset 18 (its internal ``_core.export``, which keeps ONNX functions; the public
   ``torch.onnx.export`` is the fallback), where every fused op becomes a call of an ONNX
   function in the ``gnncompile`` domain (:mod:`.onnx_functions`; a message program: one
   function per distinct program, ``message_<reduce>_<hash>``, :mod:`.onnx_programs`), whose
   body is standard ONNX.

Inputs are tensors or dicts of tensors (a heterogeneous model, ``forward(x_dict,
edge_index_dict)`` from ``torch_geometric.nn.to_hetero``): the ONNX file takes one input per
tensor, ``<parameter>.<key>`` (``x.paper``, ``edge_index.author__writes__paper``), and gives one
output per tensor of the result (``out``, ``out_0``, ``out.paper``): :mod:`.onnx_names`;
:meth:`ExportResult.onnx_feed` builds the feed from the model's own arguments, checking keys and
dtypes. A pt2 program takes and returns the dicts as the model does; load it with
:func:`load` (``torch.export.load`` gives edge types back as lists, which the program then
refuses).

What cannot be exported raises :class:`ExportError` naming the layer (:mod:`.diagnose`).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

import torch

from .._log import get_logger
from ..passes.report import Fusions
from .capture import export_settings, flat_inputs, key_name, optimize, settings_of
from .diagnose import ExportError
from .onnx_names import flat_names, output_names

FORMATS = ("onnx", "pt2")
_log = get_logger(__name__)


@dataclass
class ExportResult(Fusions):
    path: str = ""
    format: str = "onnx"
    program: Any = None  # the torch.export.ExportedProgram
    onnx_functions: List[str] = field(default_factory=list)
    # ONNX: (layer, 'gnncompile::<function>') of every call of a fused op in the main graph
    onnx_calls: List[Tuple[str, str]] = field(default_factory=list)
    # the flattened inputs and outputs (the ONNX file's names): x, edge_index / x.paper, ...
    input_names: List[str] = field(default_factory=list)
    output_names: List[str] = field(default_factory=list)
    # message programs on (False: off by the argument or the settings, or fallen back to
    # standard ops because one had no ONNX form: then a note says why)
    programs: bool = True
    # (name, position, dict key or None, dtype, ndim) of every example tensor
    _inputs: List[Tuple[str, int, Any, torch.dtype, int]] = field(default_factory=list, repr=False)

    @property
    def size_bytes(self) -> int:
        return os.path.getsize(self.path)

    def onnx_feed(self, *inputs) -> Dict[str, Any]:
        """The onnxruntime feed (``{input name: numpy array}``) of the model's own arguments
        (tensors, dicts of tensors), checked against the export example: a missing or unknown
        dict key, a tensor of another dtype or rank is a ValueError / TypeError naming the input."""
        positions = 1 + max((p for _, p, _, _, _ in self._inputs), default=-1)
        if len(inputs) != positions:
            raise ValueError(f"gnncompile export: {len(inputs)} inputs given, the export takes {positions} "
                             f"({', '.join(self.input_names)})")
        feed: Dict[str, Any] = {}
        keys: Dict[int, list] = {}
        for name, pos, key, dtype, ndim in self._inputs:
            a = inputs[pos]
            if key is not None:
                param = name[:-len(key_name(key)) - 1]  # 'x' of 'x.paper'
                if not isinstance(a, dict):
                    raise TypeError(f"gnncompile export: input {pos} ({param}) must be a dict of tensors, "
                                    f"got a {type(a).__name__}")
                keys.setdefault(pos, []).append(key)
                if key not in a:
                    raise ValueError(f"gnncompile export: input {name} is missing: {param} has no key {key!r} "
                                     f"(keys given: {list(a)})")
                a = a[key]
            if not isinstance(a, torch.Tensor):
                raise TypeError(f"gnncompile export: input {name} must be a tensor, got a {type(a).__name__}")
            if a.dtype != dtype:
                raise TypeError(f"gnncompile export: input {name} has dtype {a.dtype}; the export takes {dtype}")
            if a.dim() != ndim:
                raise ValueError(f"gnncompile export: input {name} has {a.dim()} dims; the export takes {ndim}")
            feed[name] = a.detach().cpu().numpy()
        for pos, want in keys.items():
            extra = [k for k in inputs[pos] if k not in want]
            if extra:
                raise ValueError(f"gnncompile export: input {pos} has keys the export does not take: {extra} "
                                 f"(it takes {want})")
        return feed


def export(model, example_inputs, path, format: str = "onnx", dynamic: bool = True,
           programs: bool = True) -> ExportResult:
    """Exports the gnncompile-optimized graph of ``model``.

    Args:
        model: a PyG model (``nn.Module``) called as ``model(*example_inputs)``. It is captured
            in eval mode with gradients off (its mode is restored afterwards). A model returned
            by :func:`gnncompile.compile` is exported with its own settings
            (``.gnncompile_settings``: the kernel knobs in the fused calls); any other with the
            configuration's (the kernels' own knobs).
        example_inputs: a tuple of tensors (x, edge_index, ...) or of dicts of tensors
            (x_dict, edge_index_dict of a heterogeneous model; keys: strings or tuples of
            strings). With ``dynamic=True`` the numbers of nodes (dim 0 of feature tensors) and
            edges (dim 1 of ``[2, E]`` integer tensors) are symbolic, one per tensor: use at
            least 2 nodes and 2 edges, and different numbers of nodes and edges.
        path: the file to write.
        format: ``"onnx"`` (opset 18; every fused op is a function of the ``gnncompile``
            domain whose body is standard ONNX) or ``"pt2"`` (``torch.export.save``; load it
            with ``torch.export.load`` after ``import gnncompile``).
        dynamic: dynamic numbers of nodes and edges (default) or the example's sizes only.
        programs: fuse the messages that are more than a gathered feature as message programs
            (default; off too when the settings' programs choice is 'never'): in ONNX one
            function per distinct program, in pt2 the ``gnncompile::message_reduce`` /
            ``message_edges`` ops. ``False`` exports them as the standard ops they are written
            with. A program that cannot be written in ONNX is exported as standard ops, with a
            warning and a note in the result.

    Returns an :class:`ExportResult`; raises :class:`ExportError` naming the layer that cannot
    be exported.
    """
    if format not in FORMATS:
        raise ValueError(f"gnncompile.export: unknown format {format!r}; expected one of {FORMATS}")
    path = os.fspath(path)
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    programs = export_settings(settings_of(model), programs)[1]
    ep, report = optimize(model, args, dynamic=dynamic, for_onnx=format == "onnx", programs=programs)
    with warnings.catch_warnings():  # torch's own deprecation noise (pytree LeafSpec)
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        if format == "pt2":
            torch.export.save(ep, path)
            _log.info("wrote %s: torch.export program", path)
            functions: List[str] = []
            calls: List[Tuple[str, str]] = []
        else:
            from .onnx_export import ProgramNotConverted, to_onnx

            try:
                functions, calls = to_onnx(ep, path, model, args)
            except ProgramNotConverted as e:
                # never a file without the layer: the messages as standard ops, and said so
                warnings.warn(f"{e}; exporting message programs as standard ops", stacklevel=2)
                ep, report = optimize(model, args, dynamic=dynamic, for_onnx=True, programs=False)
                report.notes.append(f"message programs exported as standard ops: {e}")
                programs = False
                functions, calls = to_onnx(ep, path, model, args)
    names = flat_names(model, args)
    res = ExportResult(report.fused, report.unfused, list(report.notes), path=path, format=format, program=ep,
                       onnx_functions=functions, onnx_calls=calls, input_names=names,
                       output_names=output_names(ep), programs=programs,
                       _inputs=[(name, pos, key, t.dtype, t.dim())
                                for name, (pos, key, t) in zip(names, flat_inputs(args))])
    return res


def _tuple_keys(spec):
    """``spec`` (a pytree TreeSpec) with the keys of its dicts that are lists made tuples again."""
    from torch.utils import _pytree as pytree

    if spec is None or spec.is_leaf():
        return spec
    context = spec.context
    if spec.type is dict and isinstance(context, list):
        def tupled(k):
            return tuple(tupled(v) for v in k) if isinstance(k, list) else k

        context = [tupled(k) for k in context]
    return pytree.TreeSpec(spec.type, context, [_tuple_keys(c) for c in spec.children()])


def load(path):
    """``torch.export.load(path)`` of a program written by :func:`export` (``format="pt2"``),
    runnable by ``.module()`` with the model's own arguments. ``torch.export.save`` writes
    the dict keys of the inputs and outputs as JSON, where a heterogeneous model's edge types
    (tuples: ``('author', 'writes', 'paper')``) become lists, which the loaded program then
    neither accepts nor compares (``unhashable type: 'list'``): they are made tuples again. A
    program without such keys loads as ``torch.export.load`` gives it."""
    ep = torch.export.load(os.fspath(path))
    for entry in ep.module_call_graph:
        sig = entry.signature
        if sig is not None:
            sig.in_spec, sig.out_spec = _tuple_keys(sig.in_spec), _tuple_keys(sig.out_spec)
    return ep


__all__ = ["export", "load", "optimize", "ExportError", "ExportResult", "FORMATS"]
