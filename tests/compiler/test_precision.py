"""The opt-in bf16 gathering of the fused spmm (choices['precision'], $GNNCOMPILE_PRECISION,
gnncompile.passes.precision): the default leaves every compiled graph as it was, bf16 stays
within the rounding bound of bfloat16 and really runs the op on bfloat16, gradients flow back
as float32, and what stays fp32 says why."""
from __future__ import annotations

import sys
import warnings

import pytest
import torch
from torch_geometric.nn import GCNConv, MessagePassing, SAGEConv

import gnncompile
from gnncompile import config, profiles
from gnncompile.compiler.backend import Backend
from gnncompile.ops import targets
from gnncompile.passes import precision as P
from gnncompile.settings import Settings

NATIVE = pytest.mark.skipif(not gnncompile.info()["native"], reason="needs the native kernels")
BF16 = {"choices": {"precision": "bf16", "guard": "off", "spmm_impl": "native"}}
FP32 = {"choices": {"guard": "off", "spmm_impl": "native"}}
# bfloat16 keeps 8 significant bits (7 stored): rounding to nearest is off by at most 2^-8
# relative (half a unit in the last place, 2^-7 at 1). A gathered term w * x carries the rounding
# of x and of w (2^-8 each; 2^-16 for both together) and the float32 sum adds about deg * 2^-24;
# spmm_bf16 writes the float32 accumulator (no rounding of the output): in all at most 2 * 2^-8
# (+ 2^-12 for the products and the float32 sums) of sum |w| |x| per element, 2^-8 unweighted.


def bound(weighted: bool) -> float:
    return (2 if weighted else 1) * 2.0 ** -8 + 2.0 ** -12


class Aggregate(MessagePassing):
    def __init__(self, aggr="add"):
        super().__init__(aggr=aggr)

    def forward(self, x, edge_index, w=None):
        return self.propagate(edge_index, x=x, w=w)

    def message(self, x_j, w):
        return x_j if w is None else w.view(-1, 1) * x_j


class Net(torch.nn.Module):
    """GCN (weighted sum), SAGE mean (unweighted) and SAGE max (not covered)."""

    def __init__(self, F=16):
        super().__init__()
        self.c1, self.c2, self.c3 = GCNConv(F, F), SAGEConv(F, F), SAGEConv(F, F, aggr="max")

    def forward(self, x, ei):
        return self.c3(self.c2(self.c1(x, ei).relu(), ei).relu(), ei)


def _graph(N=300, E=2400, F=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, F, generator=g, dtype=dtype), torch.randint(0, N, (2, E), generator=g), g


_DTYPES = {"float": torch.float32, "c10::BFloat16": torch.bfloat16, "double": torch.float64}


class SpmmDtypes:
    """The feature dtypes the spmm calls gathered (forward and backward), read from torch's
    profiler: gnncompile::spmm's x, gnncompile::spmm_bf16's xb."""

    def __enter__(self):
        self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
        self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        self.prof.__exit__(*exc)
        where = {"gnncompile::spmm": 4, "gnncompile::spmm_bf16": 5}
        self.seen = [_DTYPES.get(e.input_dtypes[where[e.name]], e.input_dtypes[where[e.name]])
                     for e in self.prof.events() if e.name in where]
        self.bf16_op = sum(1 for e in self.prof.events() if e.name == "gnncompile::spmm_bf16")
        return False


def _compile(model, settings):
    return gnncompile.compile(model, profile=None, settings=settings)


def _explain(compiled, *args) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return str(gnncompile.explain(compiled, *args))


def _rewritten_code(model, settings, *args, monkeypatch=None, today=False):
    """The rewritten graphs' code and the output / input gradient of ``model`` compiled with the
    backend of ``settings``; ``today``: with the precision pass taken out (the code before it)."""
    torch._dynamo.reset()
    be = Backend(Settings().replace(**settings))
    codes = []

    def backend(gm, example_inputs):
        out = be(gm, example_inputs)
        codes.append(gm.code)
        return out

    if today:
        monkeypatch.setattr(sys.modules["gnncompile.passes.rewrite"], "gather_bf16", lambda *a: 0)
    compiled = torch.compile(model, backend=backend)
    x = args[0].clone().requires_grad_()
    y = compiled(x, *args[1:])
    y.backward(torch.ones_like(y))
    if today:
        monkeypatch.undo()
    return codes, y.detach(), x.grad


