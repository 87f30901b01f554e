"""The lean forwards of PyG layers (gnncompile.compiler.lean): the graph Dynamo captures through
them is PyG's graph op for op, runs to PyG's bits (forward and gradients), and anything PyG's
path would honour that the lean one does not (a subclass, hooks, explain, decomposed layers, a
method set on the instance, other settings) keeps PyG's forward. The user's module objects are
not modified."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

pyg = pytest.importorskip("torch_geometric")
from torch_geometric.nn import GCNConv, GINConv, GINEConv  # noqa: E402

import gnncompile  # noqa: E402
from gnncompile.compiler import lean  # noqa: E402
from gnncompile.compiler.api import CompileFallbackWarning  # noqa: E402
from gnncompile.compiler.backend import dynamic_output_shapes  # noqa: E402
from gnncompile.settings import Settings  # noqa: E402


def _mlp(d, h=16):
    return torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.ReLU(), torch.nn.Linear(h, h))


class Net(torch.nn.Module):
    """Two layers of one kind (and one option set) and a readout."""

    def __init__(self, kind: str, F: int = 8, **opts):
        super().__init__()
        self.kind = kind
        if kind == "gin":
            self.convs = torch.nn.ModuleList([GINConv(_mlp(F), **opts), GINConv(_mlp(16), **opts)])
        elif kind == "gine":
            self.convs = torch.nn.ModuleList([GINEConv(_mlp(F), edge_dim=3, **opts),
                                              GINEConv(_mlp(16), edge_dim=3, **opts)])
        else:
            self.convs = torch.nn.ModuleList([GCNConv(F, 16, **opts), GCNConv(16, 16, **opts)])

    def forward(self, x, edge_index, edge_attr, edge_weight):
        for conv in self.convs:
            if self.kind == "gine":
                x = conv(x, edge_index, edge_attr)
            elif self.kind == "gcn":
                x = conv(x, edge_index, edge_weight)
            else:
                x = conv(x, edge_index)
            x = x.relu()
        return x.sum(0)


def _graph(seed, n=30, e=90, F=8, weights=False):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei[:, :3] = torch.arange(3).repeat(2, 1)  # a few self loops
    x = torch.randn(n, F, generator=g, requires_grad=True)
    ea = torch.randn(e, 3, generator=g)
    ew = torch.rand(e, generator=g) + 0.1 if weights else None
    return x, ei, ea, ew


def _capture(model, inputs, lean_on: bool, record=None):
    """Output, gradients (parameters then x) and FX graphs of ``model`` run through Dynamo with
    no rewrite: the graph Dynamo captured, run as captured."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    x = inputs[0].detach().clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    with dynamic_output_shapes(True), lean.scope(lean_on, record):
        out = compiled(x, *inputs[1:])
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    return out.detach(), grads, graphs


def _eager(model, inputs):
    x = inputs[0].detach().clone().requires_grad_(True)
    model.zero_grad(set_to_none=True)
    out = model(x, *inputs[1:])
    out.sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]


def _ops(gm) -> list:
    """The graph as a list of (op, target, args) with every node named by its place (inputs by
    their source name): the same list for two graphs that compute the same thing in the same
    order, whatever Dynamo named their values or the order it met the inputs in."""
    place, out = {}, []

    def norm(a):
        if isinstance(a, torch.fx.Node):
            return place[a]
        if isinstance(a, (list, tuple)):
            return type(a)(norm(v) for v in a)
        if isinstance(a, dict):
            return {k: norm(v) for k, v in a.items()}
        if isinstance(a, torch.SymInt) or type(a).__name__ == "SymInt":
            return "sym"
        return repr(a) if not isinstance(a, (int, float, bool, str, type(None))) else a

    for n in gm.graph.nodes:
        if n.op == "placeholder":
            place[n] = ("input", "sym" if n.name.startswith("s") and n.type is torch.SymInt else n.target)
            continue
        place[n] = ("node", len(out))
        out.append((n.op, str(n.target), norm(n.args), norm(n.kwargs)))
    return out


def _norms(gm) -> int:
    """How many times the graph computes GCN's normalization (its ``pow_(-0.5)``)."""
    return sum(1 for n in gm.graph.nodes if n.op in ("call_method", "call_function") and "pow_" in str(n.target))


class _memo:
    """lean.NORM_MEMO set for a block."""

    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        self.prev, lean.NORM_MEMO[0] = lean.NORM_MEMO[0], self.on

    def __exit__(self, *exc):
        lean.NORM_MEMO[0] = self.prev


