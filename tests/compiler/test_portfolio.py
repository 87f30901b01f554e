"""The spmm implementation portfolio (gnncompile.compiler.portfolio): the vendor candidate's
agreement with the native kernel, the choice and its cache, and a compiled model that runs the
candidate measured faster (and says so in explain)."""
from __future__ import annotations

import json
from typing import List, Optional
import warnings

import pytest
import torch
from torch_geometric.nn import GCNConv, SAGEConv

import gnncompile
from gnncompile import profiles
from gnncompile.compiler import portfolio
from gnncompile.ops import structure as S
from gnncompile.ops import vendor
from gnncompile.ops.schemas import ops
from gnncompile.settings import Settings

NATIVE = pytest.mark.skipif(not gnncompile.info()["native"], reason="needs the native kernels")


def _graph(N=300, E=2400, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, E), generator=g)
    ei[:, :min(50, E // 4)] = ei[:, :1]  # repeated edges; the random ends leave isolated nodes and empty rows
    return ei, g


def _both(ei, N, x, w, reduce):
    s = S.build(ei, N)
    csr, csc = (s.rowptr, s.col, s.perm), s.transposed(N)
    out = {}
    for impl in ("native", "torch_sparse"):
        xr = x.detach().clone().requires_grad_()
        wr = None if w is None else w.detach().clone().requires_grad_()
        y = portfolio.run_candidate(impl, csr, csc, wr, xr, reduce)
        go = torch.randn(y.shape, generator=torch.Generator().manual_seed(3), dtype=y.dtype)
        grads = torch.autograd.grad(y, [xr] + ([wr] if wr is not None else []), go)
        out[impl] = (y.detach(),) + tuple(t.detach() for t in grads)
    return out["native"], out["torch_sparse"]


@NATIVE
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("shape", [(16,), (2, 5)])
def test_torch_sparse_gives_the_native_bits_unweighted(dtype, reduce, shape):
    ei, g = _graph()
    x = torch.randn((300,) + shape, generator=g, dtype=dtype)
    native, vend = _both(ei, 300, x, None, reduce)
    for a, b in zip(native, vend):
        assert a.shape == b.shape and torch.equal(a, b)


@NATIVE
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_sparse_weighted_agrees_and_the_probe_says_whether_bitwise(dtype):
    ei, g = _graph(seed=1)
    x = torch.randn(300, 24, generator=g, dtype=dtype)
    w = torch.rand(2400, generator=g, dtype=dtype)
    native, vend = _both(ei, 300, x, w, "sum")
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-13)
    for a, b in zip(native, vend):
        torch.testing.assert_close(b, a, **tol)
    assert torch.equal(native[2], vend[2])  # the weight's gradient is edge_dot in both
    # the exactness probe of the measurement agrees with a direct comparison on its own inputs
    csr, csc, w2, x2 = portfolio._inputs(torch.device("cpu"), dtype, True, 24)
    direct = _both_on(csr, csc, w2, x2)
    assert portfolio._exact(("native", "torch_sparse"), csr, csc, w2, x2) == direct


def _both_on(csr, csc, w, x):
    a = portfolio.run_candidate("native", csr, csc, w, x)
    b = portfolio.run_candidate("torch_sparse", csr, csc, w, x)
    return torch.equal(a, b)


@NATIVE
def test_torch_sparse_second_derivative_and_gradcheck():
    ei, g = _graph(N=6, E=12, seed=2)
    s = S.build(ei, 6)
    x = torch.randn(6, 2, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(12, generator=g, dtype=torch.float64, requires_grad=True)
    f = lambda x, w: vendor.spmm_sparse(s.rowptr, s.col, s.perm, w, x, "mean", [])  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, w))
    assert torch.autograd.gradgradcheck(f, (x, w))


@NATIVE
@pytest.mark.parametrize("shape", [(8, 3), (8, 2, 3)])
def test_torch_sparse_output_can_be_changed_in_place(shape):
    """Its output is no view (autograd refuses an in-place change of a custom op's view output:
    PyG adds PDNConv's bias in place after the propagation)."""
    ei, g = _graph(N=8, E=20, seed=3)
    s = S.build(ei, 8)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    w = torch.rand(20, generator=g, requires_grad=True)
    out = vendor.spmm_sparse(s.rowptr, s.col, s.perm, w, x, "sum", [])
    assert out._base is None
    out += 1.0
    out.square().sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


