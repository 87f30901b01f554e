"""The vendor library's implementation of the fused spmm: ``gnncompile::spmm_sparse``, a Python
custom op that computes what ``gnncompile::spmm`` computes for a sum or a mean (unweighted, or
with one weight per edge) through ``torch.sparse.mm`` on a CSR tensor (MKL on the CPU; cuSPARSE
on CUDA). It is the second candidate of the spmm portfolio
(:mod:`gnncompile.compiler.portfolio`), which the rewrite swaps in for ``gnncompile::spmm``
where it was measured faster (:mod:`gnncompile.passes.portfolio`).

* The CSR tensor wraps the structure's own ``rowptr`` and ``col`` (no copy, built per call in
  O(1)); its values are the edge weights in CSR order (``weight[perm]``), or, unweighted, a
  vector of ones, which depends only on the edge count and is kept (:data:`ONES`, the last
  :data:`MAX_ONES` sizes) so that it is built once per structure size, not per call.
* Mean: the sum times ``1 / max(degree, 1)``, the factor the native kernel multiplies by
  (native/cpu/reduce_core.h), so that both give the same bits.
* Backward: the gradient of ``x`` is ``spmm_sparse`` over the transposed structure (the CSC
  given with the call, else computed), of the output gradient divided by the degree for a mean,
  as ``gnncompile::spmm``'s formula (:mod:`.autograd`); the gradient of the weight is
  ``gnncompile::edge_dot``, the native formula's own. Both are differentiable, so a second
  derivative is exact as well.

Which calls may take it (:func:`supports`): reduce sum or mean, x of float32 / float64, the
weight None or one value per edge of x's dtype. Whether it gives the same bits as the native
kernel on a device is measured, not assumed: :func:`gnncompile.compiler.portfolio.measure`
compares both before it times them.
"""
from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .registration import register_autograd
from .schemas import ops
from .structure import transpose_structure

#: reduces the vendor op computes
REDUCES = ("sum", "mean")
#: feature dtypes it takes (MKL's and cuSPARSE's sparse times dense)
DTYPES = (torch.float32, torch.float64)
MAX_ONES = 4

ONES: "OrderedDict[Tuple[int, torch.dtype, torch.device], Tensor]" = OrderedDict()
_lock = threading.Lock()
#: calls of the op per device type (its forward and the backward's spmm over the CSC): what tests
#: and benchmarks read to see which implementation ran
CALLS = {"cpu": 0, "cuda": 0}
#: device types on which a product has run: torch warns once a process ("sparse CSR support is in
#: beta", TORCH_WARN_ONCE), so the warnings are silenced around the first product of a device type
#: only (``warnings.catch_warnings`` costs about 2 us a call and resets the warning registries)
_QUIET: set = set()


def supports(reduce: str, x_dtype: torch.dtype, weight_dims: Optional[int], weight_dtype=None) -> bool:
    """Whether ``gnncompile::spmm_sparse`` computes this spmm: ``weight_dims`` None (no weight) or
    the weight's number of dimensions (1: one value per edge)."""
    return (reduce in REDUCES and x_dtype in DTYPES
            and (weight_dims is None or (weight_dims == 1 and weight_dtype == x_dtype)))


