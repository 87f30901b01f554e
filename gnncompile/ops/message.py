"""``gnncompile::message_reduce`` and ``gnncompile::message_edges``: message programs
(:mod:`.program`) run over a CSR structure, with their references, fake kernels and autograd.

The native CPU kernels (native/cpu/message.cpp) interpret the program on register tiles; the
references here (every other backend) evaluate it with torch ops on gathered ``E x F`` tensors.

Backward, derived from the program (:func:`.program.derivative`), nothing of the forward pass
stored. With ``G`` the upstream gradient and ``d_k = G * dm/d(input k)``:

* sum / mean: an input read per destination row gets ``message_reduce(CSR, d_k, sum)``; one
  read per neighbour ``message_reduce(CSC, d_k, sum)`` (the sides swap on the CSC); a per-edge
  input ``message_edges(CSR, d_k)`` summed to its width; a constant input the total of
  ``message_reduce(CSR, d_k, sum)``.
* max / min: ``d_k`` evaluated at the chosen edge of every (row, feature) (``[M, F]`` tensors)
  and added to the rows it was read from; a program that only loads per-edge messages (computed
  beforehand: EdgeCNN's) gets torch's formula in one pass per row instead
  (``gnncompile::extreme_edges_backward``, :func:`loaded_edges`).
* message_edges (whose gradient is per edge): the same, with ``G`` read per edge.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Sequence, Tuple

import torch

from . import extremes
from . import program as P
from . import autograd as _autograd
from .autograd import accumulate_rows
from .reference import _rows, arg_record
from .registration import register_autograd
from .schemas import _lib, ops
from .structure import transpose_structure


# ----------------------------------------------------------------------------- reference
def _check(rowptr, col, perm, inputs, sides, width: int, op: str) -> None:
    if len(inputs) == 0 or len(inputs) != len(sides):
        raise ValueError(f"{op}: {len(inputs)} inputs for {len(sides)} sides (at least one input)")
    M, E = rowptr.numel() - 1, col.numel()
    for k, (t, s) in enumerate(zip(inputs, sides)):
        if s in P.ENCODERS:
            _check_encoder(inputs, sides, k, width, E, op)
            continue
        if t.dim() != 2 or t.shape[1] < 1 or width % t.shape[1]:
            raise ValueError(f"{op}: input {k} of shape {list(t.shape)} is not [rows, W] with W dividing {width}")
        if t.dtype != inputs[0].dtype or not t.is_floating_point():
            raise TypeError(f"{op}: input {k} has dtype {t.dtype}; inputs must share one float dtype")
        if s in (P.EDGE, P.SLOT) and t.shape[0] != E:
            raise ValueError(f"{op}: input {k} is read per edge but has {t.shape[0]} rows for {E} edges")
        if s == P.ROW and t.shape[0] < M:
            raise ValueError(f"{op}: input {k} is read per destination row but has {t.shape[0]} rows for {M} rows")
        if s not in (P.COL, P.ROW, P.EDGE, P.CONST, P.SLOT):
            raise ValueError(f"{op}: input {k} has unknown side {s}")


def _check_encoder(inputs, sides, k: int, width: int, E: int, op: str) -> None:
    """An edge encoder at input k (program.py): features [E, D], then constants Wt [D, W], b [1, W]."""
    a = inputs[k]
    if k + 2 >= len(inputs) or sides[k + 1] != P.CONST or sides[k + 2] != P.CONST:
        raise ValueError(f"{op}: the edge encoder at input {k} needs its weight and bias as constant inputs "
                         f"{k + 1} and {k + 2}")
    wt, b = inputs[k + 1], inputs[k + 2]
    if a.dim() != 2 or a.shape[0] != E or a.shape[1] < 1:
        raise ValueError(f"{op}: the edge encoder's features (input {k}) have shape {list(a.shape)}, "
                         f"not [{E} edges, D]")
    D = a.shape[1]
    if wt.dim() != 2 or wt.shape[0] != D or wt.shape[1] < 1 or width % wt.shape[1]:
        raise ValueError(f"{op}: the edge encoder's weight (input {k + 1}) has shape {list(wt.shape)}, not "
                         f"[{D}, W] with W dividing {width}")
    if b.dim() != 2 or list(b.shape) != [1, wt.shape[1]]:
        raise ValueError(f"{op}: the edge encoder's bias (input {k + 2}) has shape {list(b.shape)}, "
                         f"not [1, {wt.shape[1]}]")
    if any(t.dtype != inputs[0].dtype for t in (a, wt, b)) or not a.is_floating_point():
        raise TypeError(f"{op}: the edge encoder at input {k} has dtypes {a.dtype}, {wt.dtype}, {b.dtype}; "
                        f"inputs must share one float dtype")


def _slot_values(rowptr, col, perm, inputs, sides, slot=None) -> Tuple[List[torch.Tensor], torch.Tensor]:
    """Every input read for every traversed slot (``[E, W_k]``; constants ``[1, W_k]``), and the
    row of every slot."""
    rows = _rows(rowptr)
    vals = []
    for t, s in zip(inputs, sides):
        if s == P.SLOT:
            vals.append(t if slot is None else t.index_select(0, slot.long()))
        elif s == P.COL:
            vals.append(t.index_select(0, col.long()))
        elif s == P.ROW:
            vals.append(t.index_select(0, rows))
        elif s == P.EDGE:
            vals.append(t.index_select(0, perm.long()))
        elif s == P.ENC:
            k = len(vals)
            vals.append(P.encode_edges(t.index_select(0, perm.long()), inputs[k + 1], inputs[k + 2]))
        elif s == P.ENCS:  # the features stored per CSR slot
            k = len(vals)
            vals.append(P.encode_edges(t if slot is None else t.index_select(0, slot.long()), inputs[k + 1],
                                       inputs[k + 2]))
        else:
            vals.append(t[:1])
    return vals, rows


def message_reduce(rowptr, col, perm, inputs, sides, code, consts, width: int, reduce: str,
                   knobs: Sequence[int] = (), csc: Sequence[torch.Tensor] = (), slot=None):
    _check(rowptr, col, perm, inputs, sides, width, "gnncompile.message_reduce")
    if reduce not in ("sum", "mean", "max", "min"):
        raise ValueError(f"gnncompile.message_reduce: unknown reduce {reduce!r}")
    M, E, F = rowptr.numel() - 1, col.numel(), width
    vals, rows = _slot_values(rowptr, col, perm, inputs, sides, slot)
    m = P.evaluate(code, consts, vals, F).expand(E, F)
    x0 = inputs[0]
    out = torch.zeros(M, F, dtype=x0.dtype, device=x0.device)
    empty = torch.empty(0, dtype=torch.long, device=x0.device)
    if reduce in ("sum", "mean"):
        out.index_add_(0, rows, m)
        if reduce == "mean":
            out = out / (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(out.dtype).view(-1, 1)
        return out, empty
    idx = rows.view(-1, 1).expand(E, F)
    best = out.scatter_reduce(0, idx, m, "amax" if reduce == "max" else "amin", include_self=False)
    has = (rowptr[1:] > rowptr[:-1]).view(-1, 1)
    return torch.where(has, best, torch.zeros_like(best)), arg_record(m, best, rows, rowptr)


def message_edges(rowptr, col, perm, inputs, sides, code, consts, width: int, out_width: int,
                  by_slot: bool = False, knobs: Sequence[int] = (), csc: Sequence[torch.Tensor] = (), slot=None):
    _check(rowptr, col, perm, inputs, sides, width, "gnncompile.message_edges")
    if out_width < 1 or width % out_width:
        raise ValueError(f"gnncompile.message_edges: out_width {out_width} does not divide {width}")
    E, F = col.numel(), width
    vals, _ = _slot_values(rowptr, col, perm, inputs, sides, slot)
    m = P.evaluate(code, consts, vals, F).expand(E, F)
    if out_width != F:
        m = m.reshape(E, out_width, F // out_width).sum(-1)
    if by_slot:
        return m.contiguous()
    out = torch.empty(E, out_width, dtype=inputs[0].dtype, device=inputs[0].device)
    out[perm.long()] = m
    return out


def _check_temperature(t, inputs, width: int, op: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[0] != 1 or t.shape[1] < 1 or width % t.shape[1]:
        shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{op}: t has shape {shape}, not [1, Wt] with Wt dividing {width}")
    if t.dtype != inputs[0].dtype or t.device != inputs[0].device:
        raise TypeError(f"{op}: t is {t.dtype} on {t.device}, the inputs {inputs[0].dtype} on {inputs[0].device}")


def message_softmax(rowptr, col, perm, inputs, sides, code, consts, width: int, t,
                    knobs: Sequence[int] = (), csc: Sequence[torch.Tensor] = ()):
    """Reference (and the CUDA path): PyG's softmax aggregation of the program's messages ``m``
    ([E, F] here) with temperature ``t`` ([1, Wt], feature f reads t[f // (F / Wt)]): per row and
    feature, ``out = sum softmax(t * m) * m`` and ``lse = log sum exp(t * m)`` (0 and 0 for a row
    without edges). The native CPU kernel computes both in one pass per row with an online
    maximum (native/cpu/message_core.h, softmax_rows), no [E, F] tensor."""
    op = "gnncompile.message_softmax"
    _check(rowptr, col, perm, inputs, sides, width, op)
    _check_temperature(t, inputs, width, op)
    M, E, F = rowptr.numel() - 1, col.numel(), width
    vals, rows = _slot_values(rowptr, col, perm, inputs, sides)
    m = P.evaluate(code, consts, vals, F).expand(E, F)
    z = m * _group_spread(t, F)
    idx = rows.view(-1, 1).expand(E, F)
    x0 = inputs[0]
    mx = torch.full((M, F), -torch.inf, dtype=x0.dtype, device=x0.device).scatter_reduce(0, idx, z, "amax")
    p = torch.exp(z - mx.index_select(0, rows))
    s = torch.zeros(M, F, dtype=x0.dtype, device=x0.device).index_add_(0, rows, p)
    w = torch.zeros(M, F, dtype=x0.dtype, device=x0.device).index_add_(0, rows, p * m)
    has = (rowptr[1:] > rowptr[:-1]).view(-1, 1)
    zero = torch.zeros_like(s)
    return torch.where(has, w / s, zero), torch.where(has, mx + torch.log(s), zero)


def _group_spread(t: torch.Tensor, F: int) -> torch.Tensor:
    """[1, Wt] -> [1, F]: t's column f // (F / Wt) at feature f."""
    return t if t.shape[1] == F else t.repeat_interleave(F // t.shape[1], dim=1)


_lib.impl("message_softmax", message_softmax, "CompositeExplicitAutograd")


@torch.library.register_fake("gnncompile::message_softmax")
def _message_softmax_fake(rowptr, col, perm, inputs, sides, code, consts, width, t, knobs, csc):
    M = rowptr.shape[0] - 1
    return inputs[0].new_empty((M, width)), inputs[0].new_empty((M, width))


def message_sum_multi(rowptr, col, perm, inputs, sides, code, consts, results, width: int,
                      knobs: Sequence[int] = (), slot=None):
    """Reference: every result slot of the program, summed over each row: [K, M, width]."""
    _check(rowptr, col, perm, inputs, sides, width, "gnncompile.message_sum_multi")
    M, E, F = rowptr.numel() - 1, col.numel(), width
    vals, rows = _slot_values(rowptr, col, perm, inputs, sides, slot)
    regs = P.evaluate_slots(code, consts, vals, F)
    out = []
    for r in results:
        acc = torch.zeros(M, F, dtype=inputs[0].dtype, device=inputs[0].device)
        out.append(acc.index_add_(0, rows, regs[int(r)].expand(E, F)))
    return torch.stack(out)


def message_encoder_grad(rowptr, col, perm, inputs, sides, code, consts, width: int, enc: int,
                         need_features: bool, knobs: Sequence[int] = ()):
    """Reference: the gradient of the encoder's values per edge (message_edges with out_width W,
    an [E, W] tensor), then ``dk Wt^T``, ``a^T dk`` and the column sums of ``dk``. The native CPU
    kernel (native/cpu/message.cpp) accumulates them per chunk of its row split instead."""
    op = "gnncompile.message_encoder_grad"
    if not 0 <= enc < len(inputs) or len(sides) != len(inputs) or sides[enc] not in P.ENCODERS:
        raise ValueError(f"{op}: input {enc} is not an edge encoder (side {P.ENC} or {P.ENCS})")
    _check(rowptr, col, perm, inputs, sides, width, op)
    a, wt = inputs[enc], inputs[enc + 1]
    W = wt.shape[1]
    # (enc_slot: the features, and so their gradient, in CSR slot order: dk by slot too)
    dk = ops.message_edges(rowptr, col, perm, list(inputs), list(sides), list(code), list(consts), width, W,
                           sides[enc] == P.ENCS, list(knobs), [], None)
    da = dk.mm(wt.t()) if need_features else a.new_empty((0, a.shape[1]))
    return da, a.t().mm(dk), dk.sum(0, keepdim=True)


_lib.impl("message_encoder_grad", message_encoder_grad, "CompositeExplicitAutograd")


@torch.library.register_fake("gnncompile::message_encoder_grad")
def _message_encoder_grad_fake(rowptr, col, perm, inputs, sides, code, consts, width, enc, need_features, knobs):
    a, wt = inputs[enc], inputs[enc + 1]
    return (a.new_empty((col.shape[0] if need_features else 0, a.shape[1])), wt.new_empty(tuple(wt.shape)),
            wt.new_empty((1, wt.shape[1])))


_lib.impl("message_sum_multi", message_sum_multi, "CompositeExplicitAutograd")
_lib.impl("message_reduce", message_reduce, "CompositeExplicitAutograd")
_lib.impl("message_edges", message_edges, "CompositeExplicitAutograd")


@torch.library.register_fake("gnncompile::message_reduce")
def _message_reduce_fake(rowptr, col, perm, inputs, sides, code, consts, width, reduce, knobs, csc, slot):
    M = rowptr.shape[0] - 1
    x = inputs[0]
    out = x.new_empty((M, width))
    arg = x.new_empty((M, width) if reduce in ("max", "min") else (0,), dtype=torch.long)
    return out, arg


@torch.library.register_fake("gnncompile::message_sum_multi")
def _message_sum_multi_fake(rowptr, col, perm, inputs, sides, code, consts, results, width, knobs, slot):
    return inputs[0].new_empty((len(results), rowptr.shape[0] - 1, width))


@torch.library.register_fake("gnncompile::message_edges")
def _message_edges_fake(rowptr, col, perm, inputs, sides, code, consts, width, out_width, by_slot, knobs, csc,
                        slot):
    return inputs[0].new_empty((col.shape[0], out_width))


# ----------------------------------------------------------------------------- autograd
#: set by gnncompile.codegen when it is imported (``import gnncompile`` imports it): prepares the
#: generated kernel of a message op call before the call (gnncompile.codegen.prepare_call); ops
#: does not import codegen (codegen imports ops)
PREPARE = None


def _generated(op: str, index: torch.Tensor, ins, sides, code, consts, F: int, **kw) -> None:
    """With $GNNCOMPILE_CODEGEN=auto, the generated kernel of the message op call about to run
    (``op``: 'reduce', 'multi' or 'edges': gnncompile.codegen.prepare_call) is built or loaded at
    its first use, here at trace time when the backward is traced: the derivative programs run
    generated kernels, as the forward does. Otherwise nothing (the interpreter runs)."""
    if PREPARE is not None:
        PREPARE(op, index, ins, sides, code, consts, F, **kw)


#: how the sum / mean / message_edges backward (outside a double backward) gets an edge
#: encoder's gradients: 'accumulate' (gnncompile::message_encoder_grad: one pass over the edges,
#: the weight's and bias's accumulated per chunk, no [E, W] tensor) or 'per_edge' (the value
#: gradient per edge, [E, W], then GEMMs: the path of a double backward; kept to measure against,
#: benchmarks/codegen_encoder.py). Read when the backward runs (traced: when it is traced).
ENCODER_GRAD = "accumulate"

_SWAP = {P.COL: P.ROW, P.ROW: P.COL, P.EDGE: P.EDGE, P.CONST: P.CONST, P.SLOT: P.SLOT, P.ENC: P.ENC,
         P.ENCS: P.ENCS}


def _csc_slots(perm: torch.Tensor, perm_t: torch.Tensor) -> torch.Tensor:
    """The CSR slot of every CSC slot: ``inv(perm)[perm_t]``."""
    inv = torch.empty_like(perm)
    inv[perm.long()] = torch.arange(perm.numel(), dtype=perm.dtype, device=perm.device)
    return inv.index_select(0, perm_t.long())


def _group(t: torch.Tensor, W: int) -> torch.Tensor:
    """[R, F] -> [R, W]: the sum of each run of F / W columns (input k read at f // (F / W))."""
    F = t.shape[1]
    return t if W == F else t.reshape(t.shape[0], W, F // W).sum(-1)


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0],) + tuple(t.shape[1:]))])