def test_torch_sparse_refuses_bad_input():
    ei, _ = _graph(N=10, E=30)
    s = S.build(ei, 10)
    x = torch.randn(10, 4)
    with pytest.raises(ValueError, match="reduce"):
        vendor.spmm_sparse(s.rowptr, s.col, s.perm, None, x, "max", [])
    with pytest.raises(IndexError, match="out of range"):
        vendor.spmm_sparse(s.rowptr, s.col, s.perm, None, x[:3], "sum", [])
    with pytest.raises(ValueError, match="weight"):
        vendor.spmm_sparse(s.rowptr, s.col, s.perm, torch.rand(30, 2), x, "sum", [])
    with pytest.raises(TypeError, match="float32 or float64"):
        vendor.spmm_sparse(s.rowptr, s.col, s.perm, None, x.half(), "sum", [])


def test_a_bad_setting_value_is_an_error():
    with pytest.raises(ValueError, match="spmm_impl"):
        Settings(choices=(("spmm_impl", "fastest"),))
    assert Settings(choices=(("spmm_impl", "torch_sparse"),)).spmm_impl == "torch_sparse"
    assert Settings().spmm_impl == "auto"
    with pytest.raises(profiles.ProfileError, match="spmm_impl"):
        profiles.check_settings({"spmm_impl": "mkl"})
    assert profiles.check_settings({"spmm_impl": "native"})[0]["spmm_impl"] == "native"
    with pytest.raises(ValueError, match="spmm_impl"):
        portfolio.decide("cpu", torch.float32, 16, setting="fast")


def test_a_profile_carries_the_choice(monkeypatch, tmp_path):
    monkeypatch.setenv("GNNCOMPILE_SPMM_IMPL", "auto")
    props = gnncompile.hardware.detect()
    doc = profiles.make(props, {"kind": "graphs", "model": "gin"},
                        {"knobs": [4], "threads": 1, "spmm_impl": "torch_sparse"})
    path = profiles.save(doc, tmp_path)
    prof = profiles.load_file(path)
    assert prof.settings["spmm_impl"] == "torch_sparse"
    assert Settings.build(prof).spmm_impl == "torch_sparse"
    assert Settings.build(prof, choices={"spmm_impl": "native"}).spmm_impl == "native"  # explicit wins


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GNNCOMPILE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_times(monkeypatch, faster: str):
    """time_candidate says ``faster`` takes 1 ms and the other 3 ms (nothing is run)."""
    monkeypatch.setattr(portfolio, "time_candidate", lambda impl, fn: 1e-3 if impl == faster else 3e-3)


def test_the_measurement_is_cached_and_a_corrupt_file_is_measured_again(cache, monkeypatch):
    _fake_times(monkeypatch, "torch_sparse")
    d = portfolio.decide("cpu", torch.float32, 20)  # unweighted: exact, so admitted
    assert d.impl == "torch_sparse" and "measured now at F32" in d.why and "torch_sparse 1 ms" in d.why
    key = portfolio.device_key(torch.device("cpu"))
    path = cache / "profiles" / "portfolio" / f"{key}.json"
    assert path == portfolio.cache_path(key)
    doc = json.loads(path.read_text())
    entry = doc["classes"][portfolio.class_key(torch.float32, False, 20)]
    assert entry["ms"] == {"native": 3.0, "torch_sparse": 1.0} and entry["exact"] is True
    # read back: no measurement, whatever the timing says now
    monkeypatch.setattr(portfolio, "measure", lambda *a, **k: pytest.fail("measured again"))
    d2 = portfolio.decide("cpu", torch.float32, 30)  # the same class (F32)
    assert d2.impl == "torch_sparse" and "measured at F32" in d2.why
    assert portfolio.decide("cpu", torch.float32, 30, setting="native").impl == "native"
    # corrupt: a warning, a new measurement, and a whole file again
    monkeypatch.undo()
    monkeypatch.setenv("GNNCOMPILE_CACHE_DIR", str(cache))
    _fake_times(monkeypatch, "native")
    for bad in ("{not json", json.dumps({"format": "gnncompile-portfolio", "version": 1,
                                         "classes": {"x": {"ms": {"native": -1}, "exact": True}}})):
        path.write_text(bad)
        with pytest.warns(portfolio.PortfolioWarning, match="corrupt"):
            d3 = portfolio.decide("cpu", torch.float32, 30)
        assert d3.impl == "native" and "measured now" in d3.why
        assert json.loads(path.read_text())["classes"][portfolio.class_key(torch.float32, False, 30)]["ms"] == \
            {"native": 1.0, "torch_sparse": 3.0}


