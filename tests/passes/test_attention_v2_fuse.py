"""passes/attention_v2.py: GATv2Conv's rewritten attention chain (gathered x_l / x_r, z,
leaky_relu, att, sum, edge_softmax, dropout, weighted spmm) becomes one gnncompile::attention_v2
on the CPU, and is left as it was where it must not be (the coefficients read elsewhere, the
choice 'chain'); compiled results equal eager's."""
from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import GATv2Conv, models

import gnncompile
from gnncompile.passes.attention_v2 import UNVERIFIED
from shared import _fresh_dynamo, node_edge_data  # noqa: F401  (_fresh_dynamo resets Dynamo before each test)

N, E, F = 200, 1500, 16


def _data(seed=0, edge_dim=0):
    return node_edge_data(N, E, F, seed, edge_dim)


def _compiled(model, inner="eager", attention="fused"):
    return gnncompile.compile(model, inner=inner, settings={"choices": {"guard": "off", "attention": attention}})


def _explain(model, *inputs, attention="fused"):
    return gnncompile.explain(gnncompile.compile(model, settings={"choices": {"attention": attention}}), *inputs)


def _kinds(model, *inputs, attention="fused"):
    rep = _explain(model, *inputs, attention=attention)
    return [f.kind for f in rep.fused], rep.op_calls


def _close(model, compiled, inputs, tol=1e-4):
    params = list(model.parameters())
    out_c, out_e = compiled(*inputs), model(*inputs)
    torch.testing.assert_close(out_c, out_e, rtol=tol, atol=tol * out_e.abs().max().item())
    g = torch.randn_like(out_e)
    for a, b in zip(torch.autograd.grad(out_c, params, g), torch.autograd.grad(out_e, params, g)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(b.abs().max().item(), 1e-3))


LAYERS = {
    "heads4_slope": dict(heads=4, negative_slope=0.05),
    "heads1_mean_no_self_loops": dict(heads=1, concat=False, add_self_loops=False),
    "mean_heads_shared_weights": dict(heads=2, concat=False, share_weights=True),
    "edge_dim": dict(heads=2, edge_dim=3),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_gatv2conv_fuses_into_one_op_and_computes_what_eager_does(name):
    torch.manual_seed(0)
    conv = GATv2Conv(F, 8, **LAYERS[name])
    x, ei, ea = _data(edge_dim=LAYERS[name].get("edge_dim", 0))
    inputs = (x, ei) if ea is None else (x, ei, ea)
    rep = _explain(conv, *inputs)
    kinds = [f.kind for f in rep.fused]
    if ea is None:
        assert kinds == ["attention_v2"], rep
        assert rep.op_calls == {"attention_v2": 1}, rep.op_calls
    else:  # the self loops' 'mean' edge features are a degree and an spmm of their own
        assert kinds.count("attention_v2") == 1 and "edge_softmax" not in rep.op_calls, rep
        assert rep.op_calls.get("attention_v2") == 1, rep.op_calls
    assert "attention_v2[z, logits, softmax, sum" in str(rep)
    _close(conv, _compiled(conv), inputs)


def test_float64_is_tight():
    torch.manual_seed(0)
    conv = GATv2Conv(F, 8, heads=4).double()
    x, ei, _ = _data()
    _close(conv, _compiled(conv), (x.double(), ei), tol=1e-10)


def test_bipartite_gatv2conv():
    torch.manual_seed(0)
    conv = GATv2Conv((F, 12), 8, heads=2, add_self_loops=False)
    g = torch.Generator().manual_seed(3)
    xs, xd = torch.randn(N, F, generator=g), torch.randn(120, 12, generator=g)
    ei = torch.stack([torch.randint(0, N, (E,), generator=g), torch.randint(0, 120, (E,), generator=g)])
    assert _kinds(conv, (xs, xd), ei)[1] == {"attention_v2": 1}
    _close(conv, _compiled(conv), ((xs, xd), ei))


@pytest.mark.parametrize("inner", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_two_layer_gatv2_trains_like_eager(inner):
    torch.manual_seed(0)
    model = models.GAT(F, 32, 2, 4, heads=4, v2=True)
    x, ei, _ = _data()
    if inner == "eager":
        assert _kinds(model, x, ei)[1] == {"attention_v2": 2}
    _close(model, _compiled(model, inner), (x, ei))


def test_chain_choice_keeps_softmax_and_spmm_with_equal_results():
    torch.manual_seed(0)
    conv = GATv2Conv(F, 8, heads=4)
    x, ei, _ = _data()
    kinds, calls = _kinds(conv, x, ei, attention="chain")
    assert sorted(kinds) == ["edge_softmax", "spmm"] and "attention_v2" not in calls
    fused, chain = _compiled(conv, attention="fused"), _compiled(conv, attention="chain")
    torch.testing.assert_close(fused(x, ei), chain(x, ei), rtol=1e-5, atol=1e-6)


def test_attention_dropout_uses_the_dropout_ops_mask():
    """Training with attention dropout: the fused op drops exactly what the chain drops, in the
    forward and (the mask regenerated) the backward."""
    conv = GATv2Conv(F, 8, heads=4, dropout=0.4)
    x, ei, _ = _data()
    fused, chain = _compiled(conv, attention="fused"), _compiled(conv, attention="chain")
    assert _kinds(conv, x, ei)[1] == {"attention_v2": 1}
    torch.manual_seed(7)
    a = fused(x, ei)
    torch.manual_seed(7)
    b = chain(x, ei)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(a)
    for u, v in zip(torch.autograd.grad(a, list(conv.parameters()), g),
                    torch.autograd.grad(b, list(conv.parameters()), g)):
        torch.testing.assert_close(u, v, rtol=1e-4, atol=1e-5)
    torch.manual_seed(8)
    assert not torch.allclose(fused(x, ei), a)


def test_coefficients_read_elsewhere_are_not_fused():
    torch.manual_seed(0)
    conv = GATv2Conv(F, 8, heads=2)
    x, ei, _ = _data()

    class WithWeights(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x, ei):
            out, (_, alpha) = self.conv(x, ei, return_attention_weights=True)
            return out, alpha

    m = WithWeights()
    assert "attention_v2" not in _kinds(m, x, ei)[1]
    (o1, a1), (o2, a2) = _compiled(m)(x, ei), m(x, ei)
    torch.testing.assert_close(o1, o2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a1, a2, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_chain_stays_and_says_why():
    torch.manual_seed(0)
    conv = GATv2Conv(F, 8, heads=4).cuda()
    x, ei, _ = _data()
    rep = _explain(conv, x.cuda(), ei.cuda())
    assert "attention_v2" not in rep.op_calls and UNVERIFIED in str(rep)