CASES = [
    ("gin", {}),
    ("gin", {"train_eps": True, "eps": 0.25}),
    ("gine", {}),
    ("gine", {"train_eps": True}),
    ("gcn", {}),
    ("gcn", {"improved": True}),
    ("gcn", {"add_self_loops": False}),
    ("gcn", {"bias": False}),
    ("gcn-weights", {}),
]


@pytest.mark.parametrize("kind,opts", CASES, ids=[f"{k}-{'-'.join(f'{a}={v}' for a, v in o.items()) or 'default'}"
                                                  for k, o in CASES])
def test_lean_forward_is_pygs_bit_for_bit(kind, opts):
    weights = kind.endswith("-weights")
    kind = kind.split("-")[0]
    torch.manual_seed(0)
    model = Net(kind, **opts)
    for seed in (1, 2):
        inputs = _graph(seed, n=25 + 7 * seed, e=80 + 11 * seed, weights=weights)
        rec = lean.Record()
        out_l, grads_l, graphs_l = _capture(model, inputs, True, rec)
        assert [x.split(":")[1].strip() for x in rec.lines(model)] == ["lean forward"] * 2, rec.lines(model)
        out_p, grads_p, graphs_p = _capture(model, inputs, False)
        out_e, grads_e = _eager(model, inputs)
        assert len(graphs_l) == len(graphs_p) == 1
        if kind == "gcn":  # (the second layer reuses the first's gcn_norm: PyG's graph with the memo off)
            assert _norms(graphs_l[0]) == 1
            with _memo(False):
                out_l, grads_l2, graphs_l = _capture(model, inputs, True)
            assert _norms(graphs_l[0]) == 2
            assert all(torch.equal(a, b) for a, b in zip(grads_l, grads_l2))
        assert _ops(graphs_l[0]) == _ops(graphs_p[0])  # PyG's graph, op for op
        assert torch.equal(out_l, out_p) and torch.equal(out_l, out_e)
        for a, b, c in zip(grads_l, grads_p, grads_e):
            assert torch.equal(a, b) and torch.equal(a, c)


def test_lean_forward_keeps_pygs_errors():
    torch.manual_seed(0)
    model = Net("gin")
    x, ei, ea, ew = _graph(3)
    for bad, match in ((ei.float(), "integer type"), (ei[0], "two-dimensional"), (torch.cat([ei, ei[:1]]), "size '2'")):
        with pytest.raises(Exception, match=match):
            _capture(model, (x, bad, ea, ew), True)
        with pytest.raises(Exception, match=match):
            model(x, bad, ea, ew)


def _snapshot(model):
    """What compiling must not change: each module's type, instance dict keys and hook dicts,
    and the PyG classes' own dicts."""
    # (torch.compile itself marks the root module with _is_torch_compile, lean or not; once
    # lightning_fabric is imported in the process, its wrapper of torch.compile sets _compile_kwargs)
    mods = [(type(m), sorted(set(vars(m)) - {"_is_torch_compile", "_compile_kwargs"}),
             [len(getattr(m, h, {})) for h in lean._MODULE_HOOKS + lean._MP_HOOKS], m.training)
            for m in model.modules()]
    classes = [dict(vars(c)) for c in (GINConv, GINEConv, GCNConv)]
    return mods, classes


@pytest.mark.parametrize("kind", ["gin", "gine", "gcn"])
def test_compile_takes_the_lean_forward_and_leaves_the_model_alone(kind):
    torch.manual_seed(0)
    model = Net(kind)
    ref = copy.deepcopy(model)
    before = _snapshot(model)
    inputs = _graph(4)
    torch._dynamo.reset()
    compiled = gnncompile.compile(model, dynamic=True, settings={"choices": {"guard": "off"}})
    out = compiled(*inputs)
    assert _snapshot(model) == before
    assert [ln.split(": ", 1)[1] for ln in compiled.lean_record.lines(model)] == ["lean forward"] * 2
    torch.testing.assert_close(out, ref(*inputs), rtol=1e-5, atol=1e-5)
    rep = gnncompile.explain(compiled, *inputs)
    assert rep.lean_layers == [f"convs.{i} ({type(model.convs[0]).__name__}): lean forward" for i in range(2)]
    assert "lean forwards" in str(rep) and rep.as_dict()["lean_layers"] == rep.lean_layers
    off = gnncompile.compile(model, dynamic=True, settings={"choices": {"guard": "off", "lean_layers": "off"}})
    torch._dynamo.reset()
    torch.testing.assert_close(off(*inputs), out, rtol=1e-5, atol=1e-5)
    assert off.lean_record.lines(model) == []
    assert gnncompile.explain(off, *inputs).lean_layers == []


class MyGIN(GINConv):
    pass