def test_what_is_not_admitted_runs_native(cache, monkeypatch):
    _fake_times(monkeypatch, "torch_sparse")
    assert "the only candidate" in portfolio.decide("cpu", torch.float32, 16, reduce="max").why
    assert portfolio.decide("cpu", torch.bfloat16, 16).impl == "native"
    assert "per-head" in portfolio.decide("cpu", torch.float32, 16, weight_dims=2).why
    assert "not admitted on cuda" in portfolio.decide("cuda", torch.float32, 16).why
    # a class whose candidates differ in the last bits: native, unless reassociate
    monkeypatch.setattr(portfolio, "_exact", lambda *a: False)
    d = portfolio.decide("cpu", torch.float64, 64, weight_dims=1, setting="torch_sparse")
    assert d.impl == "native" and "admitted only with reassociate" in d.why
    assert portfolio.decide("cpu", torch.float64, 64, weight_dims=1, reassociate=True).impl == "torch_sparse"


def test_the_budget_bounds_the_measurement(monkeypatch):
    clock = iter(range(0, 10_000))  # every perf_counter() call advances one second
    monkeypatch.setattr(portfolio.time, "perf_counter", lambda: float(next(clock)))
    monkeypatch.setattr(portfolio, "time_candidate", lambda impl, fn: 1e-3)
    e = portfolio.measure(torch.device("cpu"), torch.float32, False, 16, budget_s=2.0)
    # the start reads 0; the checks after rounds 1 and 2 read 1 s and 2 s: past 0.9 x the budget
    assert e["rounds"] == 2 < portfolio.REPEATS


