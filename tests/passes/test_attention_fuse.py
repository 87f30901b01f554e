"""passes/attention.py: GATConv's rewritten attention chain (gathered logits, leaky_relu,
edge_softmax, dropout, weighted spmm) becomes one gnncompile::attention, in every form the layer
takes, and is left as it was where it must not be (the coefficients read elsewhere, the choice
'chain'); compiled results equal eager's."""
from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import GATConv, models

import gnncompile
from shared import _fresh_dynamo, node_edge_data  # noqa: F401  (_fresh_dynamo resets Dynamo before each test)

N, E, F = 300, 3000, 16


def _data(seed=0, edge_dim=0):
    return node_edge_data(N, E, F, seed, edge_dim)


def _compiled(model, inner="eager", attention="fused"):
    return gnncompile.compile(model, inner=inner, settings={"choices": {"guard": "off", "attention": attention}})


def _kinds(model, *inputs, attention="fused"):
    rep = gnncompile.explain(gnncompile.compile(model, settings={"choices": {"attention": attention}}), *inputs)
    return [f.kind for f in rep.fused], rep.op_calls


def _close(model, compiled, inputs, tol=1e-4):
    """Outputs and gradients, compared at a tolerance scaled by each tensor's size (float32
    sums in another order: the eager layer's own error against float64 is of this order)."""
    params = list(model.parameters())
    out_c, out_e = compiled(*inputs), model(*inputs)
    torch.testing.assert_close(out_c, out_e, rtol=tol, atol=tol * out_e.abs().max().item())
    g = torch.randn_like(out_e)
    for a, b in zip(torch.autograd.grad(out_c, params, g), torch.autograd.grad(out_e, params, g)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(b.abs().max().item(), 1e-3))


LAYERS = {
    "heads4": dict(heads=4),
    "heads1": dict(heads=1),
    "mean_heads": dict(heads=2, concat=False),
    "no_self_loops": dict(heads=4, add_self_loops=False),
    "slope": dict(heads=2, negative_slope=0.05),
}


@pytest.mark.parametrize("inner", ["eager", "inductor"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_gatconv_fuses_into_one_op_and_computes_what_eager_does(name, inner):
    torch.manual_seed(0)
    conv = GATConv(F, 8, **LAYERS[name])
    x, ei, _ = _data()
    kinds, calls = _kinds(conv, x, ei)
    assert kinds == ["attention"], kinds
    assert calls == {"attention": 1}, calls
    _close(conv, _compiled(conv, inner), (x, ei))


def test_edge_features_are_a_third_logit_term():
    torch.manual_seed(0)
    conv = GATConv(F, 8, heads=4, edge_dim=5)
    x, ei, ea = _data(edge_dim=5)
    kinds, calls = _kinds(conv, x, ei, ea)
    assert "attention" in kinds and calls.get("attention") == 1 and "edge_softmax" not in calls, calls
    _close(conv, _compiled(conv, "eager"), (x, ei, ea))


def test_bipartite_gatconv():
    torch.manual_seed(0)
    conv = GATConv((F, 12), 8, heads=2, add_self_loops=False)
    g = torch.Generator().manual_seed(3)
    xs, xd = torch.randn(N, F, generator=g), torch.randn(200, 12, generator=g)
    ei = torch.stack([torch.randint(0, N, (E,), generator=g), torch.randint(0, 200, (E,), generator=g)])
    assert _kinds(conv, (xs, xd), ei)[1] == {"attention": 1}
    _close(conv, _compiled(conv, "eager"), ((xs, xd), ei))


@pytest.mark.parametrize("inner", ["eager", "inductor"])
def test_two_layer_gat_trains_like_eager(inner):
    torch.manual_seed(0)
    model = models.GAT(F, 32, 2, 4, heads=4)
    x, ei, _ = _data()
    assert _kinds(model, x, ei)[1] == {"attention": 2}
    _close(model, _compiled(model, inner), (x, ei))


def test_chain_choice_keeps_softmax_and_spmm_with_equal_results():
    torch.manual_seed(0)
    conv = GATConv(F, 8, heads=4)
    x, ei, _ = _data()
    kinds, calls = _kinds(conv, x, ei, attention="chain")
    assert sorted(kinds) == ["edge_softmax", "spmm"] and "attention" not in calls
    fused, chain = _compiled(conv, attention="fused"), _compiled(conv, attention="chain")
    torch.testing.assert_close(fused(x, ei), chain(x, ei), rtol=1e-5, atol=1e-6)


def test_attention_dropout_uses_the_dropout_ops_mask():
    """Training with attention dropout (inner 'eager': gnncompile::dropout in both forms, its seed
    drawn from torch's generator): the fused op drops exactly what the chain drops."""
    conv = GATConv(F, 8, heads=4, dropout=0.4)
    x, ei, _ = _data()
    fused, chain = _compiled(conv, attention="fused"), _compiled(conv, attention="chain")
    assert _kinds(conv, x, ei)[1] == {"attention": 1}
    torch.manual_seed(7)
    a = fused(x, ei)
    torch.manual_seed(7)
    b = chain(x, ei)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(a)
    for u, v in zip(torch.autograd.grad(a, list(conv.parameters()), g),
                    torch.autograd.grad(b, list(conv.parameters()), g)):
        torch.testing.assert_close(u, v, rtol=1e-4, atol=1e-5)
    conv.eval()
    torch.testing.assert_close(fused(x, ei), conv(x, ei), rtol=1e-4, atol=1e-5)
    conv.train()
    torch.manual_seed(8)
    assert not torch.allclose(fused(x, ei), a)  # another seed, another mask


def test_attention_dropout_with_inductor_is_applied():
    conv = GATConv(F, 8, heads=4, dropout=0.5)
    x, ei, _ = _data()
    fused = _compiled(conv, "inductor")
    torch.manual_seed(1)
    a = fused(x, ei)
    conv.eval()
    plain = conv(x, ei)
    conv.train()
    assert torch.isfinite(a).all() and not torch.allclose(a, plain, atol=1e-3)
    (gx,) = torch.autograd.grad(a.sum(), [conv.lin.weight])
    assert torch.isfinite(gx).all()


def test_coefficients_read_elsewhere_are_not_fused():
    torch.manual_seed(0)
    conv = GATConv(F, 8, heads=2)
    x, ei, _ = _data()

    class WithWeights(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x, ei):
            out, (_, alpha) = self.conv(x, ei, return_attention_weights=True)
            return out, alpha

    m = WithWeights()
    assert "attention" not in _kinds(m, x, ei)[1]
    c = _compiled(m)
    (o1, a1), (o2, a2) = c(x, ei), m(x, ei)
    torch.testing.assert_close(o1, o2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a1, a2, rtol=1e-4, atol=1e-5)


def test_bad_attention_choice():
    with pytest.raises(ValueError, match="attention"):
        gnncompile.compile(GATConv(F, 8), settings={"choices": {"attention": "sometimes"}})
