"""The max / min backward's fast form without a sort: gnncompile::arg_route (the gradient of the
gathered rows) and gnncompile::arg_edge_dot (of spmm's edge weight) against the scatter path they
replaced (ops/autograd.py, ARG_ROUTE = "scatter"), the reference, torch's scatter_reduce gradient
(ties and NaN still take the formula), and opcheck."""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import gnncompile
from gnncompile.ops import autograd as ag
from gnncompile.ops import reference, transpose_structure
from shared import _fresh_dynamo  # noqa: F401  (autouse)

ops = torch.ops.gnncompile
H, C = 2, 3
# knobs[1] of arg_route on the CPU: 0 the rule, 1 the CSC pass, 2 the winner pass; None: no CSC given
PASSES = {"rule": [], "csc": [0, 1], "winners": [0, 2], "no-csc": None}


@contextlib.contextmanager
def route(name: str):
    old = ag.ARG_ROUTE
    ag.ARG_ROUTE = name
    try:
        yield
    finally:
        ag.ARG_ROUTE = old


def _graph(n_src=11, n_dst=9, e=60, seed=0, index_dtype=torch.int64):
    """Edges that leave the last two sources isolated and the last two destinations empty, with
    duplicate edges (ties where there is no weight) and self loops; unsorted."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n_src - 2, (e,), generator=g)
    dst = torch.randint(0, n_dst - 2, (e,), generator=g)
    src = torch.cat([src, torch.tensor([0, 0, 3, 3, 4])])
    dst = torch.cat([dst, torch.tensor([0, 0, 3, 3, 4])])
    return torch.stack([src, dst]).to(index_dtype)


def _setup(weight_mode, dtype, index_dtype=torch.int64, reduce="max", seed=0, n_src=11, n_dst=9, e=60):
    """CSR, CSC, x, weight, the forward's records and a gradient routed only where there is a
    winner (what fast_grad hands the backward)."""
    g = torch.Generator().manual_seed(seed + 100)
    ei = _graph(n_src, n_dst, e, seed, index_dtype)
    E = ei.size(1)
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], n_dst, n_src)
    csc = transpose_structure(rowptr, col, perm, n_src)
    shape = (n_src, H, C) if weight_mode == "head" else (n_src, H * C)
    x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    w = {"none": None, "edge": torch.randn(E, generator=g, dtype=torch.float64),
         "edge1": torch.randn(E, 1, generator=g, dtype=torch.float64),
         "head": torch.randn(E, H, generator=g, dtype=torch.float64)}[weight_mode]
    w = None if w is None else w.to(dtype)
    _, arg = ops.spmm(rowptr, col, perm, w, x, reduce, [])
    grad = torch.randn((n_dst,) + shape[1:], generator=g, dtype=torch.float64).to(dtype)
    grad = torch.where(arg >= 0, grad, torch.zeros_like(grad))
    return (rowptr, col, perm), csc, x, w, arg, grad


def _native(csr, csc, w, arg, grad, n_src, pass_):
    knobs = PASSES[pass_]
    t = (None, None, None) if knobs is None else csc
    return ops.arg_route(*csr, w, arg, grad, n_src, knobs or [], *t)


# ----------------------------------------------------------------------------- the op
@pytest.mark.parametrize("pass_", list(PASSES))
@pytest.mark.parametrize("weight_mode", ["none", "edge", "edge1", "head"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_arg_route_equals_the_scatter_path(native, dtype, index_dtype, weight_mode, pass_):
    """The same bits as scatter_add_ over the [M, F] winners (the same terms in the same order),
    whichever pass runs; the reference agrees."""
    csr, csc, x, w, arg, grad = _setup(weight_mode, dtype, index_dtype)
    n_src = x.shape[0]
    want, _ = ag._arg_backward_scatter(x.shape, csr[1], csr[2], w, x, arg, grad, True, False)
    got = _native(csr, csc, w, arg, grad, n_src, pass_)
    assert got.shape == x.shape and got.dtype == dtype
    assert torch.equal(got, want)
    ref = reference.arg_route(*csr, w, arg, grad, n_src, [], *csc)
    torch.testing.assert_close(ref, want, rtol=0, atol=0) if dtype == torch.float64 else \
        torch.testing.assert_close(ref, want, rtol=1e-6, atol=1e-6)
    assert torch.all(got[-2:] == 0)  # sources without an out-edge


@pytest.mark.parametrize("weight_mode", ["edge", "edge1", "head"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_arg_edge_dot_equals_the_scatter_path(native, dtype, index_dtype, weight_mode):
    csr, csc, x, w, arg, grad = _setup(weight_mode, dtype, index_dtype)
    _, want = ag._arg_backward_scatter(x.shape, csr[1], csr[2], w, x, arg, grad, False, True)
    heads = w.shape[1] if w.dim() == 2 else 1
    got = ops.arg_edge_dot(*csr, x, arg, grad, heads, []).reshape(w.shape)
    assert got.dtype == dtype
    assert torch.equal(got, want)
    ref = reference.arg_edge_dot(*csr, x, arg, grad, heads, []).reshape(w.shape)
    torch.testing.assert_close(ref, want, rtol=1e-6 if dtype == torch.float32 else 0,
                               atol=1e-6 if dtype == torch.float32 else 0)


@pytest.mark.parametrize("pass_", list(PASSES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16bit_sums_in_float_and_rounds_once(native, dtype, pass_):
    csr, csc, x, w, arg, grad = _setup("edge", dtype)
    n_src = x.shape[0]
    want = reference.arg_route(*csr, w, arg, grad, n_src, [])  # float sums, one rounding
    got = _native(csr, csc, w, arg, grad, n_src, pass_)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=0)
    gw = ops.arg_edge_dot(*csr, x, arg, grad, 1, [])
    torch.testing.assert_close(gw.float(), reference.arg_edge_dot(*csr, x, arg, grad, 1, []).float(),
                               rtol=0, atol=0)


@pytest.mark.parametrize("pass_", ["csc", "winners"])
def test_deterministic_across_threads(native, pass_):
    csr, csc, x, w, arg, grad = _setup("edge", torch.float32, n_src=300, n_dst=200, e=6000, seed=3)
    old = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for chunks in ([], [1], [64]):
                knobs = list(PASSES[pass_])
                knobs[0:1] = chunks or [0]
                outs.append(ops.arg_route(*csr, w, arg, grad, x.shape[0], knobs, *csc))
    finally:
        torch.set_num_threads(old)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("pass_", list(PASSES))
def test_no_edges_no_sources_no_features(native, pass_):
    empty = torch.empty(0, dtype=torch.long)
    rowptr = torch.zeros(5, dtype=torch.long)
    csr = (rowptr, empty, empty)
    csc = (torch.zeros(4, dtype=torch.long), empty, empty)
    arg = torch.full((4, 3), -1, dtype=torch.long)
    grad = torch.randn(4, 3)
    out = _native(csr, csc, None, arg, grad, 3, pass_)
    assert out.shape == (3, 3) and torch.all(out == 0)
    none = _native(csr, (torch.zeros(1, dtype=torch.long), empty, empty), None, arg, grad, 0, pass_)
    assert none.shape == (0, 3)
    narrow = _native(csr, csc, None, arg[:, :0], grad[:, :0], 3, pass_)
    assert narrow.shape == (3, 0)
    assert ops.arg_edge_dot(*csr, torch.randn(3, 3), arg, grad, 1, []).shape == (0, 1)


def test_bad_inputs_are_refused(native):
    csr, csc, x, w, arg, grad = _setup("none", torch.float32)
    n = x.shape[0]
    with pytest.raises(ValueError, match="come together"):
        ops.arg_route(*csr, None, arg, grad, n, [], csc[0], csc[1], None)
    with pytest.raises(TypeError, match="int64"):
        ops.arg_route(*csr, None, arg.int(), grad, n, [])
    with pytest.raises(ValueError, match="one shape"):
        ops.arg_route(*csr, None, arg[:, :2], grad, n, [])
    with pytest.raises(ValueError, match="transpose"):
        ops.arg_route(*csr, None, arg, grad, n + 1, [], *csc)
    bad_col_t = csc[1].clone()
    bad_col_t[0] = grad.shape[0]  # a destination past the rows of grad
    with pytest.raises(IndexError, match="col_t"):
        ops.arg_route(*csr, None, arg, grad, n, [0, 1], csc[0], bad_col_t, csc[2])
    bad_col = csr[1].clone()
    bad_col[int(arg[arg >= 0][0])] = n  # the source of a recorded winner past num_src (what is read is checked)
    with pytest.raises(IndexError, match="source index"):
        ops.arg_route(csr[0], bad_col, csr[2], None, arg, grad, n, [0, 2])


@pytest.mark.parametrize("weight_mode", ["none", "head"])
def test_opcheck(native, weight_mode):
    csr, csc, x, w, arg, grad = _setup(weight_mode, torch.float32)
    n = x.shape[0]
    torch.library.opcheck(ops.arg_route.default, (*csr, w, arg, grad, n, [], *csc))
    torch.library.opcheck(ops.arg_route.default, (*csr, w, arg, grad, n, []))
    if w is not None:
        torch.library.opcheck(ops.arg_edge_dot.default, (*csr, x, arg, grad, H, []))


@pytest.mark.parametrize("pass_", list(PASSES))
@pytest.mark.parametrize("weight_mode", ["none", "edge", "head"])
def test_gradcheck_and_gradgradcheck(native, weight_mode, pass_):
    """Both ops are differentiable (linear in each float input), so a double backward through
    max / min stays exact."""
    csr, csc, x, w, arg, grad = _setup(weight_mode, torch.float64, n_src=7, n_dst=6, e=20)
    n = x.shape[0]
    knobs = PASSES[pass_]
    t = (None, None, None) if knobs is None else csc
    inputs = [grad.clone().requires_grad_()] + ([] if w is None else [w.clone().requires_grad_()])

    def route_(gr, *ws):
        return ops.arg_route(*csr, ws[0] if ws else None, arg, gr, n, knobs or [], *t)

    assert torch.autograd.gradcheck(route_, inputs)
    assert torch.autograd.gradgradcheck(route_, inputs)
    if w is not None:
        heads = w.shape[1] if w.dim() == 2 else 1

        def edge_dot_(xx, gr):
            return ops.arg_edge_dot(*csr, xx, arg, gr, heads, [])

        ins = [x.clone().requires_grad_(), grad.clone().requires_grad_()]
        assert torch.autograd.gradcheck(edge_dot_, ins)
        assert torch.autograd.gradgradcheck(edge_dot_, ins)


# ----------------------------------------------------------------------------- the backward
def _torch_grads(ei, x, w, reduce, g, num_dst):
    """torch's own gradient: PyG's spelling of the aggregation, scatter_reduce into zeros."""
    x = x.detach().clone().requires_grad_()
    ws = None if w is None else w.detach().clone().requires_grad_()
    msg = x[ei[0].long()]
    if ws is not None:
        msg = msg * (ws.unsqueeze(-1) if ws.dim() == 2 and ws.shape[1] > 1 else ws.reshape(-1, *[1] * (x.dim() - 1)))
    idx = ei[1].long().view(-1, *[1] * (x.dim() - 1)).expand_as(msg)
    out = torch.zeros((num_dst,) + tuple(x.shape[1:]), dtype=x.dtype).scatter_reduce(
        0, idx, msg, "amax" if reduce == "max" else "amin", include_self=False)
    return torch.autograd.grad(out, [x] + ([ws] if ws is not None else []), g)


def _spmm_grads(csr, csc, x, w, reduce, g, route_name):
    x = x.detach().clone().requires_grad_()
    ws = None if w is None else w.detach().clone().requires_grad_()
    with route(route_name):
        out, _ = ops.spmm(*csr, ws, x, reduce, [], *csc)
        return torch.autograd.grad(out, [x] + ([ws] if ws is not None else []), g)


@pytest.mark.parametrize("with_csc", [False, True])
@pytest.mark.parametrize("special", ["none", "ties", "nan", "inf-grad"])
@pytest.mark.parametrize("weight_mode", ["none", "edge", "head"])
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_spmm_backward_native_equals_scatter_and_torch(native, reduce, weight_mode, special, with_csc):
    """Through autograd: the native route gives the scatter path's bits, ties / NaN / non-finite
    gradients still go through the formula, and both are torch's scatter_reduce gradient."""
    dtype = torch.float64
    n_src, n_dst = 11, 9
    ei = _graph(n_src, n_dst, 60, seed=5)
    csr = ops.build_csr(ei[1], ei[0], n_dst, n_src)
    csc = transpose_structure(*csr, n_src) if with_csc else (None, None, None)
    g = torch.Generator().manual_seed(9)
    shape = (n_src, H, C) if weight_mode == "head" else (n_src, H * C)
    x = torch.randn(shape, generator=g, dtype=dtype)
    E = ei.size(1)
    w = {"none": None, "edge": torch.rand(E, generator=g, dtype=dtype) + 0.5,
         "head": torch.rand(E, H, generator=g, dtype=dtype) + 0.5}[weight_mode]
    if special == "ties":  # equal messages: a source appearing twice in a row, and equal features
        x[1] = x[2]
        if w is not None:
            w = torch.ones_like(w)
    elif special == "nan":
        x[2, 0] = float("nan")
    go = torch.randn((n_dst,) + shape[1:], generator=g, dtype=dtype)
    if special == "inf-grad":
        go[0, 0] = float("inf")
    native_grads = _spmm_grads(csr, csc, x, w, reduce, go, "native")
    scatter_grads = _spmm_grads(csr, csc, x, w, reduce, go, "scatter")
    for a, b in zip(native_grads, scatter_grads):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) and torch.equal(a.isnan(), b.isnan())
    want = _torch_grads(ei, x, w, reduce, go, n_dst)
    for a, b in zip(native_grads, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_spmm_backward_float32_bitwise(native):
    n_src = n_dst = 400
    g = torch.Generator().manual_seed(4)
    ei = torch.randint(0, n_src, (2, 8000), generator=g)
    csr = ops.build_csr(ei[1], ei[0], n_dst, n_src)
    x = torch.randn(n_src, 40, generator=g)
    w = torch.rand(ei.size(1), generator=g) + 0.5
    go = torch.randn(n_dst, 40, generator=g)
    for csc in ((None, None, None), transpose_structure(*csr, n_src)):
        a = _spmm_grads(csr, csc, x, w, "max", go, "native")
        b = _spmm_grads(csr, csc, x, w, "max", go, "scatter")
        assert all(torch.equal(p, q) for p, q in zip(a, b))


def test_a_bad_switch_is_an_error(native):
    csr, csc, x, w, arg, grad = _setup("none", torch.float32)
    with route("sorted"), pytest.raises(ValueError, match="ARG_ROUTE"):
        _spmm_grads(csr, csc, x, None, "max", torch.randn(grad.shape), "sorted")


# ----------------------------------------------------------------------------- compiled models
def _grads_compiled(factory, inputs, route_name):
    from gnncompile.compiler import CompileFallbackWarning
    from gnncompile.compiler.backend import STATS

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = factory().double()
    fused = STATS["fused"]
    with route(route_name), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", CompileFallbackWarning)  # compiled, not the model as written
        compiled = gnncompile.compile(model, inner="aot_eager")
        xs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
        out = compiled(*xs)
        params = [p for p in model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(out, params + [xs[0]], torch.ones_like(out))
    assert STATS["fused"] > fused
    return out.detach(), grads


def _pna_factory(F, ei, N):
    from torch_geometric.nn import PNAConv

    deg = torch.bincount(torch.bincount(ei[1], minlength=N))
    return lambda: PNAConv(F, F, ["mean", "min", "max", "std"], ["identity", "amplification"], deg, edge_dim=3,
                           towers=1)


def _sage_factory(F):
    from torch_geometric.nn import SAGEConv

    return lambda: SAGEConv(F, F, aggr="max")


@pytest.mark.parametrize("model", ["SAGE-max", "PNA"])
def test_compiled_models_native_equals_scatter(native, model):
    """SAGEConv(aggr='max') (spmm) and PNAConv (message programs, max and min): the same outputs
    and gradients, bit for bit in float64, with either route traced into the backward graph."""
    N, E, F = 40, 300, 8
    g = torch.Generator().manual_seed(11)
    ei = torch.randint(0, N, (2, E), generator=g)
    x = torch.randn(N, F, generator=g, dtype=torch.float64)
    if model == "PNA":
        factory, inputs = _pna_factory(F, ei, N), (x, ei, torch.randn(E, 3, generator=g, dtype=torch.float64))
    else:
        factory, inputs = _sage_factory(F), (x, ei)
    out_n, grads_n = _grads_compiled(factory, inputs, "native")
    out_s, grads_s = _grads_compiled(factory, inputs, "scatter")
    assert torch.equal(out_n, out_s)
    for a, b in zip(grads_n, grads_s):
        assert torch.equal(a, b)
    torch.manual_seed(0)  # and eager PyG agrees
    eager = factory().double()
    xs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out_e = eager(*xs)
    ge = torch.autograd.grad(out_e, [p for p in eager.parameters() if p.requires_grad] + [xs[0]],
                             torch.ones_like(out_e))
    torch.testing.assert_close(out_n, out_e.detach(), rtol=1e-10, atol=1e-10)
    for a, b in zip(grads_n, ge):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)


# ----------------------------------------------------------------------------- CUDA
CUDA = torch.cuda.is_available() and gnncompile.info()["cuda_kernels"]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and the CUDA kernels")
@pytest.mark.parametrize("weight_mode", ["none", "edge", "head"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16], ids=str)
def test_cuda_matches_the_cpu_and_repeats_itself(dtype, weight_mode):
    """The CSC pass on CUDA (spmm's merge-path split: sums in another order than the CPU's, so
    close, not equal) gives the same bits on every run; arg_edge_dot too."""
    csr, csc, x, w, arg, grad = _setup(weight_mode, dtype, n_src=300, n_dst=200, e=5000, seed=8)
    n = x.shape[0]
    want = ops.arg_route(*csr, w, arg, grad, n, [], *csc).double()
    dev = [t.cuda() for t in (*csr, *csc)]
    wd = None if w is None else w.cuda()
    got = ops.arg_route(*dev[:3], wd, arg.cuda(), grad.cuda(), n, [], *dev[3:])
    again = ops.arg_route(*dev[:3], wd, arg.cuda(), grad.cuda(), n, [], *dev[3:])
    assert torch.equal(got, again)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(got.cpu().double(), want, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="CSC"):
        ops.arg_route(*dev[:3], wd, arg.cuda(), grad.cuda(), n, [])
    if w is not None:
        heads = w.shape[1] if w.dim() == 2 else 1
        gw = ops.arg_edge_dot(*dev[:3], x.cuda(), arg.cuda(), grad.cuda(), heads, [])
        torch.testing.assert_close(gw.cpu().double(), ops.arg_edge_dot(*csr, x, arg, grad, heads, []).double(),
                                   rtol=tol, atol=tol)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and the CUDA kernels")
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_cuda_spmm_backward_native_matches_scatter(reduce):
    csr, csc, x, w, arg, grad = _setup("edge", torch.float64, n_src=300, n_dst=200, e=5000, seed=9)
    dev = tuple(t.cuda() for t in csr)
    go = torch.randn(grad.shape, dtype=torch.float64).cuda()
    for t in ((None, None, None), tuple(s.cuda() for s in csc)):
        a = _spmm_grads(dev, t, x.cuda(), w.cuda(), reduce, go, "native")
        b = _spmm_grads(dev, t, x.cuda(), w.cuda(), reduce, go, "scatter")
        for p, q in zip(a, b):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12)
