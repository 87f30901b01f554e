"""Caches of the passes' compile-time work: the in-place-write analysis (semantics.Writes) reused
within one passes.run while the graph is unchanged (Writes.of inside writes_cache) and built again
after any change; the printed sizes of canonical.size_key."""
from __future__ import annotations

import operator

import pytest
import torch
import torch_geometric.nn as gnn

import gnncompile
from gnncompile import passes
from gnncompile.passes import semantics as S


def _graph():
    def f(x, j):
        a = x * 1
        v = a.view(-1)
        b = a + 1
        v.add_(1)  # writes a through its view
        c = b.clone()
        c.mul_(2)
        d = c[0]
        return a, b, c, d

    gms = []
    torch._dynamo.reset()  # (f's code object is the same at every call)
    torch.compile(f, backend=lambda gm, ex: gms.append(gm) or gm.forward)(torch.ones(3, 2), None)
    g = gms[0].graph
    return g, {n.name: n for n in g.nodes}


def _targets(w, n):
    return [x.target for x in w.writes_of(n)]


def test_outside_a_scope_every_call_builds():
    g, _ = _graph()
    assert S.Writes.of(g) is not S.Writes.of(g)


def test_an_unchanged_graph_reuses_and_the_scope_ends():
    g, nodes = _graph()
    with S.writes_cache():
        w = S.Writes.of(g)
        assert S.Writes.of(g) is w
        with S.writes_cache():  # a nested scope shares the outer cache
            assert S.Writes.of(g) is w
        assert S.Writes.of(g) is w
        g2, _ = _graph()  # another graph has its own
        assert S.Writes.of(g2) is not w
    assert getattr(S._SCOPE, "cache", None) is None
    with S.writes_cache():
        assert S.Writes.of(g) is not w  # a new scope starts empty


def test_cache_off_builds_every_time():
    g, _ = _graph()
    S.CACHE[0] = False
    try:
        with S.writes_cache():
            assert S.Writes.of(g) is not S.Writes.of(g)
    finally:
        S.CACHE[0] = True


def test_a_new_write_is_seen():
    g, nodes = _graph()
    with S.writes_cache():
        w = S.Writes.of(g)
        assert _targets(w, nodes["b"]) == []
        with g.inserting_after(nodes["b"]):
            g.call_method("sub_", (nodes["b"], 1))
        w2 = S.Writes.of(g)
        assert w2 is not w and _targets(w2, nodes["b"]) == ["sub_"]


def test_a_changed_argument_is_seen():
    g, nodes = _graph()
    mul_ = next(n for n in g.nodes if n.target == "mul_")
    with S.writes_cache():
        w = S.Writes.of(g)
        assert _targets(w, nodes["b"]) == []
        mul_.update_arg(0, nodes["b"])  # mul_ now writes b, not c
        w2 = S.Writes.of(g)
        assert w2 is not w and _targets(w2, nodes["b"]) == ["mul_"] and _targets(w2, nodes["c"]) == []
        mul_.replace_input_with(nodes["b"], nodes["c"])
        w3 = S.Writes.of(g)
        assert w3 is not w2 and _targets(w3, nodes["c"]) == ["mul_"]


def test_a_changed_kwarg_is_seen():
    g, nodes = _graph()
    with S.writes_cache():
        w = S.Writes.of(g)
        assert _targets(w, nodes["a"]) == ["add_"]
        out = torch.empty(0)
        with g.inserting_after(nodes["b"]):
            n = g.call_function(torch.add, (nodes["b"], 1))
        w1 = S.Writes.of(g)
        assert w1 is not w and _targets(w1, nodes["b"]) == []
        n.update_kwarg("out", nodes["b"])  # an out= write to b
        w2 = S.Writes.of(g)
        assert w2 is not w1 and _targets(w2, nodes["b"]) == [torch.add]
        del out


def test_a_changed_target_is_seen():
    g, nodes = _graph()
    clone = nodes["c"]
    with S.writes_cache():
        w = S.Writes.of(g)
        assert _targets(w, nodes["b"]) == []
        add = nodes["b"]
        add.target = operator.iadd  # b = a + 1 becomes a += 1: a write to a
        w2 = S.Writes.of(g)
        assert w2 is not w and operator.iadd in _targets(w2, nodes["a"])
        del clone


def test_an_erased_write_is_gone_and_a_moved_node_moves():
    g, nodes = _graph()
    mul_ = next(n for n in g.nodes if n.target == "mul_")
    with S.writes_cache():
        w = S.Writes.of(g)
        assert _targets(w, nodes["c"]) == ["mul_"]
        pos = w.pos[nodes["c"]]
        assert w.first_write(nodes["c"], pos, len(w.pos)) is mul_
        nodes["d"].replace_all_uses_with(nodes["c"])
        g.erase_node(nodes["d"])
        mul_.replace_all_uses_with(nodes["c"])
        g.erase_node(mul_)
        w2 = S.Writes.of(g)
        assert w2 is not w and _targets(w2, nodes["c"]) == []
        v = next(n for n in g.nodes if n.target == "view")
        nodes["b"].append(v)  # v now right after b
        w3 = S.Writes.of(g)
        assert w3 is not w2 and w3.pos[v] == w3.pos[nodes["b"]] + 1


