"""Bit-level comparisons the generated-kernel tests share (tests/codegen): a float tensor's bit
pattern, equality bit for bit, and a callable run once on the interpreter and once on the
generated kernels."""
from __future__ import annotations

from typing import Any, Callable, Tuple

import torch


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit pattern as an integer view (int64 for float64, int32 for float32)."""
    if t.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"bits: float32 or float64 tensor expected, got {t.dtype}")
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, *, any_nan: bool = False) -> None:
    """``a`` and ``b`` equal bit for bit (same shape and dtype). With ``any_nan`` a NaN matches any
    NaN (its payload and sign left to the instruction that made it) and every other value is
    compared bit for bit."""
    assert a.shape == b.shape, f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"
    assert a.dtype == b.dtype, f"dtypes differ: {a.dtype} vs {b.dtype}"
    if any_nan:
        nan = torch.isnan(a)
        assert torch.equal(nan, torch.isnan(b)), "NaN in different places"
        assert torch.equal(bits(a)[~nan], bits(b)[~nan]), "values differ in their bits"
    else:
        assert torch.equal(bits(a), bits(b)), "values differ in their bits"


def interpreted_then_generated(fn: Callable[[], Any]) -> Tuple[Any, Any, int]:
    """``fn()`` with the generated kernels suspended (the interpreter runs), then with them back:
    (interpreter's result, generated kernels' result, generated-kernel calls made by the second)."""
    from .. import codegen

    codegen.suspend()
    try:
        ref = fn()
    finally:
        codegen.resume()
    before = codegen.calls()
    out = fn()
    return ref, out, codegen.calls() - before


__all__ = ["bits", "assert_same_bits", "interpreted_then_generated"]
