"""Graph-invariant hoisting (gnncompile/passes/hoist.py, gnncompile/ops/hoisted.py): graph-only
work is computed once per graph and reused, and nothing that depends on features, parameters,
float inputs or randomness is ever cached; every change to the graph recomputes."""
from __future__ import annotations

import gc

import pytest
import torch
import torch_geometric.nn as gnn
from torch_geometric.nn import models
from torch_geometric.utils import add_remaining_self_loops, degree

import gnncompile
from gnncompile.compiler import backend as _backend
from gnncompile.ops import hoisted, structure

N, F = 40, 8


def _graph(seed=0, n=N, e=160):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei[:, :5] = torch.arange(5).repeat(2, 1)  # a few self loops already present
    return torch.randn(n, F, generator=g), ei


def _fresh():
    torch._dynamo.reset()
    structure.clear_cache()


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _step(fn, model, *inputs):
    model.zero_grad()
    out = fn(*inputs)
    out.square().sum().backward()
    return out.detach(), _grads(model)


def _same_step(model, compiled, *inputs):
    e_out, e_grads = _step(model, model, *inputs)
    c_out, c_grads = _step(compiled, model, *inputs)
    torch.testing.assert_close(c_out, e_out, rtol=1e-4, atol=1e-5)
    for a, b in zip(c_grads, e_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("factory", [lambda: models.GCN(F, 16, 2, 4), lambda: models.GAT(F, 8, 2, 4, heads=2)],
                         ids=["GCN", "GAT"])
def test_default_gcn_gat_one_piece_and_computed_once(factory):
    _fresh()
    torch.manual_seed(0)
    model = factory()
    x, ei = _graph()
    rep = gnncompile.explain(model, x, ei)
    assert rep.num_graph_breaks == 0 and rep.num_graphs == 1, str(rep)
    assert rep.hoisted == 1 and not rep.unfused, str(rep)
    c = gnncompile.compile(model)
    hoisted.CACHE.clear()
    for _ in range(3):
        _same_step(model, c, x, ei)
    h = hoisted.hoist_info()
    assert h["computes"] == 1 and h["hits"] == 2, h


def test_every_change_of_the_graph_recomputes():
    _fresh()
    torch.manual_seed(0)
    model = models.GCN(F, 16, 2, 4)
    c = gnncompile.compile(model)
    x, ei = _graph()
    _same_step(model, c, x, ei)
    assert hoisted.hoist_info()["computes"] == 1
    ei[1, 7:20] = (ei[1, 7:20] + 3) % N  # in place: the version counter moves
    _same_step(model, c, x, ei)
    assert hoisted.hoist_info()["computes"] == 2
    ei.numpy()[0, 30:50] = 2  # behind the version counter: the fingerprint notices
    _same_step(model, c, x, ei)
    h = hoisted.hoist_info()
    assert h["computes"] == 3 and h["stale"] == 2, h  # both edits refused the old result
    _, other = _graph(seed=5)  # another graph of the same shape
    _same_step(model, c, x, other)
    assert hoisted.hoist_info()["computes"] == 4
    _same_step(model, c, x, ei)  # the earlier graph again: still cached, still valid
    assert hoisted.hoist_info()["computes"] == 4


def test_results_go_with_the_graph():
    _fresh()
    model = models.GCN(F, 16, 2, 4)
    c = gnncompile.compile(model)
    x, ei = _graph()
    c(x, ei)
    assert hoisted.hoist_info()["results"] == 1
    del ei
    assert hoisted.hoist_info()["results"] == 0


def test_float_edge_weights_are_never_cached():
    """A user's edge weights (float, no gradient) reach the normalization every call."""
    _fresh()
    torch.manual_seed(0)
    model = models.GCN(F, 16, 2, 4)
    c = gnncompile.compile(model)
    x, ei = _graph()
    w = torch.rand(ei.shape[1])
    for _ in range(2):
        _same_step(model, c, x, ei, w)
        w.mul_(3.0).add_(0.5)  # in place, same tensor
    w.numpy()[:10] = 7.0
    _same_step(model, c, x, ei, w)


def test_trainable_edge_weights_get_their_gradient():
    _fresh()
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.rand(160 + N))
            self.conv = gnn.GCNConv(F, 4, add_self_loops=False)

        def forward(self, x, ei):
            ei, _ = add_remaining_self_loops(ei, num_nodes=x.size(0))
            return self.conv(x, ei, self.w[: ei.size(1)].sigmoid())

    model = Net()
    c = gnncompile.compile(model)
    x, ei = _graph()
    for _ in range(2):
        _same_step(model, c, x, ei)
        with torch.no_grad():
            model.w.add_(0.1)


