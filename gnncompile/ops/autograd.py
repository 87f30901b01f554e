"""Autograd formulas of the kernel ops (registered with ``torch.library.register_autograd``).

* ``spmm``: sum / mean backward is the CSC spmm of the output gradient (for x) and ``edge_dot``
  (for the weight); max / min route each output gradient to the edge chosen in the forward pass,
  and follow torch's formula where it differs (ties, NaN: :mod:`.extremes`).
* ``edge_softmax``: ``edge_softmax_backward``; a second derivative is refused with a clear error.
* ``edge_dot``: two spmm calls, so that a double backward through spmm is exact.
* ``gather``: a segment sum over the structure that groups the edges by the gathered index.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from . import extremes
from .schemas import ops
from .structure import transpose_structure


def _spmm_setup(ctx, inputs, output):
    rowptr, col, perm, weight, x, reduce, knobs, rowptr_t, col_t, perm_t = inputs
    ctx.reduce = reduce
    ctx.knobs = knobs
    ctx.num_src = x.shape[0]
    ctx.x_shape = x.shape
    ctx.has_weight = weight is not None
    need_x = ctx.needs_input_grad[4]
    need_w = ctx.needs_input_grad[3]
    saved_x = x if (need_w or (need_x and reduce in ("max", "min"))) else None
    saved_out = output[0] if reduce in ("max", "min") else None  # (extremes.exact_rows reads it)
    ctx.save_for_backward(rowptr, col, perm, weight, saved_x, output[1], rowptr_t, col_t, perm_t, saved_out)


def _head_index(weight, shape):
    """Column of weight for every feature of an [M, *F] tensor (0 for a scalar weight)."""
    if weight is None or weight.dim() == 1 or weight.shape[1] == 1:
        return None
    H = weight.shape[1]
    return torch.arange(H, device=weight.device).view(1, H, 1).expand(shape)


def accumulate_rows(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor,
                    sort: Optional[bool] = None) -> None:
    """``out[index[i, f], f] += values[i, f]`` (``out`` [N, F] or [N], ``index`` and ``values`` of
    one shape [K, F] or [K]), deterministically: with repeated rows the sums come out the same on
    every run. On the CPU ``scatter_add_`` adds each column in index order; on CUDA, where it
    uses atomics, ``index_put_(accumulate=True)`` on the flattened indices sorts them first
    (``sort`` forces either path, for tests)."""
    values = values.to(out.dtype)
    if not (sort if sort is not None else out.device.type != "cpu"):
        out.scatter_add_(0, index, values)
        return
    flat = index
    if out.dim() == 2:
        F = out.shape[1]
        flat = index * F + torch.arange(F, device=out.device)
    out.view(-1).index_put_((flat.reshape(-1),), values.reshape(-1), accumulate=True)


@torch.library.custom_op("gnncompile::spmm_arg_backward", mutates_args=())
def spmm_arg_backward(rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor, weight: Optional[torch.Tensor],
                      x: Optional[torch.Tensor], arg: torch.Tensor, out: torch.Tensor, grad: torch.Tensor,
                      reduce: str, x_shape: List[int], need_x: bool, need_w: bool
                      ) -> Tuple[torch.Tensor, torch.Tensor]:
    """The max / min backward of spmm: (grad of x, grad of weight), an empty tensor for the one
    not needed. An op of its own (opaque to tracing) because it decides from the data which rows
    take torch's formula (:mod:`.extremes`)."""
    gx, gw = _arg_backward(reduce, x_shape, rowptr, col, perm, weight, x, arg, out, grad.contiguous(), need_x,
                           need_w)
    empty = grad.new_empty(0)
    return (gx if gx is not None else empty), (gw if gw is not None else empty)


@spmm_arg_backward.register_fake
def _spmm_arg_backward_fake(rowptr, col, perm, weight, x, arg, out, grad, reduce, x_shape, need_x, need_w):
    return (grad.new_empty(x_shape) if need_x else grad.new_empty(0),
            weight.new_empty(weight.shape) if need_w else grad.new_empty(0))


