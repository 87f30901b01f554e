"""``gnncompile.export(model, example_inputs, path, format="onnx" | "pt2")``: the optimized
graph of a PyG model as an ONNX file or a ``torch.export`` program.

Pipeline (:mod:`.capture`, then :mod:`.onnx_export` for ONNX):

1. **capture**: ``torch._dynamo.export`` (full graph, torch-level FX, no duck sizing so that
   N and E stay distinct symbols), with the model in eval mode and gradients off;
2. **rewrite**: :func:`gnncompile.passes.run` fuses message passing into
   ``gnncompile::spmm`` / ``edge_softmax``; then the structure ops that keep a process-wide
   cache (``cached_csr`` & co.) are swapped for the pure ``gnncompile::pair_csr`` (a
   ``gnncompile::build_csr`` counting sort on every call) and plain slicing for
   ``csr_degree``, so that the program holds no state; for ONNX, the index of every standard
   op whose eager kernel rejects a negative index is guarded (:mod:`.indices`), since ONNX's
   Gather / ScatterElements wrap it;
3. **export**: ``torch.export.export`` (non-strict) of the rewritten graph, with dynamic
   numbers of nodes (dim 0 of every feature tensor) and edges (dim 1 of every ``[2, E]``
   integer tensor). ``format="pt2"`` saves that program (``torch.export.load`` runs it once
   ``gnncompile`` is imported); ``format="onnx"`` converts it with torch.onnx's dynamo
   exporter at opset 18 (its internal ``_core.export``, which keeps ONNX functions; the public
   ``torch.onnx.export`` is the fallback), where every fused op becomes a call of an ONNX
   function in the ``gnncompile`` domain (:mod:`.onnx_functions`), whose body is standard ONNX.

What cannot be exported raises :class:`ExportError` naming the layer (:mod:`.diagnose`).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, List

import torch

from .._log import get_logger
from ..passes.report import Fusions
from .capture import optimize
from .diagnose import ExportError

FORMATS = ("onnx", "pt2")
_log = get_logger(__name__)


@dataclass
class ExportResult(Fusions):
    path: str = ""
    format: str = "onnx"
    program: Any = None  # the torch.export.ExportedProgram
    onnx_functions: List[str] = field(default_factory=list)

    @property
    def size_bytes(self) -> int:
        return os.path.getsize(self.path)


def export(model, example_inputs, path, format: str = "onnx", dynamic: bool = True) -> ExportResult:
    """Exports the gnncompile-optimized graph of ``model``.

    Args:
        model: a PyG model (``nn.Module``) called as ``model(*example_inputs)``. It is captured
            in eval mode with gradients off (its mode is restored afterwards). A model returned
            by :func:`gnncompile.compile` is exported with its own settings
            (``.gnncompile_settings``: the kernel knobs in the fused calls); any other with the
            configuration's (the kernels' own knobs).
        example_inputs: a tuple of tensors (x, edge_index, ...). With ``dynamic=True`` the
            numbers of nodes (dim 0 of feature tensors) and edges (dim 1 of ``[2, E]`` integer
            tensors) are symbolic: use at least 2 nodes and 2 edges, and different numbers of
            nodes and edges.
        path: the file to write.
        format: ``"onnx"`` (opset 18; every fused op is a function of the ``gnncompile``
            domain whose body is standard ONNX) or ``"pt2"`` (``torch.export.save``; load it
            with ``torch.export.load`` after ``import gnncompile``).
        dynamic: dynamic numbers of nodes and edges (default) or the example's sizes only.

    Returns an :class:`ExportResult`; raises :class:`ExportError` naming the layer that cannot
    be exported.
    """
    if format not in FORMATS:
        raise ValueError(f"gnncompile.export: unknown format {format!r}; expected one of {FORMATS}")
    path = os.fspath(path)
    ep, report = optimize(model, example_inputs, dynamic=dynamic, for_onnx=format == "onnx")
    res = ExportResult(report.fused, report.unfused, path=path, format=format, program=ep)
    with warnings.catch_warnings():  # torch's own deprecation noise (pytree LeafSpec)
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        if format == "pt2":
            torch.export.save(ep, path)
            _log.info("wrote %s: torch.export program", path)
        else:
            from .onnx_export import to_onnx

            res.onnx_functions = to_onnx(ep, path, model)
    return res


__all__ = ["export", "optimize", "ExportError", "ExportResult", "FORMATS"]
