"""gnncompile::message_softmax: PyG's softmax aggregation (SoftmaxAggregation: alpha =
softmax(t * m) per row and feature, out = sum alpha * m) of a message program's messages in one
pass per row. The native kernel against the torch reference and against PyG's own formula,
gradients (the messages' inputs and the temperature) against finite differences and against
autograd through PyG's formula, and bad input refused."""
from __future__ import annotations

import warnings

import pytest
import torch

from gnncompile.ops import message as M
from gnncompile.ops import program as P
from gnncompile.ops import structure
from gnncompile.ops.schemas import ops

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.utils import softmax as pyg_softmax

N_SRC, N_DST, E = 9, 7, 40
I0, I1, I2, I3 = (P.inp(k) for k in range(4))
SIDES = [P.COL, P.ROW, P.EDGE, P.CONST]
# GENConv's message relu(x_j + e) + eps, and one reading every side
PROGRAMS = {
    "genconv": P.node("add", P.node("relu", P.node("add", I0, I2)), P.const(1e-7)),
    "mixed": P.node("mul", P.node("tanh", P.node("sub", I0, I1)), P.node("add", I2, I3)),
}


def _structure(seed=0, n_src=N_SRC, n_dst=N_DST, e=E):
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n_src, (e,), generator=g), torch.randint(0, n_dst, (e,), generator=g)
    dst[0] = 0  # (row N_DST - 1 may be empty: rows without edges are part of the test)
    rowptr, col, perm = ops.build_csr(dst, src, n_dst, n_src)
    return (rowptr, col, perm), structure.transpose_structure(rowptr, col, perm, n_src), (src, dst)


def _inputs(dtype, F, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(N_SRC, F, dtype=dtype, generator=g), torch.randn(N_DST, F, dtype=dtype, generator=g),
            torch.randn(E, 1, dtype=dtype, generator=g), torch.randn(1, F, dtype=dtype, generator=g)]


def _pyg(expr, ins, t, edges, F):
    """PyG's SoftmaxAggregation over the messages, computed as PyG does (per-edge tensors)."""
    src, dst = edges
    vals = [ins[0][src], ins[1][dst], ins[2], ins[3]]
    code, consts = P.encode(expr)
    m = P.evaluate(code, consts, vals, F).expand(E, F)
    alpha = pyg_softmax(m * t.view(1, -1), dst, num_nodes=N_DST, dim=0)
    return torch.zeros(N_DST, F, dtype=m.dtype).index_add_(0, dst, m * alpha)


