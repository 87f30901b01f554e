"""ONNX functions (domain ``gnncompile``) for the fused ops, written in ONNX Script.

Each function body uses standard ONNX only (opset 18), so an exported file runs in any ONNX
runtime as it is; a runtime with a native kernel for ``gnncompile::spmm_sum`` etc. may replace
the function. Semantics follow :mod:`gnncompile.ops.reference`.

The fused ops (:data:`OPS`, the functions the exporter calls):

* ``build_csr(dst, src, num_dst) -> (rowptr, col, perm)``: stable sort of the edges by
  destination (TopK on the unique key ``dst * E + edge_id``), counts by ScatterElements(add),
  CumSum. A ``dst`` outside ``[0, num_dst)`` fails there (``in_range``).
* ``spmm_<reduce>[_weighted](rowptr, col, perm, [weight,] x)``: the message of every CSR slot,
  ``Gather(x, col) [* Gather(weight, perm)]``, reduced per destination row by
  ``segment_<reduce>`` and reshaped to ``[M, *x.shape[1:]]`` (``unflatten``). ``weight``
  arrives already shaped to broadcast against ``x[col]`` (done by the exporter). A ``col``
  outside ``[0, N)`` fails in that Gather (``in_range``). The eight are
  made by :func:`_spmm` from two ONNX Script bodies, one per message kind.
* ``edge_softmax(rowptr, perm, scores)``: softmax over the edges sharing a destination
  (segment max by ``scatter_rows(max)``, Exp, segment sum by ``scatter_rows(add)``,
  ``+ 1e-16``, division), in the original edge order.

Message programs (``gnncompile::message_reduce`` / ``message_edges``) get one function per
distinct program, written instruction by instruction by :mod:`.onnx_programs`, which reduces
with the ``segment_<reduce>`` helpers below.

The helpers they call (:data:`HELPERS`, functions of the same domain; a file written by
:func:`gnncompile.export.onnx_export.to_onnx` has them inlined into the fused ops):

* ``in_range(index, n)``: ``index`` where it lies in ``[0, n)``, else ``n``. ONNX has no
  assert, and Gather / ScatterElements accept ``-n <= i < 0`` (wrapped to ``i + n``) where
  eager raises; ``n`` makes onnxruntime raise "indices element out of data bounds";
* ``csr_rows(rowptr, col)``: the destination row of every CSR slot, recovered from ``rowptr``
  (ScatterElements(add) of ones at the row starts, CumSum);
* ``scatter_rows(index, msg, num_rows)``, attributes ``reduction`` and ``fill``: ``msg``
  flattened to ``[E, F]`` and reduced (ScatterElements(reduction)) into the rows ``index`` of
  a ``[num_rows, F]`` tensor that starts at ``fill``; ``csr_scatter(rowptr, col, msg)``, same
  attributes: the same into the CSR rows (``csr_rows``);
* ``segment_<reduce>(rowptr, col, msg) -> [M, F]``: sum; mean divides by
  ``max(in-degree, 1)`` (``in_degree``: ``rowptr[1:] - rowptr[:-1]``); max / min start from
  -inf / +inf and give 0 to a node with no incoming edge (``nonempty``:
  ``Where(in-degree > 0, ., 0)``), as PyG; ``nan_rows`` puts NaN where a row's messages
  hold one (a sum scatter of ``IsNaN``), as eager's ``scatter_reduce`` (ScatterElements(max)
  may drop it).

:func:`function_protos` gives a function with every function it calls (what a model of its
own needs). All index inputs are int64 (the exporter casts).
"""
from __future__ import annotations

from typing import Dict, List, Tuple, TypeVar, Union

import onnx
from onnxscript import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT64, OnnxFunction
from onnxscript import opset18 as op
from onnxscript import script
from onnxscript.values import Opset

DOMAIN = "gnncompile"
GNN = Opset(DOMAIN, 1)
TFloat = TypeVar("TFloat", bound=Union[FLOAT, DOUBLE, FLOAT16, BFLOAT16])


@script(GNN, default_opset=op)
def in_range(index: INT64, n: INT64) -> INT64:
    # ONNX has no assert: an index outside [0, n) becomes n, which the Gather / ScatterElements
    # of its caller rejects ("indices element out of data bounds") where it would wrap -1 to n-1
    ok = op.And(op.GreaterOrEqual(index, op.Constant(value_int=0)), op.Less(index, n))
    return op.Where(ok, index, n)


