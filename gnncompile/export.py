"""``gnncompile.export(model, example_inputs, path, format="onnx" | "pt2")``: the optimized
graph of a PyG model as an ONNX file or a ``torch.export`` program.

Pipeline:

1. **capture**: ``torch._dynamo.export`` (full graph, torch-level FX, no duck sizing so that
   N and E stay distinct symbols), with the model in eval mode and gradients off;
2. **rewrite**: :func:`gnncompile.passes.run` fuses message passing into
   ``gnncompile::spmm`` / ``edge_softmax``; then :func:`_pure_structures` swaps the runtime's
   Python structure ops that keep a process-wide cache (``cached_csr`` & co.) for the pure
   ``gnncompile::pair_csr`` (a ``gnncompile::build_csr`` counting sort on every call) and plain
   slicing for ``csr_degree``, so that the program holds no state;
3. **export**: ``torch.export.export`` (non-strict) of the rewritten graph, with dynamic
   numbers of nodes (dim 0 of every feature tensor) and edges (dim 1 of every ``[2, E]``
   integer tensor). ``format="pt2"`` saves that program (``torch.export.load`` runs it once
   ``gnncompile`` is imported); ``format="onnx"`` converts it with ``torch.onnx.export(...,
   dynamo=True)`` where every fused op becomes a call of an ONNX function in the
   ``gnncompile`` domain (:mod:`gnncompile._onnx_functions`), whose body is standard ONNX.

What cannot be exported raises :class:`ExportError` naming the layer.
"""
from __future__ import annotations

import contextlib
import operator
import os
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

import torch
from torch.fx import GraphModule, Node

FORMATS = ("onnx", "pt2")
OPSET = 18


class ExportError(RuntimeError):
    """A model (or one of its layers) that cannot be exported; the message names the layer."""


@dataclass
class ExportResult:
    path: str
    format: str
    fused: List[Any] = field(default_factory=list)
    unfused: List[Any] = field(default_factory=list)
    program: Any = None  # the torch.export.ExportedProgram
    onnx_functions: List[str] = field(default_factory=list)

    @property
    def num_fused(self) -> int:
        return sum(1 for f in self.fused if f.kind != "degree")

    @property
    def size_bytes(self) -> int:
        return os.path.getsize(self.path)


# ----------------------------------------------------------------------------- layer naming
def _layer_index(model: torch.nn.Module):
    """filename -> [(first line, last line, layer name)] of every method of every submodule."""
    idx = {}
    for name, mod in model.named_modules():
        label = f"{name or '<model>'} ({type(mod).__name__})"
        for klass in type(mod).__mro__:
            if klass in (torch.nn.Module, object):
                break
            for v in vars(klass).values():
                fn = getattr(v, "__func__", v)
                code = getattr(fn, "__code__", None)
                if code is None:
                    continue
                lines = [ln for _, _, ln in code.co_lines() if ln is not None]
                idx.setdefault(code.co_filename, []).append(
                    (min(lines, default=code.co_firstlineno), max(lines, default=code.co_firstlineno), label))
    return idx


def _frames(exc: BaseException):
    frames = []
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        frames += [(f.filename, f.lineno) for f in traceback.extract_tb(e.__traceback__)]
        for attr in ("real_stack", "user_stack"):
            st = getattr(e, attr, None)
            if st:
                frames += [(f.filename, f.lineno) for f in st]
        e = e.__cause__ or e.__context__
    return frames


def _layer_of_exception(model: torch.nn.Module, exc: BaseException) -> Optional[str]:
    """The innermost layer whose code appears in the exception's (user) stack."""
    idx = _layer_index(model)
    found = None
    for filename, lineno in _frames(exc):
        labels = sorted({lab for lo, hi, lab in idx.get(filename, ()) if lineno and lo <= lineno <= hi})
        if labels:
            cand = " / ".join(labels)
            if found is None or not cand.startswith("<model>"):
                found = cand
    if found is None:
        # dynamo reports the user frame in its message ("... test.py:136 in forward")
        import re

        text = " ".join(str(e) for e in _chain(exc))
        for m in re.finditer(r"(\S+\.py):(\d+) in \w+", text):
            fname, line = m.group(1), int(m.group(2))
            for filename, entries in idx.items():
                if filename.endswith(fname.lstrip(".")) or fname.endswith(filename[-40:]):
                    labels = sorted({lab for lo, hi, lab in entries if lo <= line <= hi})
                    if labels:
                        found = " / ".join(labels)
    return found