def _declined(model, inputs):
    rec = lean.Record()
    try:
        _capture(model, inputs, True, rec)
    except Exception:  # PyG's own path fails under Dynamo for some settings (explain without a
        with pytest.raises(Exception):  # mask, decomposed layers of a tuple): eagerly too
            model(*inputs)
    return rec.lines(model)


def test_subclasses_and_other_classes_keep_pygs_forward():
    torch.manual_seed(0)
    model = Net("gin")
    model.convs[0] = MyGIN(_mlp(8))
    lines = _declined(model, _graph(5))
    assert lines == ["convs.1 (GINConv): lean forward"]  # the subclass is no candidate at all


@pytest.mark.parametrize("change,why", [
    (lambda c: c.register_forward_hook(lambda m, a, o: None), "a module hook (_forward_hooks)"),
    (lambda c: c.register_forward_pre_hook(lambda m, a: None), "a module hook (_forward_pre_hooks)"),
    (lambda c: c.register_message_forward_hook(lambda m, a, o: None), "a message-passing hook"),
    (lambda c: c.register_propagate_forward_pre_hook(lambda m, a: None), "a message-passing hook"),
    (lambda c: c.register_aggregate_forward_hook(lambda m, a, o: None), "a message-passing hook"),
    (lambda c: c.aggr_module.register_forward_hook(lambda m, a, o: None), "a hook on its aggregation module"),
    (lambda c: setattr(c, "explain", True), "propagate set on the instance"),
    (lambda c: setattr(c, "decomposed_layers", 2), "propagate set on the instance"),
    (lambda c: setattr(c, "message", lambda x_j: 2 * x_j), "message set on the instance"),
])
def test_hooks_and_changed_layers_keep_pygs_forward(change, why):
    torch.manual_seed(0)
    model = Net("gin")
    change(model.convs[1])
    inputs = _graph(6)
    lines = _declined(model, inputs)
    assert lines[0] == "convs.0 (GINConv): lean forward"
    assert len(lines) == 2 and lines[1].startswith("convs.1 (GINConv): PyG's forward: " + why), lines


def test_other_settings_keep_pygs_forward():
    torch.manual_seed(0)
    model = Net("gin")
    model.convs[1] = GINConv(_mlp(16), aggr="mean")
    lines = _declined(model, _graph(7))
    assert lines[1].startswith("convs.1 (GINConv): PyG's forward: aggr='mean'"), lines
    model = Net("gcn", cached=True)
    lines = _declined(model, _graph(7))
    assert all("PyG's forward: cached=True" in ln for ln in lines), lines


def test_inputs_the_lean_forward_is_not_written_for_take_pygs_path_in_the_trace():
    torch.manual_seed(0)
    conv = GINConv(_mlp(8))
    x, ei, _, _ = _graph(8)

    class Bipartite(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x, ei):
            return self.conv((x, x[:20]), ei[:, ei[1] < 20], size=(x.size(0), 20))

    m = Bipartite()
    out_l, grads_l, _ = _capture(m, (x, ei), True)
    out_e, grads_e = _eager(m, (x, ei))
    assert torch.equal(out_l, out_e)
    assert all(torch.equal(a, b) for a, b in zip(grads_l, grads_e))


def test_a_change_after_compiling_recompiles_through_pygs_forward():
    torch.manual_seed(0)
    model = Net("gin")
    inputs = _graph(9)
    torch._dynamo.reset()
    compiled = gnncompile.compile(model, dynamic=True, settings={"choices": {"guard": "off"}})
    first = compiled(*inputs)
    h = model.convs[0].register_message_forward_hook(lambda m, a, o: 3 * o)
    # the layer's lean forward was guarded on its empty hook dicts: the next call traces it again,
    # through PyG's code (which skips message hooks under torch.compile: the same result)
    out = compiled(*inputs)
    lines = compiled.lean_record.lines(model)
    assert "convs.0 (GINConv): PyG's forward: a message-passing hook (_message_forward_hooks)" in lines, lines
    torch.testing.assert_close(out, first, rtol=1e-5, atol=1e-5)
    h.remove()
    model.convs[1].message = lambda x_j: 2 * x_j  # a method set on the instance: PyG's path runs it
    out = compiled(*inputs)
    assert "convs.1 (GINConv): PyG's forward: message set on the instance" in compiled.lean_record.lines(model)
    assert not torch.allclose(out, first)
    del model.convs[1].message
    model.convs[1].aggr = "mean"  # (a setting read as a constant: guarded too)
    compiled(*inputs)
    assert any(ln.startswith("convs.1 (GINConv): PyG's forward: aggr='mean'") for ln in compiled.lean_record.lines(model))