def test_a_changed_example_value_is_seen():
    # whether a getitem aliases its base depends on the base's recorded value (indexing by a
    # tensor copies): a new value makes a new analysis
    g, nodes = _graph()
    with S.writes_cache():
        w = S.Writes.of(g)
        nodes["c"].meta["example_value"] = nodes["c"].meta["example_value"]  # the same object: reused
        assert S.Writes.of(g) is w
        nodes["c"].meta["example_value"] = None
        assert S.Writes.of(g) is not w


# ----------------------------------------------------------------------------- whole passes
def _models():
    torch.manual_seed(0)
    x = torch.randn(40, 16)
    ei = torch.randint(0, 40, (2, 160))
    ea = torch.randn(160, 6)

    class Net(torch.nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.kind = kind
            if kind == "gin":
                self.convs = torch.nn.ModuleList(
                    gnn.GINConv(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16)))
                    for _ in range(3))
            elif kind == "gine":
                self.convs = torch.nn.ModuleList(
                    gnn.GINEConv(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()), edge_dim=6)
                    for _ in range(3))
            elif kind == "gcn":
                self.convs = torch.nn.ModuleList(gnn.GCNConv(16, 16) for _ in range(3))
            elif kind == "gat":
                self.convs = torch.nn.ModuleList([gnn.GATConv(16, 4, heads=4), gnn.GATConv(16, 16)])
            elif kind == "gatv2":
                self.convs = torch.nn.ModuleList([gnn.GATv2Conv(16, 4, heads=4), gnn.GATv2Conv(16, 16)])
            else:
                self.convs = torch.nn.ModuleList([gnn.TransformerConv(16, 16, edge_dim=6)])

        def forward(self, x, ei, ea):
            for c in self.convs:
                x = (c(x, ei, ea) if self.kind in ("gine", "transformer") else c(x, ei)).relu()
            return x

    return x, ei, ea, Net


@pytest.mark.parametrize("kind", ["gin", "gine", "gcn", "gat", "gatv2", "transformer"])
def test_passes_give_the_same_graph_and_bits_with_the_cache_on_and_off(kind, monkeypatch):
    x, ei, ea, Net = _models()
    run = passes.run
    codes, stats = {}, {}

    def recording(gm, *a, **k):
        before = dict(S.STATS)
        report = run(gm, *a, **k)
        codes.setdefault(S.CACHE[0], []).append(gm.code)
        stats[S.CACHE[0]] = {k: S.STATS[k] - before[k] for k in before}
        return report

    monkeypatch.setattr(passes, "run", recording)
    outs = {}
    for on in (False, True):
        S.CACHE[0] = on
        try:
            torch._dynamo.reset()
            torch.manual_seed(1)
            model = Net(kind)
            compiled = gnncompile.compile(model, dynamic=True, settings={"choices": {"guard": "off"}})
            y = compiled(x, ei, ea)
            y.square().sum().backward()
            outs[on] = (y.detach(), [p.grad.clone() for p in model.parameters()])
        finally:
            S.CACHE[0] = True
    assert codes[True] == codes[False]
    assert torch.equal(outs[True][0], outs[False][0])
    assert all(torch.equal(a, b) for a, b in zip(outs[True][1], outs[False][1]))
    assert stats[False]["reused"] == 0
    # the same analyses, fewer builds
    assert stats[True]["built"] + stats[True]["reused"] == stats[False]["built"]
    if kind in ("gin", "gcn", "gat"):
        assert stats[True]["reused"] > 0


def test_size_keys_are_the_prints_of_the_sizes():
    from gnncompile.passes import canonical as C

    sizes = []

    def backend(gm, ex):
        for n in gm.graph.nodes:
            v = n.meta.get("example_value")
            if isinstance(v, torch.Tensor):
                sizes.extend(v.shape)
            elif isinstance(v, torch.SymInt):
                sizes.append(v)
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(lambda x, i: torch.cat([x[i], x]).view(-1, 2) * x.size(0), backend=backend, dynamic=True)
    f(torch.ones(6, 2), torch.arange(3))
    syms = [s for s in sizes if isinstance(s, torch.SymInt)]
    assert len({str(s) for s in syms}) >= 3  # several expressions (s0, s1, s0 + s1, ...)
    C._SIZE_KEYS.clear()
    for s in sizes + [1, 7]:
        assert C.size_key(s) == str(s)
        assert C.size_key(s) == str(s)  # from the cache
    assert len(C._SIZE_KEYS) == len({s.node.expr for s in syms})
    a, b = syms[0], syms[0] + 1
    assert C.same_size(a, a) and not C.same_size(a, b) and C.size_key(b) == str(b)