def _derivative(code, consts, k: int, n: int, extreme: bool = False):
    dcode, dconsts = P.derivative(tuple(int(c) for c in code), tuple(float(c) for c in consts), k, n, extreme)
    if P.OPS[dcode[0]][0] == "const" and len(dcode) == P.INSTR and dconsts[dcode[2]] == 0.0:
        return None  # the message does not depend on input k
    return list(dcode), list(dconsts)


@functools.lru_cache(maxsize=256)
def _batched_derivatives(code: tuple, consts: tuple, ks: tuple, n: int, extreme: bool = False):
    """One instruction stream computing ``G * dm/d(input k)`` for every k of ``ks`` (the
    upstream gradient G: :func:`.program.upstream`): (code, consts, result slots)."""
    root = P.decode(code, consts)
    grads = P.backward_expr(root, P.upstream(root, n, extreme))
    code_, consts_, results = P.encode_many([grads[k] for k in ks])
    return list(code_), list(consts_), list(results)


def _finish(r: torch.Tensor, t: torch.Tensor, side: int) -> torch.Tensor:
    """Input ``t``'s gradient from ``r`` ([rows, F] sums of its d_k per destination, or per
    neighbour): summed to t's width; a constant's summed over the rows; padded to t's rows."""
    if side == P.CONST:
        r = r.sum(0, keepdim=True)
    return _pad_rows(_group(r, t.shape[1]), t.shape[0])


