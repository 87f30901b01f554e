"""ONNX functions (domain ``gnncompile``) for the fused ops, written in ONNX Script.

Each function body uses standard ONNX only (opset 18), so an exported file runs in any ONNX
runtime as it is; a runtime with a native kernel for ``gnncompile::spmm_sum`` etc. may replace
the function. Semantics follow :mod:`gnncompile.ops.reference`:

* ``build_csr(dst, src, num_dst) -> (rowptr, col, perm)``: stable sort of the edges by
  destination (TopK on the unique key ``dst * E + edge_id``), counts by ScatterElements(add),
  CumSum.
* ``spmm_<reduce>[_weighted](rowptr, col, perm, [weight,] x)``: the destination row of every
  CSR slot is recovered from ``rowptr`` (ScatterElements(add) of ones at the row starts, CumSum),
  the message is ``Gather(x, col) [* Gather(weight, perm)]``, reduced with
  ScatterElements(add | max | min); mean divides by ``max(in-degree, 1)``; max / min start from
  -inf / +inf and give 0 to a node with no incoming edge (``Where(count > 0, ., 0)``), as PyG.
  ``weight`` arrives already shaped to broadcast against ``x[col]`` (done by the exporter).
* ``edge_softmax(rowptr, perm, scores)``: softmax over the edges sharing a destination
  (segment max by ScatterElements(max), Exp, segment sum, ``+ 1e-16``, division), in the
  original edge order.

All index inputs are int64 (the exporter casts).
"""
from __future__ import annotations

from typing import Tuple, TypeVar, Union

from onnxscript import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT64
from onnxscript import opset18 as op
from onnxscript import script
from onnxscript.values import Opset

DOMAIN = "gnncompile"
GNN = Opset(DOMAIN, 1)
TFloat = TypeVar("TFloat", bound=Union[FLOAT, DOUBLE, FLOAT16, BFLOAT16])


@script(GNN, default_opset=op)
def build_csr(dst: INT64, src: INT64, num_dst: INT64) -> Tuple[INT64, INT64, INT64]:
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


# ----------------------------------------------------------------------------- spmm
# The row computation is repeated in every body (a function cannot call a helper that the
# exporter would not know to include in the model).

@script(GNN, default_opset=op)
def spmm_sum(rowptr: INT64, col: INT64, perm: INT64, x: TFloat) -> TFloat:
    one = op.Constant(value_ints=[1])
    e = op.Shape(col)
    starts = op.Slice(rowptr, one, op.Constant(value_ints=[-1]))
    delta = op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), e + one), starts,
                               op.Expand(one, op.Shape(starts)), axis=0, reduction="add")
    rows = op.Slice(op.CumSum(delta, op.Constant(value_int=0)), op.Constant(value_ints=[0]), e)
    msg = op.Flatten(op.Gather(x, col, axis=0), axis=1)
    xf = op.Shape(op.Flatten(x, axis=1))
    m = op.Shape(rowptr) - one
    idx = op.Expand(op.Unsqueeze(rows, one), op.Shape(msg))
    zeros = op.CastLike(op.Expand(op.Constant(value_float=0.0), op.Concat(m, op.Slice(xf, one, one + one), axis=0)), x)
    out = op.ScatterElements(zeros, idx, msg, axis=0, reduction="add")
    return op.Reshape(out, op.Concat(m, op.Slice(op.Shape(x), one, op.Constant(value_ints=[64])), axis=0))


