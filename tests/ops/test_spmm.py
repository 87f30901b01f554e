"""gnncompile.ops.spmm against PyG's scatter, the reference op, autograd and opcheck."""
from __future__ import annotations


import pytest
import torch

from gnncompile.ops import reference, spmm, transpose_structure

REDUCES = ("sum", "mean", "max", "min")
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int64, torch.int32)
WEIGHT_MODES = ("none", "edge", "head")
ops = torch.ops.gnncompile

H, C = 3, 4  # heads and channels per head for the [E, H] weight case


def _graph_with_features(n=13, e=50, num_dst=None, index_dtype=torch.int64, seed=0, device="cpu"):
    """A small graph that has every feature the kernels must handle: isolated destination
    nodes, self loops, duplicate edges and an unsorted edge order."""
    g = torch.Generator().manual_seed(seed)
    num_dst = n if num_dst is None else num_dst
    src = torch.randint(0, n, (e,), generator=g)
    # destinations avoid the last two rows -> at least two isolated destination nodes
    dst = torch.randint(0, max(num_dst - 2, 1), (e,), generator=g)
    k = min(n, num_dst) - 2
    extra_src = torch.tensor([0, 0, 3, 3, 5])          # self loops and a duplicate pair
    extra_dst = torch.tensor([0, 0, 3, 3, 5]).clamp(max=max(k - 1, 0))
    src = torch.cat([src, extra_src])
    dst = torch.cat([dst, extra_dst])
    return torch.stack([src, dst]).to(index_dtype).to(device)


# ----------------------------------------------------------------------------- parity grid
@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("reduce", REDUCES)
def test_parity_with_pyg(h, device, reduce, dtype, index_dtype, weight_mode):
    g = torch.Generator().manual_seed(7)
    N = 13
    ei = _graph_with_features(N, 50, index_dtype=index_dtype, device=device)
    E = ei.size(1)
    x = h.make_x(weight_mode, N, H, C, dtype, g, device)
    w = h.make_weight(weight_mode, E, H, dtype, g, device)
    out = spmm(ei, x, w, reduce=reduce)
    assert out.dtype == dtype and out.device == x.device
    assert out.shape == (N,) + tuple(x.shape[1:])
    exp = h.expected_spmm(ei, x, w, reduce)
    h.assert_close(out, exp, dtype, msg=f"{reduce} {dtype} {index_dtype} {weight_mode}")
    # isolated destination nodes (the last two) are exactly 0 for every reduce
    assert torch.all(out[-2:] == 0)


@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("num_dst", [5, 11, 25])  # smaller and larger than x.size(0) = 11
def test_bipartite_num_dst(h, device, reduce, weight_mode, num_dst):
    g = torch.Generator().manual_seed(3)
    N = 11
    ei = h.random_graph(N, 40, num_dst, generator=g, device=device)
    x = h.make_x(weight_mode, N, H, C, torch.float32, g, device)
    w = h.make_weight(weight_mode, ei.size(1), H, torch.float32, g, device)
    out = spmm(ei, x, w, reduce=reduce, num_dst=num_dst)
    assert out.shape == (num_dst,) + tuple(x.shape[1:])
    h.assert_close(out, h.expected_spmm(ei, x, w, reduce, num_dst))


def test_default_num_dst_is_x_size(h):
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    x = torch.arange(8.0).view(4, 2)
    out = spmm(ei, x)
    assert out.shape == (4, 2)
    torch.testing.assert_close(out, torch.tensor([[4.0, 5], [0, 1], [2, 3], [0, 0]]))


def test_add_is_an_alias_for_sum(h):
    g = torch.Generator().manual_seed(0)
    ei = h.random_graph(6, 20, generator=g)
    x = torch.randn(6, 3, generator=g)
    assert torch.equal(spmm(ei, x, reduce="add"), spmm(ei, x, reduce="sum"))


# ----------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_no_edges(h, device, reduce, weight_mode):
    for index_dtype in INDEX_DTYPES:
        ei = torch.empty(2, 0, dtype=index_dtype, device=device)
        x = h.make_x(weight_mode, 4, H, C, torch.float32, device=device)
        w = h.make_weight(weight_mode, 0, H, torch.float32, device=device)
        out = spmm(ei, x, w, reduce=reduce)
        assert out.shape == (4,) + tuple(x.shape[1:])
        assert torch.equal(out, torch.zeros_like(out))
        out = spmm(ei, x, w, reduce=reduce, num_dst=7)
        assert out.shape == (7,) + tuple(x.shape[1:])
        assert torch.equal(out, torch.zeros_like(out))
        h.assert_close(out, h.expected_spmm(ei, x, w, reduce, 7))


