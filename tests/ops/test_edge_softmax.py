"""gnncompile.ops.edge_softmax against torch_geometric.utils.softmax."""
from __future__ import annotations

import pytest
import torch

from gnncompile.ops import edge_softmax, reference, spmm

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int64, torch.int32)
SHAPES = ((), (4,), (2, 3))  # scores [E], [E, H], [E, H, C]
ops = torch.ops.gnncompile


def _case(h, N=15, E=70, shape=(), dtype=torch.float32, index_dtype=torch.int64, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ei = h.random_graph(N, E, generator=g, index_dtype=index_dtype, device=device)
    scores = (3 * torch.randn((E,) + shape, generator=g, dtype=torch.float64)).to(dtype).to(device)
    return ei, scores


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_parity_with_pyg(h, device, dtype, index_dtype, shape):
    ei, scores = _case(h, shape=shape, dtype=dtype, index_dtype=index_dtype, device=device)
    out = edge_softmax(ei, scores)
    assert out.dtype == dtype and out.shape == scores.shape and out.device == scores.device
    h.assert_close(out, h.expected_softmax(ei, scores), dtype)
    # every destination with an edge sums to one per head
    dst = ei[1].long()
    sums = torch.zeros((int(dst.max()) + 1,) + shape, dtype=torch.float64, device=device)
    sums.index_add_(0, dst, out.double())
    has_edge = torch.bincount(dst, minlength=sums.size(0)) > 0
    tol = 1e-6 if dtype in (torch.float32, torch.float64) else 2e-2
    torch.testing.assert_close(sums[has_edge], torch.ones_like(sums[has_edge]), rtol=0, atol=tol)


@pytest.mark.parametrize("num_dst", [15, 40])
def test_explicit_num_dst(h, num_dst):
    ei, scores = _case(h, shape=(3,), seed=1)
    out = edge_softmax(ei, scores, num_dst=num_dst)
    h.assert_close(out, h.expected_softmax(ei, scores, num_dst))
    assert torch.equal(out, edge_softmax(ei, scores))  # trailing empty rows change nothing


def test_bipartite_sources_beyond_destinations(h):
    # sources index a larger node set than the destinations; only destinations matter
    ei = torch.tensor([[0, 9, 7, 3, 8], [0, 0, 1, 1, 1]])
    scores = torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0])
    out = edge_softmax(ei, scores, num_dst=2)
    h.assert_close(out, h.expected_softmax(ei, scores, 2))


def test_values_by_hand():
    ei = torch.tensor([[0, 1, 2, 0], [1, 1, 1, 2]])
    s = torch.tensor([0.0, 1.0, 2.0, 5.0])
    out = edge_softmax(ei, s)
    e = torch.exp(torch.tensor([0.0, 1.0, 2.0]))
    torch.testing.assert_close(out, torch.cat([e / e.sum(), torch.ones(1)]))


def test_unsorted_and_duplicate_edges(h):
    ei = torch.tensor([[2, 0, 2, 1, 2, 0], [1, 0, 1, 0, 1, 1]])
    s = torch.tensor([0.3, -1.0, 0.3, 2.0, 1.5, 0.0])
    out = edge_softmax(ei, s)
    h.assert_close(out, h.expected_softmax(ei, s))
    assert out[0] == out[2]  # duplicate edge, same score -> same weight


def test_non_contiguous_scores(h):
    ei, scores = _case(h, shape=(4,), seed=11)
    nc = scores.t().contiguous().t()[:, ::2]  # [E, 2], strided
    assert not nc.is_contiguous()
    h.assert_close(edge_softmax(ei, nc), h.expected_softmax(ei, nc.contiguous()))


def test_no_edges(h):
    for index_dtype in INDEX_DTYPES:
        ei = torch.empty(2, 0, dtype=index_dtype)
        for shape in ((0,), (0, 3)):
            out = edge_softmax(ei, torch.empty(shape))
            assert out.shape == shape
            assert out.shape == h.expected_softmax(ei, torch.empty(shape)).shape
        assert edge_softmax(ei, torch.empty(0), num_dst=5).shape == (0,)


def test_one_edge(h):
    ei = torch.tensor([[3], [2]])
    for s in (torch.tensor([-7.0]), torch.tensor([[1e4, -1e4]])):
        out = edge_softmax(ei, s)
        torch.testing.assert_close(out, torch.ones_like(s))
        h.assert_close(out, h.expected_softmax(ei, s))


def test_large_scores_do_not_overflow(h):
    ei = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    s = torch.tensor([1000.0, 1000.0, -1000.0, -999.0])
    out = edge_softmax(ei, s)
    assert torch.isfinite(out).all()
    h.assert_close(out, h.expected_softmax(ei, s))
    torch.testing.assert_close(out[:2], torch.tensor([0.5, 0.5]))


def test_some_minus_inf_scores_match_pyg(h):
    inf = float("inf")
    ei = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    s = torch.tensor([-inf, 1.0, 2.0, -inf])
    out = edge_softmax(ei, s)
    exp = h.expected_softmax(ei, s)
    assert torch.isfinite(exp).all()
    torch.testing.assert_close(out, exp)
    torch.testing.assert_close(out, torch.tensor([0.0, 1.0, 1.0, 0.0]))