@script(GNN, default_opset=op)
def spmm_sum_weighted(rowptr: INT64, col: INT64, perm: INT64, weight: TFloat, x: TFloat) -> TFloat:
    one = op.Constant(value_ints=[1])
    e = op.Shape(col)
    starts = op.Slice(rowptr, one, op.Constant(value_ints=[-1]))
    delta = op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), e + one), starts,
                               op.Expand(one, op.Shape(starts)), axis=0, reduction="add")
    rows = op.Slice(op.CumSum(delta, op.Constant(value_int=0)), op.Constant(value_ints=[0]), e)
    msg = op.Flatten(op.Gather(x, col, axis=0) * op.Gather(weight, perm, axis=0), axis=1)
    xf = op.Shape(op.Flatten(x, axis=1))
    m = op.Shape(rowptr) - one
    idx = op.Expand(op.Unsqueeze(rows, one), op.Shape(msg))
    zeros = op.CastLike(op.Expand(op.Constant(value_float=0.0), op.Concat(m, op.Slice(xf, one, one + one), axis=0)), x)
    out = op.ScatterElements(zeros, idx, msg, axis=0, reduction="add")
    return op.Reshape(out, op.Concat(m, op.Slice(op.Shape(x), one, op.Constant(value_ints=[64])), axis=0))


@script(GNN, default_opset=op)
def spmm_mean(rowptr: INT64, col: INT64, perm: INT64, x: TFloat) -> TFloat:
    one = op.Constant(value_ints=[1])
    e = op.Shape(col)
    starts = op.Slice(rowptr, one, op.Constant(value_ints=[-1]))
    delta = op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), e + one), starts,
                               op.Expand(one, op.Shape(starts)), axis=0, reduction="add")
    rows = op.Slice(op.CumSum(delta, op.Constant(value_int=0)), op.Constant(value_ints=[0]), e)
    msg = op.Flatten(op.Gather(x, col, axis=0), axis=1)
    xf = op.Shape(op.Flatten(x, axis=1))
    m = op.Shape(rowptr) - one
    idx = op.Expand(op.Unsqueeze(rows, one), op.Shape(msg))
    zeros = op.CastLike(op.Expand(op.Constant(value_float=0.0), op.Concat(m, op.Slice(xf, one, one + one), axis=0)), x)
    out = op.ScatterElements(zeros, idx, msg, axis=0, reduction="add")
    count = op.Slice(rowptr, one, op.Constant(value_ints=[9223372036854775807])) - op.Slice(
        rowptr, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]))
    den = op.CastLike(op.Max(count, op.Constant(value_int=1)), x)
    out = op.Div(out, op.Unsqueeze(den, one))
    return op.Reshape(out, op.Concat(m, op.Slice(op.Shape(x), one, op.Constant(value_ints=[64])), axis=0))


@script(GNN, default_opset=op)
def spmm_mean_weighted(rowptr: INT64, col: INT64, perm: INT64, weight: TFloat, x: TFloat) -> TFloat:
    one = op.Constant(value_ints=[1])
    e = op.Shape(col)
    starts = op.Slice(rowptr, one, op.Constant(value_ints=[-1]))
    delta = op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), e + one), starts,
                               op.Expand(one, op.Shape(starts)), axis=0, reduction="add")
    rows = op.Slice(op.CumSum(delta, op.Constant(value_int=0)), op.Constant(value_ints=[0]), e)
    msg = op.Flatten(op.Gather(x, col, axis=0) * op.Gather(weight, perm, axis=0), axis=1)
    xf = op.Shape(op.Flatten(x, axis=1))
    m = op.Shape(rowptr) - one
    idx = op.Expand(op.Unsqueeze(rows, one), op.Shape(msg))
    zeros = op.CastLike(op.Expand(op.Constant(value_float=0.0), op.Concat(m, op.Slice(xf, one, one + one), axis=0)), x)
    out = op.ScatterElements(zeros, idx, msg, axis=0, reduction="add")
    count = op.Slice(rowptr, one, op.Constant(value_ints=[9223372036854775807])) - op.Slice(
        rowptr, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]))
    den = op.CastLike(op.Max(count, op.Constant(value_int=1)), x)
    out = op.Div(out, op.Unsqueeze(den, one))
    return op.Reshape(out, op.Concat(m, op.Slice(op.Shape(x), one, op.Constant(value_ints=[64])), axis=0))


