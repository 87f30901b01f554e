"""Aggregate first (gnncompile/passes/order.py, opt-in with reassociate=True): a fused sum over a
linear map of a graph input that needs no gradient, ``A (x W)``, becomes ``(A x) W`` (no spmm in
the backward). Off by default, where the graph is left exactly as it was."""
from __future__ import annotations

import importlib

import pytest
import torch
import torch_geometric.nn as gnn
from torch_geometric.nn import models

import gnncompile
from gnncompile import passes
from gnncompile.compiler import backend as _backend
from gnncompile.ops import targets
from gnncompile.settings import DEFAULT

_rewrite = importlib.import_module("gnncompile.passes.rewrite")  # (the package re-exports a function of that name)

N, E = 120, 700
OFF = {"choices": {"guard": "off"}}  # the speed guard would run the unrewritten form on some calls


def _graph(F=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, F, generator=g), torch.randint(0, N, (2, E), generator=g)


class Stack(torch.nn.Module):
    """``layers`` GCNConv layers, F -> hidden (-> out)."""

    def __init__(self, layers=2, F=16, hidden=32, out=8, **kw):
        super().__init__()
        dims = [F, hidden, out][:layers + 1]
        self.convs = torch.nn.ModuleList(gnn.GCNConv(a, b, **kw) for a, b in zip(dims, dims[1:]))

    def forward(self, x, ei):
        for i, c in enumerate(self.convs):
            x = c(x, ei)
            if i + 1 < len(self.convs):
                x = torch.relu(x)
        return x


def _captured(model, *inputs):
    got = []

    def grab(gm, example_inputs):
        got.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with _backend.dynamic_output_shapes():
        torch.compile(model, backend=grab)(*inputs)
    torch._dynamo.reset()
    assert len(got) == 1
    out = got[0]
    got.clear()
    return out


def _spmm_widths(gm):
    """The feature width each native spmm of ``gm`` reads (features: arg 4)."""
    from gnncompile.passes.canonical import fake_tensor

    def width(n):
        while fake_tensor(n) is None and n.op == "call_method":
            n = n.args[0]
        return fake_tensor(n).shape[-1]

    return [width(n.args[4]) for n in gm.graph.nodes if n.op == "call_function" and n.target is targets.SPMM]


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_reassociate_off_leaves_the_graph_as_it_was(monkeypatch):
    """Without the opt-in the rewritten graph is the one the passes made without the rule (same
    code), and the compiled model gives the same bits, forward and gradients."""
    torch.manual_seed(0)
    model = Stack(2)
    x, ei = _graph()
    gm_with = _captured(model, x, ei)
    gm_without = _captured(model, x, ei)
    r = passes.run(gm_with, DEFAULT)
    monkeypatch.setattr(_rewrite, "aggregate_first", lambda graph, lines, re, notes: 0)
    passes.run(gm_without, DEFAULT)
    assert r.aggregated_first == 0
    assert gm_with.code == gm_without.code
    assert any("reassociate=True) aggregates 'x' first" in n for n in r.notes)  # explain says what it would do

    def step(compiled):
        model.zero_grad()
        out = compiled(x, ei)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    out_without, g_without = step(gnncompile.compile(model, settings=OFF))
    monkeypatch.undo()
    torch._dynamo.reset()
    out_with, g_with = step(gnncompile.compile(model, settings=OFF))
    assert torch.equal(out_with, out_without)
    assert all(torch.equal(a, b) for a, b in zip(g_with, g_without))


def test_gcn_first_layer_aggregates_first_and_explain_says_so():
    torch.manual_seed(0)
    model = Stack(2)
    x, ei = _graph()
    gm = _captured(model, x, ei)
    before = len(gm.graph.nodes)
    r = passes.run(gm, DEFAULT.replace(reassociate=True))
    assert before > 0 and r.aggregated_first == 1
    assert sorted(_spmm_widths(gm)) == [8, 16]  # the first layer's spmm reads x (16), not x W (32)
    note = [n for n in r.notes if "aggregated before its linear map" in n]
    assert len(note) == 1 and note[0].startswith("convs.0 (GCNConv)") and "'x' needs no gradient" in note[0]
    rep = gnncompile.explain(gnncompile.compile(model, reassociate=True), x, ei)
    assert any("aggregated before its linear map" in str(f) and "convs.0" in str(f) for f in rep.fused)
    assert any(n.startswith("convs.0 (GCNConv): aggregated before") for n in rep.notes)