def _arg_backward(reduce, x_shape, rowptr, col, perm, weight, x, arg, out, grad_out, need_x, need_w):
    """max / min: each output gradient goes to the edge chosen in the forward pass ([M, F]
    tensors, not [E, F]), except in the rows where torch's formula gives other numbers (ties,
    NaN, non-finite gradients or inputs: :mod:`.extremes`), which are computed by it."""
    M = grad_out.shape[0]
    if col.numel() == 0:  # no edge: every output is the constant 0
        gx = torch.zeros(x_shape, dtype=grad_out.dtype, device=grad_out.device) if need_x else None
        gw = torch.zeros_like(weight) if need_w else None
        return gx, gw
    a2, g2 = arg.reshape(M, -1), grad_out.reshape(M, -1)
    exact = extremes.exact_rows(a2, g2, out.reshape(M, -1),
                                extremes.non_finite(weight if need_x else None, x if need_w else None))
    valid = arg >= 0
    if exact is not None:
        valid = valid & ~exact.view(-1, *([1] * (arg.dim() - 1)))
    slot = torch.where(valid, arg, torch.zeros_like(arg))
    src = col.long()[slot]
    g = torch.where(valid, grad_out, torch.zeros_like(grad_out))
    eid = perm.long()[slot]
    heads = _head_index(weight, g.shape)
    if weight is not None:
        w = weight[eid, heads] if heads is not None else weight.reshape(-1)[eid]
    gx = gw = None
    if need_x:
        contrib = torch.where(valid, g * w, torch.zeros_like(g)) if weight is not None else g
        gx = torch.zeros(x_shape, dtype=grad_out.dtype, device=grad_out.device)
        accumulate_rows(gx.reshape(x_shape[0], -1), src.reshape(M, -1), contrib.reshape(M, -1))
    if need_w:
        xs = x.reshape(x.shape[0], -1).gather(0, src.reshape(M, -1)).reshape(g.shape)
        flat = eid * weight.shape[1] + heads if heads is not None else eid
        gw = torch.zeros(weight.numel(), dtype=weight.dtype, device=weight.device)
        accumulate_rows(gw, flat.reshape(-1), torch.where(valid, xs * g, torch.zeros_like(g)).reshape(-1))
    if exact is not None:
        _exact_arg_backward(reduce, rowptr, col, perm, weight, x, g2, exact, gx, gw)
    if need_w:
        gw = gw.reshape(weight.shape)
    return gx, gw


