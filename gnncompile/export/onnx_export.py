"""ONNX conversion of an exported program: torch.onnx's dynamo exporter with translations
that turn every fused op into a call of an ONNX function of the ``gnncompile`` domain
(:mod:`.onnx_functions`, bodies in standard ONNX); the helper functions that those bodies call
are inlined into them before the file is written."""
from __future__ import annotations

import re
from typing import List, Optional, Sequence, Tuple

import torch
from torch.fx import Node

from ..ops import targets
from ..passes.canonical import layer_of
from ..passes.report import one_line
from .._log import get_logger
from .diagnose import ExportError, chain, fail
from .onnx_names import readable_names

OPSET = 18
_log = get_logger(__name__)


def _translations():
    from onnxscript import opset18 as op

    from . import onnx_functions as F
    from . import onnx_programs as P

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

    def message_reduce(rowptr, col, perm, inputs, sides, code, consts, width: int, reduce: str,
                       knobs: Sequence[int] = (), csc=(), slot=None):
        if slot is not None:
            raise P.ProgramNotExpressible("a program over a transposed structure (slot order given)")
        spec = P.spec_of("reduce", inputs, sides, code, consts, width, reduce=reduce)
        out = _call_program(spec, [rowptr, col, perm, *inputs])
        # `arg` (the chosen edge of max / min) only serves the backward pass
        return out, op.Constant(value=_EMPTY_I64)

    def message_edges(rowptr, col, perm, inputs, sides, code, consts, width: int, out_width: int,
                      by_slot: bool = False, knobs: Sequence[int] = (), csc=(), slot=None):
        if slot is not None:
            raise P.ProgramNotExpressible("a program over a transposed structure (slot order given)")
        spec = P.spec_of("edges", inputs, sides, code, consts, width, out_width=out_width, by_slot=by_slot)
        return _call_program(spec, [rowptr, col, perm, *inputs])

    return {targets.BUILD_CSR: build_csr, targets.PAIR_CSR: pair_csr, targets.SPMM: spmm,
            targets.EDGE_SOFTMAX: edge_softmax, targets.MESSAGE_REDUCE: message_reduce,
            targets.MESSAGE_EDGES: message_edges}


def _call_program(spec, inputs):
    """Records, in the graph being converted, a call of the message function of ``spec``
    (:mod:`.onnx_programs`), and hands the exporter the function to define in the model. The
    exporter's recorder (an onnxscript evaluator) takes ONNX functions in the form of
    onnxscript functions or ONNX IR ones; a program's body is written node by node, so the
    call is recorded directly."""
    import onnx_ir as ir
    import onnxscript.evaluator

    from . import onnx_functions as F
    from . import onnx_programs as P

    tracer = onnxscript.evaluator.default()
    if not hasattr(tracer, "nodes") or not hasattr(tracer, "functions"):  # pragma: no cover - private API
        raise P.ProgramNotExpressible(f"torch.onnx's recorder changed ({type(tracer).__name__})")
    fn = ir.serde.deserialize_function(P.function_proto(spec))
    tracer.functions.setdefault(fn.identifier(), fn)
    try:  # the recorder's own value type (Python operators on the result)
        from torch.onnx._internal.exporter._tensors import SymbolicTensor

        outputs = [SymbolicTensor(tracer.opset)]
    except ImportError:  # pragma: no cover - private layout changed
        outputs = [ir.Value()]
    node = ir.Node(F.DOMAIN, spec.name, inputs=list(inputs), outputs=outputs, version=1)
    tracer.nodes.append(node)
    return node.outputs[0]


def _unsupported_onnx(ep, exc: BaseException) -> Optional[Node]:
    """The node of ``ep`` behind an ONNX conversion error. The exporter names the failing node
    of its *decomposed* copy of the program ("Error when translating node %zeta : ...
    target=torch.ops.prims.zeta.default"): match by name, else by operator name."""

    text = " ".join(str(e) for e in chain(exc))
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


def _onnx_program(ep, table):
    """torch.onnx's dynamo exporter with our translations, at opset 18 and without the version
    conversion step: ``torch.onnx.export(..., opset_version=...)`` always runs onnxscript's
    version converter, which inlines every ONNX function (the fused ops would be lost). The
    lower-level ``_core.export`` (what ``torch.onnx.export`` calls) skips it when no
    opset_version is given; the public API is the fallback (functions then inlined)."""
    try:
        from torch.onnx._internal.exporter import _core, _registration
    except ImportError:  # pragma: no cover - private layout changed
        _log.info("torch.onnx's _core.export is not importable: the public torch.onnx.export "
                  "(the fused ops' functions get inlined)")
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


