"""The bit-level checks the generated-kernel tests rely on must be able to fail."""
from __future__ import annotations

import pytest
import torch

from gnncompile.testing.bits import assert_same_bits, bits


def test_bits_views_the_pattern():
    assert bits(torch.tensor([1.0])).item() == 0x3F800000
    assert bits(torch.tensor([-0.0], dtype=torch.float64)).item() == -(2**63)
    with pytest.raises(TypeError, match="float32 or float64"):
        bits(torch.tensor([1], dtype=torch.int32))


def test_same_bits_fails_on_a_last_bit_and_on_signed_zero():
    a = torch.tensor([1.0, 2.0])
    b = a.clone()
    b.view(torch.int32)[1] += 1  # one ulp
    with pytest.raises(AssertionError, match="bits"):
        assert_same_bits(a, b)
    with pytest.raises(AssertionError, match="bits"):
        assert_same_bits(torch.tensor([0.0]), torch.tensor([-0.0]))
    with pytest.raises(AssertionError, match="dtypes"):
        assert_same_bits(a, a.double())
    with pytest.raises(AssertionError, match="shapes"):
        assert_same_bits(a, a[:1])
    assert_same_bits(a, a.clone())


def test_any_nan_matches_nan_payloads_but_not_places():
    a = torch.tensor([float("nan"), 1.0])
    b = a.clone()
    b.view(torch.int32)[0] ^= 1  # another NaN payload
    with pytest.raises(AssertionError):
        assert_same_bits(a, b)
    assert_same_bits(a, b, any_nan=True)
    with pytest.raises(AssertionError, match="NaN"):
        assert_same_bits(a, torch.tensor([1.0, float("nan")]), any_nan=True)
