"""GINConv's self term folded into the fused sum (passes/self_term.py): ``spmm + (1 + eps) * x``
-> one ``gnncompile::spmm_self`` per layer in compiled graphs. The folded graph computes the same
bits as the unfolded one (outputs and every gradient), matches eager, and explain() reports the
op; a self term over another tensor (a bipartite GINConv's x_dst) is left as written."""
from __future__ import annotations

import warnings

import pytest
import torch

import gnncompile
import gnncompile.passes as passes
from shared import _fresh_dynamo, check_same  # noqa: F401  (_fresh_dynamo: autouse)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn

N, E, F = 300, 1200, 32


class _Stack(torch.nn.Module):
    def __init__(self, layers=3, train_eps=False):
        super().__init__()
        torch.manual_seed(0)
        self.convs = torch.nn.ModuleList(
            gnn.GINConv(torch.nn.Sequential(torch.nn.Linear(F, F), torch.nn.ReLU(), torch.nn.Linear(F, F)),
                        train_eps=train_eps, eps=0.25 * i)
            for i in range(layers))

    def forward(self, x, edge_index):
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return x


def _inputs(seed=0, n=N, e=E, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, F, generator=g, dtype=dtype).requires_grad_(), torch.randint(0, n, (2, e), generator=g)


def _compiled(model):
    return gnncompile.compile(model, dynamic=True, inner="eager", settings={"choices": {"guard": "off"}})


def _run(compiled, model, inputs):
    out = compiled(*inputs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out, params + [inputs[0]], g)
    return [out.detach()] + list(grads)


@pytest.mark.parametrize("train_eps", [False, True])
def test_folded_equals_unfolded_bit_for_bit(native, monkeypatch, train_eps):
    inputs = _inputs()
    model = _Stack(train_eps=train_eps)
    with gnncompile.compiler.collect() as reports:
        folded = _run(_compiled(model), model, inputs)
    assert sum(r.self_terms for r in reports) == 3
    calls = {}
    for r in reports:
        for k, v in r.op_calls.items():
            calls[k] = calls.get(k, 0) + v
    assert calls.get("spmm_self") == 3 and "spmm" not in calls, calls

    torch._dynamo.reset()
    monkeypatch.setattr(passes, "fuse_self_terms", lambda graph, report: 0)
    with gnncompile.compiler.collect() as reports:
        plain = _run(_compiled(model), model, inputs)
    assert sum(r.self_terms for r in reports) == 0
    assert sum(r.op_calls.get("spmm", 0) for r in reports) == 3
    for a, b in zip(folded, plain):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_compiled_equals_eager(dtype):
    model = _Stack(train_eps=True).to(dtype)
    compiled = _compiled(model)
    for seed, (n, e) in enumerate([(N, E), (N + 13, E + 77)]):  # two sizes: one symbolic graph
        x, ei = _inputs(seed, n, e, dtype)
        check_same(model, compiled, [x, ei], rtol=1e-4, atol=1e-5)


def test_explain_names_the_op():
    model = _Stack(layers=2)
    rep = gnncompile.explain(model, *_inputs())
    assert rep.op_calls.get("spmm_self") == 2, str(rep)
    assert any("spmm_self" in n for n in rep.notes), str(rep)


def test_bipartite_self_term_is_left_alone():
    # GINConv((x_src, x_dst)): the term is (1 + eps) * x_dst, not the spmm's input
    torch.manual_seed(0)
    conv = gnn.GINConv(torch.nn.Linear(F, F))
    g = torch.Generator().manual_seed(0)
    x_src, x_dst = torch.randn(N, F, generator=g), torch.randn(N, F, generator=g)
    ei = torch.randint(0, N, (2, E), generator=g)

    class Bi(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, a, b, ei):
            return self.conv((a, b), ei)

    model = Bi()
    with gnncompile.compiler.collect() as reports:
        check_same(model, _compiled(model), [x_src, x_dst, ei])
    assert sum(r.self_terms for r in reports) == 0
    assert sum(r.op_calls.get("spmm", 0) for r in reports) == 1


@pytest.mark.parametrize("written", [None, "x", "s"])
def test_a_write_in_place_between_the_reads_and_the_add_keeps_the_ops(written):
    """The folded op reads x and s at the add; the separate ops read x at the spmm and the product.
    Where x or s is written in place in between, the fold would see other values: the ops stay."""
    import operator

    from torch.fx import Graph

    from gnncompile.ops import targets
    from gnncompile.passes.report import PassReport
    from gnncompile.passes.self_term import fuse_self_terms

    x_val, s_val = torch.randn(5, 4), torch.tensor([1.5])
    g = Graph()
    rowptr, col, perm = (g.placeholder(name) for name in ("rowptr", "col", "perm"))
    x, s = g.placeholder("x"), g.placeholder("s")
    x.meta["val"], s.meta["val"] = x_val, s_val
    sp = g.call_function(targets.SPMM, (rowptr, col, perm, None, x, "sum", [], None, None, None))
    out0 = g.call_function(operator.getitem, (sp, 0))
    if written is not None:
        g.call_method("mul_", ({"x": x, "s": s}[written], 2.0))
    prod = g.call_function(operator.mul, (s, x))
    prod.meta["val"] = s_val * x_val
    add = g.call_function(operator.add, (out0, prod))
    add.meta["val"] = x_val.clone()
    g.output(add)
    folded = fuse_self_terms(g, PassReport())
    assert folded == (1 if written is None else 0)
    assert any(n.target is targets.SPMM_SELF for n in g.nodes) == (written is None)
