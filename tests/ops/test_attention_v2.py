"""gnncompile::attention_v2 and its backward (native/cpu/attention_v2_core.h, GATv2's attention):
against the chain it fuses written with torch and PyG (softmax, dropout, aggregation,
differentiated by autograd), against the pure-torch reference, gradcheck, empty rows, bipartite
sizes, determinism across thread counts, and bad input."""
from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import softmax as pyg_softmax

from gnncompile.ops import reference
from gnncompile.ops.structure import transpose_structure

from shared import attention_graph

ops = torch.ops.gnncompile


def _graph(N=60, M=50, E=600, seed=0, dtype=torch.int64):
    return attention_graph(N, M, E, seed, dtype)


def _inputs(N, M, E, H, C, dtype, edge, seed=1):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).requires_grad_()

    return r(N, H, C), r(M, H, C), r(1, H, C), (r(E, H, C) if edge else None)


def _chain(src, dst, M, x_l, x_r, att, e, slope, p, seed):
    """GATv2Conv's attention as PyG computes it (edge order), dropout by the dropout op."""
    z = x_r[dst] + x_l[src]
    if e is not None:
        z = z + e
    s = (torch.nn.functional.leaky_relu(z, slope) * att).sum(-1)
    alpha = pyg_softmax(s, dst, num_nodes=M)
    if p > 0:
        alpha = ops.dropout(alpha.contiguous(), p, seed)
    return torch.zeros(M, *x_l.shape[1:], dtype=x_l.dtype).index_add(0, dst, x_l[src] * alpha.unsqueeze(-1))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("edge", [False, True])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("H", [1, 4])
def test_forward_and_gradients_equal_the_chain(dtype, tol, edge, p, H):
    N, M, E, C = 60, 50, 600, 8
    src, dst, csr, csc = _graph(N, M, E)
    x_l, x_r, att, e = _inputs(N, M, E, H, C, dtype, edge)
    seed = torch.tensor(1234)
    want = _chain(src, dst, M, x_l, x_r, att, e, 0.2, p, seed)
    got, stats = ops.attention_v2(*csr, x_l, x_r, att, e, 0.2, p, seed if p else None, [], *csc)
    assert got.shape == (M, H, C) and got.dtype == dtype
    assert stats.shape == (M, 2, H) and stats.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale)
    g = torch.randn_like(want)
    ins = [t for t in (x_l, x_r, att, e) if t is not None]
    for a, b in zip(torch.autograd.grad(got, ins, g), torch.autograd.grad(want, ins, g)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(b.abs().max().item(), 1.0))


def test_dropout_mask_is_the_dropout_ops_and_regenerated_in_backward():
    """Same seed, same output and gradients (the backward regenerates the mask); another seed,
    another result; about p of the coefficients dropped."""
    N, M, E, H, C = 40, 30, 3000, 2, 4
    _, _, csr, csc = _graph(N, M, E)
    x_l, x_r, att, _ = _inputs(N, M, E, H, C, torch.float64, False)
    outs = [ops.attention_v2(*csr, x_l, x_r, att, None, 0.2, 0.5, torch.tensor(s), [], *csc)[0] for s in (1, 2, 1)]
    assert torch.equal(outs[0], outs[2]) and not torch.allclose(outs[0], outs[1])
    g = torch.randn_like(outs[0])
    ga = torch.autograd.grad(outs[0], (x_l, x_r, att), g)
    gc = torch.autograd.grad(outs[2], (x_l, x_r, att), g)
    assert all(torch.equal(a, b) for a, b in zip(ga, gc))
    kept = ops.dropout(torch.ones(E, H, dtype=torch.float64), 0.5, torch.tensor(1)) > 0
    assert 0.45 < kept.double().mean().item() < 0.55


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("index", [torch.int64, torch.int32])
def test_native_equals_the_reference(dtype, index):
    N, M, E, H, C = 40, 30, 300, 4, 8
    _, _, csr, csc = _graph(N, M, E, dtype=index)
    x_l, x_r, att, e = (t.detach() for t in _inputs(N, M, E, H, C, dtype, True))
    args = (x_l, x_r, att, e, 0.2, 0.25, torch.tensor(5))
    out, st = ops.attention_v2(*csr, *args, [], *csc)
    r_out, r_st = reference.attention_v2(*csr, *args, [])
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(out, r_out, rtol=tol, atol=tol)
    torch.testing.assert_close(st, r_st, rtol=tol, atol=tol)
    g = torch.randn(out.shape, dtype=torch.float64).to(dtype)
    got = ops.attention_v2_backward(*csr, *args, out, st, g, [], *csc)
    want = reference.attention_v2_backward(*csr, *args, out, st, g, [], *csc)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(1.0, b.abs().max().item()))


