"""The gradient of a max / min reduction, as torch's ``scatter_reduce`` gives it.

For a row ``r`` and feature ``f`` with reduced value ``y`` and upstream gradient ``g``, torch
gives every message ``m_e`` of the row ``(m_e == y) * (g / N)``, where ``N`` counts the messages
equal to ``y``: ties split the gradient evenly; a NaN extreme (``N = 0``) gives every message of
the row NaN; an infinite or NaN ``g`` gives the messages that did not win ``0 * inf = NaN``; and
the chain rule then multiplies each message's share into its inputs' derivatives, so a
non-finite derivative at a message that did not win gives NaN too (``0 * inf``).

Two details of torch's formula are followed as the installed torch has them (:func:`torch_rule`
measures them once): PyG reduces into a fresh zeros buffer with ``include_self=False``, yet
torch 2.13 still counts that buffer in ``N`` where it equals the extreme (an extreme of exactly
0 gives each of its ``N`` messages ``g / (N + 1)``); and ``N = 0`` (a NaN extreme) divides by
zero. A torch that changes either is followed as it is.

The fused ops keep the fast form where it is the same number: the kernels record per output
element the slot of the winner, or ``-2 - slot`` when ``N != 1`` (``arg_fold`` in
native/common/macros.h), so the backward routes ``g`` to the one winner with ``[M, F]``
tensors, and evaluates the formula above only for the rows that need it (:func:`exact_rows`):
a tie, NaN or 0 there, a non-finite ``g``, or, for every row, non-finite values in what the
derivatives read.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch


def _measure() -> Tuple[bool, bool]:
    src = torch.tensor([0.0, -1.0, float("nan")], dtype=torch.float64, requires_grad=True)
    index = torch.tensor([0, 0, 1])
    with torch.enable_grad(), torch.inference_mode(False):
        out = torch.zeros(2, dtype=torch.float64).scatter_reduce(0, index, src, "amax", include_self=False)
        g, = torch.autograd.grad(out, src, torch.ones(2, dtype=torch.float64))
    return bool(g[0] == 0.5), bool(torch.isnan(g[2]))


# measured at import: the backward ops run below autograd, where it cannot be measured
_RULE = _measure()


def torch_rule() -> Tuple[bool, bool]:
    """(does the zeros buffer count where it equals the extreme, does a NaN extreme give NaN):
    measured on the installed torch with PyG's spelling of a max aggregation."""
    return _RULE


def exact_rows(arg: torch.Tensor, grad: torch.Tensor, out: torch.Tensor, everywhere: bool = False
               ) -> Optional[torch.Tensor]:
    """Rows (bool [M]) whose gradient needs torch's formula, or None when none does. ``arg``,
    ``grad`` and ``out`` (the reduced values) are [M, F]; ``everywhere``: every row with an
    edge does (non-finite inputs)."""
    has = arg != -1
    if everywhere:
        rows = has.any(1)
    else:
        special = (arg < -1) | (has & ~torch.isfinite(grad))
        if torch_rule()[0]:
            special = special | (has & (out == 0))
        rows = special.any(1)
    return rows if bool(rows.any()) else None


def row_slots(rowptr: torch.Tensor, rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(row ids, CSR slots of their edges, the position in row ids of each slot's row)."""
    ids = rows.nonzero().squeeze(1)
    start = rowptr[ids].long()
    cnt = (rowptr[ids + 1] - rowptr[ids]).long()
    total = int(cnt.sum())
    which = torch.repeat_interleave(torch.arange(ids.numel(), device=rowptr.device), cnt, output_size=total)
    first = torch.cumsum(cnt, 0) - cnt
    slots = start.index_select(0, which) + torch.arange(total, device=rowptr.device) - first.index_select(0, which)
    return ids, slots, which


def shares(m: torch.Tensor, which: torch.Tensor, grad: torch.Tensor, is_min: bool) -> torch.Tensor:
    """torch's share of every message ``m`` [Es, F] (its row: ``which``) of the rows' gradient
    ``grad`` [R, F]: ``(m == y) * (g / N)`` with ``y`` the rows' extremes."""
    R, F = grad.shape
    idx = which.view(-1, 1).expand_as(m)
    y = torch.zeros(R, F, dtype=m.dtype, device=m.device).scatter_reduce(
        0, idx, m, "amin" if is_min else "amax", include_self=False)
    eq = m == y.index_select(0, which)
    n = torch.zeros(R, F, dtype=m.dtype, device=m.device).scatter_add(0, idx, eq.to(m.dtype))
    counts_zeros, nan_gives_nan = torch_rule()
    if counts_zeros:
        n = n + (y == 0).to(m.dtype)
    if not nan_gives_nan:
        n = torch.where(n == 0, torch.ones_like(n), n)
    q = grad.to(m.dtype) / n
    return eq.to(m.dtype) * q.index_select(0, which)


def non_finite(*tensors: Optional[torch.Tensor]) -> bool:
    return any(t is not None and t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors)


__all__ = ["torch_rule", "exact_rows", "row_slots", "shares", "non_finite"]