@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_no_edges_backward(h, reduce, weight_mode):
    x = h.make_x(weight_mode, 4, H, C, torch.float64).requires_grad_()
    w = h.make_weight(weight_mode, 0, H, torch.float64)
    params = [x] if w is None else [x, w.requires_grad_()]
    out = spmm(torch.empty(2, 0, dtype=torch.long), x, w, reduce=reduce, num_dst=3)
    grads = torch.autograd.grad(out, params, torch.randn(out.shape, dtype=torch.float64))
    for p, gr in zip(params, grads):
        assert gr.shape == p.shape and torch.equal(gr, torch.zeros_like(p))


@pytest.mark.parametrize("reduce", REDUCES)
def test_no_edges_and_no_destinations(reduce):
    ei = torch.empty(2, 0, dtype=torch.long)
    out = spmm(ei, torch.randn(3, 2), reduce=reduce, num_dst=0)
    assert out.shape == (0, 2)


@pytest.mark.parametrize("reduce", REDUCES)
def test_isolated_nodes_are_zero(h, reduce):
    # node 1 and 3 receive nothing; negative features so that max would be < 0 if 0 leaked in
    ei = torch.tensor([[0, 2, 4, 4], [0, 2, 0, 2]])
    x = -torch.rand(5, 3) - 1.0
    out = spmm(ei, x, reduce=reduce)
    assert torch.equal(out[1], torch.zeros(3)) and torch.equal(out[3], torch.zeros(3))
    assert torch.equal(out[4], torch.zeros(3))
    h.assert_close(out, h.expected_spmm(ei, x, None, reduce))
    if reduce == "max":
        torch.testing.assert_close(out[0], torch.maximum(x[0], x[4]))
    if reduce == "min":
        torch.testing.assert_close(out[2], torch.minimum(x[2], x[4]))


@pytest.mark.parametrize("reduce", REDUCES)
def test_self_loops_only(h, reduce):
    N = 6
    ei = torch.arange(N).repeat(2, 1)
    x = torch.randn(N, 5)
    w = torch.rand(N) + 0.5
    # one edge per node: every reduce returns the (weighted) node itself
    torch.testing.assert_close(spmm(ei, x, reduce=reduce), x)
    torch.testing.assert_close(spmm(ei, x, w, reduce=reduce), x * w[:, None])


@pytest.mark.parametrize("reduce", REDUCES)
def test_duplicate_edges(h, reduce):
    ei = torch.tensor([[1, 1, 1, 2], [0, 0, 0, 0]])
    x = torch.tensor([[0.0, 0.0], [1.0, -2.0], [3.0, 4.0]])
    out = spmm(ei, x, reduce=reduce)
    expected = {
        "sum": torch.tensor([[6.0, -2.0]]),
        "mean": torch.tensor([[1.5, -0.5]]),
        "max": torch.tensor([[3.0, 4.0]]),
        "min": torch.tensor([[1.0, -2.0]]),
    }[reduce]
    torch.testing.assert_close(out[:1], expected)
    assert torch.equal(out[1:], torch.zeros(2, 2))
    h.assert_close(out, h.expected_spmm(ei, x, None, reduce))


@pytest.mark.parametrize("weight_mode", ("none", "edge"))
@pytest.mark.parametrize("reduce", REDUCES)
def test_unsorted_equals_sorted(h, reduce, weight_mode):
    g = torch.Generator().manual_seed(5)
    ei = h.random_graph(20, 80, generator=g)
    x = torch.randn(20, 6, generator=g)
    w = h.make_weight(weight_mode, 80, 1, torch.float32, g)
    order = torch.argsort(ei[1] * 100 + ei[0])
    ei_sorted = ei[:, order]
    w_sorted = None if w is None else w[order]
    a = spmm(ei, x, w, reduce=reduce)
    b = spmm(ei_sorted, x, w_sorted, reduce=reduce)
    assert not torch.equal(ei, ei_sorted)  # the input really is unsorted
    h.assert_close(a, b)
    h.assert_close(a, h.expected_spmm(ei, x, w, reduce))