def _layer_of_node(n: Node) -> str:
    stack = n.meta.get("nn_module_stack") or {}
    if not stack:
        return "<model>"
    path, cls = list(stack.values())[-1]
    name = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
    from .passes.canonical import module_label

    return module_label(path, str(name).rsplit(".", 1)[-1])


def _short(msg: str, limit: int = 600) -> str:
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= limit else msg[:limit] + " ..."


def _fail(model, stage: str, exc: BaseException) -> ExportError:
    layer = _layer_of_exception(model, exc) or f"<model> ({type(model).__name__})"
    return ExportError(f"gnncompile.export: cannot export layer {layer}: {stage} failed: "
                       f"{type(exc).__name__}: {_short(exc)}")


# ----------------------------------------------------------------------------- inputs
def _is_edge_index(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.size(0) == 2 and t.dtype in (torch.int32, torch.int64)


def _dynamic_shapes(args: Sequence[Any]):
    from torch.export import Dim

    spec = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() >= 1:
            spec.append({1: Dim.AUTO} if _is_edge_index(a) else {0: Dim.AUTO})
        else:
            spec.append(None)
    return tuple(spec)


def _check_inputs(args: Sequence[Any], dynamic: bool) -> None:
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            raise ExportError(f"gnncompile.export: example input {i} is a {type(a).__name__}; "
                              "pass tensors only (x, edge_index, edge weights / attributes)")
        if dynamic and a.dim() >= 1:
            d = a.size(1) if _is_edge_index(a) else a.size(0)
            if d < 2:
                raise ExportError(
                    f"gnncompile.export: example input {i} has {d} rows: use an example with at "
                    "least 2 nodes and 2 edges (sizes 0 and 1 are specialized by torch.export)")


def _no_duck_shapes():
    """Without duck sizing, a number of nodes that equals the number of edges in the example
    does not merge their symbols (which would bake N == E into the program)."""
    try:
        from torch.fx.experimental import _config as fx_config

        return fx_config.patch(use_duck_shape=False)
    except (ImportError, AttributeError):  # pragma: no cover - older torch
        return contextlib.nullcontext()


# ----------------------------------------------------------------------------- rewrite
def _pure_structures(gm: GraphModule) -> None:
    """Replace the runtime's cached structure op ``cached_csr(edge_index, num_dst)`` with the pure
    ``pair_csr(edge_index[1], edge_index[0], num_dst)`` (no cache: a counting sort by
    ``gnncompile::build_csr`` on every call; its schema keeps ``num_dst`` symbolic, which
    ``build_csr``'s ``int`` arguments would specialize), the degree op with rowptr differences,
    and drop transposed structures (export is inference)."""
    graph = gm.graph
    rt = torch.ops.gnncompile
    for n in list(graph.nodes):
        if n.op != "call_function":
            continue
        if n.target is rt.spmm.default and len(n.args) > 7:
            n.args = tuple(n.args[:7])
        elif n.target is rt.cached_csr.default:
            ei, num_dst = n.args[0], n.args[1]
            with graph.inserting_before(n):
                dst = graph.call_function(operator.getitem, (ei, 1))
                src = graph.call_function(operator.getitem, (ei, 0))
                new = graph.call_function(rt.pair_csr.default, (dst, src, num_dst))
            new.meta = dict(n.meta)
            n.replace_all_uses_with(new)
            graph.erase_node(n)
        elif n.target is rt.csr_degree.default:
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
        if n.op == "call_function" and n.target in (rt.cached_csc.default, rt.pair_csc.default):
            for u in list(n.users):
                if not u.users:
                    graph.erase_node(u)
            if not n.users:
                graph.erase_node(n)
    # (no graph.eliminate_dead_code(): FX would drop in-place methods whose result is unused,
    # such as ``count.scatter_add_(...)``, which change the model)
    graph.lint()
    gm.recompile()


def optimize(model, example_inputs: Sequence[Any], dynamic: bool = True):
    """Captures ``model`` on ``example_inputs`` and returns ``(exported_program, pass_report)``:
    a ``torch.export`` program holding the fused gnncompile ops and pure structure ops."""
    from . import passes

    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    _check_inputs(args, dynamic)
    was_training = getattr(model, "training", False)
    if isinstance(model, torch.nn.Module):
        model.eval()
    try:
        with torch.no_grad(), _no_duck_shapes(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            try:
                gm, _guards = torch._dynamo.export(
                    model, aten_graph=False, assume_static_by_default=not dynamic)(*args)
            except Exception as e:
                raise _fail(model, "graph capture (torch._dynamo.export)", e) from e
            report = passes.run(gm)
            _pure_structures(gm)
            try:
                ep = torch.export.export(
                    gm, args, dynamic_shapes=_dynamic_shapes(args) if dynamic else None, strict=False)
            except Exception as e:
                raise _fail(model, "torch.export", e) from e
    finally:
        if isinstance(model, torch.nn.Module):
            model.train(was_training)
    if dynamic:
        _warn_specialized(ep, args)
    return ep, report


def _warn_specialized(ep, args) -> None:
    """Dim.AUTO lets torch.export fix a size the model's code depends on: say so."""
    user = [n for n in ep.graph.nodes if n.op == "placeholder"
            and n.name in set(ep.graph_signature.user_inputs)]
    for i, (n, a) in enumerate(zip(user, args)):
        val = n.meta.get("val")
        if not isinstance(a, torch.Tensor) or val is None or a.dim() == 0:
            continue
        d = 1 if _is_edge_index(a) else 0
        if isinstance(val.shape[d], int):
            warnings.warn(f"gnncompile.export: input {i} ({n.name}) dim {d} was specialized to "
                          f"{val.shape[d]} by the model's code; the export only accepts that size",
                          stacklevel=3)


# ----------------------------------------------------------------------------- ONNX
def _translations():
    from onnxscript import opset18 as op

    from . import _onnx_functions as F

    import onnx

    INT64 = onnx.TensorProto.INT64
    _EMPTY_I64 = onnx.helper.make_tensor("empty", INT64, [0], [])

    def build_csr(dst, src, num_dst, num_src=None):
        dst = op.Cast(dst, to=INT64)
        src = op.Cast(src, to=INT64)
        if isinstance(num_dst, int):
            num_dst = op.Constant(value_int=num_dst)
        return F.build_csr(dst, src, op.Cast(num_dst, to=INT64))

    def pair_csr(dst, src, num_dst):
        return build_csr(dst, src, num_dst)

    def spmm(rowptr, col, perm, weight, x, reduce: str, knobs: Sequence[int],
             rowptr_t=None, col_t=None, perm_t=None):
        fn = F.SPMM[(reduce, weight is not None)]
        if weight is None:
            out = fn(rowptr, col, perm, x)
        else:
            xr, wr = len(x.shape), len(weight.shape)
            wh = weight.shape[1] if wr == 2 else 1
            if wr == 2 and wh != 1:  # one weight per edge and head, x: [N, H, C]
                wb = op.Unsqueeze(weight, op.Constant(value_ints=[-1]))
            else:
                wb = op.Reshape(weight, op.Constant(value_ints=[-1] + [1] * (xr - 1)))
            out = fn(rowptr, col, perm, wb, x)
        # `arg` (the chosen edge of max / min) only serves the backward pass
        return out, op.Constant(value=_EMPTY_I64)

    def edge_softmax(rowptr, perm, scores, knobs: Sequence[int]):
        return F.edge_softmax(rowptr, perm, scores)

    g = torch.ops.gnncompile
    return {g.build_csr.default: build_csr, g.pair_csr.default: pair_csr, g.spmm.default: spmm,
            g.edge_softmax.default: edge_softmax}


def _unsupported_onnx(ep, exc: BaseException) -> Optional[Node]:
    """The node of ``ep`` behind an ONNX conversion error. The exporter names the failing node
    of its *decomposed* copy of the program ("Error when translating node %zeta : ...
    target=torch.ops.prims.zeta.default"): match by name, else by operator name."""
    import re

    text = " ".join(str(e) for e in _chain(exc))
    names = re.findall(r"translating node %(\w+)", text)
    ops = [t.split(".")[-2] for t in re.findall(r"target=torch\.ops\.([\w\.]+)", text) if "." in t]
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    for name in names:
        for n in calls:
            if n.name == name:
                return n
    for opname in ops:
        for n in calls:
            t = str(n.target)
            if re.search(rf"(^|[._]){re.escape(opname)}(\.|$)", t):
                return n
    return None


def _chain(exc: BaseException):
    seen = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _onnx_program(ep, table):
    """torch.onnx's dynamo exporter with our translations, at opset 18 and without the version
    conversion step: ``torch.onnx.export(..., opset_version=...)`` always runs onnxscript's
    version converter, which inlines every ONNX function (the fused ops would be lost). The
    lower-level ``_core.export`` (what ``torch.onnx.export`` calls) skips it when no
    opset_version is given; the public API is the fallback (functions then inlined)."""
    try:
        from torch.onnx._internal.exporter import _core, _registration
    except ImportError:  # pragma: no cover - private layout changed
        return torch.onnx.export(ep, (), dynamo=True, custom_translation_table=table,
                                 opset_version=OPSET, optimize=False, verbose=False)
    import logging

    reg_log = logging.getLogger(_registration.__name__)  # "torchvision is not installed" x5
    level = reg_log.level
    reg_log.setLevel(logging.ERROR)
    try:
        registry = _registration.ONNXRegistry.from_torchlib(opset_version=OPSET)
    finally:
        reg_log.setLevel(level)
    for target, fn in table.items():
        registry.register_op(target, fn, is_complex=False)
    return _core.export(ep, (), registry=registry, optimize=False, verbose=False, opset_version=None)


def _to_onnx(ep, path: str, model) -> List[str]:
    import onnx

    table = _translations()
    try:
        prog = _onnx_program(ep, table)
    except Exception as e:
        node = _unsupported_onnx(ep, e)
        if node is not None:
            cause = [c for c in _chain(e)][-1]
            raise ExportError(
                f"gnncompile.export: cannot export layer {_layer_of_node(node)} to ONNX: operator "
                f"{node.target} does not convert ({type(cause).__name__}: {_short(cause, 300)})") from e
        raise _fail(model, "ONNX conversion (torch.onnx.export)", e) from e
    try:  # drop the constants the exporter left unused (the `arg` output of spmm, ...)
        from onnx_ir.passes import common as ir_common

        ir_common.RemoveUnusedNodesPass()(prog.model)
    except Exception:  # pragma: no cover - cosmetic only
        pass
    # the exporter records a Python stack trace per node: most of the file for small models
    for node in prog.model.graph.all_nodes() if hasattr(prog.model.graph, "all_nodes") else prog.model.graph:
        node.metadata_props.clear()
    prog.save(path)
    m = onnx.load(path, load_external_data=False)
    return [f"{f.domain}::{f.name}" for f in m.functions]


# ----------------------------------------------------------------------------- entry point
def export(model, example_inputs, path, format: str = "onnx", dynamic: bool = True) -> ExportResult:
    """Exports the gnncompile-optimized graph of ``model``.

    Args:
        model: a PyG model (``nn.Module``) called as ``model(*example_inputs)``. It is captured
            in eval mode with gradients off (its mode is restored afterwards).
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
    ep, report = optimize(model, example_inputs, dynamic=dynamic)
    res = ExportResult(path, format, report.fused, report.unfused, ep)
    with warnings.catch_warnings():  # torch's own deprecation noise (pytree LeafSpec)
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        if format == "pt2":
            torch.export.save(ep, path)
        else:
            res.onnx_functions = _to_onnx(ep, path, model)
    return res


__all__ = ["export", "optimize", "ExportError", "ExportResult", "FORMATS", "OPSET"]