def _ones(E: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    key = (E, dtype, device)
    with _lock:
        v = ONES.get(key)
        if v is not None:
            ONES.move_to_end(key)
            return v
    v = torch.ones(E, dtype=dtype, device=device)
    with _lock:
        ONES[key] = v
        while len(ONES) > MAX_ONES:
            ONES.popitem(last=False)
    return v


def _product(rowptr: Tensor, col: Tensor, perm: Tensor, weight: Optional[Tensor], x2: Tensor) -> Tensor:
    M, E = rowptr.numel() - 1, col.numel()
    vals = _ones(E, x2.dtype, x2.device) if weight is None else weight.index_select(0, perm)
    if x2.device.type in _QUIET:
        A = torch.sparse_csr_tensor(rowptr, col, vals, (M, x2.shape[0]), check_invariants=False)
        return torch.sparse.mm(A, x2)
    with warnings.catch_warnings():  # "sparse CSR support is in beta" and the invariant-check notice
        warnings.simplefilter("ignore", UserWarning)
        A = torch.sparse_csr_tensor(rowptr, col, vals, (M, x2.shape[0]), check_invariants=False)
        out = torch.sparse.mm(A, x2)
    _QUIET.add(x2.device.type)
    return out


def _check(rowptr, col, perm, weight, x, reduce) -> None:
    if reduce not in REDUCES:
        raise ValueError(f"gnncompile::spmm_sparse: reduce must be one of {REDUCES}, got {reduce!r}")
    if x.dtype not in DTYPES:
        raise TypeError(f"gnncompile::spmm_sparse: x must be float32 or float64, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError("gnncompile::spmm_sparse: x must have a node dimension")
    if rowptr.dim() != 1 or col.dim() != 1 or perm.shape != col.shape or rowptr.dtype != col.dtype:
        raise ValueError("gnncompile::spmm_sparse: rowptr, col and perm must be 1-D index tensors, col and perm "
                         "of one length, rowptr and col of one dtype")
    if weight is not None and (weight.dim() != 1 or weight.shape[0] != col.shape[0] or weight.dtype != x.dtype):
        raise ValueError(f"gnncompile::spmm_sparse: weight must hold one {x.dtype} value per edge "
                         f"([{col.shape[0]}]), got {tuple(weight.shape)} {weight.dtype}")
    if col.numel():
        lo, hi = (int(v) for v in torch.aminmax(col))
        if hi >= x.shape[0] or lo < 0:
            bad = hi if hi >= x.shape[0] else lo
            raise IndexError(f"gnncompile::spmm_sparse: source index {bad} out of range for {x.shape[0]} "
                             "source nodes (x.size(0))")


_lib = torch.library.Library("gnncompile", "FRAGMENT")
_lib.define("spmm_sparse(Tensor rowptr, Tensor col, Tensor perm, Tensor? weight, Tensor x, str reduce, int[] knobs, "
            "Tensor? rowptr_t=None, Tensor? col_t=None, Tensor? perm_t=None) -> Tensor")


def _spmm_sparse_impl(rowptr: Tensor, col: Tensor, perm: Tensor, weight: Optional[Tensor], x: Tensor, reduce: str,
                      knobs: List[int], rowptr_t: Optional[Tensor] = None, col_t: Optional[Tensor] = None,
                      perm_t: Optional[Tensor] = None) -> Tensor:
    _check(rowptr, col, perm, weight, x, reduce)
    CALLS[x.device.type] = CALLS.get(x.device.type, 0) + 1
    N, M = x.shape[0], rowptr.numel() - 1
    out = _product(rowptr, col, perm, weight, x.reshape(N, -1).contiguous())
    if reduce == "mean":
        deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(x.dtype)
        out = out * (1.0 / deg).view(-1, 1)
    shape = (M,) + tuple(x.shape[1:])
    # never a view: autograd refuses an in-place change of a custom op's view output (PyG adds
    # a bias in place after the propagation: PDNConv failed so)
    return out if tuple(out.shape) == shape else out.reshape(shape).clone()


# A Python kernel on the dispatcher's CompositeExplicitAutograd key, its gradient registered by
# ops.registration (the Python that torch.library.custom_op runs around every call, forward and
# backward, done once: HISTORY section 40)
_lib.impl("spmm_sparse", _spmm_sparse_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("gnncompile::spmm_sparse")
def _(rowptr, col, perm, weight, x, reduce, knobs, rowptr_t=None, col_t=None, perm_t=None):
    return x.new_empty((rowptr.shape[0] - 1,) + tuple(x.shape[1:]))


SPMM_SPARSE = torch.ops.gnncompile.spmm_sparse.default


def spmm_sparse(rowptr: Tensor, col: Tensor, perm: Tensor, weight: Optional[Tensor], x: Tensor, reduce: str,
                knobs: List[int], rowptr_t: Optional[Tensor] = None, col_t: Optional[Tensor] = None,
                perm_t: Optional[Tensor] = None) -> Tensor:
    """``gnncompile::spmm(...)[0]`` for a sum or a mean through ``torch.sparse.mm`` (see the
    module); ``knobs`` are passed to the native ``edge_dot`` of the weight's gradient. Calls
    ``torch.ops.gnncompile.spmm_sparse``."""
    return SPMM_SPARSE(rowptr, col, perm, weight, x, reduce, knobs, rowptr_t, col_t, perm_t)


def _setup(ctx, inputs, output) -> None:
    rowptr, col, perm, weight, x, reduce, knobs, rowptr_t, col_t, perm_t = inputs
    ctx.reduce, ctx.knobs, ctx.num_src = reduce, list(knobs), x.shape[0]
    need_w = ctx.needs_input_grad[3]
    ctx.save_for_backward(rowptr, col, perm, weight, x if need_w else None, rowptr_t, col_t, perm_t)


def _backward(ctx, grad):
    rowptr, col, perm, weight, x, rowptr_t, col_t, perm_t = ctx.saved_tensors
    need_w, need_x = ctx.needs_input_grad[3], ctx.needs_input_grad[4]
    g = grad.contiguous()
    if ctx.reduce == "mean":  # as gnncompile::spmm's formula (ops/autograd.py): the same bits
        deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(g.dtype)
        g = g / deg.view(-1, *([1] * (g.dim() - 1)))
    gx = gw = None
    if need_x:
        if rowptr_t is None:
            rowptr_t, col_t, perm_t = transpose_structure(rowptr, col, perm, ctx.num_src)
        gx = spmm_sparse(rowptr_t, col_t, perm_t, weight, g, "sum", ctx.knobs)
    if need_w:
        gw = ops.edge_dot(rowptr, col, perm, x, g, 1, ctx.knobs).reshape(weight.shape)
    return None, None, None, gw, gx, None, None, None, None, None


register_autograd("gnncompile::spmm_sparse", _backward, setup_context=_setup)

__all__ = ["spmm_sparse", "supports", "REDUCES", "DTYPES", "CALLS", "ONES", "SPMM_SPARSE"]
