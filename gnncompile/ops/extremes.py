"""The gradient of a max / min reduction, as torch's ``scatter_reduce`` gives it.

For a row ``r`` and feature ``f`` with reduced value ``y`` and upstream gradient ``g``, torch
gives every message ``m_e`` of the row ``(m_e == y) * (g / N)``, where ``N`` counts the messages
equal to ``y``: ties split the gradient evenly; a NaN extreme (``N = 0``) gives every message of
the row NaN; an infinite or NaN ``g`` gives the messages that did not win ``0 * inf = NaN``; and
the chain rule then multiplies each message's share into its inputs' derivatives, so a
non-finite derivative at a message that did not win gives NaN too (``0 * inf``).

The fused ops keep the fast form where it is the same number: the kernels record per output
element the slot of the winner, or ``-2 - slot`` when ``N != 1`` (``arg_fold`` in
native/common/macros.h), so the backward routes ``g`` to the one winner with ``[M, F]``
tensors, and evaluates the formula above only for the rows that need it (:func:`exact_rows`):
a tie or NaN there, a non-finite ``g``, or, for every row, non-finite values in what the
derivatives read.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch


def exact_rows(arg: torch.Tensor, grad: torch.Tensor, everywhere: bool = False) -> Optional[torch.Tensor]:
    """Rows (bool [M]) whose gradient needs torch's formula, or None when none does. ``arg`` and
    ``grad`` are [M, F]; ``everywhere``: every row with an edge does (non-finite inputs)."""
    has = arg != -1
    if everywhere:
        rows = has.any(1)
    else:
        rows = ((arg < -1) | (has & ~torch.isfinite(grad))).any(1)
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
    q = grad.to(m.dtype) / n
    return eq.to(m.dtype) * q.index_select(0, which)


def non_finite(*tensors: Optional[torch.Tensor]) -> bool:
    return any(t is not None and t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors)


__all__ = ["exact_rows", "row_slots", "shares", "non_finite"]