@pytest.mark.parametrize("reduce", REDUCES)
def test_num_dst_beyond_max_index(h, reduce):
    ei = torch.tensor([[0, 1, 2], [0, 1, 1]])
    x = torch.randn(3, 4)
    out = spmm(ei, x, reduce=reduce, num_dst=9)
    assert out.shape == (9, 4)
    assert torch.equal(out[2:], torch.zeros(7, 4))
    h.assert_close(out, h.expected_spmm(ei, x, None, reduce, 9))


@pytest.mark.parametrize("weight", ("none", "edge", "edge1"))
@pytest.mark.parametrize("reduce", REDUCES)
def test_extra_trailing_dims(h, reduce, weight):
    g = torch.Generator().manual_seed(11)
    ei = h.random_graph(9, 30, generator=g)
    x = torch.randn(9, 2, 3, 2, generator=g)
    w = {"none": None, "edge": torch.randn(30, generator=g), "edge1": torch.randn(30, 1, generator=g)}[weight]
    out = spmm(ei, x, w, reduce=reduce)
    assert out.shape == (9, 2, 3, 2)
    h.assert_close(out, h.expected_spmm(ei, x, w, reduce))


@pytest.mark.parametrize("reduce", REDUCES)
def test_one_dimensional_x(h, reduce):
    g = torch.Generator().manual_seed(12)
    ei = h.random_graph(8, 25, generator=g)
    x = torch.randn(8, generator=g)
    w = torch.randn(25, generator=g)
    out = spmm(ei, x, w, reduce=reduce)
    assert out.shape == (8,)
    h.assert_close(out, h.expected_spmm(ei, x, w, reduce))


@pytest.mark.parametrize("reduce", REDUCES)
def test_zero_features(reduce):
    ei = torch.tensor([[0, 1], [1, 0]])
    out = spmm(ei, torch.randn(3, 0), reduce=reduce)
    assert out.shape == (3, 0)


@pytest.mark.parametrize(
    "dtype,shape,weight_mode",
    [
        (torch.float32, (7, 300), "edge"),     # > one 128-wide float tile, ragged tail
        (torch.float32, (7, 256), "none"),     # exactly two tiles
        (torch.float64, (7, 150), "edge"),     # > one 64-wide double tile
        (torch.float32, (7, 2, 130), "head"),  # per-head tiles with a tail
        (torch.bfloat16, (7, 200), "edge"),
        (torch.float16, (7, 129), "none"),
    ],
)
@pytest.mark.parametrize("reduce", REDUCES)
def test_wide_features(h, reduce, dtype, shape, weight_mode):
    g = torch.Generator().manual_seed(13)
    ei = h.random_graph(7, 30, generator=g)
    x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    w = h.make_weight(weight_mode, 30, shape[1], dtype, g)
    out = spmm(ei, x, w, reduce=reduce)
    h.assert_close(out, h.expected_spmm(ei, x, w, reduce), dtype)


@pytest.mark.parametrize("reduce", REDUCES)
def test_non_contiguous_inputs(h, reduce):
    g = torch.Generator().manual_seed(14)
    ei = h.random_graph(10, 40, generator=g)
    base = torch.randn(6, 10, generator=g)
    x = base.t()[:, ::2]  # [10, 3], non-contiguous
    wb = torch.randn(40, 2, generator=g)
    w = wb[:, 1]          # strided
    ei_nc = torch.stack([ei[1], ei[0]]).t().contiguous().t().flip(0)  # same values, odd strides
    assert not x.is_contiguous() and not w.is_contiguous() and not ei_nc.is_contiguous()
    assert torch.equal(ei_nc, ei)
    out = spmm(ei_nc, x, w, reduce=reduce)
    h.assert_close(out, h.expected_spmm(ei, x.contiguous(), w.contiguous(), reduce))


@pytest.mark.parametrize("reduce", REDUCES)
def test_high_degree_row_and_parallel_split(h, reduce):
    # one hub with most of the edges, many light rows: exercises the edge-balanced split
    g = torch.Generator().manual_seed(15)
    N = 200
    hub = torch.stack([torch.randint(0, N, (600,), generator=g), torch.zeros(600, dtype=torch.long)])
    rest = h.random_graph(N, 400, generator=g)
    ei = torch.cat([rest, hub], 1)[:, torch.randperm(1000, generator=g)]
    x = torch.randn(N, 5, generator=g)
    w = torch.randn(1000, generator=g)
    h.assert_close(spmm(ei, x, w, reduce=reduce), h.expected_spmm(ei, x, w, reduce))