@script(GNN, default_opset=op)
def spmm_max(rowptr: INT64, col: INT64, perm: INT64, x: TFloat) -> TFloat:
    one = op.Constant(value_ints=[1])
    e = op.Shape(col)
    starts = op.Slice(rowptr, one, op.Constant(value_ints=[-1]))
    delta = op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), e + one), starts,
                               op.Expand(one, op.Shape(starts)), axis=0, reduction="add")
    rows = op.Slice(op.CumSum(delta, op.Constant(value_int=0)), op.Constant(value_ints=[0]), e)
    msg = op.Flatten(op.Gather(x, col, axis=0), axis=1)
    xf = op.Shape(op.Flatten(x, axis=1))
    m = op.Shape(rowptr) - one
    idx = op.Expand(op.Unsqueeze(rows, one), op.Shape(msg))
    zero = op.CastLike(op.Constant(value_float=0.0), x)
    init = op.CastLike(op.Expand(op.Constant(value_float=float("-inf")), op.Concat(m, op.Slice(xf, one, one + one), axis=0)), x)
    out = op.ScatterElements(init, idx, msg, axis=0, reduction="max")
    count = op.Slice(rowptr, one, op.Constant(value_ints=[9223372036854775807])) - op.Slice(
        rowptr, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]))
    has = op.Unsqueeze(op.Greater(count, op.Constant(value_int=0)), one)
    out = op.Where(has, out, zero)
    return op.Reshape(out, op.Concat(m, op.Slice(op.Shape(x), one, op.Constant(value_ints=[64])), axis=0))


@script(GNN, default_opset=op)
def spmm_max_weighted(rowptr: INT64, col: INT64, perm: INT64, weight: TFloat, x: TFloat) -> TFloat:
    one = op.Constant(value_ints=[1])
    e = op.Shape(col)
    starts = op.Slice(rowptr, one, op.Constant(value_ints=[-1]))
    delta = op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), e + one), starts,
                               op.Expand(one, op.Shape(starts)), axis=0, reduction="add")
    rows = op.Slice(op.CumSum(delta, op.Constant(value_int=0)), op.Constant(value_ints=[0]), e)
    msg = op.Flatten(op.Gather(x, col, axis=0) * op.Gather(weight, perm, axis=0), axis=1)
    xf = op.Shape(op.Flatten(x, axis=1))
    m = op.Shape(rowptr) - one
    idx = op.Expand(op.Unsqueeze(rows, one), op.Shape(msg))
    zero = op.CastLike(op.Constant(value_float=0.0), x)
    init = op.CastLike(op.Expand(op.Constant(value_float=float("-inf")), op.Concat(m, op.Slice(xf, one, one + one), axis=0)), x)
    out = op.ScatterElements(init, idx, msg, axis=0, reduction="max")
    count = op.Slice(rowptr, one, op.Constant(value_ints=[9223372036854775807])) - op.Slice(
        rowptr, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]))
    has = op.Unsqueeze(op.Greater(count, op.Constant(value_int=0)), one)
    out = op.Where(has, out, zero)
    return op.Reshape(out, op.Concat(m, op.Slice(op.Shape(x), one, op.Constant(value_ints=[64])), axis=0))


@script(GNN, default_opset=op)
def spmm_min(rowptr: INT64, col: INT64, perm: INT64, x: TFloat) -> TFloat:
    one = op.Constant(value_ints=[1])
    e = op.Shape(col)
    starts = op.Slice(rowptr, one, op.Constant(value_ints=[-1]))
    delta = op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), e + one), starts,
                               op.Expand(one, op.Shape(starts)), axis=0, reduction="add")
    rows = op.Slice(op.CumSum(delta, op.Constant(value_int=0)), op.Constant(value_ints=[0]), e)
    msg = op.Flatten(op.Gather(x, col, axis=0), axis=1)
    xf = op.Shape(op.Flatten(x, axis=1))
    m = op.Shape(rowptr) - one
    idx = op.Expand(op.Unsqueeze(rows, one), op.Shape(msg))
    zero = op.CastLike(op.Constant(value_float=0.0), x)
    init = op.CastLike(op.Expand(op.Constant(value_float=float("inf")), op.Concat(m, op.Slice(xf, one, one + one), axis=0)), x)
    out = op.ScatterElements(init, idx, msg, axis=0, reduction="min")
    count = op.Slice(rowptr, one, op.Constant(value_ints=[9223372036854775807])) - op.Slice(
        rowptr, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]))
    has = op.Unsqueeze(op.Greater(count, op.Constant(value_int=0)), one)
    out = op.Where(has, out, zero)
    return op.Reshape(out, op.Concat(m, op.Slice(op.Shape(x), one, op.Constant(value_ints=[64])), axis=0))


