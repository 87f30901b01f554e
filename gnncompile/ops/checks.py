"""Input checks shared by the public op functions, the structure ops, the passes and export.

The dtypes the kernels accept are named here once; the native kernels make the same checks in
``native/common/torch_glue.h``.
"""
from __future__ import annotations

from typing import Optional

import torch

INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def is_edge_index(t) -> bool:
    """A ``[2, E]`` integer tensor of a dtype the kernels take."""
    return isinstance(t, torch.Tensor) and t.dim() == 2 and t.size(0) == 2 and t.dtype in INDEX_DTYPES


def check_edge_index(edge_index, fn: str, device: Optional[torch.device] = None) -> None:
    """Raises a TypeError / ValueError naming ``fn`` unless ``edge_index`` is a ``[2, E]`` int32 or
    int64 tensor (on ``device`` when one is given)."""
    if not isinstance(edge_index, torch.Tensor):
        raise TypeError(f"{fn}: edge_index must be a torch.Tensor, got {type(edge_index).__name__}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"{fn}: edge_index must have shape [2, E], got {list(edge_index.shape)}")
    if edge_index.dtype not in INDEX_DTYPES:
        raise TypeError(f"{fn}: edge_index must be int64 or int32, got {edge_index.dtype}")
    if device is not None and edge_index.device != device:
        raise ValueError(f"{fn}: edge_index is on {edge_index.device} but the features are on {device}")


def check_float(t, name: str, fn: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{fn}: {name} must be float32, float64, float16 or bfloat16, got {t.dtype}")


def check_count(value, name: str, fn: str) -> int:
    """A non-negative int (a 0-d tensor is read); anything else raises a ValueError."""
    if isinstance(value, torch.Tensor):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{fn}: {name} must be a non-negative int, got {value!r}")
    return value


def check_range(idx: torch.Tensor, bound: int, what: str) -> None:
    """Raises an IndexError unless every entry of ``idx`` lies in ``[0, bound)``."""
    if idx.numel() == 0:
        return
    lo, hi = torch.aminmax(idx)
    lo, hi = int(lo), int(hi)
    if lo < 0:
        raise IndexError(f"{what} holds the negative index {lo}; node indices must be >= 0")
    if hi >= bound:
        raise IndexError(f"{what} holds index {hi}, out of range for {bound} nodes")


__all__ = ["INDEX_DTYPES", "FLOAT_DTYPES", "is_edge_index", "check_edge_index", "check_float",
           "check_count", "check_range"]
