"""The gradient of a max / min reduction, as torch's ``scatter_reduce`` gives it.

For a row ``r`` and feature ``f`` with reduced value ``y`` and upstream gradient ``g``, torch
gives every message ``m_e`` of the row ``(m_e == y) * (g / N)``, where ``N`` counts the messages
equal to ``y``: ties split the gradient evenly; a NaN extreme (``N = 0``) gives every message of
the row NaN; an infinite or NaN ``g`` gives the messages that did not win ``0 * inf = NaN``; and
the chain rule then multiplies each message's share into its inputs' derivatives, so a
non-finite derivative at a message that did not win gives NaN too (``0 * inf``).

Two details of that formula are followed as the installed torch has them (:func:`torch_rule`
measures them once, at import): PyG reduces into a fresh zeros buffer with
``include_self=False``, yet torch 2.13 still counts that buffer in ``N`` where it equals the
extreme (an extreme of exactly 0 gives each of its ``N`` messages ``g / (N + 1)``); and ``N = 0``
(a NaN extreme) divides by zero. A torch that changes either is followed as it is.

The kernels record per output element (``arg_fold`` in native/common/macros.h) the CSR slot of
the winner when one message reached the extreme, ``-N`` for a tie of ``N``, or
:data:`NAN_RECORD`. The backward then takes one of two forms:

* the fast one, where it gives torch's numbers: no tie and no NaN extreme anywhere, finite
  gradients, finite inputs, and derivatives that cannot be infinite at finite inputs: each
  gradient goes to its winner alone (``[M, F]`` tensors; ``g / 2`` for a winner at exactly 0
  where torch counts the buffer), added to the winner's source row by ``gnncompile::arg_route``
  (and to its edge weight by ``arg_edge_dot``) with no sort and no atomics, in the order of
  torch's ``scatter_add_`` over the winners (ops/autograd.py, ``ARG_ROUTE``);
* in the rows where it does not, the formula itself, as a sum reduction's backward over the
  edges of those rows (the kernels' CSR and CSC passes over a structure of those rows): the
  message program's derivatives with the upstream gradient ``eq(m, y) * (g / N)`` per edge
  (``gnncompile.ops.message.formula_grads``).

A message program that only loads per-edge messages computed beforehand (EdgeCNN's max over its
MLP's output) needs neither: its messages' gradient is the formula itself, ``(m == y) * (g / N)``,
computed in one pass per row by ``gnncompile::extreme_edges_backward`` with the rule of
:func:`torch_rule` passed as its arguments (``gnncompile.ops.message.loaded_edges``).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

NAN_RECORD = -(1 << 62)  # kNanRecord in native/common/macros.h


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


def formula_rows(arg: torch.Tensor, grad: torch.Tensor, everywhere) -> torch.Tensor:
    """The rows (bool [M]) whose gradient needs torch's formula rather than the fast form
    (module docstring). ``arg`` and ``grad`` are [M, F]; ``everywhere`` (a bool, or a 0-d bool
    tensor): every row with an edge does (non-finite inputs, or derivatives that can be
    infinite at finite inputs). Tensor operations only, no decision on the data: the backward
    graphs that call it are traced, and their compiler fuses it."""
    has = arg != -1
    special = (arg < -1) | (has & ~torch.isfinite(grad))
    if everywhere is True:
        special = has
    elif isinstance(everywhere, torch.Tensor):
        special = special | (has & everywhere)
    return special.any(1)


def fast_grad(arg: torch.Tensor, out: torch.Tensor, grad: torch.Tensor, rows: torch.Tensor,
              zeros: bool = True) -> torch.Tensor:
    """The gradient the fast form routes to each winner: 0 where there is none (and in the
    formula's ``rows``), ``g / 2`` for a winner at exactly 0 where torch counts the zeros buffer
    (``zeros``: an extreme of 0 may still be routed). Tensor operations only, as
    :func:`formula_rows`."""
    valid = (arg >= 0) & ~rows.view(-1, *([1] * (arg.dim() - 1)))
    if zeros and torch_rule()[0]:
        grad = torch.where(out == 0, grad / 2, grad)
    return torch.where(valid, grad, torch.zeros_like(grad))


def non_finite(*tensors: Optional[torch.Tensor]):
    """A 0-d bool tensor: does any of ``tensors`` hold a non-finite value (False, a bool, when
    none is given)?"""
    flags = [torch.isfinite(t).all() for t in tensors if t is not None and t.is_floating_point()]
    if not flags:
        return False
    out = flags[0]
    for f in flags[1:]:
        out = out & f
    return ~out


def shares(count: torch.Tensor, out: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``g / N`` per output element of rows with edges, ``count`` being the number of messages
    equal to the extreme ``out``, with ``N`` as the installed torch counts (module docstring)."""
    n = count.to(grad.dtype)
    counts_zeros, nan_gives_nan = torch_rule()
    if counts_zeros:
        n = n + (out == 0).to(grad.dtype)
    if not nan_gives_nan:
        n = torch.where(n == 0, torch.ones_like(n), n)
    return grad / n


__all__ = ["NAN_RECORD", "torch_rule", "formula_rows", "fast_grad", "non_finite", "shares"]