@pytest.mark.parametrize("Wt", [1, "F"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_native_matches_reference_and_pyg(name, dtype, Wt):
    F = 70 if dtype == torch.float64 else 140  # more than one tile, not a multiple of it
    Wt = F if Wt == "F" else Wt
    code, consts = P.encode(PROGRAMS[name])
    csr, _, edges = _structure()
    ins = _inputs(dtype, F)
    t = (torch.rand(1, Wt, dtype=dtype, generator=torch.Generator().manual_seed(5)) * 3 + 0.2)
    out, lse = ops.message_softmax(*csr, ins, SIDES, code, consts, F, t, [], [])
    ref, ref_lse = M.message_softmax(*csr, ins, SIDES, code, consts, F, t)
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(lse, ref_lse, **tol)
    torch.testing.assert_close(out, _pyg(PROGRAMS[name], ins, t.view(-1).repeat_interleave(F // Wt), edges, F), **tol)
    empty = csr[0][1:] == csr[0][:-1]
    assert torch.all(out[empty] == 0)


def test_online_maximum_with_large_scores():
    """Scores far beyond exp's range (t * m ~ 1e3): the running maximum keeps the sums finite."""
    code, consts = P.encode(PROGRAMS["genconv"])
    csr, _, edges = _structure(2)
    ins = [x * 300 for x in _inputs(torch.float32, 16, seed=4)]
    t = torch.full((1, 1), 4.0)
    out, _ = ops.message_softmax(*csr, ins, SIDES, code, consts, 16, t, [], [])
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, _pyg(PROGRAMS["genconv"], ins, t.view(-1).expand(16), edges, 16),
                               rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("Wt", [1, 5])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_gradients_match_finite_differences(name, Wt):
    code, consts = P.encode(PROGRAMS[name])
    csr, csc, _ = _structure(3)
    F = 5
    ins = [x.requires_grad_() for x in _inputs(torch.float64, F, seed=7)]
    t = torch.full((1, Wt), 0.7, dtype=torch.float64).add_(torch.arange(Wt) * 0.3).requires_grad_()

    def f(*xs):
        return ops.message_softmax(*csr, list(xs[:-1]), SIDES, code, consts, F, xs[-1], [], list(csc))[0]

    assert torch.autograd.gradcheck(f, [*ins, t], eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_match_pyg_autograd(dtype):
    """Forward and backward (inputs and t) against autograd through PyG's formula, without the CSC
    (built by the backward) and with it."""
    F = 33
    code, consts = P.encode(PROGRAMS["mixed"])
    csr, csc, edges = _structure(4)
    base = _inputs(dtype, F, seed=11)
    g = torch.randn(N_DST, F, dtype=dtype, generator=torch.Generator().manual_seed(3))
    ref_ins = [x.clone().requires_grad_() for x in base]
    ref_t = torch.tensor([1.3], dtype=dtype, requires_grad=True)
    ref = _pyg(PROGRAMS["mixed"], ref_ins, ref_t.expand(F), edges, F)
    ref_grads = torch.autograd.grad(ref, ref_ins + [ref_t], g)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    for c in ([], list(csc)):
        ins = [x.clone().requires_grad_() for x in base]
        t = torch.tensor([[1.3]], dtype=dtype, requires_grad=True)
        out = ops.message_softmax(*csr, ins, SIDES, code, consts, F, t, [], c)[0]
        torch.testing.assert_close(out, ref.detach(), **tol)
        grads = torch.autograd.grad(out, ins + [t], g)
        for a, b in zip(grads, ref_grads):
            torch.testing.assert_close(a.reshape(b.shape), b, **tol)


def test_reference_is_the_fallback_and_fake_shapes():
    code, consts = P.encode(PROGRAMS["genconv"])
    csr, _, _ = _structure(5)
    ins = _inputs(torch.float32, 8)
    t = torch.ones(1, 1)
    out = torch.library.opcheck(ops.message_softmax, (*csr, ins, SIDES, code, consts, 8, t, [], []),
                                test_utils=("test_schema", "test_faketensor"))
    assert out["test_schema"] == "SUCCESS" and out["test_faketensor"] == "SUCCESS"


def test_bad_input_raises():
    code, consts = P.encode(PROGRAMS["genconv"])
    csr, _, _ = _structure(6)
    ins = _inputs(torch.float32, 8)
    for op in (ops.message_softmax, M.message_softmax):
        with pytest.raises(ValueError, match="t has shape"):
            op(*csr, ins, SIDES, code, consts, 8, torch.ones(1, 3), [], [])  # 3 does not divide 8
        with pytest.raises(ValueError, match="t has shape"):
            op(*csr, ins, SIDES, code, consts, 8, torch.ones(2, 1), [], [])
        with pytest.raises(TypeError):
            op(*csr, ins, SIDES, code, consts, 8, torch.ones(1, 1, dtype=torch.float64), [], [])
    bad_col = csr[1].clone()
    bad_col[0] = N_SRC + 5
    with pytest.raises((ValueError, IndexError, RuntimeError)):
        ops.message_softmax(csr[0], bad_col, csr[2], ins, SIDES, code, consts, 8, torch.ones(1, 1), [], [])


def test_lse_is_not_differentiable():
    code, consts = P.encode(PROGRAMS["genconv"])
    csr, _, _ = _structure(7)
    ins = [x.requires_grad_() for x in _inputs(torch.float64, 4)]
    out, lse = ops.message_softmax(*csr, ins, SIDES, code, consts, 4, torch.ones(1, 1, dtype=torch.float64), [], [])
    assert out.requires_grad and not lse.requires_grad