def _row_only(code, sides) -> bool:
    """Does the program read only inputs of the destination row and constants?"""
    return all(sides[code[i + 2]] in (P.ROW, P.CONST) for i in range(0, len(code), P.INSTR)
               if code[i] == P.OPCODE["in"])


def _row_only_grad(csr, csc, ins, sides, dcode, dconsts, F, t, side, deg, knobs, W: Optional[int] = None
                   ) -> torch.Tensor:
    """The gradient of input ``t`` when ``d_k`` depends only on the destination row (a linear
    message's sum / mean: PNA's ``x_i + x_j + e + b``): ``v = d_k`` once per row, then the degree
    times ``v`` (per destination), ``v`` summed over the CSC (per neighbour: the tuned spmm),
    ``v`` per edge (per-edge inputs) or the total (constants)."""
    rowptr, col, perm = csr
    M = rowptr.shape[0] - 1
    vals = [x[:M] if s == P.ROW else (x if s == P.CONST else None) for x, s in zip(ins, sides)]
    v = P.evaluate(dcode, dconsts, vals, F).expand(M, F)
    W = t.shape[1] if W is None else W  # an edge encoder's: its map's width
    if side in (P.ROW, P.CONST):  # a row without edges adds nothing, whatever its gradient
        return _finish(torch.where(deg > 0, v * deg, torch.zeros_like(v)), t, side)
    if side == P.COL:
        return _group(ops.spmm(*csc[:3], None, v.contiguous(), "sum", knobs)[0], W)
    rows = torch.repeat_interleave(torch.arange(M, device=rowptr.device), rowptr[1:] - rowptr[:-1],
                                   output_size=col.shape[0])  # the row of every CSR slot
    per_slot = _group(v, W).index_select(0, rows)
    if side == P.SLOT:
        return per_slot
    out = torch.empty_like(per_slot)
    out[perm.long()] = per_slot
    return out