@script(GNN, default_opset=op)
def build_csr(dst: INT64, src: INT64, num_dst: INT64) -> Tuple[INT64, INT64, INT64]:
    dst = in_range(dst, op.Reshape(num_dst, op.Constant(value_ints=[-1])))
    zero = op.Constant(value_ints=[0])
    one = op.Constant(value_ints=[1])
    e = op.Shape(dst)
    ids = op.Range(op.Constant(value_int=0), op.Squeeze(e), op.Constant(value_int=1))
    key = dst * op.Squeeze(e) + ids
    _vals, perm = op.TopK(key, e, axis=0, largest=0, sorted=1)
    counts = op.ScatterElements(op.Expand(zero, op.Reshape(num_dst, one)), dst,
                                op.Expand(one, e), axis=0, reduction="add")
    rowptr = op.Concat(zero, op.CumSum(counts, op.Constant(value_int=0)), axis=0)
    col = op.Gather(src, perm, axis=0)
    return rowptr, col, perm


# ----------------------------------------------------------------------------- helpers
@script(GNN, default_opset=op)
def csr_rows(rowptr: INT64, col: INT64) -> INT64:
    one = op.Constant(value_ints=[1])
    e = op.Shape(col)
    starts = op.Slice(rowptr, one, op.Constant(value_ints=[-1]))
    delta = op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), e + one), starts,
                               op.Expand(one, op.Shape(starts)), axis=0, reduction="add")
    return op.Slice(op.CumSum(delta, op.Constant(value_int=0)), op.Constant(value_ints=[0]), e)


@script(GNN, default_opset=op)
def scatter_rows(index: INT64, msg: TFloat, num_rows: INT64, reduction: str, fill: float) -> TFloat:
    flat = op.Flatten(msg, axis=1)
    idx = op.Expand(op.Unsqueeze(index, op.Constant(value_ints=[1])), op.Shape(flat))
    shape = op.Concat(num_rows, op.Shape(flat, start=1), axis=0)
    init = op.CastLike(op.Expand(op.Constant(value_float=fill), shape), msg)
    return op.ScatterElements(init, idx, flat, axis=0, reduction=reduction)


@script(GNN, default_opset=op)
def csr_scatter(rowptr: INT64, col: INT64, msg: TFloat, reduction: str, fill: float) -> TFloat:
    num_rows = op.Shape(rowptr) - op.Constant(value_ints=[1])
    return scatter_rows(csr_rows(rowptr, col), msg, num_rows, reduction=reduction, fill=fill)


@script(GNN, default_opset=op)
def in_degree(rowptr: INT64) -> INT64:
    ends = op.Slice(rowptr, op.Constant(value_ints=[1]), op.Constant(value_ints=[9223372036854775807]))
    return ends - op.Slice(rowptr, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]))


@script(GNN, default_opset=op)
def nonempty(rowptr: INT64, out: TFloat) -> TFloat:
    has = op.Unsqueeze(op.Greater(in_degree(rowptr), op.Constant(value_int=0)), op.Constant(value_ints=[1]))
    return op.Where(has, out, op.CastLike(op.Constant(value_float=0.0), out))


@script(GNN, default_opset=op)
def segment_sum(rowptr: INT64, col: INT64, msg: TFloat) -> TFloat:
    return csr_scatter(rowptr, col, msg, reduction="add", fill=0.0)


@script(GNN, default_opset=op)
def segment_mean(rowptr: INT64, col: INT64, msg: TFloat) -> TFloat:
    den = op.CastLike(op.Max(in_degree(rowptr), op.Constant(value_int=1)), msg)
    return op.Div(segment_sum(rowptr, col, msg), op.Unsqueeze(den, op.Constant(value_ints=[1])))


@script(GNN, default_opset=op)
def nan_rows(rowptr: INT64, col: INT64, msg: TFloat, out: TFloat) -> TFloat:
    # ScatterElements(max / min) may drop a NaN; eager's scatter_reduce propagates it: NaN
    # wherever a row's messages hold one (counted by a sum scatter)
    nans = csr_scatter(rowptr, col, op.CastLike(op.IsNaN(msg), msg), reduction="add", fill=0.0)
    nan = op.CastLike(op.Constant(value_float=float("nan")), out)
    return op.Where(op.Greater(nans, op.CastLike(op.Constant(value_float=0.0), out)), nan, out)