class _WritesDegree(torch.nn.Module):
    """Graph-only degree, then written in place with feature-dependent values."""

    def forward(self, x, ei):
        deg = degree(ei[1], x.size(0), dtype=x.dtype)
        deg.add_(x.sum(1))  # the rest of the graph writes the invariant value
        return x * deg.unsqueeze(1)


class _RandomEdges(torch.nn.Module):
    def forward(self, x, ei):
        keep = torch.rand(ei.size(1)) < 0.5
        src, dst = ei[0][keep], ei[1][keep]
        return torch.zeros_like(x).index_add_(0, dst, x[src])


def test_values_written_later_are_not_cached():
    _fresh()
    m = _WritesDegree()
    c = gnncompile.compile(m)
    x, ei = _graph()
    for s in range(3):
        x = torch.randn(N, F, generator=torch.Generator().manual_seed(s))
        torch.testing.assert_close(c(x, ei), m(x, ei))


def test_random_graph_work_is_not_cached():
    _fresh()
    c = gnncompile.compile(_RandomEdges(), inner="aot_eager")
    x, ei = _graph()
    outs = [c(x, ei) for _ in range(3)]
    assert not torch.equal(outs[0], outs[1]) or not torch.equal(outs[1], outs[2])
    assert hoisted.hoist_info()["computes"] == 0


def test_mini_batches_and_inductor():
    """New graphs every call (mini-batches) with the inductor inner: correct each time, and
    the copies handed to inductor leave the cached results intact."""
    _fresh()
    torch.manual_seed(0)
    model = models.GCN(F, 16, 2, 4)
    c = gnncompile.compile(model, inner="inductor", dynamic=True)
    for s in range(3):
        x, ei = _graph(seed=s, n=N + 4 * s, e=160 + 8 * s)
        _same_step(model, c, x, ei)
        _same_step(model, c, x, ei)  # cached now
    assert hoisted.hoist_info()["hits"] >= 3


def test_capture_flag_is_restored_and_can_be_turned_off(monkeypatch):
    _fresh()
    cfg = torch._dynamo.config
    assert not cfg.capture_dynamic_output_shape_ops
    model = models.GCN(F, 16, 2, 4)
    x, ei = _graph()
    gnncompile.compile(model)(x, ei)
    assert not cfg.capture_dynamic_output_shape_ops
    _fresh()
    with gnncompile.config.override(capture_dynamic=False):
        rep = gnncompile.explain(model, x, ei)
    assert rep.num_graph_breaks >= 1  # as plain torch.compile: the nonzero breaks the graph


# ----------------------------------------------------------------------------- region lifetime
def _live_regions() -> int:
    gc.collect()
    return hoisted.hoist_info()["regions"]