def _inline_helpers(model) -> None:
    """The exporter defines in the model the functions that its graph calls (the fused ops),
    not the helpers that their bodies call (:data:`.onnx_functions.HELPERS`). Add those
    (:func:`.onnx_functions.function_protos`), then inline them: the file keeps one
    self-contained function per fused op, the functions its graph calls."""
    import onnx_ir as ir
    from onnx_ir.passes.common import InlinePass

    from . import onnx_functions as F

    graphs = [model.graph, *model.functions.values()]
    called = {n.op_type for g in graphs for n in ir.traversal.RecursiveGraphIterator(g)
              if n.domain == F.DOMAIN and n.op_type in F.BY_NAME}
    for name in called:
        for proto in F.function_protos(F.BY_NAME[name]):
            fn = ir.serde.deserialize_function(proto)
            model.functions.setdefault(fn.identifier(), fn)
    helpers = {(F.DOMAIN, h.name) for h in F.HELPERS}
    InlinePass(criteria=lambda fn: (fn.domain, fn.name) in helpers)(model)
    for fn in model.functions.values():  # a fused op's body no longer calls the domain
        if not any(n.domain == F.DOMAIN for n in fn):
            fn.opset_imports.pop(F.DOMAIN, None)


class ProgramNotConverted(ExportError):
    """A message program whose ONNX function could not be written (:mod:`.onnx_programs`):
    :func:`gnncompile.export.export` then exports the messages as standard ops."""


def _calls(ir_model) -> List[Tuple[str, str]]:
    """``(layer, 'gnncompile::<function>')`` of every call of a fused op in the main graph, the
    layer read from the node of the exported program that the exporter converted."""
    from . import onnx_functions as F

    def layer(fx) -> str:
        if not isinstance(fx, Node):
            return "?"
        # a node in no layer of the model: torch.export puts it in its own wrapper module
        stack = fx.meta.get("nn_module_stack") or {}
        if stack and all("torch.export" in str(v[-1]) for v in stack.values()):
            return "<model>"
        return layer_of(fx)

    return [(layer(node.meta.get("node")), f"{F.DOMAIN}::{node.op_type}")
            for node in ir_model.graph if node.domain == F.DOMAIN]


def to_onnx(ep, path: str, model, args: Optional[Sequence] = None) -> Tuple[List[str], List[Tuple[str, str]]]:
    """Writes ``ep`` to ``path`` as ONNX; returns the file's functions (``'gnncompile::name'``)
    and the calls of the fused ops with their layers (:func:`_calls`). ``args``: the example
    inputs (their dicts name the flattened inputs, :mod:`.onnx_names`)."""
    import onnx

    table = _translations()
    try:
        prog = _onnx_program(ep, table)
    except Exception as e:
        node = _unsupported_onnx(ep, e)
        if node is not None:
            cause = [c for c in chain(e)][-1]
            if node.target in (targets.MESSAGE_REDUCE, targets.MESSAGE_EDGES):
                raise ProgramNotConverted(
                    f"gnncompile.export: cannot export layer {layer_of(node)} to ONNX: its message program "
                    f"({node.target}) has no ONNX form ({type(cause).__name__}: {one_line(cause, 300)})") from e
            raise ExportError(
                f"gnncompile.export: cannot export layer {layer_of(node)} to ONNX: operator "
                f"{node.target} does not convert ({type(cause).__name__}: {one_line(cause, 300)})") from e
        raise fail(model, "ONNX conversion (torch.onnx.export)", e) from e
    calls = _calls(prog.model)
    _inline_helpers(prog.model)
    readable_names(prog.model, ep, model, args)
    try:  # drop the constants the exporter left unused (the `arg` output of spmm, ...)
        from onnx_ir.passes import common as ir_common

        ir_common.RemoveUnusedNodesPass()(prog.model)
    except Exception as e:  # pragma: no cover - cosmetic only
        _log.debug("RemoveUnusedNodesPass failed (the file keeps unused constants): %s", e)
    # the exporter records a Python stack trace per node: most of the file for small models
    for node in prog.model.graph.all_nodes() if hasattr(prog.model.graph, "all_nodes") else prog.model.graph:
        node.metadata_props.clear()
    prog.save(path)
    m = onnx.load(path, load_external_data=False)
    functions = [f"{f.domain}::{f.name}" for f in m.functions]
    _log.info("wrote %s: opset %d, inputs %s, outputs %s, functions %s", path, OPSET,
              [i.name for i in m.graph.input], [o.name for o in m.graph.output], functions)
    return functions, calls


__all__ = ["to_onnx", "OPSET", "ProgramNotConverted"]