@script(GNN, default_opset=op)
def spmm_min_weighted(rowptr: INT64, col: INT64, perm: INT64, weight: TFloat, x: TFloat) -> TFloat:
    one = op.Constant(value_ints=[1])
    e = op.Shape(col)
    starts = op.Slice(rowptr, one, op.Constant(value_ints=[-1]))
    delta = op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), e + one), starts,
                               op.Expand(one, op.Shape(starts)), axis=0, reduction="add")
    rows = op.Slice(op.CumSum(delta, op.Constant(value_int=0)), op.Constant(value_ints=[0]), e)
    msg = op.Flatten(op.Gather(x, col, axis=0) * op.Gather(weight, perm, axis=0), axis=1)
    xf = op.Shape(op.Flatten(x, axis=1))
    m = op.Shape(rowptr) - one
    idx = op.Expand(op.Unsqueeze(rows, one), op.Shape(msg))
    zero = op.CastLike(op.Constant(value_float=0.0), x)
    init = op.CastLike(op.Expand(op.Constant(value_float=float("inf")), op.Concat(m, op.Slice(xf, one, one + one), axis=0)), x)
    out = op.ScatterElements(init, idx, msg, axis=0, reduction="min")
    count = op.Slice(rowptr, one, op.Constant(value_ints=[9223372036854775807])) - op.Slice(
        rowptr, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]))
    has = op.Unsqueeze(op.Greater(count, op.Constant(value_int=0)), one)
    out = op.Where(has, out, zero)
    return op.Reshape(out, op.Concat(m, op.Slice(op.Shape(x), one, op.Constant(value_ints=[64])), axis=0))


# ----------------------------------------------------------------------------- edge softmax
@script(GNN, default_opset=op)
def edge_softmax(rowptr: INT64, perm: INT64, scores: TFloat) -> TFloat:
    one = op.Constant(value_ints=[1])
    e = op.Shape(perm)
    starts = op.Slice(rowptr, one, op.Constant(value_ints=[-1]))
    delta = op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), e + one), starts,
                               op.Expand(one, op.Shape(starts)), axis=0, reduction="add")
    rows = op.Slice(op.CumSum(delta, op.Constant(value_int=0)), op.Constant(value_ints=[0]), e)
    # destination of every edge, in the original edge order
    dst = op.ScatterElements(rows, perm, rows, axis=0)
    s = op.Flatten(op.Unsqueeze(scores, op.Constant(value_ints=[-1])), axis=1)
    m = op.Shape(rowptr) - one
    shape = op.Concat(m, op.Slice(op.Shape(s), one, one + one), axis=0)
    idx = op.Expand(op.Unsqueeze(dst, one), op.Shape(s))
    init = op.CastLike(op.Expand(op.Constant(value_float=float("-inf")), shape), s)
    smax = op.ScatterElements(init, idx, s, axis=0, reduction="max")
    ex = op.Exp(s - op.Gather(smax, dst, axis=0))
    zeros = op.CastLike(op.Expand(op.Constant(value_float=0.0), shape), s)
    den = op.ScatterElements(zeros, idx, ex, axis=0, reduction="add") + op.CastLike(
        op.Constant(value_float=1e-16), s)
    out = ex / op.Gather(den, dst, axis=0)
    return op.Reshape(out, op.Shape(scores))


SPMM = {
    ("sum", False): spmm_sum, ("sum", True): spmm_sum_weighted,
    ("mean", False): spmm_mean, ("mean", True): spmm_mean_weighted,
    ("max", False): spmm_max, ("max", True): spmm_max_weighted,
    ("min", False): spmm_min, ("min", True): spmm_min_weighted,
}
FUNCTIONS = [build_csr, edge_softmax, *SPMM.values()]