def _calls(fn) -> dict:
    """How many times ``fn()`` calls each spmm implementation (op names in torch's profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    names = [e.name for e in prof.events()]
    return {"native": names.count("gnncompile::spmm"), "torch_sparse": names.count("gnncompile::spmm_sparse")}


class GCN(torch.nn.Module):
    def __init__(self, F=16):
        super().__init__()
        self.c1, self.c2 = GCNConv(F, F, normalize=False), SAGEConv(F, F)  # sum and mean, unweighted

    def forward(self, x, ei):
        return self.c2(self.c1(x, ei).relu(), ei)


def _compile_and_run(model, x, ei):
    torch._dynamo.reset()
    compiled = gnncompile.compile(model, profile=None, settings={"choices": {"spmm_impl": "auto", "guard": "off"}})
    out = compiled(x, ei)  # compiles
    out.sum().backward()
    return compiled, out, _calls(lambda: compiled(x, ei).sum().backward())


@NATIVE
def test_the_compiled_model_runs_the_candidate_measured_faster(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = GCN()
    ei, g = _graph(N=200, E=1600, seed=4)
    x = torch.randn(200, 16, generator=g)
    expect = model(x, ei)
    for faster, other in (("torch_sparse", "native"), ("native", "torch_sparse")):
        monkeypatch.setenv("GNNCOMPILE_CACHE_DIR", str(tmp_path / f"fresh-{faster}"))  # a fresh cache
        _fake_times(monkeypatch, faster)
        compiled, out, n = _compile_and_run(model, x, ei)
        assert n[faster] >= 4 and n[other] == 0, n  # two layers, forward and backward
        torch.testing.assert_close(out, expect)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            text = str(gnncompile.explain(compiled, x, ei))
        lines = [ln for ln in text.splitlines() if "spmm[" in ln]
        assert len(lines) == 2 and all(f"runs {faster} (fastest" in ln for ln in lines), text
        assert f"{faster} 1 ms" in lines[0] and f"{other} 3 ms" in lines[0]


def test_a_class_measured_in_too_few_rounds_keeps_native(cache, monkeypatch):
    _fake_times(monkeypatch, "torch_sparse")
    clock = iter(range(0, 10_000))  # one second a perf_counter() call: the budget ends after round 2
    monkeypatch.setattr(portfolio.time, "perf_counter", lambda: float(next(clock)))
    d = portfolio.decide("cpu", torch.float32, 20)
    assert d.impl == "native" and "2 round(s) only" in d.why
    # read back from the file: still native, no new measurement
    monkeypatch.setattr(portfolio, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert portfolio.decide("cpu", torch.float32, 30).impl == "native"
    assert portfolio.decide("cpu", torch.float32, 30, setting="torch_sparse").impl == "torch_sparse"  # asked for
    # enough rounds: the faster one
    key = portfolio.device_key(torch.device("cpu"))
    doc = json.loads(portfolio.cache_path(key).read_text())
    doc["classes"][portfolio.class_key(torch.float32, False, 20)]["rounds"] = portfolio.MIN_ROUNDS
    portfolio.cache_path(key).write_text(json.dumps(doc))
    assert portfolio.decide("cpu", torch.float32, 30).impl == "torch_sparse"


@torch.library.custom_op("gnncompile_test_glue::spmm_sparse", mutates_args=())
def _custom_op_copy(rowptr: torch.Tensor, col: torch.Tensor, perm: torch.Tensor, weight: Optional[torch.Tensor],
                    x: torch.Tensor, reduce: str, knobs: List[int], rowptr_t: Optional[torch.Tensor] = None,
                    col_t: Optional[torch.Tensor] = None, perm_t: Optional[torch.Tensor] = None) -> torch.Tensor:
    """gnncompile::spmm_sparse's kernel and formulas behind torch.library.custom_op's glue (as the
    op was registered before HISTORY section 40)."""
    return vendor._spmm_sparse_impl(rowptr, col, perm, weight, x, reduce, knobs, rowptr_t, col_t, perm_t)


_custom_op_copy.register_fake(lambda rowptr, col, perm, weight, x, *a, **k: x.new_empty((rowptr.shape[0] - 1,)
                                                                                         + tuple(x.shape[1:])))


def _copy_backward(ctx, grad):
    out = list(vendor._backward(ctx, grad))
    if out[4] is not None:  # vendor._backward's x gradient, through the copy's own op again
        rowptr, col, perm, weight, x, rowptr_t, col_t, perm_t = ctx.saved_tensors
        g = grad.contiguous()
        if ctx.reduce == "mean":
            deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(g.dtype)
            g = g / deg.view(-1, *([1] * (g.dim() - 1)))
        if rowptr_t is None:
            rowptr_t, col_t, perm_t = S.transpose_structure(rowptr, col, perm, ctx.num_src)
        out[4] = _custom_op_copy(rowptr_t, col_t, perm_t, weight, g, "sum", ctx.knobs)
    return tuple(out)


_custom_op_copy.register_autograd(_copy_backward, setup_context=vendor._setup)


@NATIVE
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("with_csc", [False, True])
def test_torch_sparse_registration_same_bits_as_custom_op_and_no_per_call_glue(reduce, weighted, with_csc,
                                                                                monkeypatch):
    """gnncompile::spmm_sparse is a dispatcher op whose autograd kernel is ops.registration's: the
    output and gradients are bit for bit those of the same kernel behind torch.library.custom_op
    (as before), and a forward with a gradient no longer refills the op's defaults from its schema
    (torch._library.utils.fill_defaults) at every call."""
    from torch._library import utils as lib_utils

    ei, g = _graph(N=50, E=400, seed=4)
    s = S.build(ei, 50)
    csc = list(S.transpose_structure(s.rowptr, s.col, s.perm, 50)) if with_csc else [None, None, None]
    x = torch.randn(50, 6, generator=g, requires_grad=True)
    w = torch.rand(400, generator=g, requires_grad=True) if weighted else None
    grad = torch.randn(50, 6, generator=g)
    got = []
    for f in (vendor.spmm_sparse, _custom_op_copy):
        x.grad = None
        if w is not None:
            w.grad = None
        out = f(s.rowptr, s.col, s.perm, w, x, reduce, [], *csc)
        out.backward(grad)
        got.append((out.detach(), x.grad.clone(), None if w is None else w.grad.clone()))
    for a, b in zip(*got):
        assert (a is None and b is None) or torch.equal(a, b)
    calls = []
    real = lib_utils.fill_defaults
    monkeypatch.setattr(lib_utils, "fill_defaults", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    out = vendor.spmm_sparse(s.rowptr, s.col, s.perm, w, x, reduce, [], *csc)
    assert type(out.grad_fn).__name__ == "GeneratedBackwardFor_gnncompile_spmm_sparse_defaultBackward"
    out.backward(grad)
    assert calls == []
    _custom_op_copy(s.rowptr, s.col, s.perm, w, x, reduce, [], *csc)
    assert calls  # (the check sees torch's glue where it runs)


@NATIVE
def test_torch_sparse_opcheck():
    ei, g = _graph(N=20, E=80, seed=5)
    s = S.build(ei, 20)
    x = torch.randn(20, 3, generator=g, requires_grad=True)
    w = torch.rand(80, generator=g, requires_grad=True)
    torch.library.opcheck(torch.ops.gnncompile.spmm_sparse.default, (s.rowptr, s.col, s.perm, w, x, "mean", []))