@pytest.mark.parametrize("reduce", ("max", "min"))
def test_nan_propagates_like_pyg(h, reduce):
    """PyG (torch.scatter_reduce amax/amin) propagates a NaN message into its row."""
    ei = torch.tensor([[0, 1, 2, 3], [0, 0, 1, 1]])
    x = torch.tensor([[1.0], [float("nan")], [float("nan")], [2.0]])
    out = spmm(ei, x, reduce=reduce)
    exp = h.expected_spmm(ei, x, None, reduce)
    assert torch.isnan(exp[:2]).all()  # what PyG gives
    torch.testing.assert_close(out, exp, equal_nan=True)


# ----------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("reduce", REDUCES)
def test_deterministic(h, reduce, dtype):
    g = torch.Generator().manual_seed(16)
    N = 300
    ei = h.random_graph(N, 3000, generator=g)
    x = torch.randn(N, 33, generator=g).to(dtype)
    w = torch.randn(3000, generator=g).to(dtype)
    a = spmm(ei, x, w, reduce=reduce)
    b = spmm(ei, x, w, reduce=reduce)
    assert torch.equal(a, b)
    # a fresh (uncached) but equal edge_index gives the same bits
    c = spmm(ei.clone(), x, w, reduce=reduce)
    assert torch.equal(a, c)


@pytest.mark.parametrize("reduce", REDUCES)
def test_deterministic_across_threads_and_knobs(h, reduce):
    g = torch.Generator().manual_seed(17)
    N = 300
    ei = h.random_graph(N, 3000, generator=g)
    x = torch.randn(N, 17, generator=g)
    w = torch.randn(3000, generator=g)
    ref = spmm(ei, x, w, reduce=reduce)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = spmm(ei, x, w, reduce=reduce)
        torch.set_num_threads(max(threads, 2))
        # knobs[1], the prefetch distance (1000: clamped to the kernels' cap), only warms caches
        for knobs in ([1], [2], [64], [4, 1], [4, 64], [2, 1000]):
            assert torch.equal(spmm(ei, x, w, reduce=reduce, knobs=knobs), ref), knobs
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, ref)


# ----------------------------------------------------------------------------- native vs reference
@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("reduce", REDUCES)
def test_native_matches_reference(native, h, reduce, dtype, index_dtype, weight_mode):
    g = torch.Generator().manual_seed(18)
    N = 12
    ei = _graph_with_features(N, 45, index_dtype=index_dtype, seed=1)
    E = ei.size(1)
    # integer-valued features: max/min have ties; both must record the winner's CSR slot, or
    # how many messages tie (-N: the gradient is split, as torch splits it)
    x = torch.randint(-3, 4, (N, H, C) if weight_mode == "head" else (N, H * C), generator=g).to(dtype)
    w = h.make_weight(weight_mode, E, H, dtype, g)
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
    out, arg = ops.spmm(rowptr, col, perm, w, x, reduce, [])
    rout, rarg = reference.spmm(rowptr, col, perm, w, x, reduce, [])
    assert out.dtype == rout.dtype == dtype
    h.assert_close(out, rout.to(h.acc_dtype(dtype)), dtype)
    assert torch.equal(arg, rarg)
    if reduce in ("max", "min"):
        assert arg.shape == out.shape and arg.dtype == torch.long
        # isolated rows have arg -1, others point at a CSR slot of their own row
        deg = (rowptr[1:] - rowptr[:-1]).long()
        empty = (deg == 0).view(-1, *([1] * (x.dim() - 1))).expand_as(arg)
        assert torch.all(arg[empty] == -1)
        lo = rowptr[:-1].long().view(-1, *([1] * (x.dim() - 1))).expand_as(arg)
        hi = rowptr[1:].long().view(-1, *([1] * (x.dim() - 1))).expand_as(arg)
        one = ~empty & (arg >= 0)
        assert torch.all((arg[one] >= lo[one]) & (arg[one] < hi[one]))
        ties = ~empty & (arg < -1)
        assert bool(ties.any())  # the integer features do tie
        assert torch.all(-arg[ties] <= (hi - lo)[ties])
    else:
        assert arg.numel() == 0


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.bfloat16), ids=str)
def test_edge_dot_native_matches_reference(native, h, dtype):
    g = torch.Generator().manual_seed(19)
    ei = _graph_with_features(10, 40, seed=2)
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], 10, 10)
    for heads, x_shape in ((1, (10, 6)), (3, (10, 3, 2))):
        x = torch.randn(x_shape, generator=g, dtype=torch.float64).to(dtype)
        go = torch.randn(x_shape, generator=g, dtype=torch.float64).to(dtype)
        a = ops.edge_dot(rowptr, col, perm, x, go, heads, [])
        b = reference.edge_dot(rowptr, col, perm, x, go, heads, [])
        assert a.shape == (ei.size(1), heads)
        h.assert_close(a, b.to(h.acc_dtype(dtype)), dtype)
        # and the definition: <x[src_e, h], g[dst_e, h]>
        xe = x.double().reshape(10, heads, -1)[ei[0]]
        ge = go.double().reshape(10, heads, -1)[ei[1]]
        h.assert_close(a, (xe * ge).sum(-1).to(h.acc_dtype(dtype)), dtype)