@pytest.mark.parametrize("inner", ["eager", "aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_regions_live_only_as_long_as_a_compiled_graph_that_calls_them(inner):
    """Every fresh compile whose region code differs (static sizes here) registered one more
    region and none was ever freed: 1, 2 regions over GCNs run on 50, 51 nodes."""
    _fresh()
    before = _live_regions()
    for n in (50, 51):
        torch.manual_seed(0)
        model = models.GCN(F, 16, 2, 4)
        c = gnncompile.compile(model, inner=inner)
        x, ei = _graph(n=n, e=4 * n)
        _same_step(model, c, x, ei)
        assert _live_regions() == before + 1, n
        hoisted.CACHE.clear()  # the next call runs the region again: it must still be there
        _same_step(model, c, x, ei)
        del c, model
        torch._dynamo.reset()
    assert _live_regions() == before


def _captures(model, *inputs, times=2):
    """``times`` captures of ``model``'s graph as Dynamo hands them to a backend (identical
    graphs, so identical regions once hoisted), with their example inputs."""
    got = []

    def grab(gm, example_inputs):
        got.append((gm, list(example_inputs)))
        return gm.forward

    for _ in range(times):
        torch._dynamo.reset()
        with _backend.dynamic_output_shapes():
            torch.compile(model, backend=grab)(*inputs)
    torch._dynamo.reset()
    # the captures leave the closure: Dynamo may keep ``grab`` alive (a cached callback, after
    # other tests in the process), and its list would keep every graph alive with it
    out = list(got)
    got.clear()
    return out


def test_a_region_shared_by_two_compiled_graphs_lives_while_either_does():
    _fresh()
    torch.manual_seed(0)
    model = models.GCN(F, 16, 2, 4)
    x, ei = _graph()
    before = _live_regions()
    (ga, inputs), (gb, _) = _captures(model, x, ei)
    be = _backend.make_backend("eager")
    fa, fb = be(ga, inputs), be(gb, inputs)
    del ga, gb
    assert _live_regions() == before + 1  # one key, registered by both
    (region,) = getattr(fa.__self__, hoisted.HELD)  # eager: fa is gm.forward
    (key,) = [k for k, r in hoisted._REGIONS.items() if r is region]
    del region
    want = model(x, ei)
    torch.testing.assert_close(fa(*inputs)[0], want)
    del fa
    hoisted.CACHE.clear()
    assert _live_regions() == before + 1
    torch.testing.assert_close(fb(*inputs)[0], want)  # runs the region again
    assert hoisted.hoist_info()["computes"] == 1
    del fb
    assert _live_regions() == before and hoisted.hoist_info()["results"] == 0  # its results went with it
    with pytest.raises(RuntimeError, match=f"no region {key} in this process; the compiled graph calling it was freed"):
        hoisted.region(key)


def test_pass_on_holds_regions_without_a_wrapper_where_it_can():
    gm = torch.fx.symbolic_trace(lambda ei: ei.flip(0))
    region = torch.fx.symbolic_trace(lambda ei: ei + 1)
    hoisted.hold(gm, region)
    hoisted.hold(gm, region)
    assert getattr(gm, hoisted.HELD) == [region]
    assert hoisted.pass_on(gm, gm.forward).__self__ is gm  # eager: gm holds them

    def fn(*args):
        return args

    fn._boxed_call = True
    assert hoisted.pass_on(gm, fn) is fn and getattr(fn, hoisted.HELD) == [region]

    class Slotted:
        __slots__ = ("_boxed_call",)

        def __call__(self, *args):
            return args

    obj = Slotted()
    obj._boxed_call = True
    wrapped = hoisted.pass_on(gm, obj)
    assert wrapped is not obj and getattr(wrapped, hoisted.HELD) == [region] and wrapped(1, 2) == (1, 2)
    assert wrapped._boxed_call  # Dynamo still calls it with one list
    plain = torch.fx.symbolic_trace(lambda ei: ei)
    assert hoisted.pass_on(plain, obj) is obj  # nothing to hold


def test_hoisted_op_refuses_float_roots():
    from gnncompile.ops import targets

    with pytest.raises(TypeError, match="integer tensors"):
        targets.HOISTED(0, [torch.rand(3)], [], False)
    with pytest.raises(RuntimeError, match="no region"):
        targets.HOISTED(12345, [torch.zeros(2, 3, dtype=torch.long)], [], False)


def test_auto_inner_rule_by_graph_size(monkeypatch):
    """'auto' without a profile or $GNNCOMPILE_INNER: below the measured size
    AUTO_SMALL_FUSED_TRAINING (eager by default: aot_eager's trace costs more at the first call
    than it saves in a short run) for a piece with fused ops that records a backward, eager for
    the others, inductor at and above it (benchmarks/inner_rule.py, results/small_steps.md,
    results/molecules.md); parameters do not count as nodes."""
    T = _backend.AUTO_INDUCTOR_MIN_SIZE
    weight = torch.nn.Parameter(torch.empty(T, 1))  # requires grad: a training piece in grad mode
    small = [torch.empty(2708, 16), torch.empty(2, 10556, dtype=torch.long), weight]
    assert _backend.graph_size(small) == 2708 + 10556
    assert _backend.AUTO_SMALL_FUSED_TRAINING == "eager"
    assert _backend.choose_inner(small, fused=3) == "eager"
    monkeypatch.setattr(_backend, "AUTO_SMALL_FUSED_TRAINING", "aot_eager")  # the rule's other setting
    assert _backend.choose_inner(small, fused=3) == "aot_eager"
    assert _backend.choose_inner(small, fused=0) == "eager"  # nothing fused: nothing to trace
    with torch.no_grad():  # Dynamo compiles a no-grad call apart: no backward to trace
        assert _backend.choose_inner(small, fused=3) == "eager"
    assert _backend.choose_inner(small[:2], fused=3) == "eager"  # no input needs a gradient
    big = [torch.empty(T // 10, 4), torch.empty(2, T - T // 10, dtype=torch.long), weight]
    assert _backend.choose_inner(big) == "inductor"
    with torch.no_grad():
        assert _backend.choose_inner(big, fused=3) == "inductor"
    with gnncompile.config.override(inner=None):
        assert _backend.make_backend("auto").inner == "auto"
    with gnncompile.config.override(inner="aot_eager"):  # $GNNCOMPILE_INNER names one for every piece
        assert _backend.make_backend("auto").inner == "aot_eager"


def test_auto_inner_picks_aot_eager_for_fused_training_pieces(monkeypatch):
    """The backend's 'auto' below the inductor size, with AUTO_SMALL_FUSED_TRAINING set to
    aot_eager: a piece with fused ops compiled in grad mode goes to it (the choice is made after
    the passes), the same model's no-grad piece to eager; both compute what eager computes, and
    explain's settings say what 'auto' does."""
    monkeypatch.setattr(_backend, "AUTO_SMALL_FUSED_TRAINING", "aot_eager")
    from torch_geometric.nn import GCNConv

    torch.manual_seed(0)
    conv = GCNConv(8, 8)
    x, ei = torch.randn(40, 8), torch.randint(0, 40, (2, 160))
    with gnncompile.config.override(inner=None):
        compiled = gnncompile.compile(conv, settings={"choices": {"guard": "off", "spmm_impl": "native"}})
    assert compiled.gnncompile_settings.inner == "auto"
    with _backend.collect() as reports:
        out = compiled(x, ei)
        out.sum().backward()
        with torch.no_grad():
            out_ng = compiled(x, ei)
    assert [r.inner for r in reports] == ["aot_eager", "eager"], [(r.inner, r.num_fused) for r in reports]
    assert all(r.num_fused >= 1 for r in reports)
    torch.testing.assert_close(out, conv(x, ei), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_ng, out.detach(), rtol=1e-6, atol=1e-6)
    assert conv.lin.weight.grad is not None
    assert "inductor from AUTO_INDUCTOR_MIN_SIZE nodes + edges, else eager" in str(gnncompile.explain(compiled, x, ei))
