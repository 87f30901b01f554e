"""gnncompile::spmm_self (spmm's sum + scale * x, GINConv's self term): bit for bit the two ops
it replaces (the native kernel adds the rounded product after the row's sum, no fused
multiply-add), gradients equal to theirs, the reference, bad input, opcheck."""
from __future__ import annotations

import pytest
import torch

from gnncompile.ops import reference, transpose_structure
from gnncompile.ops.schemas import ops


def _structure(n=40, e=300, index_dtype=torch.int64, seed=0, isolated=True):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e,), generator=g)
    dst = torch.randint(0, n - 3 if isolated else n, (e,), generator=g)  # rows n-3.. isolated
    src = torch.cat([src, torch.tensor([0, 0, 4])])  # a self loop and a duplicate pair
    dst = torch.cat([dst, torch.tensor([0, 0, 4])])
    src, dst = src.to(index_dtype), dst.to(index_dtype)
    return ops.build_csr(dst, src, n, n)


def _separate(s, x, rowptr, col, perm):
    """What the graph computed before the fold: spmm, then mul, then add."""
    return ops.spmm(rowptr, col, perm, None, x, "sum", [])[0] + s * x


@pytest.mark.parametrize("F", [1, 7, 64, 200])  # narrow, odd, one tile, more than one tile (128)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_bit_equal_to_the_separate_ops(native, dtype, index_dtype, F):
    rowptr, col, perm = _structure(index_dtype=index_dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, F, generator=g, dtype=dtype)
    for s in (torch.tensor(1.0), torch.tensor(1.3), torch.tensor(-0.7, dtype=torch.float64)):
        s = s.to(dtype) if s.dtype != dtype and dtype == torch.float64 else s
        got = ops.spmm_self(rowptr, col, perm, x, s, [])
        assert got.dtype == dtype and got.shape == x.shape
        assert torch.equal(got, _separate(s, x, rowptr, col, perm)), (dtype, F, float(s))
    # the isolated rows hold the term alone
    assert torch.equal(got[-3:], (s * x)[-3:])


def test_knobs_and_blocks_change_no_bit(native):
    rowptr, col, perm = _structure(n=400, e=4000)
    x = torch.randn(400, 96)
    s = torch.tensor(1.25)
    want = _separate(s, x, rowptr, col, perm)
    for knobs in ([], [1], [64, 2], [8, 16, 4096]):  # grain, prefetch distance, column block budget
        assert torch.equal(ops.spmm_self(rowptr, col, perm, x, s, knobs), want), knobs


def test_no_edges(native):
    rowptr, col, perm = ops.build_csr(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 5, 5)
    x = torch.randn(5, 3)
    s = torch.tensor(2.5)
    assert torch.equal(ops.spmm_self(rowptr, col, perm, x, s, []), s * x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_reference_agrees(dtype):
    rowptr, col, perm = _structure()
    x = torch.randn(40, 16, dtype=dtype)
    s = torch.tensor(0.5, dtype=dtype)
    ref = reference.spmm_self(rowptr, col, perm, x, s)
    torch.testing.assert_close(ref, ops.spmm(rowptr, col, perm, None, x, "sum", [])[0] + s * x)
    torch.testing.assert_close(ops.spmm_self(rowptr, col, perm, x, s, []), ref)


@pytest.mark.parametrize("with_transpose", [False, True])
def test_gradients_equal_the_separate_ops(native, with_transpose):
    rowptr, col, perm = _structure()
    t = transpose_structure(rowptr, col, perm, 40) if with_transpose else (None, None, None)
    x0 = torch.randn(40, 64)
    s0 = torch.tensor(1.1)
    grad = torch.randn(40, 64)
    x1, s1 = x0.clone().requires_grad_(), s0.clone().requires_grad_()
    out = ops.spmm_self(rowptr, col, perm, x1, s1, [], *t)
    out.backward(grad)
    x2, s2 = x0.clone().requires_grad_(), s0.clone().requires_grad_()
    (ops.spmm(rowptr, col, perm, None, x2, "sum", [], *t)[0] + s2 * x2).backward(grad)
    assert torch.equal(out, ops.spmm(rowptr, col, perm, None, x0, "sum", [])[0] + s0 * x0)
    assert torch.equal(x1.grad, x2.grad)  # A^T g + s g: the transposed sum, then the rounded product
    torch.testing.assert_close(s1.grad, s2.grad, rtol=1e-6, atol=1e-6)


def test_gradcheck():
    rowptr, col, perm = _structure(n=12, e=40)
    x = torch.randn(12, 3, dtype=torch.float64, requires_grad=True)
    s = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, s: ops.spmm_self(rowptr, col, perm, x, s, []), (x, s))
    assert torch.autograd.gradgradcheck(lambda x, s: ops.spmm_self(rowptr, col, perm, x, s, []), (x, s))


def test_opcheck():
    rowptr, col, perm = _structure(n=12, e=40)
    x = torch.randn(12, 5, requires_grad=True)
    torch.library.opcheck(ops.spmm_self, (rowptr, col, perm, x, torch.tensor(1.5), []))


def test_bad_input():
    rowptr, col, perm = _structure(n=12, e=40)
    with pytest.raises(ValueError, match="square"):
        ops.spmm_self(rowptr, col, perm, torch.randn(13, 4), torch.tensor(1.0), [])
    with pytest.raises(ValueError, match="float32 or float64"):
        ops.spmm_self(rowptr, col, perm, torch.randn(12, 4).half(), torch.tensor(1.0), [])
    with pytest.raises(ValueError, match="one value"):
        ops.spmm_self(rowptr, col, perm, torch.randn(12, 4), torch.tensor([1.0, 2.0]), [])
    bad = col.clone()
    bad[0] = 99
    with pytest.raises((ValueError, IndexError, RuntimeError), match="99|range|col"):
        ops.spmm_self(rowptr, bad, perm, torch.randn(12, 4), torch.tensor(1.0), [])