# ----------------------------------------------------------------------------- gradients
def _grad_case(h, reduce, weight_mode, dtype, num_dst=None, seed=20, index_dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    N = 9
    M = N if num_dst is None else num_dst
    # unique (src, dst) pairs and continuous random values: no ties for max/min
    ei = h.random_graph(N, 30, M, generator=g, unique=True, index_dtype=index_dtype)
    ei = ei[:, ei[1] < M - 1]  # the last destination stays isolated
    x = h.make_x(weight_mode, N, H, C, dtype, g).requires_grad_()
    w = h.make_weight(weight_mode, ei.size(1), H, dtype, g)
    if w is not None:
        w.requires_grad_()
    grad_out = torch.randn((M,) + tuple(x.shape[1:]), generator=g, dtype=torch.float64).to(dtype)
    return ei, x, w, grad_out


@pytest.mark.parametrize("num_dst", [None, 5, 14])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_gradients_match_pyg(h, reduce, weight_mode, index_dtype, num_dst):
    dtype = torch.float64
    ei, x, w, go = _grad_case(h, reduce, weight_mode, dtype, num_dst, index_dtype=index_dtype)
    out = spmm(ei, x, w, reduce=reduce, num_dst=num_dst)
    params = [x] + ([w] if w is not None else [])
    grads = torch.autograd.grad(out, params, go)

    x2 = x.detach().clone().requires_grad_()
    w2 = None if w is None else w.detach().clone().requires_grad_()
    exp = h.expected_spmm(ei, x2, w2, reduce, num_dst, upcast=False)
    torch.testing.assert_close(out, exp)
    egrads = torch.autograd.grad(exp, [x2] + ([w2] if w2 is not None else []), go)
    for name, a, b in zip(("x", "edge_weight"), grads, egrads):
        torch.testing.assert_close(a, b, msg=lambda m: f"grad of {name}: {m}")
        assert torch.count_nonzero(b) > 0  # the comparison is not vacuous


@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_gradients_float32_and_single_input(h, reduce, weight_mode):
    """float32 gradients, and each input requiring grad on its own."""
    ei, x, w, go = _grad_case(h, reduce, weight_mode, torch.float32, seed=21)
    x2 = x.detach().clone().requires_grad_()
    w2 = None if w is None else w.detach().clone().requires_grad_()
    exp = h.expected_spmm(ei, x2, w2, reduce, upcast=False)
    egrads = torch.autograd.grad(exp, [x2] + ([w2] if w2 is not None else []), go)
    # x only
    xo = x.detach().clone().requires_grad_()
    (gx,) = torch.autograd.grad(spmm(ei, xo, None if w is None else w.detach(), reduce=reduce), [xo], go)
    torch.testing.assert_close(gx, egrads[0], rtol=1e-5, atol=1e-5)
    if w is not None:
        # weight only
        wo = w.detach().clone().requires_grad_()
        (gw,) = torch.autograd.grad(spmm(ei, x.detach(), wo, reduce=reduce), [wo], go)
        torch.testing.assert_close(gw, egrads[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduce", REDUCES)
def test_gradients_column_weight_with_multi_dim_x(h, reduce):
    """An [E, 1] weight is one scalar per edge, also for x of shape [N, A, B]."""
    g = torch.Generator().manual_seed(31)
    ei = h.random_graph(8, 30, generator=g, unique=True)
    x = torch.randn(8, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(ei.size(1), 1, generator=g, dtype=torch.float64, requires_grad=True)
    out = spmm(ei, x, w, reduce=reduce)
    exp = h.expected_spmm(ei, x, w, reduce, upcast=False)
    torch.testing.assert_close(out, exp)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(out, [x, w], go), torch.autograd.grad(exp, [x, w], go)):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("reduce", ("sum", "mean"))
def test_gradients_16bit(h, reduce, dtype):
    ei, x, w, go = _grad_case(h, reduce, "edge", dtype, seed=22)
    gx, gw = torch.autograd.grad(spmm(ei, x, w, reduce=reduce), [x, w], go)
    assert gx.dtype == dtype and gw.dtype == dtype
    x2 = x.detach().float().requires_grad_()
    w2 = w.detach().float().requires_grad_()
    exp = h.expected_spmm(ei, x2, w2, reduce, upcast=False)
    ex, ew = torch.autograd.grad(exp, [x2, w2], go.float())
    tol = dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(gx.float(), ex, **tol)
    torch.testing.assert_close(gw.float(), ew, **tol)


@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_gradcheck(h, reduce, weight_mode):
    g = torch.Generator().manual_seed(23)
    N, E = 6, 14
    ei = h.random_graph(N, E, generator=g, unique=True)
    ei = ei[:, ei[1] < N - 1]  # keep one isolated node
    x = h.make_x(weight_mode, N, 2, 2, torch.float64, g).requires_grad_()
    w = h.make_weight(weight_mode, ei.size(1), 2, torch.float64, g)
    inputs = (x,) if w is None else (x, w.requires_grad_())
    if reduce in ("max", "min"):
        # tie check: all messages of a row/feature differ by far more than gradcheck's eps
        msg = x.detach()[ei[0]]
        if w is not None:
            msg = msg * h.weight_view(w.detach(), x)
        for r in range(N):
            m = msg[ei[1] == r].flatten(1)
            if m.size(0) > 1:
                s = m.sort(0).values
                assert (s[1:] - s[:-1]).min() > 1e-3

    def f(*args):
        return spmm(ei, args[0], args[1] if len(args) > 1 else None, reduce=reduce)

    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("reduce", REDUCES)
def test_gradcheck_bipartite_int32(h, reduce):
    g = torch.Generator().manual_seed(24)
    ei = h.random_graph(7, 12, 4, generator=g, unique=True, index_dtype=torch.int32)
    x = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(ei.size(1), generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b: spmm(ei, a, b, reduce=reduce, num_dst=4), (x, w), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_double_backward_is_correct_or_refused(h, reduce, weight_mode):
    """Second derivatives (e.g. a gradient penalty) must be right, or raise: never silently wrong."""
    g = torch.Generator().manual_seed(30)
    ei = h.random_graph(6, 14, generator=g, unique=True)
    x = h.make_x(weight_mode, 6, 2, 2, torch.float64, g).requires_grad_()
    w = h.make_weight(weight_mode, ei.size(1), 2, torch.float64, g)
    inputs = (x,) if w is None else (x, w.requires_grad_())

    def f(*args):
        return spmm(ei, args[0], args[1] if len(args) > 1 else None, reduce=reduce)

    try:
        ok = torch.autograd.gradgradcheck(f, inputs, raise_exception=False)
    except RuntimeError:
        return  # refused loudly: acceptable
    assert ok, f"gradgradcheck of spmm({reduce}, {weight_mode}) is wrong without raising"


def test_structure_shared_between_two_layers_backward(h):
    """Two layers on one edge_index: gradients flow through both and match PyG."""
    g = torch.Generator().manual_seed(25)
    ei = h.random_graph(10, 40, generator=g)
    w = torch.randn(40, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(10, 4, generator=g, dtype=torch.float64, requires_grad=True)
    out = spmm(ei, spmm(ei, x, w, reduce="mean").tanh(), w, reduce="sum")
    gx, gw = torch.autograd.grad(out.square().sum(), [x, w])
    x2 = x.detach().clone().requires_grad_()
    w2 = w.detach().clone().requires_grad_()
    exp = h.expected_spmm(ei, h.expected_spmm(ei, x2, w2, "mean").tanh(), w2, "sum")
    ex, ew = torch.autograd.grad(exp.square().sum(), [x2, w2])
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gw, ew)


# ----------------------------------------------------------------------------- opcheck
def _structure(ei, num_dst, num_src):
    return ops.build_csr(ei[1], ei[0], num_dst, num_src)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_opcheck_spmm(h, reduce, weight_mode, transposed):
    index_dtype = torch.int32 if weight_mode == "edge" else torch.int64  # both, at half the cost
    g = torch.Generator().manual_seed(26)
    N, M = 7, 6
    ei = h.random_graph(N, 20, M, generator=g, unique=True, index_dtype=index_dtype)
    rowptr, col, perm = _structure(ei, M, N)
    x = h.make_x(weight_mode, N, 2, 3, torch.float32, g).requires_grad_()
    w = h.make_weight(weight_mode, ei.size(1), 2, torch.float32, g)
    if w is not None:
        w.requires_grad_()
    t = transpose_structure(rowptr, col, perm, N) if transposed else (None, None, None)
    torch.library.opcheck(ops.spmm.default, (rowptr, col, perm, w, x, reduce, [], *t))
    # no input requiring grad as well
    torch.library.opcheck(
        ops.spmm.default, (rowptr, col, perm, None if w is None else w.detach(), x.detach(), reduce, [2], *t))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=str)
def test_opcheck_build_csr(h, index_dtype):
    g = torch.Generator().manual_seed(27)
    ei = h.random_graph(8, 25, 5, generator=g, index_dtype=index_dtype)
    torch.library.opcheck(ops.build_csr.default, (ei[1], ei[0], 5, 8))
    empty = torch.empty(0, dtype=index_dtype)
    torch.library.opcheck(ops.build_csr.default, (empty, empty, 3, 3))


@pytest.mark.parametrize("heads", [1, 2])
def test_opcheck_edge_dot(h, heads):
    g = torch.Generator().manual_seed(28)
    ei = h.random_graph(8, 25, generator=g)
    rowptr, col, perm = _structure(ei, 8, 8)
    x = torch.randn(8, heads, 3, generator=g)
    go = torch.randn(8, heads, 3, generator=g)
    torch.library.opcheck(ops.edge_dot.default, (rowptr, col, perm, x, go, heads, []))


@pytest.mark.parametrize("shape", [(), (3,)])
def test_opcheck_edge_softmax(h, shape):
    g = torch.Generator().manual_seed(29)
    ei = h.random_graph(8, 25, generator=g)
    rowptr, col, perm = _structure(ei, 8, 8)
    scores = torch.randn((25,) + shape, generator=g, requires_grad=True)
    torch.library.opcheck(ops.edge_softmax.default, (rowptr, perm, scores, []))
    torch.library.opcheck(ops.edge_softmax.default, (rowptr, perm, scores.detach(), []))
    out = ops.edge_softmax(rowptr, perm, scores.detach(), [])
    grad = torch.randn(out.shape, generator=g)
    torch.library.opcheck(ops.edge_softmax_backward.default, (rowptr, perm, out, grad, []))


def test_max_min_backward_accumulation_paths_agree():
    """The max / min backward adds each output gradient into its chosen source row; repeated rows
    are accumulated deterministically on both paths (scatter_add_ on the CPU, index_put_ with
    accumulate=True, which sorts, on CUDA), and both give the same sums."""
    from gnncompile.ops.autograd import accumulate_rows

    g = torch.Generator().manual_seed(0)
    for shape, out_shape in (((5000, 6), (50, 6)), ((5000,), (50,))):
        idx = torch.randint(0, 50, shape, generator=g)
        vals = torch.randn(shape, generator=g, dtype=torch.float64)
        want = torch.zeros(out_shape, dtype=torch.float64)
        for k in range(shape[0]):  # the definition, one addition at a time
            if len(shape) == 2:
                want[idx[k], torch.arange(shape[1])] += vals[k]
            else:
                want[idx[k]] += vals[k]
        for sort in (False, True):
            out = torch.zeros(out_shape, dtype=torch.float64)
            accumulate_rows(out, idx, vals, sort=sort)
            torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
            again = torch.zeros(out_shape, dtype=torch.float64)
            accumulate_rows(again, idx, vals, sort=sort)
            assert torch.equal(out, again)
