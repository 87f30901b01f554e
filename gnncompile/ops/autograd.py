"""Autograd formulas of the kernel ops (registered with :func:`.registration.register_autograd`:
torch.library.register_autograd's kernel, with its per-call work done once).

* ``spmm``: sum / mean backward is the CSC spmm of the output gradient (for x) and ``edge_dot``
  (for the weight); max / min route each output gradient to the edge chosen in the forward pass
  (``arg_route`` for x, ``arg_edge_dot`` for the weight: no sort, no atomics), or follow torch's
  formula where that differs (ties, NaN: :mod:`.extremes`).
* ``spmm_self`` (spmm's sum + scale * x): itself over the transpose, and sum(g * x) for the scale.
* ``edge_softmax``: ``edge_softmax_backward``; a second derivative is refused with a clear error.
* ``edge_dot``: two spmm calls, so that a double backward through spmm is exact.
* ``gather``: a segment sum over the structure that groups the edges by the gathered index.
* ``attention``: ``attention_backward`` (one pass over the CSC, the coefficients recomputed from
  the forward's per-row statistics, the dropout mask regenerated); a second derivative is refused.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from . import extremes
from .registration import register_autograd
from .schemas import ops
from .structure import transpose_structure


def _spmm_setup(ctx, inputs, output):
    rowptr, col, perm, weight, x, reduce, knobs, rowptr_t, col_t, perm_t, relu_input = inputs
    ctx.reduce = reduce
    ctx.relu_input = relu_input
    ctx.knobs = knobs
    ctx.num_src = x.shape[0]
    ctx.x_shape = x.shape
    ctx.has_weight = weight is not None
    need_x = ctx.needs_input_grad[4]
    need_w = ctx.needs_input_grad[3]
    saved_x = x if (need_w or (need_x and reduce in ("max", "min"))) else None
    saved_out = output[0] if reduce in ("max", "min") else None  # (the max / min backward reads it)
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


# How the max / min backward's fast form routes each gradient to its recorded winner:
# "native": gnncompile::arg_route (and arg_edge_dot for an edge weight): one pass over the CSC, or
# on the CPU over the records, with no sort and no atomics (native/cpu/arg_route_core.h); "scatter":
# the tensor operations it replaced (accumulate_rows: scatter_add_ on the CPU, on CUDA an
# index_put_ that sorts the M x F indices). Read where the backward is traced (compiled graphs)
# or run (eager): a switch for tests and benchmarks/arg_backward.py. Both give the same bits on the
# CPU in float32 / float64 (the same terms, added in the same order).
ARG_ROUTE = "native"
ROUTES = ("native", "scatter")


def _arg_route() -> str:
    if ARG_ROUTE not in ROUTES:
        raise ValueError(f"gnncompile.ops.autograd.ARG_ROUTE must be one of {ROUTES}, got {ARG_ROUTE!r}")
    return ARG_ROUTE


def arg_route_csc(rowptr, col, perm, csc, num_src: int, device):
    """The CSC that ``gnncompile::arg_route`` walks: ``csc`` when given, else built on a device
    where the op needs one (CUDA); on the CPU none (the op then walks the records, which reads
    the CSR alone: cheaper than building the transpose)."""
    if csc is not None and len(csc) == 3 and csc[0] is not None:
        return tuple(csc)
    if device.type == "cpu":
        return (None, None, None)
    return transpose_structure(rowptr, col, perm, num_src)


def _arg_backward(x_shape, rowptr, col, perm, csc, weight, x, arg, g, need_x, need_w, knobs):
    """max / min, the fast form: each gradient ``g`` (0 where nothing is routed) goes to the
    winner recorded in ``arg`` ([M, F] tensors, not [E, F]): gnncompile::arg_route and
    arg_edge_dot, or with ARG_ROUTE == "scatter" tensor operations (traced into the backward
    graph, where its compiler fuses them)."""
    if _arg_route() == "scatter":
        return _arg_backward_scatter(x_shape, col, perm, weight, x, arg, g, need_x, need_w)
    if col.numel() == 0:  # no edge: every output is the constant 0
        gx = torch.zeros(x_shape, dtype=g.dtype, device=g.device) if need_x else None
        return gx, (torch.zeros_like(weight) if need_w else None)
    gx = gw = None
    if need_x:
        t = arg_route_csc(rowptr, col, perm, csc, x_shape[0], g.device)
        gx = ops.arg_route(rowptr, col, perm, weight, arg, g, x_shape[0], knobs, *t).reshape(x_shape)
    if need_w:
        heads = weight.shape[1] if weight.dim() == 2 else 1
        gw = ops.arg_edge_dot(rowptr, col, perm, x, arg, g, heads, knobs).reshape(weight.shape)
    return gx, gw


def _arg_backward_scatter(x_shape, col, perm, weight, x, arg, g, need_x, need_w):
    """The fast form as tensor operations (ARG_ROUTE == "scatter")."""
    M = g.shape[0]
    if col.numel() == 0:  # no edge: every output is the constant 0
        gx = torch.zeros(x_shape, dtype=g.dtype, device=g.device) if need_x else None
        return gx, (torch.zeros_like(weight) if need_w else None)
    valid = arg >= 0
    slot = arg.clamp(min=0)  # no winner: slot 0, nothing routed (g is 0 there)
    src = col.long()[slot]
    eid = perm.long()[slot]
    heads = _head_index(weight, g.shape)
    if weight is not None:
        w = weight[eid, heads] if heads is not None else weight.reshape(-1)[eid]
    gx = gw = None
    if need_x:
        contrib = torch.where(valid, g * w, torch.zeros_like(g)) if weight is not None else g
        gx = torch.zeros(x_shape, dtype=g.dtype, device=g.device)
        Fg = math.prod(g.shape[1:])
        accumulate_rows(gx.reshape(x_shape[0], Fg), src.reshape(M, Fg), contrib.reshape(M, Fg))
    if need_w:
        Fx = math.prod(x.shape[1:])
        xs = x.reshape(x.shape[0], Fx).gather(0, src.reshape(M, Fx)).reshape(g.shape)
        flat = eid * weight.shape[1] + heads if heads is not None else eid
        gw = torch.zeros(weight.numel(), dtype=weight.dtype, device=weight.device)
        accumulate_rows(gw, flat.reshape(-1), torch.where(valid, xs * g, torch.zeros_like(g)).reshape(-1))
        gw = gw.reshape(weight.shape)
    return gx, gw


# arg_route and arg_edge_dot are differentiable too, so that a double backward through max / min
# is exact (each is linear in each of its float inputs). With j the record of (r, f) when it is a
# slot of row r (s = col[j], e = perm[j], h the head of f), and G the upstream gradient:
#   arg_route     out[s, f] += grad[r, f] w[e, h]:  d grad[r, f] = G[s, f] w[e, h]   (a gather)
#                                                   d w[e, h]    = arg_edge_dot(G, grad)
#   arg_edge_dot  out[e, h] += grad[r, f] x[s, f]:  d x          = arg_route(weight G, grad)
#                                                   d grad[r, f] = x[s, f] G[e, h]   (a gather)
def _winner_values(rowptr, col, perm, arg, src, weight):
    """``[M, *F]``: at every record that is a slot ``j`` of its row, ``src[col[j]]`` (times
    ``weight[perm[j]]``, per head for an ``[E, H]`` weight); 0 elsewhere."""
    M = arg.shape[0]
    Fw = math.prod(arg.shape[1:])
    a = arg.reshape(M, Fw)
    if col.numel() == 0:
        return torch.zeros(arg.shape, dtype=src.dtype, device=src.device)
    valid = (a >= rowptr[:-1].view(-1, 1)) & (a < rowptr[1:].view(-1, 1))
    j = torch.where(valid, a, torch.zeros_like(a))
    v = src.reshape(src.shape[0], Fw).gather(0, col.long()[j])
    if weight is not None:
        e = perm.long()[j]
        if weight.dim() == 2 and weight.shape[1] > 1:
            head = torch.div(torch.arange(Fw, device=a.device), Fw // weight.shape[1], rounding_mode="floor")
            v = v * weight[e, head.view(1, Fw).expand(M, Fw)]
        else:
            v = v * weight.reshape(-1)[e]
    return torch.where(valid, v, torch.zeros_like(v)).reshape(arg.shape)


def _arg_route_setup(ctx, inputs, output):
    rowptr, col, perm, weight, arg, grad, num_src, knobs, rowptr_t, col_t, perm_t = inputs
    ctx.knobs = knobs
    ctx.save_for_backward(rowptr, col, perm, weight, arg, grad if ctx.needs_input_grad[3] else None)


def _arg_route_backward(ctx, g):
    rowptr, col, perm, weight, arg, grad = ctx.saved_tensors
    g = g.contiguous()
    gw = gg = None
    if ctx.needs_input_grad[3]:
        heads = weight.shape[1] if weight.dim() == 2 else 1
        gw = ops.arg_edge_dot(rowptr, col, perm, g, arg, grad, heads, ctx.knobs).reshape(weight.shape)
    if ctx.needs_input_grad[5]:
        gg = _winner_values(rowptr, col, perm, arg, g, weight)
    return None, None, None, gw, None, gg, None, None, None, None, None


register_autograd("gnncompile::arg_route", _arg_route_backward, setup_context=_arg_route_setup)


def _arg_edge_dot_setup(ctx, inputs, output):
    rowptr, col, perm, x, arg, grad, heads, knobs = inputs
    ctx.heads, ctx.knobs, ctx.x_shape = heads, knobs, x.shape
    ctx.save_for_backward(rowptr, col, perm, x if ctx.needs_input_grad[5] else None, arg,
                          grad if ctx.needs_input_grad[3] else None)


def _arg_edge_dot_backward(ctx, g):
    rowptr, col, perm, x, arg, grad = ctx.saved_tensors
    H = ctx.heads
    g = g.contiguous()
    gx = gg = None
    if ctx.needs_input_grad[3]:
        M = grad.shape[0]
        per_head = (M, H, math.prod(grad.shape[1:]) // H) if H > 1 else grad.shape  # arg_route's [E, H] weight form
        t = arg_route_csc(rowptr, col, perm, None, ctx.x_shape[0], g.device)
        gx = ops.arg_route(rowptr, col, perm, g if H > 1 else g.reshape(-1), arg.reshape(per_head),
                           grad.reshape(per_head), ctx.x_shape[0], ctx.knobs, *t).reshape(ctx.x_shape)
    if ctx.needs_input_grad[5]:
        gg = _winner_values(rowptr, col, perm, arg, x, g)
    return None, None, None, gx, None, gg, None, None


register_autograd("gnncompile::arg_edge_dot", _arg_edge_dot_backward, setup_context=_arg_edge_dot_setup)


@torch.library.custom_op("gnncompile::spmm_arg_formula", mutates_args=("gx", "gw"))
def spmm_arg_formula(rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor, weight: Optional[torch.Tensor],
                     x: Optional[torch.Tensor], arg: torch.Tensor, out: torch.Tensor, grad: torch.Tensor,
                     rows: torch.Tensor, reduce: str, gx: Optional[torch.Tensor], gw: Optional[torch.Tensor]) -> None:
    """Adds to ``gx`` / ``gw`` torch's max / min gradient of spmm in the rows ``rows`` (where
    the fast form is not torch's: :mod:`.extremes`), if there are any: an op of its own
    (opaque to tracing) because it decides that from the data."""
    if not bool(rows.any()):
        return
    _formula_backward(reduce, gx.shape if gx is not None else x.shape, rowptr, col, perm, weight, x, arg, out,
                      grad.contiguous(), gx is not None, gw is not None, rows, gx, gw)


@spmm_arg_formula.register_fake
def _spmm_arg_formula_fake(rowptr, col, perm, weight, x, arg, out, grad, rows, reduce, gx, gw):
    return None


def _formula_backward(reduce, x_shape, rowptr, col, perm, weight, x, arg, out, grad_out, need_x, need_w, rows,
                      gx, gw) -> None:
    """torch's max / min gradient for the rows ``rows``, added to ``gx`` / ``gw`` (in place):
    the message ``x_j`` (``w * x_j``) as a message program, through
    :func:`.message.formula_grads`, in the type the forward kernels computed in."""
    from . import message as _message
    from . import program as P

    M, N = grad_out.shape[0], x_shape[0]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    x2 = x.reshape(N, -1).to(acc)
    F = x2.shape[1]
    ins, sides = [x2], [P.COL]
    expr = P.inp(0)
    if weight is not None:
        ins.append((weight.reshape(-1, 1) if weight.dim() == 1 else weight).to(acc).contiguous())
        sides.append(P.EDGE)
        expr = P.node("mul", P.inp(1), P.inp(0))  # the kernel's w * x
    code, consts = P.encode(expr)
    y = out.reshape(M, -1)
    if y.dtype != acc:  # 16-bit: the extremes as the kernels compared them, before rounding
        y = ops.spmm(rowptr, col, perm, None if weight is None else ins[1].reshape(weight.shape), x.to(acc), reduce,
                     [])[0].reshape(M, -1)
    grads = [torch.zeros_like(t) for t in ins]
    need = [need_x] + ([need_w] if weight is not None else [])
    _message.formula_grads((rowptr, col, perm), ins, sides, code, consts, F, need, arg.reshape(M, -1), y,
                           grad_out.reshape(M, -1).to(acc), [], rows, grads)
    if need_x:
        gx.add_(grads[0].reshape(x_shape).to(gx.dtype))
    if need_w:
        gw.add_(grads[1].reshape(weight.shape).to(gw.dtype))


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
    else:  # max / min: the fast form, traced, and torch's formula where that differs (extremes.py)
        g, a = grad_out, arg
        if ctx.relu_input and weight is None:  # x = relu(h): whatever reaches a 0 of x is dropped
            zero = out == 0
            g = torch.where(zero, torch.zeros_like(g), g)
            a = torch.where(zero, torch.full_like(a, -1), a)
        M, Fw = g.shape[0], math.prod(g.shape[1:])
        rows = extremes.formula_rows(a.reshape(M, Fw), g.reshape(M, Fw),
                                     extremes.non_finite(weight if need_x else None, x if need_w else None))
        relu = ctx.relu_input and weight is None  # (an extreme of 0 routes nothing: no scaling for it)
        gx, gw = _arg_backward(ctx.x_shape, rowptr, col, perm, (rowptr_t, col_t, perm_t), weight, x, a,
                               extremes.fast_grad(a, out, g, rows, not relu), need_x, need_w, ctx.knobs)
        ops.spmm_arg_formula(rowptr, col, perm, weight, x, a, out, g, rows, reduce, gx, gw)
    return None, None, None, gw, gx, None, None, None, None, None, None


register_autograd("gnncompile::spmm", _spmm_backward, setup_context=_spmm_setup)


def _spmm_self_setup(ctx, inputs, output):
    rowptr, col, perm, x, scale, knobs, rowptr_t, col_t, perm_t = inputs
    ctx.knobs = knobs
    ctx.num_src = x.shape[0]
    ctx.save_for_backward(rowptr, col, perm, scale, x if ctx.needs_input_grad[4] else None, rowptr_t, col_t, perm_t)


def _spmm_self_backward(ctx, grad):
    """out = A x + s x: x's gradient is A^T g + s g, the same op over the transpose (the sum of
    the transposed spmm, then the rounded product, as autograd adds spmm's and mul's gradients);
    s's (where 1 + eps needs one) is sum(g * x), mul's."""
    rowptr, col, perm, scale, x, rowptr_t, col_t, perm_t = ctx.saved_tensors
    g = grad.contiguous()
    gx = gs = None
    if ctx.needs_input_grad[3]:
        if rowptr_t is None:
            rowptr_t, col_t, perm_t = transpose_structure(rowptr, col, perm, ctx.num_src)
        gx = ops.spmm_self(rowptr_t, col_t, perm_t, g, scale, ctx.knobs)
    if ctx.needs_input_grad[4]:
        gs = (g * x).sum().reshape(scale.shape).to(scale.dtype)
    return None, None, None, gx, gs, None, None, None, None


register_autograd("gnncompile::spmm_self", _spmm_self_backward, setup_context=_spmm_self_setup)


def _spmm_bf16_setup(ctx, inputs, output):
    rowptr, col, perm, weight, x, xb, reduce, knobs, rowptr_t, col_t, perm_t = inputs
    ctx.reduce, ctx.knobs, ctx.num_src = reduce, knobs, x.shape[0]
    saved_x = x if ctx.needs_input_grad[3] else None
    ctx.save_for_backward(rowptr, col, perm, weight, saved_x, rowptr_t, col_t, perm_t)


def _spmm_bf16_backward(ctx, grad):
    """x's gradient: the transposed spmm_bf16 of the (mean: degree-scaled) output gradient,
    gathered in bfloat16 and returned in float32; the weight's: edge_dot of float32 x and the
    gradient, in the weight's dtype. xb (a copy of x) gets none."""
    rowptr, col, perm, weight, x, rowptr_t, col_t, perm_t = ctx.saved_tensors
    g = grad.contiguous()
    if ctx.reduce == "mean":
        deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(g.dtype)
        g = g / deg.view(-1, *([1] * (g.dim() - 1)))
    gx = gw = None
    if ctx.needs_input_grad[4]:
        if rowptr_t is None:
            rowptr_t, col_t, perm_t = transpose_structure(rowptr, col, perm, ctx.num_src)
        gx = ops.spmm_bf16(rowptr_t, col_t, perm_t, weight, g, g.to(torch.bfloat16), "sum", ctx.knobs)
    if ctx.needs_input_grad[3]:
        heads = weight.shape[1] if weight.dim() == 2 else 1
        gw = ops.edge_dot(rowptr, col, perm, x, g, heads, ctx.knobs).reshape(weight.shape).to(weight.dtype)
    return None, None, None, gw, gx, None, None, None, None, None, None


