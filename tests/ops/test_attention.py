"""gnncompile::attention and its backward (native/cpu/attention_core.h): against the chain it
fuses written with torch and PyG (softmax, dropout, aggregation, differentiated by autograd),
against the pure-torch reference (gnncompile/ops/reference.py), at the edges of its domain (empty
rows, no edges, -inf and large logits, int32 indices, 16-bit features), and on bad input."""
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
    x = torch.randn(N, H, C, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    a_s = torch.randn(N, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    a_d = torch.randn(M, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    a_e = torch.randn(E, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_() if edge else None
    return x, a_s, a_d, a_e


def _chain(src, dst, M, x, a_s, a_d, a_e, slope, p, seed):
    """GATConv's attention as PyG computes it (edge order), dropout by the dropout op."""
    raw = a_s[src] + a_d[dst]
    if a_e is not None:
        raw = raw + a_e
    alpha = pyg_softmax(torch.nn.functional.leaky_relu(raw, slope), dst, num_nodes=M)
    if p > 0:
        alpha = ops.dropout(alpha.contiguous(), p, seed)
    return torch.zeros(M, *x.shape[1:], dtype=x.dtype).index_add(0, dst, x[src] * alpha.unsqueeze(-1))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("edge", [False, True])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("H", [1, 4])
def test_forward_and_gradients_equal_the_chain(dtype, tol, edge, p, H):
    N, M, E, C = 60, 50, 600, 8
    src, dst, csr, csc = _graph(N, M, E)
    x, a_s, a_d, a_e = _inputs(N, M, E, H, C, dtype, edge)
    seed = torch.tensor(1234)
    want = _chain(src, dst, M, x, a_s, a_d, a_e, 0.2, p, seed)
    got, stats = ops.attention(*csr, x, a_s, a_d, a_e, 0.2, p, seed if p else None, [], *csc)
    assert got.shape == (M, H, C) and got.dtype == dtype
    assert stats.shape == (M, 2, H) and stats.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale)
    g = torch.randn_like(want)
    ins = [t for t in (x, a_s, a_d, a_e) if t is not None]
    for a, b in zip(torch.autograd.grad(got, ins, g), torch.autograd.grad(want, ins, g)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(b.abs().max().item(), 1.0))


def test_dropout_drops_the_coefficients_the_dropout_op_drops():
    """With dropout, out equals the chain whose mask is ops.dropout's with the same seed (the
    test above); here: the mask matters (another seed, another result) and about p are dropped."""
    N, M, E, H, C = 60, 50, 4000, 2, 4
    _, _, csr, csc = _graph(N, M, E)
    x, a_s, a_d, _ = _inputs(N, M, E, H, C, torch.float64, False)
    a, _ = ops.attention(*csr, x, a_s, a_d, None, 0.2, 0.5, torch.tensor(1), [], *csc)
    b, _ = ops.attention(*csr, x, a_s, a_d, None, 0.2, 0.5, torch.tensor(2), [], *csc)
    c, _ = ops.attention(*csr, x, a_s, a_d, None, 0.2, 0.5, torch.tensor(1), [], *csc)
    assert torch.equal(a, c) and not torch.allclose(a, b)
    kept = ops.dropout(torch.ones(E, H, dtype=torch.float64), 0.5, torch.tensor(1)) > 0
    assert 0.45 < kept.double().mean().item() < 0.55


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("index", [torch.int64, torch.int32])
def test_native_equals_the_reference(dtype, index):
    N, M, E, H, C = 40, 30, 300, 4, 8
    _, _, csr, csc = _graph(N, M, E, dtype=index)
    x, a_s, a_d, a_e = (t.detach() if t is not None else None for t in _inputs(N, M, E, H, C, dtype, True))
    args = (x, a_s, a_d, a_e, 0.2, 0.25, torch.tensor(5))
    out, st = ops.attention(*csr, *args, [], *csc)
    r_out, r_st = reference.attention(*csr, *args, [])
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(out, r_out, rtol=tol, atol=tol)
    torch.testing.assert_close(st, r_st, rtol=tol, atol=tol)
    g = torch.randn(out.shape, dtype=torch.float64).to(dtype)
    got = ops.attention_backward(*csr, *args, out, st, g, [], *csc)
    want = reference.attention_backward(*csr, *args, out, st, g, [], *csc)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(1.0, b.abs().max().item()))


@pytest.mark.parametrize("edge", [False, True])
def test_gradcheck_float64(edge):
    """Without and with the edge term (whose gradient is the logit gradients in edge order)."""
    N, M, E, H, C = 12, 10, 50, 2, 3
    _, _, csr, csc = _graph(N, M, E)
    x, a_s, a_d, a_e = _inputs(N, M, E, H, C, torch.float64, edge)

    def f(x, a_s, a_d, *a_e):
        return ops.attention(*csr, x, a_s, a_d, a_e[0] if a_e else None, 0.2, 0.0, None, [], *csc)[0]

    assert torch.autograd.gradcheck(f, (x, a_s, a_d) + ((a_e,) if edge else ()))


@pytest.mark.parametrize("H,edge", [(4, False), (3, False), (4, True)])
def test_backward_bits_do_not_depend_on_the_threads(H, edge):
    """The destinations' gradient is summed in one fixed order however the rows are split
    (threads, chunks per thread): the same bits from 1 thread as from 2 with many chunks, and
    with any prefetch distance."""
    N, M, E, C = 300, 200, 5000, 8
    _, _, csr, csc = _graph(N, M, E)
    x, a_s, a_d, a_e = _inputs(N, M, E, H, C, torch.float32, edge)
    out, st = ops.attention(*csr, x, a_s, a_d, a_e, 0.2, 0.1, torch.tensor(5), [], *csc)
    g = torch.randn_like(out)
    threads = torch.get_num_threads()
    runs = []
    try:
        for n, knobs in ((1, []), (2, [16]), (2, []), (2, [4, 1]), (1, [0, 64])):
            torch.set_num_threads(n)
            runs.append(ops.attention_backward(*csr, x, a_s, a_d, a_e, 0.2, 0.1, torch.tensor(5), out, st, g, knobs,
                                               *csc))
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


def test_without_a_csc_the_backward_builds_one():
    N, M, E, H, C = 30, 20, 200, 2, 4
    _, _, csr, csc = _graph(N, M, E)
    x, a_s, a_d, _ = _inputs(N, M, E, H, C, torch.float64, False)
    g = torch.randn(M, H, C, dtype=torch.float64)
    with_csc = torch.autograd.grad(ops.attention(*csr, x, a_s, a_d, None, 0.2, 0.0, None, [], *csc)[0], (x, a_s, a_d), g)
    without = torch.autograd.grad(ops.attention(*csr, x, a_s, a_d, None, 0.2, 0.0, None, [])[0], (x, a_s, a_d), g)
    for a, b in zip(with_csc, without):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_empty_rows_no_edges_and_extreme_logits():
    # rows 0 and 3 have no edges; logits of -inf (a row all -inf), +-80 (the exp at its range's end)
    src = torch.tensor([0, 1, 2, 0, 1])
    dst = torch.tensor([1, 1, 2, 4, 4])
    rowptr, col, perm = ops.build_csr(dst, src, 5, 3)
    csc = transpose_structure(rowptr, col, perm, 3)
    x = torch.randn(3, 1, 4, dtype=torch.float32)
    a_s = torch.tensor([[80.0], [-80.0], [float("-inf")]])
    a_d = torch.zeros(5, 1)
    out, st = ops.attention(rowptr, col, perm, x, a_s, a_d, None, 1.0, 0.0, None, [], *csc)
    want = _chain(src, dst, 5, x.double(), a_s.double(), a_d.double(), None, 1.0, 0.0, None).float()
    assert torch.equal(out[0], torch.zeros(1, 4)) and torch.equal(out[3], torch.zeros(1, 4))
    keep = torch.tensor([0, 1, 3, 4])
    torch.testing.assert_close(out[keep], want[keep], rtol=1e-5, atol=1e-6)
    # row 2's only logit is -inf: PyG's softmax gives NaN (-inf - -inf); gnncompile's edge_softmax
    # gives 0 coefficients there (its rule for a row of -inf), and so does the fused op
    assert torch.isnan(want[2]).all() and torch.equal(out[2], torch.zeros(1, 4))
    alpha = ops.edge_softmax(rowptr, perm, torch.tensor([[80.0], [-80.0], [float("-inf")], [80.0], [-80.0]]), [])
    assert alpha[2].item() == 0.0
    # no edges at all: zeros, and zero gradients
    empty = ops.build_csr(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 4, 3)
    xe = torch.randn(3, 2, 2, requires_grad=True)
    o, s = ops.attention(*empty, xe, torch.randn(3, 2), torch.randn(4, 2), None, 0.2, 0.0, None, [])
    assert torch.equal(o, torch.zeros(4, 2, 2)) and torch.equal(s, torch.zeros(4, 2, 2))
    (gx,) = torch.autograd.grad(o.sum(), xe)
    assert torch.equal(gx, torch.zeros_like(xe))


def test_exp_is_within_a_few_ulp():
    """The kernel's exp (exp_approx) against float64, over the logits a softmax meets."""
    src = torch.arange(2000) % 7
    dst = torch.zeros(2000, dtype=torch.long)
    rowptr, col, perm = ops.build_csr(dst, src, 1, 7)
    x = torch.zeros(7, 1, 1)
    x[0] = 1.0  # out = the summed coefficients of source 0's edges
    a_s = torch.linspace(-60, 0, 7).view(7, 1)
    out, st = ops.attention(rowptr, col, perm, x, a_s, torch.zeros(1, 1), None, 1.0, 0.0, None, [])
    a64 = a_s.double().view(-1)
    want = (torch.exp(a64[0]) / torch.exp(a64)[src].sum()).item() * (src == 0).sum().item()
    assert abs(out.item() - want) <= 1e-6 * want


def _bad(**over):
    N, M, E, H, C = 6, 5, 20, 2, 3
    _, _, csr, csc = _graph(N, M, E)
    kw = dict(rowptr=csr[0], col=csr[1], perm=csr[2], x=torch.randn(N, H, C), a_src=torch.randn(N, H),
              a_dst=torch.randn(M, H), a_edge=None, negative_slope=0.2, p=0.0, seed=None)
    kw.update(over)
    return ops.attention(*kw.values(), [])


@pytest.mark.parametrize("over,err,msg", [
    (dict(x=torch.randn(6, 6)), ValueError, "x must be"),
    (dict(a_src=torch.randn(5, 2)), ValueError, "a_src must be"),
    (dict(a_dst=torch.randn(5, 3)), ValueError, "a_dst must be"),
    (dict(a_edge=torch.randn(19, 2)), ValueError, "a_edge must be"),
    (dict(a_src=torch.randn(6, 2, dtype=torch.float64)), TypeError, "dtype"),
    (dict(p=1.0, seed=torch.tensor(1)), ValueError, "dropout p"),
    (dict(p=0.5), ValueError, "needs a seed"),
    (dict(negative_slope=float("inf")), ValueError, "negative_slope"),
    (dict(col=torch.full((20,), 9)), IndexError, "out of range"),
    (dict(perm=torch.full((20,), 20)), IndexError, "perm"),
    (dict(rowptr=torch.tensor([0, 5, 3, 20, 20, 20])), ValueError, "rowptr"),
])
def test_bad_input_is_a_clear_error(over, err, msg):
    with pytest.raises(err, match=msg):
        _bad(**over)


def test_backward_refuses_a_csc_of_other_sizes_and_a_second_derivative():
    N, M, E, H, C = 6, 5, 20, 2, 3
    _, _, csr, csc = _graph(N, M, E)
    x, a_s, a_d, _ = _inputs(N, M, E, H, C, torch.float64, False)
    out, st = ops.attention(*csr, x, a_s, a_d, None, 0.2, 0.0, None, [], *csc)
    g = torch.randn_like(out)
    bad_csc = transpose_structure(*csr, N + 1)
    with pytest.raises(ValueError, match="transpose"):
        ops.attention_backward(*csr, x, a_s, a_d, None, 0.2, 0.0, None, out, st, g, [], *bad_csc)
    (gx,) = torch.autograd.grad(out, x, g, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(gx.sum(), x)


def test_noncontiguous_inputs():
    N, M, E, H, C = 20, 15, 100, 2, 3
    _, _, csr, csc = _graph(N, M, E)
    x = torch.randn(N, C, H).transpose(1, 2)
    a_s = torch.randn(H, N).t()
    a_d = torch.randn(M, H)
    got, _ = ops.attention(*csr, x, a_s, a_d, None, 0.2, 0.0, None, [], *csc)
    want, _ = ops.attention(*csr, x.contiguous(), a_s.contiguous(), a_d, None, 0.2, 0.0, None, [], *csc)
    assert torch.equal(got, want)