def _exact_arg_backward(reduce, rowptr, col, perm, weight, x, grad, rows, gx, gw) -> None:
    """torch's max / min gradient (:func:`.extremes.shares`) for the rows ``rows``, added to
    ``gx`` / ``gw`` (in place; None: not needed). The messages are recomputed as the kernels
    computed them (in the accumulation type), so ties are the kernels' ties."""
    _, slots, which = extremes.row_slots(rowptr, rows)
    src, eid = col.long()[slots], perm.long()[slots]
    F = grad.shape[1]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xs = x.reshape(x.shape[0], -1).index_select(0, src).to(acc)
    w = None
    if weight is not None:
        we = weight.index_select(0, eid).to(acc)
        w = we.reshape(-1, 1) if weight.dim() == 1 or weight.shape[1] == 1 else \
            we.repeat_interleave(F // weight.shape[1], dim=1)
    m = xs * w if w is not None else xs
    share = extremes.shares(m, which, grad.index_select(0, rows.nonzero().squeeze(1)), reduce == "min")
    if gx is not None:
        c = share * w if w is not None else share
        accumulate_rows(gx.reshape(gx.shape[0], -1), src.view(-1, 1).expand_as(c), c.to(gx.dtype))
    if gw is not None:
        per = (share * xs)
        per = per.sum(1) if weight.dim() == 1 or weight.shape[1] == 1 else \
            per.reshape(per.shape[0], weight.shape[1], -1).sum(-1).reshape(-1)
        H = 1 if weight.dim() == 1 else weight.shape[1]
        flat = (eid.view(-1, 1) * H + torch.arange(H, device=eid.device)).reshape(-1)
        accumulate_rows(gw, flat, per.reshape(-1).to(gw.dtype))


def _spmm_backward(ctx, grad_out, grad_arg):
    rowptr, col, perm, weight, x, arg, rowptr_t, col_t, perm_t, out = ctx.saved_tensors
    need_w, need_x = ctx.needs_input_grad[3], ctx.needs_input_grad[4]
    gx = gw = None
    reduce = ctx.reduce
    grad_out = grad_out.contiguous()
    if reduce in ("sum", "mean"):
        g = grad_out
        if reduce == "mean":
            deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(g.dtype)
            g = g / deg.view(-1, *([1] * (g.dim() - 1)))
        if need_x:
            if rowptr_t is None:
                rowptr_t, col_t, perm_t = transpose_structure(rowptr, col, perm, ctx.num_src)
            gx = ops.spmm(rowptr_t, col_t, perm_t, weight, g, "sum", ctx.knobs)[0]
        if need_w:
            heads = weight.shape[1] if weight.dim() == 2 else 1
            gw = ops.edge_dot(rowptr, col, perm, x, g, heads, ctx.knobs).reshape(weight.shape)
    else:
        gx, gw = ops.spmm_arg_backward(rowptr, col, perm, weight, x, arg, out, grad_out, reduce,
                                       list(ctx.x_shape), need_x, need_w)
        gx, gw = (gx if need_x else None), (gw if need_w else None)
    return None, None, None, gw, gx, None, None, None, None, None


torch.library.register_autograd("gnncompile::spmm", _spmm_backward, setup_context=_spmm_setup)


def _softmax_setup(ctx, inputs, output):
    rowptr, perm, scores, knobs = inputs
    ctx.knobs = knobs
    ctx.save_for_backward(rowptr, perm, output)


def _softmax_backward(ctx, grad):
    rowptr, perm, out = ctx.saved_tensors
    return None, None, ops.edge_softmax_backward(rowptr, perm, out, grad.contiguous(), ctx.knobs), None


torch.library.register_autograd(
    "gnncompile::edge_softmax", _softmax_backward, setup_context=_softmax_setup
)


# edge_dot is differentiable too, so that a double backward through spmm is exact:
#   out[e, h] = <x[src_e, h, :], g[dst_e, h, :]>
#   d x[s]  = sum over edges e leaving s   of G[e, h] * g[dst_e, h, :]   (spmm over the CSC)
#   d g[d]  = sum over edges e entering d  of G[e, h] * x[src_e, h, :]   (spmm over the CSR)
def _edge_dot_setup(ctx, inputs, output):
    rowptr, col, perm, x, g, heads, knobs = inputs
    ctx.heads, ctx.knobs = heads, knobs
    ctx.save_for_backward(rowptr, col, perm, x, g)


def _edge_dot_backward(ctx, grad):
    rowptr, col, perm, x, g = ctx.saved_tensors
    H = ctx.heads
    weight = grad.reshape(-1) if H == 1 else grad
    gx = gg = None
    if ctx.needs_input_grad[3]:
        t = transpose_structure(rowptr, col, perm, x.shape[0])
        src = g.reshape(g.shape[0], H, -1) if H > 1 else g
        gx = ops.spmm(*t, weight, src.contiguous(), "sum", ctx.knobs)[0].reshape(x.shape)
    if ctx.needs_input_grad[4]:
        src = x.reshape(x.shape[0], H, -1) if H > 1 else x
        gg = ops.spmm(rowptr, col, perm, weight, src.contiguous(), "sum", ctx.knobs)[0].reshape(g.shape)
    return None, None, None, gx, gg, None, None


torch.library.register_autograd("gnncompile::edge_dot", _edge_dot_backward, setup_context=_edge_dot_setup)


def _softmax_double_backward(ctx, grad):
    raise RuntimeError(
        "gnncompile: double backward through edge_softmax is not supported "
        "(differentiate the attention scores once, or use torch_geometric.utils.softmax)"
    )


def _softmax_bwd_setup(ctx, inputs, output):
    pass


torch.library.register_autograd(
    "gnncompile::edge_softmax_backward", _softmax_double_backward, setup_context=_softmax_bwd_setup
)


def _gather_setup(ctx, inputs, output):
    x, index, rowptr, perm, knobs = inputs
    ctx.knobs = knobs
    ctx.x_shape = x.shape
    ctx.save_for_backward(rowptr, perm)


def _gather_backward(ctx, grad):
    rowptr, perm = ctx.saved_tensors
    # Segment sum of the per-edge gradient: spmm over (rowptr, perm) that reads grad through
    # perm (col = perm), i.e. out[r] = sum of grad[perm[j]] over the slots j of row r.
    g = grad.contiguous()
    gx = ops.spmm(rowptr, perm, perm, None, g, "sum", ctx.knobs)[0]
    return gx.reshape(ctx.x_shape), None, None, None, None


torch.library.register_autograd("gnncompile::gather", _gather_backward, setup_context=_gather_setup)


# dropout: the mask is a function of (seed, index), so the gradient is the same op on it
def _dropout_setup(ctx, inputs, output):
    ctx.p = inputs[1]
    ctx.save_for_backward(inputs[2])


def _dropout_backward(ctx, grad):
    (seed,) = ctx.saved_tensors
    return ops.dropout(grad.contiguous(), ctx.p, seed), None, None


torch.library.register_autograd("gnncompile::dropout", _dropout_backward, setup_context=_dropout_setup)