@pytest.mark.parametrize("layers,bias,variant", [
    (1, True, "normalize"), (1, False, "normalize"), (2, True, "normalize"), (2, False, "normalize"),
    (1, True, "cached"), (2, True, "cached"), (1, True, "plain"), (2, False, "plain"),
])
def test_gcn_numerics_match_eager(layers, bias, variant):
    """Outputs within 1e-5 relative of eager, the weights' gradients within tolerance, and the
    rule fired (one spmm reads x's width)."""
    kw = {"bias": bias}
    if variant == "cached":
        kw["cached"] = True
    if variant == "plain":
        kw["normalize"] = False
    torch.manual_seed(0)
    model = Stack(layers, hidden=32, out=8 if layers == 2 else 32, **kw)
    x, ei = _graph()
    gm = _captured(model, x, ei)
    assert passes.run(gm, DEFAULT.replace(reassociate=True)).aggregated_first == 1
    assert 16 in _spmm_widths(gm)
    for conv in model.convs:
        conv._cached_edge_index = None  # the capture filled the cache; eager fills it again
    compiled = gnncompile.compile(model, reassociate=True, settings=OFF)
    for _ in range(2):  # the second call reads the cache when cached=True
        out_c = compiled(x, ei)
        out_e = model(x, ei)
        assert _rel(out_c, out_e) < 1e-5
        g = torch.randn_like(out_e)
        params = list(model.parameters())
        gc = torch.autograd.grad(out_c, params, g)
        ge = torch.autograd.grad(out_e, params, g)
        for a, b in zip(gc, ge):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_x_that_requires_grad_keeps_the_model_order():
    """Dynamo guards on requires_grad: a call whose x requires grad gets a graph of its own, in
    which the rule does not fire, and x's gradient is eager's."""
    torch.manual_seed(0)
    model = Stack(2)
    x, ei = _graph()
    xg = x.clone().requires_grad_()
    gm = _captured(model, xg, ei)
    r = passes.run(gm, DEFAULT.replace(reassociate=True))
    assert r.aggregated_first == 0 and sorted(_spmm_widths(gm)) == [8, 32]
    compiled = gnncompile.compile(model, reassociate=True, settings=OFF)
    compiled(x, ei)  # compiled first without grad: the rule fires there
    out_c = compiled(xg, ei)
    xe = x.clone().requires_grad_()
    out_e = model(xe, ei)
    assert _rel(out_c, out_e) < 1e-5
    g = torch.randn_like(out_e)
    (gx_c,) = torch.autograd.grad(out_c, [xg], g)
    (gx_e,) = torch.autograd.grad(out_e, [xe], g)
    torch.testing.assert_close(gx_c, gx_e, rtol=1e-4, atol=1e-5)


def test_wider_input_keeps_the_model_order():
    torch.manual_seed(0)
    model = Stack(1, F=32, hidden=8)
    x, ei = _graph(F=32)
    gm = _captured(model, x, ei)
    r = passes.run(gm, DEFAULT.replace(reassociate=True))
    assert r.aggregated_first == 0 and _spmm_widths(gm) == [8]
    assert any("32 > 8 features" in n for n in r.notes)


class MatmulSum(torch.nn.Module):
    """A sum over the edges of ``x @ W`` (or of ``lin(x)`` with a bias inside the sum)."""

    def __init__(self, F=16, out=32, bias_inside=False):
        super().__init__()
        self.bias_inside = bias_inside
        self.W = torch.nn.Parameter(torch.randn(F, out) / F ** 0.5)
        self.lin = torch.nn.Linear(F, out)

    def forward(self, x, ei):
        h = self.lin(x) if self.bias_inside else x @ self.W
        return torch.zeros(x.size(0), h.size(1)).index_add_(0, ei[1], h[ei[0]])


def test_matmul_form_aggregates_first_and_bias_inside_does_not():
    x, ei = _graph()
    torch.manual_seed(0)
    m = MatmulSum()
    gm = _captured(m, x, ei)
    assert passes.run(gm, DEFAULT.replace(reassociate=True)).aggregated_first == 1
    out_c = gnncompile.compile(m, reassociate=True, settings=OFF)(x, ei)
    assert _rel(out_c, m(x, ei)) < 1e-5
    torch.manual_seed(0)
    mb = MatmulSum(bias_inside=True)
    gm = _captured(mb, x, ei)
    assert passes.run(gm, DEFAULT.replace(reassociate=True)).aggregated_first == 0


def test_benchmark_gcn_model_fires_once():
    """benchmarks/models.py's GCN (torch_geometric.nn.models.GCN): the first layer only."""
    torch.manual_seed(0)
    model = models.GCN(16, 32, 2, 8)
    x, ei = _graph()
    gm = _captured(model, x, ei)
    assert passes.run(gm, DEFAULT.replace(reassociate=True)).aggregated_first == 1