@script(GNN, default_opset=op)
def segment_max(rowptr: INT64, col: INT64, msg: TFloat) -> TFloat:
    out = csr_scatter(rowptr, col, msg, reduction="max", fill=float("-inf"))
    return nonempty(rowptr, nan_rows(rowptr, col, msg, out))


@script(GNN, default_opset=op)
def segment_min(rowptr: INT64, col: INT64, msg: TFloat) -> TFloat:
    out = csr_scatter(rowptr, col, msg, reduction="min", fill=float("inf"))
    return nonempty(rowptr, nan_rows(rowptr, col, msg, out))


@script(GNN, default_opset=op)
def unflatten(out: TFloat, x: TFloat) -> TFloat:
    return op.Reshape(out, op.Concat(op.Shape(out, end=1), op.Shape(x, start=1), axis=0))


SEGMENT = {"sum": segment_sum, "mean": segment_mean, "max": segment_max, "min": segment_min}


# ----------------------------------------------------------------------------- spmm
def _spmm(reduce: str, weighted: bool) -> OnnxFunction:
    """``spmm_<reduce>[_weighted]``: one ONNX Script body per message kind, calling the
    ``segment`` function of ``reduce`` (bound from the closure)."""
    segment = SEGMENT[reduce]
    if weighted:
        def spmm(rowptr: INT64, col: INT64, perm: INT64, weight: TFloat, x: TFloat) -> TFloat:
            msg = op.Gather(x, in_range(col, op.Shape(x, end=1)), axis=0) * op.Gather(weight, perm, axis=0)
            return unflatten(segment(rowptr, col, msg), x)
    else:
        def spmm(rowptr: INT64, col: INT64, perm: INT64, x: TFloat) -> TFloat:
            msg = op.Gather(x, in_range(col, op.Shape(x, end=1)), axis=0)
            return unflatten(segment(rowptr, col, msg), x)
    # ONNX Script names a function after its `def`: rename the translation and wrap it again
    scripted = script(GNN, default_opset=op)(spmm)
    name = f"spmm_{reduce}_weighted" if weighted else f"spmm_{reduce}"
    scripted.function_ir.name = spmm.__name__ = spmm.__qualname__ = name
    return OnnxFunction(GNN, spmm, scripted.function_ir, scripted.source, scripted.kwargs)


SPMM = {(reduce, weighted): _spmm(reduce, weighted) for reduce in SEGMENT for weighted in (False, True)}


# ----------------------------------------------------------------------------- edge softmax
@script(GNN, default_opset=op)
def edge_softmax(rowptr: INT64, perm: INT64, scores: TFloat) -> TFloat:
    rows = csr_rows(rowptr, perm)
    # destination of every edge, in the original edge order
    dst = op.ScatterElements(rows, perm, rows, axis=0)
    s = op.Flatten(op.Unsqueeze(scores, op.Constant(value_ints=[-1])), axis=1)
    m = op.Shape(rowptr) - op.Constant(value_ints=[1])
    smax = scatter_rows(dst, s, m, reduction="max", fill=float("-inf"))
    ex = op.Exp(s - op.Gather(smax, dst, axis=0))
    den = scatter_rows(dst, ex, m, reduction="add", fill=0.0) + op.CastLike(op.Constant(value_float=1e-16), s)
    return op.Reshape(ex / op.Gather(den, dst, axis=0), op.Shape(scores))


OPS = [build_csr, edge_softmax, *SPMM.values()]
HELPERS = [in_range, csr_rows, scatter_rows, csr_scatter, in_degree, nonempty, nan_rows,
           *SEGMENT.values(), unflatten]
FUNCTIONS = OPS + HELPERS
BY_NAME: Dict[str, OnnxFunction] = {f.name: f for f in FUNCTIONS}


def function_protos(fn: OnnxFunction) -> List[onnx.FunctionProto]:
    """``fn``'s FunctionProto first, then that of every function of the domain it calls,
    directly or not (each once): what a model calling ``fn`` must define."""
    protos: Dict[str, onnx.FunctionProto] = {}
    todo = [fn]
    while todo:
        f = todo.pop()
        if f.name not in protos:
            protos[f.name] = f.to_function_proto()
            todo += [BY_NAME[n.op_type] for n in protos[f.name].node if n.domain == DOMAIN]
    return list(protos.values())