register_autograd("gnncompile::spmm_bf16", _spmm_bf16_backward, setup_context=_spmm_bf16_setup)


def _softmax_setup(ctx, inputs, output):
    rowptr, perm, scores, knobs = inputs
    ctx.knobs = knobs
    ctx.save_for_backward(rowptr, perm, output)


def _softmax_backward(ctx, grad):
    rowptr, perm, out = ctx.saved_tensors
    return None, None, ops.edge_softmax_backward(rowptr, perm, out, grad.contiguous(), ctx.knobs), None


register_autograd(
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


register_autograd("gnncompile::edge_dot", _edge_dot_backward, setup_context=_edge_dot_setup)


def _softmax_double_backward(ctx, grad):
    raise RuntimeError(
        "gnncompile: double backward through edge_softmax is not supported "
        "(differentiate the attention scores once, or use torch_geometric.utils.softmax)"
    )


def _softmax_bwd_setup(ctx, inputs, output):
    pass


register_autograd(
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


register_autograd("gnncompile::gather", _gather_backward, setup_context=_gather_setup)


# dropout: the mask is a function of (seed, index), so the gradient is the same op on it
def _dropout_setup(ctx, inputs, output):
    ctx.p = inputs[1]
    ctx.save_for_backward(inputs[2])


def _dropout_backward(ctx, grad):
    (seed,) = ctx.saved_tensors
    return ops.dropout(grad.contiguous(), ctx.p, seed), None, None


register_autograd("gnncompile::dropout", _dropout_backward, setup_context=_dropout_setup)


# attention: the backward reads the forward's inputs, its output and its statistics (no [E, H]
# tensor is kept); the CSC is the one the rewrite passed, else built here.
def _attention_setup(ctx, inputs, output):
    (rowptr, col, perm, x, a_src, a_dst, a_edge, slope, p, seed, knobs, rowptr_t, col_t, perm_t) = inputs
    ctx.slope, ctx.p, ctx.knobs = slope, p, knobs
    ctx.has_edge = a_edge is not None
    ctx.save_for_backward(rowptr, col, perm, x, a_src, a_dst, a_edge, seed, rowptr_t, col_t, perm_t,
                          output[0], output[1])


def _attention_backward(ctx, grad_out, grad_stats):
    (rowptr, col, perm, x, a_src, a_dst, a_edge, seed, rowptr_t, col_t, perm_t, out, stats) = ctx.saved_tensors
    if rowptr_t is None:
        rowptr_t, col_t, perm_t = transpose_structure(rowptr, col, perm, x.shape[0])
    gx, gs, gd, ge = ops.attention_backward(rowptr, col, perm, x, a_src, a_dst, a_edge, ctx.slope, ctx.p, seed,
                                            out, stats, grad_out.contiguous(), ctx.knobs, rowptr_t, col_t, perm_t)
    need = ctx.needs_input_grad
    return (None, None, None, gx if need[3] else None, gs if need[4] else None, gd if need[5] else None,
            ge if ctx.has_edge and need[6] else None, None, None, None, None, None, None, None)


register_autograd("gnncompile::attention", _attention_backward, setup_context=_attention_setup)


def _attention_double_backward(ctx, *grads):
    raise RuntimeError(
        "gnncompile: double backward through the fused attention is not supported "
        "(differentiate the layer once, or compile with settings={'choices': {'attention': 'chain'}})"
    )


def _attention_bwd_setup(ctx, inputs, output):
    pass


register_autograd(
    "gnncompile::attention_backward", _attention_double_backward, setup_context=_attention_bwd_setup
)


# attention_v2 (GATv2): as attention's, the backward recomputes from the forward's inputs, output
# and statistics.
def _attention_v2_setup(ctx, inputs, output):
    (rowptr, col, perm, x_l, x_r, att, e_term, slope, p, seed, knobs, rowptr_t, col_t, perm_t) = inputs
    ctx.slope, ctx.p, ctx.knobs = slope, p, knobs
    ctx.has_edge = e_term is not None
    ctx.save_for_backward(rowptr, col, perm, x_l, x_r, att, e_term, seed, rowptr_t, col_t, perm_t,
                          output[0], output[1])


def _attention_v2_backward(ctx, grad_out, grad_stats):
    (rowptr, col, perm, x_l, x_r, att, e_term, seed, rowptr_t, col_t, perm_t, out, stats) = ctx.saved_tensors
    if rowptr_t is None:
        rowptr_t, col_t, perm_t = transpose_structure(rowptr, col, perm, x_l.shape[0])
    gl, gr, ga, ge = ops.attention_v2_backward(rowptr, col, perm, x_l, x_r, att, e_term, ctx.slope, ctx.p, seed,
                                               out, stats, grad_out.contiguous(), ctx.knobs, rowptr_t, col_t,
                                               perm_t)
    need = ctx.needs_input_grad
    return (None, None, None, gl if need[3] else None, gr if need[4] else None, ga if need[5] else None,
            ge if ctx.has_edge and need[6] else None, None, None, None, None, None, None, None)


register_autograd("gnncompile::attention_v2", _attention_v2_backward,
                                setup_context=_attention_v2_setup)
register_autograd(
    "gnncompile::attention_v2_backward", _attention_double_backward, setup_context=_attention_bwd_setup
)


# attention_dot (TransformerConv): as attention's, the backward recomputes from the forward's
# inputs, outputs and statistics; out_e's gradient is zeros where out_e is not read.
def _attention_dot_setup(ctx, inputs, output):
    (rowptr, col, perm, q, k, v, qe, edge_attr, scale, p, seed, knobs, rowptr_t, col_t, perm_t) = inputs
    ctx.scale, ctx.p, ctx.knobs = scale, p, knobs
    ctx.has_edge = edge_attr is not None
    ctx.save_for_backward(rowptr, col, perm, q, k, v, qe, edge_attr, seed, rowptr_t, col_t, perm_t,
                          output[0], output[1], output[2])


def _attention_dot_backward(ctx, grad_out, grad_out_e, grad_stats):
    (rowptr, col, perm, q, k, v, qe, edge_attr, seed, rowptr_t, col_t, perm_t, out, out_e,
     stats) = ctx.saved_tensors
    if rowptr_t is None:
        rowptr_t, col_t, perm_t = transpose_structure(rowptr, col, perm, k.shape[0])
    grad_out = torch.zeros_like(out) if grad_out is None else grad_out.contiguous()
    grad_out_e = torch.zeros_like(out_e) if grad_out_e is None else grad_out_e.contiguous()
    need = ctx.needs_input_grad
    # edge features that need no gradient (a model's input, the usual case): the kernel skips theirs
    gq, gk, gv, gqe, gea = ops.attention_dot_backward(rowptr, col, perm, q, k, v, qe, edge_attr, ctx.scale, ctx.p,
                                                      seed, out, out_e, stats, grad_out, grad_out_e, ctx.knobs,
                                                      rowptr_t, col_t, perm_t, bool(need[7]))
    return (None, None, None, gq if need[3] else None, gk if need[4] else None, gv if need[5] else None,
            gqe if ctx.has_edge and need[6] else None, gea if ctx.has_edge and need[7] else None,
            None, None, None, None, None, None, None)


register_autograd("gnncompile::attention_dot", _attention_dot_backward,
                                setup_context=_attention_dot_setup)
register_autograd(
    "gnncompile::attention_dot_backward", _attention_double_backward, setup_context=_attention_bwd_setup
)


# dense_attention (graph transformers' dense attention): the backward recomputes the probabilities
# from the forward's logsumexp; a second derivative is refused (no formula registered for the
# backward op).
def _dense_attention_setup(ctx, inputs, output):
    q, k, v, key_padding_mask, scale, knobs = inputs
    ctx.scale, ctx.knobs = scale, knobs
    ctx.mark_non_differentiable(output[1])  # lse: statistics for the backward, not a result
    ctx.save_for_backward(q, k, v, key_padding_mask, output[0], output[1])


def _dense_attention_backward(ctx, grad_out, grad_lse):
    q, k, v, key_padding_mask, out, lse = ctx.saved_tensors
    if grad_out is None:
        return None, None, None, None, None, None
    gq, gk, gv = ops.dense_attention_backward(q, k, v, key_padding_mask, ctx.scale, out, lse,
                                              grad_out.contiguous(), ctx.knobs)
    need = ctx.needs_input_grad
    return (gq if need[0] else None, gk if need[1] else None, gv if need[2] else None, None, None, None)


register_autograd("gnncompile::dense_attention", _dense_attention_backward,
                                setup_context=_dense_attention_setup)
