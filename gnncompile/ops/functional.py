"""The public op functions (PyG semantics).

``spmm(edge_index, x, edge_weight, reduce, num_dst)`` equals::

    torch_geometric.utils.scatter(x[edge_index[0]] * w, edge_index[1], dim=0,
                                  dim_size=num_dst, reduce=reduce)

and ``edge_softmax(edge_index, scores, num_dst)`` equals
``torch_geometric.utils.softmax(scores, edge_index[1], num_nodes=num_dst)``, without ever
materialising the ``E x F`` message tensor in the forward or the backward pass (sum, mean and
weighted sum). Each call looks up the cached graph structure of ``edge_index``
(:mod:`.structure`) and runs a ``gnncompile`` custom op, which has a fake kernel and an autograd
formula, so ``torch.compile`` and ``torch.export`` see through it. ``knobs`` (default: the
kernels' own rule) are the launch knobs of :mod:`gnncompile.settings`; compiled graphs get
theirs from the model's settings, as op arguments.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from .checks import check_count, check_edge_index, check_float
from .schemas import ops
from .structure import structure

REDUCES = ("sum", "mean", "max", "min")

def _knobs(knobs: Optional[Sequence[int]], fn: str) -> List[int]:
    if knobs is None:
        return []
    if isinstance(knobs, (str, bytes)) or not isinstance(knobs, Sequence) or any(
            isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in knobs):
        raise TypeError(f"{fn}: knobs must be a list of ints >= 0, got {knobs!r}")
    return [int(k) for k in knobs]


def _check_weight(edge_weight, x: torch.Tensor, E: int, fn: str) -> None:
    check_float(edge_weight, "edge_weight", fn)
    if edge_weight.device != x.device:
        raise ValueError(f"{fn}: edge_weight is on {edge_weight.device} but x is on {x.device}")
    if edge_weight.dtype != x.dtype:
        raise TypeError(f"{fn}: edge_weight dtype {edge_weight.dtype} does not match x dtype {x.dtype}")
    if edge_weight.dim() not in (1, 2) or edge_weight.size(0) != E:
        raise ValueError(
            f"{fn}: edge_weight must have shape [E] or [E, H] with E = {E}, got {list(edge_weight.shape)}"
        )
    if edge_weight.dim() == 2 and edge_weight.size(1) != 1 and (
        x.dim() != 3 or x.size(1) != edge_weight.size(1)
    ):
        raise ValueError(
            f"{fn}: edge_weight of shape {list(edge_weight.shape)} needs x of shape "
            f"[N, {edge_weight.size(1)}, C], got {list(x.shape)}"
        )


def spmm(edge_index: torch.Tensor, x: torch.Tensor, edge_weight: Optional[torch.Tensor] = None,
         reduce: str = "sum", num_dst: Optional[int] = None,
         knobs: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Fused gather -> (weight) -> scatter-reduce. Returns ``[num_dst, *x.shape[1:]]``.

    Args:
        edge_index: ``[2, E]`` int64 or int32, row 0 source, row 1 destination.
        x: ``[N, *]`` node features (float32/64, float16, bfloat16).
        edge_weight: None, ``[E]`` (one weight per edge, broadcast over all features) or
            ``[E, H]`` with ``x`` of shape ``[N, H, C]`` (one weight per edge and head).
        reduce: 'sum', 'mean', 'max' or 'min' ('add' is accepted for 'sum'). Nodes with no
            incoming edge get 0, as in PyG.
        num_dst: number of destination nodes (default ``x.size(0)``); may differ from
            ``x.size(0)`` for bipartite graphs.
        knobs: the kernel's launch knobs (default: its own rule; see :mod:`gnncompile.settings`).
    """
    fn = "gnncompile.ops.spmm"
    check_float(x, "x", fn)
    if x.dim() < 1:
        raise ValueError(f"{fn}: x must have a node dimension, got a scalar")
    check_edge_index(edge_index, fn, x.device)
    if reduce == "add":
        reduce = "sum"
    if reduce not in REDUCES:
        raise ValueError(f"{fn}: unknown reduce {reduce!r}; expected one of {', '.join(REDUCES)}")
    if edge_weight is not None:
        _check_weight(edge_weight, x, edge_index.size(1), fn)
    num_dst = x.size(0) if num_dst is None else check_count(num_dst, "num_dst", fn)
    s = structure(edge_index, num_dst)
    s.check_sources(x.size(0))
    t = (None, None, None)
    if torch.is_grad_enabled() and x.requires_grad and reduce in ("sum", "mean"):
        t = s.transposed(x.size(0))
    out, _ = ops.spmm(s.rowptr, s.col, s.perm, edge_weight, x, reduce, _knobs(knobs, fn), *t)
    return out


def edge_softmax(edge_index: torch.Tensor, scores: torch.Tensor,
                 num_dst: Optional[int] = None, knobs: Optional[Sequence[int]] = None) -> torch.Tensor:
    """Softmax of per-edge ``scores`` (``[E]`` or ``[E, H]``) over edges sharing a destination."""
    fn = "gnncompile.ops.edge_softmax"
    check_float(scores, "scores", fn)
    check_edge_index(edge_index, fn, scores.device)
    E = edge_index.size(1)
    if scores.dim() < 1 or scores.size(0) != E:
        raise ValueError(f"{fn}: scores must have E = {E} rows, got shape {list(scores.shape)}")
    if num_dst is None:
        num_dst = int(edge_index[1].max()) + 1 if E > 0 else 0
    num_dst = check_count(num_dst, "num_dst", fn)
    s = structure(edge_index, num_dst)
    return ops.edge_softmax(s.rowptr, s.perm, scores.contiguous(), _knobs(knobs, fn))


def collate_rows(values, starts, sizes, idx, out, incs=None) -> None:
    """Copies the rows of the graphs ``idx`` into ``out`` (the pooled loader's collation; the
    semantics are those of :func:`.reference.collate_rows`)."""
    ops.collate_rows(values, starts, sizes, idx, out, incs)


def segment_ids(sizes, idx, out, ptr) -> None:
    """PyG's ``batch`` vector and ``ptr`` of the graphs ``idx`` (see :func:`.reference.segment_ids`)."""
    ops.segment_ids(sizes, idx, out, ptr)


__all__ = ["spmm", "edge_softmax", "collate_rows", "segment_ids", "REDUCES"]