def test_a_module_hook_after_compiling_is_noticed_where_dynamo_guards_hooks():
    """Dynamo does not guard on a module's empty hook dicts by default
    (torch._dynamo.config.skip_nnmodule_hook_guards); where it does, a hook registered after
    compiling recompiles the model, and the hooked layer keeps PyG's forward."""
    torch.manual_seed(0)
    model = Net("gin")
    inputs = _graph(10)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
        compiled = gnncompile.compile(model, dynamic=True, settings={"choices": {"guard": "off"}})
        compiled(*inputs)
        fwd = []
        model.convs[1].register_forward_hook(lambda m, a, o: fwd.append(1))
        compiled(*inputs)
    assert fwd
    assert "convs.1 (GINConv): PyG's forward: a module hook (_forward_hooks)" in compiled.lean_record.lines(model)


def test_lean_layers_setting_is_checked():
    assert Settings().lean_layers == "auto"
    assert Settings().replace(choices={"lean_layers": "off"}).lean_layers == "off"
    with pytest.raises(ValueError, match="lean_layers"):
        Settings().replace(choices={"lean_layers": "sometimes"})


def test_why_not_reads_the_module():
    conv = GINConv(_mlp(8))
    assert lean.why_not(conv) == ""
    conv.register_forward_hook(lambda m, a, o: None)
    assert lean.why_not(conv).startswith("a module hook")
    assert lean.why_not(MyGIN(_mlp(8))).startswith("not one of")


def test_a_graph_break_inside_a_lean_forward_is_not_reported_as_taken():
    """With scalar reads and data-dependent sizes left to eager (capture_dynamic False), GCNConv's
    self loops break the graph inside the lean forward: Dynamo traces again without inlining the
    layer, which then runs its own forward, and the record does not list it."""
    torch.manual_seed(0)
    model = Net("gcn")
    inputs = _graph(11)
    torch._dynamo.reset()
    compiled = gnncompile.compile(model, dynamic=True, settings={"capture_dynamic": False, "choices": {"guard": "off"}})
    torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    assert compiled.lean_record.lines(model) == []


def test_gine_without_an_edge_encoder_is_pygs_bit_for_bit_and_raises_as_pyg():
    torch.manual_seed(0)

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GINEConv(_mlp(8))  # edge_dim None: no edge encoder

        def forward(self, x, edge_index, edge_attr):
            return self.conv(x, edge_index, edge_attr)

    m = One()
    x, ei, _, _ = _graph(12)
    ea = torch.randn(ei.size(1), 8)
    rec = lean.Record()
    out_l, grads_l, graphs_l = _capture(m, (x, ei, ea), True, rec)
    out_p, grads_p, graphs_p = _capture(m, (x, ei, ea), False)
    assert rec.lines(m) == ["conv (GINEConv): lean forward"]
    assert _ops(graphs_l[0]) == _ops(graphs_p[0])
    assert torch.equal(out_l, out_p) and all(torch.equal(a, b) for a, b in zip(grads_l, grads_p))
    with pytest.raises(Exception, match="dimensionalities do not match"):
        _capture(m, (x, ei, torch.randn(ei.size(1), 3)), True)


def test_a_failure_reading_the_layer_inside_dynamo_traces_pygs_code(monkeypatch):
    """Where reading a layer inside Dynamo fails (another torch's internals: an attribute or a
    guard kind missing), the layer is traced through PyG's code: same result as eager, the record
    says why, no compile fallback."""
    def broken(var, tx):
        raise AttributeError("no such thing in this torch")
    monkeypatch.setattr(lean, "_dynamo_choice", broken)
    torch.manual_seed(0)
    model = Net("gin")
    inputs = _graph(5)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallbackWarning)
        compiled = gnncompile.compile(model, dynamic=True, settings={"choices": {"guard": "off"}})
        out = compiled(*inputs)
    torch.testing.assert_close(out, model(*inputs), rtol=1e-5, atol=1e-5)
    lines = compiled.lean_record.lines(model)
    assert len(lines) == 2 and all("not readable in this torch's Dynamo (AttributeError)" in ln for ln in lines), lines
    assert compiled._failed is None


class GCN3(torch.nn.Module):
    """Three GCNConv layers with something between the second and third: ``between(x,
    edge_index, edge_weight) -> (edge_index, edge_weight)`` (identity by default)."""

    def __init__(self, between=None, **opts):
        super().__init__()
        self.convs = torch.nn.ModuleList([GCNConv(8, 16, **opts), GCNConv(16, 16, **opts), GCNConv(16, 16, **opts)])
        self.between = between

    def forward(self, x, edge_index, edge_attr, edge_weight):
        edge_index = edge_index.clone()
        for i, conv in enumerate(self.convs):
            if i == 2 and self.between is not None:
                edge_index, edge_weight = self.between(x, edge_index, edge_weight)
            x = conv(x, edge_index, edge_weight).relu()
        return x.sum(0)