def test_all_minus_inf_row_gives_zeros_not_nan(h):
    """PyG returns NaN for a destination whose every score is -inf (-inf - -inf); gnncompile
    gives weight 0 to every such edge (like an empty row) and leaves the other rows exact."""
    inf = float("inf")
    ei = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 1, 1, 2]])
    s = torch.tensor([[-inf, 0.5], [-inf, 1.5], [1.0, -inf], [2.0, -inf], [-inf, -inf]],
                     requires_grad=True)
    out = edge_softmax(ei, s)
    exp = h.expected_softmax(ei, s.detach())
    assert torch.isnan(exp).any()  # PyG's behaviour on this input (documented difference)
    assert not torch.isnan(out).any()
    ok = ~torch.isnan(exp)
    torch.testing.assert_close(out[ok], exp[ok])
    assert torch.equal(out[~ok], torch.zeros(int((~ok).sum())))
    (g,) = torch.autograd.grad(out, s, torch.randn(5, 2))
    assert torch.isfinite(g).all()
    assert torch.equal(g[~ok], torch.zeros(int((~ok).sum())))


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_deterministic(h, dtype):
    ei, scores = _case(h, N=200, E=2000, shape=(4,), dtype=dtype, seed=2)
    a = edge_softmax(ei, scores)
    assert torch.equal(a, edge_softmax(ei, scores))
    assert torch.equal(a, edge_softmax(ei.clone(), scores.clone()))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_native_matches_reference(native, h, dtype, index_dtype, shape):
    ei, scores = _case(h, shape=shape, dtype=dtype, index_dtype=index_dtype, seed=3)
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], 15, 15)
    out = ops.edge_softmax(rowptr, perm, scores, [])
    h.assert_close(out, reference.edge_softmax(rowptr, perm, scores).to(h.acc_dtype(dtype)), dtype)
    g = torch.Generator().manual_seed(4)
    grad = torch.randn(scores.shape, generator=g, dtype=torch.float64).to(dtype)
    gb = ops.edge_softmax_backward(rowptr, perm, out, grad, [])
    rb = reference.edge_softmax_backward(rowptr, perm, out, grad)
    h.assert_close(gb, rb.to(h.acc_dtype(dtype)), dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", (torch.float64, torch.float32), ids=str)
def test_gradients_match_pyg(h, dtype, index_dtype, shape):
    ei, scores = _case(h, shape=shape, dtype=dtype, index_dtype=index_dtype, seed=5)
    s1 = scores.clone().requires_grad_()
    s2 = scores.clone().requires_grad_()
    g = torch.Generator().manual_seed(6)
    go = torch.randn(scores.shape, generator=g, dtype=torch.float64).to(dtype)
    (a,) = torch.autograd.grad(edge_softmax(ei, s1), s1, go)
    (b,) = torch.autograd.grad(h.expected_softmax(ei, s2, upcast=False), s2, go)
    assert a.dtype == dtype
    h.assert_close(a, b, dtype)
    assert torch.count_nonzero(b) > 0


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_gradients_16bit(h, dtype):
    ei, scores = _case(h, shape=(2,), dtype=dtype, seed=7)
    s1 = scores.clone().requires_grad_()
    s2 = scores.float().requires_grad_()
    go = torch.randn(scores.shape, generator=torch.Generator().manual_seed(8)).to(dtype)
    (a,) = torch.autograd.grad(edge_softmax(ei, s1), s1, go)
    (b,) = torch.autograd.grad(h.expected_softmax(ei, s2, upcast=False), s2, go.float())
    assert a.dtype == dtype
    torch.testing.assert_close(a.float(), b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gradcheck(h, shape, index_dtype):
    ei, scores = _case(h, N=6, E=16, shape=shape, dtype=torch.float64, index_dtype=index_dtype, seed=9)
    s = scores.requires_grad_()
    assert torch.autograd.gradcheck(lambda t: edge_softmax(ei, t), (s,))


def test_double_backward_is_correct_or_refused(h):
    """Second derivatives (e.g. a gradient penalty) must be right, or raise: never silently wrong."""
    ei, scores = _case(h, N=6, E=16, shape=(2,), dtype=torch.float64, seed=9)
    s = scores.requires_grad_()
    try:
        ok = torch.autograd.gradgradcheck(lambda t: edge_softmax(ei, t), (s,), raise_exception=False)
    except RuntimeError:
        return  # refused loudly: acceptable
    assert ok, "gradgradcheck of edge_softmax gives wrong second derivatives without raising"


def test_attention_pipeline_matches_pyg(h):
    """GAT-style: alpha = softmax over incoming edges, then a per-head weighted sum."""
    g = torch.Generator().manual_seed(10)
    N, E, Hh, C = 12, 50, 3, 4
    ei = h.random_graph(N, E, generator=g)
    s = torch.randn(E, Hh, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(N, Hh, C, generator=g, dtype=torch.float64, requires_grad=True)
    out = spmm(ei, x, edge_softmax(ei, s, num_dst=N), reduce="sum")
    s2 = s.detach().clone().requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    alpha = h.pyg_softmax(s2, ei[1], num_nodes=N)
    exp = h.pyg_scatter(x2[ei[0]] * alpha.unsqueeze(-1), ei[1], dim=0, dim_size=N, reduce="sum")
    torch.testing.assert_close(out, exp)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(out, [s, x], go), torch.autograd.grad(exp, [s2, x2], go)):
        torch.testing.assert_close(a, b)