def _encoder_grads(dk: Optional[torch.Tensor], a, wt, b, need, perm: Optional[torch.Tensor] = None
                   ) -> List[Optional[torch.Tensor]]:
    """The gradients of an edge encoder's features, transposed weight and bias (program.py) from
    ``dk`` ([E, W], the gradient of its values in the user's edge order; None: the message does not
    depend on them): ``dk Wt^T``, ``a^T dk`` and the column sums of ``dk``. With ``perm`` (an
    enc_slot encoder: ``a`` stored in CSR slot order), the features are put back in edge order
    first, so every sum runs over the edges in the order it does for an enc encoder (the same
    bits), and their gradient is handed back in slot order."""
    if dk is None:
        return [torch.zeros_like(t) if n else None for t, n in zip((a, wt, b), need)]
    if perm is not None and need[1]:
        a = _edge_order(a, perm)
    out = [dk.mm(wt.t()) if need[0] else None, a.t().mm(dk) if need[1] else None,
           dk.sum(0, keepdim=True) if need[2] else None]
    if perm is not None and out[0] is not None:
        out[0] = out[0].index_select(0, perm.long())
    return out


def _edge_order(t: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``t`` (per CSR slot) in the user's edge order: ``out[perm[j]] = t[j]`` (a copy, differentiable)."""
    return t.new_empty(t.shape).index_copy(0, perm.long(), t)


def _encoders(sides) -> List[int]:
    return [k for k, s in enumerate(sides) if s in P.ENCODERS]


def _segment_grads(csr, csc: Sequence[torch.Tensor], inputs, sides, code, consts, F, need, g, g_side, knobs,
                   extreme: "bool | str" = False) -> List[Optional[torch.Tensor]]:
    """Gradients of every input of a sum-like program (``message_reduce`` sum / mean, or
    ``message_edges``) given ``g``, the upstream gradient read on side ``g_side``; with
    ``extreme`` True, of a max / min reduction by torch's formula (ops/extremes.py), ``g`` being the
    pair (reduced values, gradient shares), read per destination; with ``extreme`` 'softmax', of a
    softmax aggregation (message_softmax), ``g`` being (gradient, result, lse, t), the first three
    read per destination, t a constant (program.softmax_upstream). Outside a double backward,
    the gradients read per destination (and constants) share one pass over the CSR and those
    read per neighbour one pass over the CSC (``message_sum_multi``). An edge encoder's gradients
    come, outside a double backward, from one pass over the edges that accumulates its weight's
    and bias's and writes its features' (``message_encoder_grad``: no [E, W] tensor); in a double
    backward its value gradient is computed per edge ([E, W], differentiable), then carried to
    its features, weight and bias (:func:`_encoder_grads`)."""
    rowptr, col, perm = csr
    if torch.is_grad_enabled() and P.ENCS in sides:
        # a double backward: enc_slot features put back in edge order (differentiably) and read as
        # enc, so the transposed passes need no slot map (they take no gradient with one) and the
        # sums run as enc's; their gradient handed back per CSR slot
        moved = [k for k, s in enumerate(sides) if s == P.ENCS]
        inputs, sides = list(inputs), list(sides)
        for k in moved:
            inputs[k], sides[k] = _edge_order(inputs[k], perm), P.ENC
        out = _segment_grads(csr, csc, inputs, sides, code, consts, F, need, g, g_side, knobs, extreme)
        for k in moved:
            if out[k] is not None:
                out[k] = out[k].index_select(0, perm.long())
        return out
    n = len(inputs)
    encoders = _encoders(sides)
    need_enc = {k: [bool(need[k + i]) for i in range(3)] for k in encoders}
    owned = {k + i for k in encoders for i in (1, 2)}  # an encoder's weight and bias: with it
    need = [any(need_enc[k]) if k in need_enc else bool(nk) for k, nk in enumerate(need)]
    extra = list(g) if extreme else [g]
    ins, sides_g = list(inputs) + extra, list(sides) + [g_side] * len(extra)
    if extreme == "softmax":  # (q, y, lse) per destination, t a constant: program.softmax_upstream
        sides_g[-1] = P.CONST
    slot_t = v_rows = None
    out: List[Optional[torch.Tensor]] = [None] * n
    groups = {P.ROW: [], P.COL: []}
    multi = not torch.is_grad_enabled()

    def csc_and_slots(rows: int):
        nonlocal csc, slot_t
        if not csc:
            csc = transpose_structure(rowptr, col, perm, rows)
        if slot_t is None and (P.SLOT in sides_g or P.ENCS in sides_g):
            slot_t = _csc_slots(perm, csc[2])
        return csc, slot_t

    for k, t in enumerate(inputs):
        if k in owned:
            continue  # with its encoder
        d = _derivative(code, consts, k, n, extreme) if need[k] else None
        if d is None and k in need_enc:
            out[k:k + 3] = _encoder_grads(None, t, inputs[k + 1], inputs[k + 2], need_enc[k])
            need_enc.pop(k)
            continue
        if d is None:
            out[k] = torch.zeros_like(t) if need[k] else None
            continue
        dcode, dconsts = d
        W, side = t.shape[1], sides[k]
        if side in P.ENCODERS:
            W = inputs[k + 1].shape[1]
        if side in P.ENCODERS and multi and extreme is not True and ENCODER_GRAD == "accumulate":
            # outside a double backward: the encoder's gradients accumulated over the edges by
            # one pass (message_encoder_grad), its [E, W] value gradient never formed
            nk = need_enc.pop(k)
            _generated("encgrad", rowptr, ins, sides_g, dcode, dconsts, F, out_width=W, enc=k,
                       need_features=nk[0])
            r = ops.message_encoder_grad(rowptr, col, perm, ins, sides_g, dcode, dconsts, F, k, nk[0], knobs)
            out[k:k + 3] = [g_ if need_ else None for g_, need_ in zip(r, nk)]
            continue
        # d_k the same for every edge of a row: no pass over edges (not for the max / min formula,
        # whose eq(m, y) must see the messages as the kernels computed them, bit for bit)
        if not extreme and _row_only(dcode, sides_g):
            if v_rows is None:
                v_rows = (rowptr[1:] - rowptr[:-1]).to(t.dtype).view(-1, 1)
            c = csc_and_slots(t.shape[0])[0] if side == P.COL else csc
            out[k] = _row_only_grad(csr, c, ins, sides_g, dcode, dconsts, F, t, side, v_rows, knobs, W)
        elif multi and side in (P.ROW, P.CONST):
            groups[P.ROW].append(k)
        elif multi and side == P.COL:
            groups[P.COL].append(k)
        elif side == P.COL:
            c, st = csc_and_slots(t.shape[0])
            swapped = [_SWAP[s] for s in sides_g]
            _generated("reduce", c[0], ins, swapped, dcode, dconsts, F)
            out[k] = _finish(ops.message_reduce(*c, ins, swapped, dcode, dconsts, F, "sum", knobs, [], st)[0], t, side)
        elif side in (P.EDGE, P.SLOT, P.ENC, P.ENCS):
            # (an enc_slot encoder's value gradient in edge order too: _encoder_grads sums over the edges)
            _generated("edges", rowptr, ins, sides_g, dcode, dconsts, F, out_width=W, by_slot=side == P.SLOT)
            out[k] = ops.message_edges(rowptr, col, perm, ins, sides_g, dcode, dconsts, F, W, side == P.SLOT,
                                       knobs, list(csc or []), None)
        else:  # read per destination, or a constant
            _generated("reduce", rowptr, ins, sides_g, dcode, dconsts, F)
            r = ops.message_reduce(rowptr, col, perm, ins, sides_g, dcode, dconsts, F, "sum", knobs, [], None)[0]
            out[k] = _finish(r, t, side)
    key = (tuple(int(c) for c in code), tuple(float(c) for c in consts))
    for where, ks in groups.items():
        for chunk in _chunks(*key, tuple(ks), n, extreme):
            mcode, mconsts, results = _batched_derivatives(*key, chunk, n, extreme)
            if where == P.ROW:
                _generated("multi", rowptr, ins, sides_g, mcode, mconsts, F, results=results)
                r = ops.message_sum_multi(rowptr, col, perm, ins, sides_g, mcode, mconsts, results, F, knobs, None)
            else:
                c, st = csc_and_slots(inputs[chunk[0]].shape[0])
                _generated("multi", c[0], ins, [_SWAP[s] for s in sides_g], mcode, mconsts, F, results=results)
                r = ops.message_sum_multi(*c, ins, [_SWAP[s] for s in sides_g], mcode, mconsts, results, F, knobs,
                                          st)
            for i, k in enumerate(chunk):
                out[k] = _finish(r[i], inputs[k], sides[k])
    for k, nk in need_enc.items():  # out[k]: the gradient of the encoder's values, per edge
        if any(nk):
            out[k:k + 3] = _encoder_grads(out[k], inputs[k], inputs[k + 1], inputs[k + 2], nk,
                                          perm if sides[k] == P.ENCS else None)
    return out


MAX_RESULTS = 16  # results of one message_sum_multi pass (kMaxResults in native/cpu/message_core.h)


@functools.lru_cache(maxsize=256)
def _chunks(code: tuple, consts: tuple, ks: tuple, n: int, extreme: bool = False) -> Tuple[tuple, ...]:
    """``ks`` cut into runs that one message_sum_multi pass computes: at most MAX_RESULTS
    results, and an instruction stream that fits the registers (each single derivative does:
    checked when the program was matched)."""
    out, i = [], 0
    while i < len(ks):
        size = min(MAX_RESULTS, len(ks) - i)
        while size > 1:
            try:
                _batched_derivatives(code, consts, ks[i:i + size], n, extreme)
                break
            except ValueError:  # more live registers than the kernels have
                size //= 2
        out.append(ks[i:i + size])
        i += size
    return tuple(out)


# opcodes whose derivative can be infinite at finite inputs (1 / 0, log 0, sqrt 0, x ** -0.5,
# exp and softplus overflowing): torch multiplies a message's zero share into it (0 * inf =
# NaN) also where the message did not win, so these programs take torch's formula everywhere
_UNBOUNDED = {P.OPCODE[n] for n in ("div", "log", "sqrt", "pow", "exp", "softplus")}


def _unbounded(code, consts) -> bool:
    for i in range(0, len(code), P.INSTR):
        op = int(code[i])
        if op in _UNBOUNDED or (op == P.OPCODE["powc"] and float(consts[int(code[i + 3])]) < 1.0):
            return True
    return False


@functools.lru_cache(maxsize=128)
def _count_program(code: tuple, consts: tuple, n: int):
    """The program ``eq(m, y)`` (``y``: input n) of message program (code, consts)."""
    c, cs = P.encode(P.node("eq", P.decode(code, consts), P.inp(n)))
    return list(c), list(cs)


@torch.library.custom_op("gnncompile::message_arg_formula", mutates_args=("grads",))
def message_arg_formula(rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor, inputs: List[torch.Tensor],
                        sides: List[int], code: List[int], consts: List[float], width: int, arg: torch.Tensor,
                        out: torch.Tensor, grad: torch.Tensor, rows: torch.Tensor, need: List[bool],
                        knobs: List[int], grads: List[torch.Tensor]) -> None:
    """Adds to ``grads`` (one per input, an empty tensor where not needed) torch's max / min
    gradient of a message program in the rows ``rows`` (where the fast form is not torch's:
    ops/extremes.py), if there are any: an op of its own (opaque to tracing) because it decides
    that from the data."""
    if not bool(rows.any()):
        return
    formula_grads((rowptr, col, perm), list(inputs), list(sides), list(code), list(consts), width, list(need), arg,
                  out, grad.contiguous(), list(knobs), rows, list(grads))


@message_arg_formula.register_fake
def _message_arg_formula_fake(rowptr, col, perm, inputs, sides, code, consts, width, arg, out, grad, rows, need,
                              knobs, grads):
    return None


def formula_grads(csr, inputs, sides, code, consts, F, need, arg, out, grad, knobs, rows, grads) -> None:
    """torch's max / min gradient (ops/extremes.py) for the rows ``rows`` (bool [M]), added to
    ``grads`` (in place): the backward of a sum over a structure of those rows' edges, whose
    derivative programs take the upstream gradient ``eq(m, y) * (g / N)`` per edge. Per-edge
    inputs are read by slot there (gathered through perm for the rows' slots)."""
    rowptr, col, perm = csr
    ids = rows.nonzero().squeeze(1)
    cnt = (rowptr[ids + 1] - rowptr[ids]).long()
    total = int(cnt.sum())
    which = torch.repeat_interleave(torch.arange(ids.numel(), device=rowptr.device), cnt, output_size=total)
    first = torch.cumsum(cnt, 0) - cnt
    slots = rowptr[ids].long().index_select(0, which) + torch.arange(total, device=rowptr.device) - \
        first.index_select(0, which)
    sub_rowptr = torch.cat([cnt.new_zeros(1), torch.cumsum(cnt, 0)]).to(rowptr.dtype)
    sub = (sub_rowptr, col.index_select(0, slots), torch.arange(total, dtype=perm.dtype, device=perm.device))
    ins, sub_sides, edge_of = [], [], perm.long().index_select(0, slots)
    for t, s in zip(inputs, sides):
        if s == P.ROW:
            ins.append(t.index_select(0, ids))
        elif s == P.EDGE:
            ins.append(t.index_select(0, edge_of))
        elif s == P.SLOT:
            ins.append(t.index_select(0, slots))
        else:
            ins.append(t)
        sub_sides.append(P.SLOT if s in (P.EDGE, P.SLOT) else s)
    y = out.index_select(0, ids).contiguous()
    n = len(inputs)  # N, the messages equal to the extreme, counted by a pass over the rows' edges
    eq_code, eq_consts = _count_program(tuple(int(c) for c in code), tuple(float(c) for c in consts), n)
    _generated("reduce", sub[0], ins + [y], sub_sides + [P.ROW], eq_code, eq_consts, F)
    count = ops.message_reduce(*sub, ins + [y], sub_sides + [P.ROW], eq_code, eq_consts, F, "sum", knobs, [],
                               None)[0]
    q = extremes.shares(count, y, grad.index_select(0, ids)).contiguous()
    part = _segment_grads(sub, [], ins, sub_sides, code, consts, F, need, (y, q), P.ROW, knobs, extreme=True)
    for k, (g, s) in enumerate(zip(part, sides)):
        if g is None or not need[k]:
            continue
        if s == P.ROW:
            grads[k].index_add_(0, ids, g)
        elif s == P.EDGE:
            grads[k].index_add_(0, edge_of, g)
        elif s == P.SLOT:
            grads[k].index_add_(0, slots, g)
        else:
            grads[k].add_(g)


def loaded_edges(code, sides, widths, F: int, dtype: torch.dtype) -> Optional[int]:
    """The input a max / min program only loads, if it is read per edge at full width ``F`` in
    float32 / float64 (its messages computed beforehand, as written: EdgeCNN's max over its MLP's
    output): its index; else None. The backward of such a program is torch's formula in one pass
    per row (:func:`_loaded_edges_grads`)."""
    if len(code) != P.INSTR or int(code[0]) != P.OPCODE["in"]:
        return None
    k = int(code[2])
    if sides[k] not in (P.EDGE, P.SLOT) or widths[k] != F or dtype not in (torch.float32, torch.float64):
        return None
    return k


def _loaded_edges_grads(csr, ins, sides, code, F, need, out, g, knobs) -> List[Optional[torch.Tensor]]:
    """max / min of a program that loads per-edge messages (:func:`loaded_edges`): the messages'
    gradient ``(m == y) * (g / N)`` by gnncompile::extreme_edges_backward, one pass per row (the
    messages equal to the extreme counted, then the gradient shared among them: torch's formula,
    ops/extremes.py, ties, NaN and infinities included), where the general path evaluates the fast
    form over [M, F] records and gathers, then the formula in the rows where that differs. Outside
    a double backward only (the op has no derivative)."""
    rowptr, _, perm = csr
    k = int(code[2])
    counts_zeros, nan_gives_nan = extremes.torch_rule()
    grads: List[Optional[torch.Tensor]] = [torch.zeros_like(t) if nk and i != k else None
                                           for i, (t, nk) in enumerate(zip(ins, need))]
    if need[k]:
        grads[k] = ops.extreme_edges_backward(rowptr, perm, ins[k], out, g, sides[k] == P.SLOT, counts_zeros,
                                              nan_gives_nan, list(knobs))
    return grads


def _extreme_grads(csr, ins, sides, code, consts, F, need, arg, out, g, knobs,
                   csc: Sequence[torch.Tensor] = ()) -> List[Optional[torch.Tensor]]:
    """max / min: the fast form (traced: tensor operations only) and torch's formula in the rows
    where that differs (ops/extremes.py), through message_arg_formula."""
    everywhere = True if _unbounded(code, consts) else extremes.non_finite(*ins)
    relu = code[-P.INSTR] == P.OPCODE["relu"] and everywhere is not True
    if relu:  # m = relu(z): a message of 0 has z <= 0, where relu's derivative selects 0 and the
        # derivatives below it are finite (0 * finite): nothing to route. Where they may not be
        # (everywhere), eager's 0 * inf is NaN and the formula gives it.
        zero = (out == 0) & ~torch.as_tensor(everywhere, device=out.device)
        g = torch.where(zero, torch.zeros_like(g), g)
        arg = torch.where(zero, torch.full_like(arg, -1), arg)
    rows = extremes.formula_rows(arg, g, everywhere)
    grads = _arg_grads(csr, ins, sides, code, consts, F, need, arg, extremes.fast_grad(arg, out, g, rows, not relu),
                       rows, knobs, csc)
    filled = [gk if gk is not None else g.new_empty(0) for gk in grads]
    ops.message_arg_formula(*csr, ins, sides, code, consts, F, arg, out, g, rows, list(need), knobs, filled)
    return grads


def _arg_grads(csr, inputs, sides, code, consts, F, need, arg, grad, rows=None, knobs: Sequence[int] = (),
               csc: Sequence[torch.Tensor] = ()) -> List[Optional[torch.Tensor]]:
    """max / min, the fast form: d_k at the winner of every (row, feature), added where input k
    was read ([M, F] tensors); rows in ``rows`` (bool [M]) are left to :func:`formula_grads`.
    An input read per neighbour at every feature gets its sums from gnncompile::arg_route (no
    sort: ops/autograd.py, ARG_ROUTE), the others from accumulate_rows."""
    rowptr, col, perm = csr
    M = arg.shape[0]
    valid = arg >= 0
    if rows is not None:
        valid = valid & ~rows.view(-1, 1)
    E = col.shape[0]
    slot = torch.where(valid, arg, torch.full_like(arg, E))  # rows without edges read a padded 0
    zero = torch.zeros(1, dtype=torch.long, device=arg.device)
    col_p, perm_p = torch.cat([col.long(), zero]), torch.cat([perm.long(), zero])
    f = torch.arange(F, device=arg.device).view(1, F)
    g = torch.where(valid, grad, torch.zeros_like(grad))
    flat = []
    for t, s in zip(inputs, sides):
        if s == P.COL:
            r = col_p[slot]
        elif s == P.ROW:
            r = torch.arange(M, device=arg.device).view(M, 1).expand(M, F)
        elif s == P.EDGE:
            r = perm_p[slot]
        elif s == P.SLOT:
            r = torch.where(valid, arg, torch.zeros_like(arg))
        else:
            r = torch.zeros_like(arg)
        W = t.shape[1]
        col_of = torch.div(f, F // W, rounding_mode="floor")
        # a row without an edge reads one zero row padded after the input (which may be empty)
        flat.append(torch.where(valid, r * W + col_of, t.numel() + col_of))
    padded = [torch.cat([t.reshape(-1), t.new_zeros(t.shape[1])]) for t in inputs]
    vals = [tp[i] for tp, i in zip(padded, flat)]
    n = len(inputs)
    out: List[Optional[torch.Tensor]] = []
    for k, t in enumerate(inputs):
        d = _derivative(code, consts, k, n) if need[k] else None
        if d is None:
            out.append(torch.zeros_like(t) if need[k] else None)
            continue
        dk = P.evaluate(d[0], d[1], vals + [g], F).expand(M, F)
        dk = torch.where(valid, dk, torch.zeros_like(dk))
        if sides[k] == P.COL and t.shape[1] == F and _autograd._arg_route() == "native":
            c = _autograd.arg_route_csc(rowptr, col, perm, csc, t.shape[0], t.device)
            out.append(ops.arg_route(rowptr, col, perm, None, arg, dk.contiguous(), t.shape[0], list(knobs), *c))
            continue
        gk = torch.zeros(t.numel() + t.shape[1], dtype=t.dtype, device=t.device)
        accumulate_rows(gk, flat[k].reshape(-1), dk.reshape(-1))
        out.append(gk[:t.numel()].reshape(t.shape))
    return out


def _backward_return(n_csc: int, grads) -> tuple:
    """The backward's return in the structure torch.library flattens the arguments to:
    ``grads`` for the inputs, a list for the csc tensor list, ``[]`` for an empty int or float
    list (it cannot tell one from an empty tensor list), None for everything else."""
    return (None, None, None, grads, None, None, None, None, None, None, [None] * n_csc, None)


def _reduce_setup(ctx, inputs, output):
    rowptr, col, perm, ins, sides, code, consts, width, reduce, knobs, csc, slot = inputs
    if slot is not None:
        raise RuntimeError("gnncompile.message_reduce: no gradient on a transposed structure (slot given)")
    ctx.meta = (list(sides), list(code), list(consts), width, reduce, list(knobs), len(ins), len(csc))
    ctx.empty = (len(consts) == 0, len(knobs) == 0)
    ctx.need = [t.requires_grad for t in ins]
    # max / min: the reduced values too (their backward reads them); sum / mean: nothing
    ctx.save_for_backward(rowptr, col, perm, output[1], output[0] if reduce in ("max", "min") else None, *csc, *ins)


def _fix_empty(ret: tuple, ctx, knobs_at: int = 9) -> tuple:
    ret = list(ret)
    if ctx.empty[0]:
        ret[6] = []
    if ctx.empty[1]:
        ret[knobs_at] = []
    return tuple(ret)


def _reduce_backward(ctx, grad_out, grad_arg):
    sides, code, consts, F, reduce, knobs, n, n_csc = ctx.meta
    saved = ctx.saved_tensors
    rowptr, col, perm, arg, out = saved[:5]
    csc = list(saved[5:5 + n_csc])
    ins = list(saved[5 + n_csc:5 + n_csc + n])
    csr = (rowptr, col, perm)
    g = grad_out.contiguous()
    if reduce in ("sum", "mean"):
        if reduce == "mean":
            g = g / (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(g.dtype).view(-1, 1)
        grads = _segment_grads(csr, csc, ins, sides, code, consts, F, ctx.need, g, P.ROW, knobs)
    elif _encoders(sides):
        grads = _extreme_grads_encoded(csr, ins, sides, code, consts, F, ctx.need, arg, out, g, knobs, csc)
    elif loaded_edges(code, sides, [t.shape[1] for t in ins], F, ins[0].dtype) is not None and \
            not torch.is_grad_enabled():
        grads = _loaded_edges_grads(csr, ins, sides, code, F, ctx.need, out, g, knobs)
    else:
        grads = _extreme_grads(csr, ins, sides, code, consts, F, ctx.need, arg, out, g, knobs, csc)
    return _fix_empty(_backward_return(n_csc, grads), ctx)


def _encoder_values(csr, a, wt, b, knobs, side: int = P.ENC) -> torch.Tensor:
    """An edge encoder's values per edge ([E, W], the user's edge order), computed by the op the
    messages ran (message_edges over the program that reads the encoder; ``side`` enc or
    enc_slot, as the messages read it)."""
    W = wt.shape[1]
    code, consts = _LOAD
    _generated("edges", csr[0], [a, wt, b], [side, P.CONST, P.CONST], code, consts, W, out_width=W, by_slot=False)
    return ops.message_edges(*csr, [a, wt, b], [side, P.CONST, P.CONST], code, consts, W, W, False, knobs, [],
                             None)


_LOAD = tuple(list(v) for v in P.encode(P.inp(0)))  # the program that reads input 0


def _extreme_grads_encoded(csr, ins, sides, code, consts, F, need, arg, out, g, knobs, csc):
    """max / min of a program with edge encoders: each encoder's values computed per edge by
    the kernels themselves (bit for bit what the messages read: torch's formula compares the
    messages against the reduced values) and read as a per-edge input, then its gradient
    carried to the encoder."""
    ins, sides, need = list(ins), list(sides), list(need)
    encoders = {k: (ins[k], list(need[k:k + 3]), sides[k]) for k in _encoders(sides)}
    for k in encoders:
        ins[k] = _encoder_values(csr, ins[k], ins[k + 1], ins[k + 2], knobs, sides[k])
        sides[k], need[k] = P.EDGE, any(need[k:k + 3])
        need[k + 1] = need[k + 2] = False
    grads = _extreme_grads(csr, ins, sides, code, consts, F, need, arg, out, g, knobs, csc)
    for k, (a, nk, side) in encoders.items():
        if any(nk):
            grads[k:k + 3] = _encoder_grads(grads[k], a, ins[k + 1], ins[k + 2], nk,
                                            csr[2] if side == P.ENCS else None)
    return grads


register_autograd("gnncompile::message_reduce", _reduce_backward, setup_context=_reduce_setup)


def _softmax_setup(ctx, inputs, output):
    rowptr, col, perm, ins, sides, code, consts, width, t, knobs, csc = inputs
    ctx.meta = (list(sides), list(code), list(consts), width, list(knobs), len(ins), len(csc))
    ctx.empty = (len(consts) == 0, len(knobs) == 0)
    ctx.need = [x.requires_grad for x in ins]
    ctx.need_t = t.requires_grad
    ctx.mark_non_differentiable(output[1])  # lse: a statistic for the backward
    ctx.save_for_backward(rowptr, col, perm, output[0], output[1], t, *csc, *ins)


def _softmax_backward(ctx, grad_out, grad_lse):
    """From the saved per-row statistics (out, lse): the messages recomputed per edge by the
    derivative programs, whose upstream gradient is ``q * alpha * (1 + t (m - out))`` (program.
    softmax_upstream), and t's gradient, the sum of ``q * alpha * m * (m - out)`` over the edges
    (one message_reduce pass). No [E, F] tensor. (lse, a statistic for this backward, is marked
    non-differentiable.)"""
    sides, code, consts, F, knobs, n, n_csc = ctx.meta
    saved = ctx.saved_tensors
    rowptr, col, perm, out, lse, t = saved[:6]
    csc = list(saved[6:6 + n_csc])
    ins = list(saved[6 + n_csc:6 + n_csc + n])
    csr = (rowptr, col, perm)
    q = grad_out.contiguous()
    extra = [q, out, lse, t]
    grads = _segment_grads(csr, csc, ins, sides, code, consts, F, ctx.need, extra, P.ROW, knobs, extreme="softmax")
    dt = None
    if ctx.need_t:
        dcode, dconsts = P.softmax_temperature_grad(code, consts, n)
        all_ins, all_sides = ins + extra, list(sides) + [P.ROW, P.ROW, P.ROW, P.CONST]
        _generated("reduce", rowptr, all_ins, all_sides, dcode, dconsts, F)
        r = ops.message_reduce(*csr, all_ins, all_sides, dcode, dconsts, F, "sum", knobs, [], None)[0]
        dt = _finish(r, t, P.CONST)
    ret = (None, None, None, grads, None, None, None, None, dt, None, [None] * n_csc)
    return _fix_empty(ret, ctx)


register_autograd("gnncompile::message_softmax", _softmax_backward, setup_context=_softmax_setup)


def _edges_setup(ctx, inputs, output):
    rowptr, col, perm, ins, sides, code, consts, width, out_width, by_slot, knobs, csc, slot = inputs
    if slot is not None:
        raise RuntimeError("gnncompile.message_edges: no gradient on a transposed structure (slot given)")
    ctx.by_slot = by_slot
    ctx.meta = (list(sides), list(code), list(consts), width, list(knobs), len(ins), len(csc))
    ctx.empty = (len(consts) == 0, len(knobs) == 0)
    ctx.need = [t.requires_grad for t in ins]
    ctx.save_for_backward(rowptr, col, perm, *csc, *ins)


def _edges_backward(ctx, grad):
    sides, code, consts, F, knobs, n, n_csc = ctx.meta
    saved = ctx.saved_tensors
    rowptr, col, perm = saved[:3]
    csc = list(saved[3:3 + n_csc])
    ins = list(saved[3 + n_csc:3 + n_csc + n])
    grads = _segment_grads((rowptr, col, perm), csc, ins, sides, code, consts, F, ctx.need,
                           grad.contiguous(), P.SLOT if ctx.by_slot else P.EDGE, knobs)
    ret = list(_backward_return(n_csc, grads))
    ret.insert(9, None)  # by_slot
    return _fix_empty(tuple(ret), ctx, knobs_at=10)


register_autograd("gnncompile::message_edges", _edges_backward, setup_context=_edges_setup)


__all__ = ["message_reduce", "message_edges", "message_softmax"]
