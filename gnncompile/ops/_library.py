"""The one place that names ``torch.ops.gnncompile.*``: schemas, fake kernels, autograd
formulas and the reference fallbacks.

Structure tensors (``rowptr``, ``col``, ``perm``) describe a graph sorted by destination
(CSR): ``col[j]`` is the source node of CSR slot ``j`` and ``perm[j]`` its original edge id,
so per-edge tensors (weights, scores) always stay in the user's original edge order. The
optional ``*_t`` tensors are the same structure sorted by source (CSC), used by backward.
``knobs`` are the kernels' tuning arguments (see docs/ARCHITECTURE.md); ``[]`` means defaults.
"""
from __future__ import annotations

import torch

from . import reference

NAMESPACE = "gnncompile"

_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
_lib.define(
    "build_csr(Tensor dst, Tensor src, int num_dst, int num_src) -> (Tensor rowptr, Tensor col, Tensor perm)"
)
_lib.define(
    "spmm(Tensor rowptr, Tensor col, Tensor perm, Tensor? weight, Tensor x, str reduce, int[] knobs, "
    "Tensor? rowptr_t=None, Tensor? col_t=None, Tensor? perm_t=None) -> (Tensor out, Tensor arg)"
)
_lib.define(
    "edge_dot(Tensor rowptr, Tensor col, Tensor perm, Tensor x, Tensor g, int heads, int[] knobs) -> Tensor"
)
_lib.define("edge_softmax(Tensor rowptr, Tensor perm, Tensor scores, int[] knobs) -> Tensor")
_lib.define("gather(Tensor x, Tensor index, Tensor rowptr, Tensor perm, int[] knobs) -> Tensor")
_lib.define(
    "edge_softmax_backward(Tensor rowptr, Tensor perm, Tensor out, Tensor grad, int[] knobs) -> Tensor"
)

# The pooled loader's collation (gnncompile.data): copies of whole graphs into a batch buffer.
_lib.define("collate_rows(Tensor values, Tensor starts, Tensor sizes, Tensor idx, Tensor(a!) out, "
            "Tensor? incs=None) -> ()")
_lib.define("segment_ids(Tensor sizes, Tensor idx, Tensor(a!) out, Tensor(b!) ptr) -> ()")

# Kernels: the native module registers CPU (and CUDA) implementations when it loads; the
# references fill every other backend, and all of them when the native module is missing.
from .. import _native  # noqa: E402  (must come after the schemas are defined)

for _name in ("build_csr", "spmm", "edge_dot", "edge_softmax", "edge_softmax_backward", "collate_rows",
              "segment_ids"):
    _lib.impl(_name, getattr(reference, _name), "CompositeExplicitAutograd")

ops = torch.ops.gnncompile


def _gather_impl(x, index, rowptr, perm, knobs):
    return x.index_select(0, index)


# gather: x.index_select(0, index) whose gradient is a segment sum over a structure that groups
# the edges by `index` (the CSR when index is the destination row, the CSC when it is the source
# row): deterministic and parallel, where index_select's own backward is a serial index_add of
# the E x * gradient. The forward is plain index_select on every backend.
_lib.impl("gather", _gather_impl, "CompositeExplicitAutograd")

# ----------------------------------------------------------------------------- fake kernels
@torch.library.register_fake("gnncompile::build_csr")
def _build_csr_fake(dst, src, num_dst, num_src):
    E = dst.shape[0]
    return dst.new_empty(num_dst + 1), dst.new_empty(E), dst.new_empty(E)


@torch.library.register_fake("gnncompile::spmm")
def _spmm_fake(rowptr, col, perm, weight, x, reduce, knobs, rowptr_t=None, col_t=None, perm_t=None):
    shape = (rowptr.shape[0] - 1,) + tuple(x.shape[1:])
    out = x.new_empty(shape)
    if reduce in ("max", "min"):
        arg = x.new_empty(shape, dtype=torch.long)
    else:
        arg = x.new_empty((0,), dtype=torch.long)
    return out, arg


@torch.library.register_fake("gnncompile::edge_dot")
def _edge_dot_fake(rowptr, col, perm, x, g, heads, knobs):
    return x.new_empty((col.shape[0], heads))


@torch.library.register_fake("gnncompile::gather")
def _gather_fake(x, index, rowptr, perm, knobs):
    return x.new_empty((index.shape[0],) + tuple(x.shape[1:]))


@torch.library.register_fake("gnncompile::edge_softmax")
def _edge_softmax_fake(rowptr, perm, scores, knobs):
    return torch.empty_like(scores, memory_format=torch.contiguous_format)


@torch.library.register_fake("gnncompile::edge_softmax_backward")
def _edge_softmax_backward_fake(rowptr, perm, out, grad, knobs):
    return torch.empty_like(out, memory_format=torch.contiguous_format)


# ----------------------------------------------------------------------------- autograd
def transpose_structure(rowptr, col, perm, num_src: int):
    """CSC (by source) from CSR (by destination), with perm_t in original edge ids."""
    deg = rowptr[1:] - rowptr[:-1]
    rows = torch.repeat_interleave(
        torch.arange(deg.shape[0], device=rowptr.device, dtype=rowptr.dtype), deg.long()
    )
    rowptr_t, col_t, slot = ops.build_csr(col, rows, num_src, deg.shape[0])
    return rowptr_t, col_t, perm[slot.long()]


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
    ctx.save_for_backward(rowptr, col, perm, weight, saved_x, output[1], rowptr_t, col_t, perm_t)


def _head_index(weight, shape):
    """Column of weight for every feature of an [M, *F] tensor (0 for a scalar weight)."""
    if weight is None or weight.dim() == 1 or weight.shape[1] == 1:
        return None
    H = weight.shape[1]
    return torch.arange(H, device=weight.device).view(1, H, 1).expand(shape)


def _spmm_backward(ctx, grad_out, grad_arg):
    rowptr, col, perm, weight, x, arg, rowptr_t, col_t, perm_t = ctx.saved_tensors
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
        # max / min: only the chosen edge of each (row, feature) receives gradient. These are
        # [M, F] tensors, not [E, F].
        M = grad_out.shape[0]
        if col.numel() == 0:  # no edge: every output is the constant 0
            gx = torch.zeros(ctx.x_shape, dtype=grad_out.dtype, device=grad_out.device) if need_x else None
            gw = torch.zeros_like(weight) if need_w else None
            return None, None, None, gw, gx, None, None, None, None, None
        valid = arg >= 0
        slot = arg.clamp(min=0)
        src = col.long()[slot]
        g = torch.where(valid, grad_out, torch.zeros_like(grad_out))
        eid = perm.long()[slot]
        heads = _head_index(weight, g.shape)
        if weight is not None:
            w = weight[eid, heads] if heads is not None else weight.reshape(-1)[eid]
        if need_x:
            contrib = g * w if weight is not None else g
            gx = torch.zeros(ctx.x_shape, dtype=grad_out.dtype, device=grad_out.device)
            gx.reshape(ctx.x_shape[0], -1).scatter_add_(
                0, src.reshape(M, -1), contrib.reshape(M, -1))
        if need_w:
            xs = x.reshape(x.shape[0], -1).gather(0, src.reshape(M, -1)).reshape(g.shape)
            contrib = (xs * g).reshape(-1)
            flat = eid * weight.shape[1] + heads if heads is not None else eid
            gw = torch.zeros(weight.numel(), dtype=weight.dtype, device=weight.device)
            gw.index_add_(0, flat.reshape(-1), contrib.to(weight.dtype))
            gw = gw.reshape(weight.shape)
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