def _memo_case(model, inputs):
    """Bits against eager and against the memo off; the normalizations in the memo's graph(s)."""
    out_m, grads_m, graphs_m = _capture(model, inputs, True)
    with _memo(False):
        out_o, grads_o, graphs_o = _capture(model, inputs, True)
    out_e, grads_e = _eager(model, inputs)
    assert torch.equal(out_m, out_e) and torch.equal(out_m, out_o)
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(grads_m, grads_o, grads_e))
    return [_norms(g) for g in graphs_m], [_norms(g) for g in graphs_o]


def _flip_in_place(x, ei, ew):
    ei.copy_(ei.flip(0))
    return ei, ew


@pytest.mark.parametrize("between,weights,expect", [
    (None, False, [1]),
    (None, True, [1]),
    (_flip_in_place, False, [2]),  # edge_index changed in place: normalized again
    (lambda x, ei, ew: (ei.flip(0), ew), False, [2]),  # another edge_index
    (lambda x, ei, ew: (ei, ew * 2), True, [2]),  # another edge_weight
    (lambda x, ei, ew: (ei, ew), True, [1]),
    (lambda x, ei, ew: (ei[:, :-5], ew), False, [2]),  # fewer edges
], ids=["same", "same-weights", "in-place", "other-index", "other-weights", "same-weights-passed", "sliced"])
def test_gcn_norm_is_traced_once_per_identical_input(between, weights, expect):
    torch.manual_seed(0)
    model = GCN3(between)
    memo, off = _memo_case(model, _graph(11, n=31, e=97, weights=weights))
    assert memo == expect and off == [3]


def test_gcn_norm_is_not_shared_across_settings_dtypes_or_graphs():
    torch.manual_seed(0)
    model = GCN3()
    model.convs[1].improved = True  # layer 1 normalizes with fill value 2: its own norm
    assert _memo_case(model, _graph(12))[0] == [2]
    model = GCN3()
    model.convs[2].add_self_loops = False
    assert _memo_case(model, _graph(12))[0] == [2]

    class Break(GCN3):  # a graph break between the layers: one norm per graph, never carried across
        def forward(self, x, edge_index, edge_attr, edge_weight):
            x = self.convs[0](x, edge_index).relu()
            torch._dynamo.graph_break()
            for conv in self.convs[1:]:
                x = conv(x, edge_index).relu()
            return x.sum(0)
    torch.manual_seed(0)
    assert _memo_case(Break(), _graph(13)) == ([1, 1], [1, 2])

    class Dtypes(GCN3):  # x in float64 at the last layer: PyG's ones in that dtype, another norm
        def forward(self, x, edge_index, edge_attr, edge_weight):
            for conv in self.convs[:2]:
                x = conv(x, edge_index).relu()
            return self.convs[2](x.double(), edge_index).sum(0)
    torch.manual_seed(0)
    m = Dtypes()
    m.convs[2].double()
    assert _memo_case(m, _graph(14)) == ([2], [3])


def test_gcn_norm_is_not_shared_for_an_edge_weight_that_needs_gradients():
    # (its gradient would sum the layers' contributions in another order than PyG's)
    torch.manual_seed(0)
    model = GCN3()
    x, ei, ea, ew = _graph(16, weights=True)
    loops = ei[0][ei[0] == ei[1]]
    assert loops.unique().numel() == loops.numel()  # (no node with two self loops: there the edge_weight
    # gradient through gnncompile::remaining_self_loops is not eager PyG's, memo or not)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    grads = []
    for compiled in (torch.compile(model, backend=backend, dynamic=True), model):
        torch._dynamo.reset()
        w = ew.detach().clone().requires_grad_(True)
        with dynamic_output_shapes(True), lean.scope(True):
            compiled(x, ei, ea, w).sum().backward()
        grads.append(w.grad)
    assert [_norms(g) for g in graphs] == [3]
    assert torch.equal(grads[0], grads[1])


def test_gcn_memo_off_in_this_module_is_the_per_layer_lean_forward():
    torch.manual_seed(0)
    model = GCN3()
    inputs = _graph(15)
    with _memo(False):
        _, _, g_off = _capture(model, inputs, True)
    _, _, g_pyg = _capture(model, inputs, False)
    assert _ops(g_off[0]) == _ops(g_pyg[0]) and _norms(g_off[0]) == 3