@NATIVE
def test_the_default_leaves_every_compiled_graph_as_it_was(monkeypatch):
    torch.manual_seed(0)
    model = Net()
    x, ei, _ = _graph()
    for given in ({"inner": "eager"}, {"inner": "eager", "choices": {"precision": "fp32"}}):
        codes, y, gx = _rewritten_code(model, given, x, ei)
        codes0, y0, gx0 = _rewritten_code(model, {"inner": "eager"}, x, ei, monkeypatch=monkeypatch, today=True)
        assert codes == codes0 and codes and "bfloat16" not in "".join(codes)
        assert torch.equal(y, y0) and torch.equal(gx, gx0)
    assert Settings().precision == "fp32" and "precision" not in dict(Settings.from_config().choices)


@NATIVE
@pytest.mark.parametrize("aggr", ["add", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_bf16_stays_within_the_rounding_bound_and_differs_from_fp32(aggr, weighted):
    x, ei, g = _graph(N=400, E=4000, F=32, seed=1)
    w = torch.rand(ei.shape[1], generator=g) if weighted else None
    args = (ei,) if w is None else (ei, w)
    model = Aggregate(aggr)
    outs, grads = {}, {}
    for name, s in (("bf16", BF16), ("fp32", FP32)):
        torch._dynamo.reset()
        compiled = _compile(model, s)
        compiled(x.clone().requires_grad_(), *args).sum().backward()  # compiles (forward, backward)
        xr = x.clone().requires_grad_()
        with SpmmDtypes() as seen:
            y = compiled(xr, *args)
            y.backward(torch.ones_like(y) * 0.5 + x[: y.shape[0]] * 0.1)
        outs[name], grads[name] = y.detach(), xr.grad
        expect = torch.bfloat16 if name == "bf16" else torch.float32
        assert len(seen.seen) == 2 and set(seen.seen) == {expect}, seen.seen  # forward and backward spmm
        assert seen.bf16_op == (2 if name == "bf16" else 0)
        assert y.dtype == torch.float32 and xr.grad.dtype == torch.float32
    # the reference in float64, and the scale of each element: the same sum over |w| |x|
    ref = model(x.double(), *(ei,) if w is None else (ei, w.double()))
    scale = model(x.double().abs(), *(ei,) if w is None else (ei, w.double().abs()))
    err = (outs["bf16"].double() - ref).abs()
    assert (err <= bound(weighted) * scale + 1e-30).all(), (err / scale.clamp(min=1e-30)).max()
    assert not torch.equal(outs["bf16"], outs["fp32"])  # the opt-in took effect
    torch.testing.assert_close(outs["fp32"], ref.float(), rtol=1e-5, atol=1e-5)
    # the gradient of x: the transposed aggregation of a bf16 gradient, in the same bound
    go = (torch.ones(ref.shape, dtype=torch.float64) * 0.5 + x[: ref.shape[0]].double() * 0.1)
    xd = x.double().requires_grad_()
    model(xd, *(ei,) if w is None else (ei, w.double())).backward(go)
    xa = x.double().abs().requires_grad_()
    model(xa, *(ei,) if w is None else (ei, w.double().abs())).backward(go.abs())
    gerr = (grads["bf16"].double() - xd.grad).abs()
    assert (gerr <= bound(weighted) * xa.grad + 1e-30).all()
    assert not torch.equal(grads["bf16"], grads["fp32"])


@NATIVE
def test_a_model_trains_and_explain_says_per_op_what_gathers_bf16():
    torch.manual_seed(0)
    model = Net()
    x, ei, _ = _graph()
    compiled = _compile(model, BF16)
    y = compiled(x, ei)
    y.square().mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    ref = model(x, ei)
    rel = (y - ref).norm() / ref.norm()
    assert 0 < rel < 2.0 ** -5, rel  # three layers of 2^-8-sized roundings, but not the fp32 bits
    text = _explain(compiled, x, ei)
    lines = [ln for ln in text.splitlines() if "spmm[" in ln]
    assert len(lines) == 3, text
    gcn, sage, smax = (next(ln for ln in lines if f"in {c}" in ln) for c in ("c1", "c2", "c3"))
    assert P.GATHERS in gcn and "weighted" in gcn and P.GATHERS in sage
    assert "stays fp32: reduce 'max' is not covered" in smax
    assert "precision=bf16" in text  # the settings line


@NATIVE
def test_float64_and_the_vendor_spmm_stay_fp32_with_the_reason():
    torch.manual_seed(0)
    model = Net().double()
    x, ei, _ = _graph(dtype=torch.float64)
    compiled = _compile(model, BF16)
    with SpmmDtypes() as seen:
        y = compiled(x, ei)
    assert set(seen.seen) == {torch.float64}
    torch.testing.assert_close(y, model(x, ei))
    text = _explain(compiled, x, ei)
    assert text.count("stays fp32: its input is float64 (bf16 gathers float32 features only)") == 2, text
    # the vendor implementation: left as the portfolio chose it
    torch._dynamo.reset()
    agg = Aggregate()
    x32 = x.float()
    vendor = _compile(agg, {"choices": {"precision": "bf16", "guard": "off", "spmm_impl": "torch_sparse"}})
    torch.testing.assert_close(vendor(x32, ei), agg(x32, ei))
    assert "stays fp32: it runs torch_sparse" in _explain(vendor, x32, ei)


def test_a_cuda_input_stays_fp32_with_the_reason():
    """The device rule on a node whose recorded value is a fake CUDA tensor (no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx import Graph

    g = Graph()
    with FakeTensorMode():
        vals = {"cpu": torch.empty(5, 4), "cuda": torch.empty(5, 4, device="cuda"),
                "half": torch.empty(5, 4, dtype=torch.float16)}
    calls = {}
    for name, v in vals.items():
        x = g.placeholder(name)
        x.meta["example_value"] = v
        idx = g.placeholder(f"i_{name}")
        calls[name] = g.call_function(targets.SPMM, (idx, idx, idx, None, x, "sum", []))
    assert P._why_not(calls["cpu"]) == ""
    assert P._why_not(calls["cuda"]) == "stays fp32: on cuda (bf16 gathering is CPU-only)"
    assert "its input is float16" in P._why_not(calls["half"])


def test_a_bad_value_is_a_clear_error_and_the_environment_sets_it(monkeypatch):
    with pytest.raises(ValueError, match=r"choices\['precision'\] must be one of \('fp32', 'bf16'\)"):
        Settings(choices=(("precision", "fp16"),))
    with pytest.raises(ValueError, match="precision"):
        gnncompile.compile(torch.nn.Linear(2, 2), profile=None, settings={"choices": {"precision": "half"}})
    monkeypatch.setenv("GNNCOMPILE_PRECISION", "bf16")
    s = Settings.from_config()
    assert s.precision == "bf16" and "precision=bf16" in next(ln for ln in s.lines() if ln.startswith("choices:"))
    monkeypatch.setenv("GNNCOMPILE_PRECISION", "BF16")  # any case
    assert Settings.from_config().precision == "bf16"
    monkeypatch.setenv("GNNCOMPILE_PRECISION", "int8")
    with pytest.raises(config.ConfigError, match="GNNCOMPILE_PRECISION='int8': expected one of fp32, bf16"):
        Settings.from_config()
    monkeypatch.setenv("GNNCOMPILE_PRECISION", "")
    assert Settings.from_config().precision == "fp32"


@NATIVE
def test_the_environment_opts_a_compiled_model_in(monkeypatch):
    monkeypatch.setenv("GNNCOMPILE_PRECISION", "bf16")
    monkeypatch.setenv("GNNCOMPILE_GUARD", "off")
    monkeypatch.setenv("GNNCOMPILE_SPMM_IMPL", "native")
    x, ei, _ = _graph()
    compiled = gnncompile.compile(Aggregate(), profile=None)  # (settings= with choices would replace them)
    assert compiled.gnncompile_settings.precision == "bf16"
    with SpmmDtypes() as seen:
        compiled(x, ei)
    assert seen.seen and set(seen.seen) == {torch.bfloat16}


def test_a_profile_carries_the_precision(tmp_path, monkeypatch):
    with pytest.raises(profiles.ProfileError, match="settings.precision must be one of"):
        profiles.check_settings({"precision": "fp16"})
    assert profiles.check_settings({"precision": "bf16"})[0]["precision"] == "bf16"
    doc = profiles.make(gnncompile.hardware.detect(), {"kind": "graphs", "model": "gin"},
                        {"knobs": [4], "threads": 1, "precision": "bf16"})
    prof = profiles.load_file(profiles.save(doc, tmp_path))
    assert prof.settings["precision"] == "bf16"
    # a profile alone never lowers the precision: the user opts in
    monkeypatch.delenv("GNNCOMPILE_PRECISION", raising=False)
    s = Settings.build(prof)
    assert s.precision == "fp32" and "its precision 'bf16' not applied: lower precision is opt-in" in s.profile
    assert Settings.build(prof, choices={"precision": "bf16"}).precision == "bf16"  # explicit opt-in
    monkeypatch.setenv("GNNCOMPILE_PRECISION", "bf16")
    assert Settings.build(prof).precision == "bf16"  # opted in through the environment: the profile's bf16 applies
    assert Settings.build(prof, choices={"precision": "fp32"}).precision == "fp32"  # explicit wins
    tuned_fp32 = profiles.load_file(profiles.save(profiles.make(
        gnncompile.hardware.detect(), {"kind": "graphs", "model": "gin"}, {"knobs": [4], "precision": "fp32"}),
        tmp_path / "f"))
    assert Settings.build(tuned_fp32).precision == "fp32"  # opted in, but the tuner found fp32 faster
    monkeypatch.delenv("GNNCOMPILE_PRECISION")
    plain = profiles.make(gnncompile.hardware.detect(), {"kind": "graphs", "model": "gin"}, {"knobs": [4]})
    assert Settings.build(profiles.load_file(profiles.save(plain, tmp_path / "p"))).precision == "fp32"


@NATIVE
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_the_op_writes_the_float32_accumulator_and_its_gradient(reduce, weighted):
    from gnncompile.ops import schemas
    from gnncompile.ops import structure as S
    from gnncompile.ops.schemas import ops

    x, ei, g = _graph(N=200, E=1500, F=12, seed=3)
    s = S.build(ei, 200)
    csr = (s.rowptr, s.col, s.perm)
    w = torch.rand(1500, generator=g).to(torch.bfloat16) if weighted else None
    xr = x.clone().requires_grad_()
    y = ops.spmm_bf16(*csr, w, xr, xr.detach().to(torch.bfloat16), reduce, [])
    assert y.dtype == torch.float32 and y.shape == (200, 12)
    # float64 over the same bfloat16 inputs: only the float32 summation differs
    xb = x.to(torch.bfloat16)
    ref = ops.spmm(*csr, None if w is None else w.double(), xb.double(), reduce, [])[0]
    torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=1e-6)
    # without the native kernel: the bfloat16 spmm cast after, i.e. the native output rounded once more
    fallback = schemas._spmm_bf16_impl(*csr, w, x, xb, reduce, [])
    assert torch.equal(fallback, y.detach().to(torch.bfloat16).to(torch.float32))
    # x's gradient: the transposed spmm_bf16 of the (degree-scaled) gradient, float32
    go = torch.randn(200, 12, generator=g)
    y.backward(go)
    gs = go / (s.rowptr[1:] - s.rowptr[:-1]).clamp(min=1).view(-1, 1) if reduce == "mean" else go
    t = s.transposed(200)
    expect = ops.spmm_bf16(*t, w, gs, gs.to(torch.bfloat16), "sum", [])
    assert xr.grad.dtype == torch.float32 and torch.equal(xr.grad, expect)


def test_the_op_refuses_bad_input():
    from gnncompile.ops import structure as S
    from gnncompile.ops.schemas import ops

    x, ei, _ = _graph(N=20, E=60, F=4)
    s = S.build(ei, 20)
    csr = (s.rowptr, s.col, s.perm)
    with pytest.raises(ValueError, match="reduce must be sum or mean"):
        ops.spmm_bf16(*csr, None, x, x.to(torch.bfloat16), "max", [])
    with pytest.raises(ValueError, match="one shape"):
        ops.spmm_bf16(*csr, None, x[:, :3], x.to(torch.bfloat16), "sum", [])
    if gnncompile.info()["native"]:
        with pytest.raises(TypeError, match="xb must be bfloat16"):
            ops.spmm_bf16(*csr, None, x, x, "sum", [])


def test_export_runs_fp32():
    """An exported file has no bf16 op: export drops the opt-in (its passes run fp32)."""
    from gnncompile.export.capture import export_settings

    s = Settings(choices=(("precision", "bf16"), ("guard", "off")))
    for programs in (True, False):
        out, _ = export_settings(s, programs)
        assert out.precision == "fp32" and out.guard == "off"