def test_gradcheck_float64():
    N, M, E, H, C = 8, 6, 24, 2, 2
    _, _, csr, csc = _graph(N, M, E)
    ins = _inputs(N, M, E, H, C, torch.float64, True)

    def f(x_l, x_r, att, e):
        return ops.attention_v2(*csr, x_l, x_r, att, e, 0.2, 0.0, None, [], *csc)[0]

    assert torch.autograd.gradcheck(f, ins)


def test_bipartite_empty_rows_and_no_csc():
    """M != N (x_r one row per destination), destinations without in-edges (zero rows and zero
    x_r gradients), the backward building its own CSC."""
    N, M, E, H, C = 30, 45, 150, 2, 4
    src, dst, csr, csc = _graph(N, M, E)
    assert (torch.bincount(dst, minlength=M) == 0).any()
    x_l, x_r, att, _ = _inputs(N, M, E, H, C, torch.float64, False)
    out, _ = ops.attention_v2(*csr, x_l, x_r, att, None, 0.2, 0.0, None, [])
    want = _chain(src, dst, M, x_l, x_r, att, None, 0.2, 0.0, None)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (x_l, x_r, att), g)
    for a, b in zip(got, torch.autograd.grad(want, (x_l, x_r, att), g)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    empty = torch.bincount(dst, minlength=M) == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty])) and torch.equal(got[1][empty], torch.zeros_like(got[1][empty]))
    # no edges at all
    none = ops.build_csr(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 4, 3)
    xl = torch.randn(3, 2, 2, requires_grad=True)
    o, s = ops.attention_v2(*none, xl, torch.randn(4, 2, 2), torch.randn(2, 2), None, 0.2, 0.0, None, [])
    assert torch.equal(o, torch.zeros(4, 2, 2)) and torch.equal(s, torch.zeros(4, 2, 2))
    assert torch.equal(torch.autograd.grad(o.sum(), xl)[0], torch.zeros_like(xl))


def test_bits_do_not_depend_on_the_thread_count():
    N, M, E, H, C = 300, 300, 5000, 4, 8
    _, _, csr, csc = _graph(N, M, E)
    x_l, x_r, att, e = _inputs(N, M, E, H, C, torch.float32, True)
    threads = torch.get_num_threads()
    res = []
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            out, _ = ops.attention_v2(*csr, x_l, x_r, att, e, 0.2, 0.1, torch.tensor(3), [], *csc)
            res.append((out, *torch.autograd.grad(out, (x_l, x_r, att, e), torch.ones_like(out))))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(*res))


def _bad(**over):
    N, M, E, H, C = 6, 5, 20, 2, 3
    _, _, csr, csc = _graph(N, M, E)
    kw = dict(rowptr=csr[0], col=csr[1], perm=csr[2], x_l=torch.randn(N, H, C), x_r=torch.randn(M, H, C),
              att=torch.randn(H, C), e_term=None, negative_slope=0.2, p=0.0, seed=None)
    kw.update(over)
    return kw


@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("over,err,msg", [
    (dict(x_l=torch.randn(6, 6)), ValueError, "x_l must be"),
    (dict(x_r=torch.randn(6, 2, 3)), ValueError, "x_r must be"),
    (dict(att=torch.randn(2, 4)), ValueError, "att must be"),
    (dict(e_term=torch.randn(19, 2, 3)), ValueError, "e_term must be"),
    (dict(x_r=torch.randn(5, 2, 3, dtype=torch.float64)), TypeError, "dtype"),
    (dict(p=1.0, seed=torch.tensor(1)), ValueError, "dropout p"),
    (dict(p=0.5), ValueError, "needs a seed"),
    (dict(negative_slope=float("inf")), ValueError, "negative_slope"),
    (dict(col=torch.full((20,), 9)), IndexError, "out of range"),
    (dict(perm=torch.full((20,), 20)), IndexError, "perm"),
])
def test_bad_input_is_a_clear_error(impl, over, err, msg):
    kw = _bad(**over)
    fn = ops.attention_v2 if impl == "native" else reference.attention_v2
    with pytest.raises(err, match=msg):
        fn(*kw.values(), [])


def test_backward_refuses_a_csc_of_other_sizes_and_a_second_derivative():
    N, M, E, H, C = 6, 5, 20, 2, 3
    _, _, csr, csc = _graph(N, M, E)
    x_l, x_r, att, _ = _inputs(N, M, E, H, C, torch.float64, False)
    out, st = ops.attention_v2(*csr, x_l, x_r, att, None, 0.2, 0.0, None, [], *csc)
    g = torch.randn_like(out)
    bad_csc = transpose_structure(*csr, N + 1)
    with pytest.raises(ValueError, match="transpose"):
        ops.attention_v2_backward(*csr, x_l, x_r, att, None, 0.2, 0.0, None, out, st, g, [], *bad_csc)
    (gx,) = torch.autograd.grad(out, x_l, g, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(gx.sum(), x_l)
