"""passes/attention_dot.py: TransformerConv's rewritten attention chain (gathered q / k (+ the
lin_edge term), the scaled dot product, edge_softmax, dropout, the aggregation of v (+ the lin_edge
term): an spmm, or a scatter the match phase left for it) becomes one gnncompile::attention_dot on
the CPU, and is left as it was where it must not be (the coefficients read elsewhere, the choice
'chain'); compiled results and gradients equal eager's."""
from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import TransformerConv

import gnncompile
from gnncompile.passes.attention_dot import UNVERIFIED
from shared import _fresh_dynamo, node_edge_data  # noqa: F401  (_fresh_dynamo resets Dynamo before each test)

N, E, F = 200, 1500, 16


def _data(seed=0, edge_dim=0):
    return node_edge_data(N, E, F, seed, edge_dim)


def _compiled(model, inner="eager", attention="fused", programs="auto"):
    return gnncompile.compile(model, inner=inner, settings={"choices": {"guard": "off", "attention": attention,
                                                                         "programs": programs}})


def _explain(model, *inputs, attention="fused", programs="auto"):
    return gnncompile.explain(gnncompile.compile(model, settings={"choices": {"attention": attention,
                                                                                "programs": programs}}), *inputs)


def _close(model, compiled, inputs, tol=1e-5):
    """Outputs and every parameter's gradient (and the inputs' that require one) within ``tol``
    relative of eager's: rtol ``tol``, atol ``tol`` times the largest entry of the output, or of
    all gradients (the key's bias has a gradient of exactly 0 in exact arithmetic, the softmax
    being blind to a per-row constant: both sides give rounding noise there)."""
    params = list(model.parameters()) + [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    out_c, out_e = compiled(*inputs), model(*inputs)
    torch.testing.assert_close(out_c, out_e, rtol=tol, atol=tol * out_e.abs().max().item())
    g = torch.randn_like(out_e)
    got = torch.autograd.grad(out_c, params, g, allow_unused=True)
    want = torch.autograd.grad(out_e, params, g, allow_unused=True)  # (root_weight=False: lin_skip unused)
    scale = max(b.abs().max().item() for b in want if b is not None)
    assert scale > 0
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if b is not None:
            torch.testing.assert_close(a, b, rtol=tol, atol=tol * scale)


LAYERS = {
    "heads4": dict(heads=4),
    "heads1": dict(heads=1),
    "heads4_mean": dict(heads=4, concat=False),
    "heads4_edge16": dict(heads=4, edge_dim=16),
    "heads1_edge16": dict(heads=1, edge_dim=16),
    "heads4_edge16_mean_beta": dict(heads=4, edge_dim=16, concat=False, beta=True),
    "heads2_edge3_no_root": dict(heads=2, edge_dim=3, root_weight=False),
}


@pytest.mark.parametrize("programs", ["auto", "always"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_transformerconv_fuses_into_one_op_and_computes_what_eager_does(name, programs):
    torch.manual_seed(0)
    conv = TransformerConv(F, 8, **LAYERS[name])
    x, ei, ea = _data(edge_dim=LAYERS[name].get("edge_dim", 0))
    inputs = (x, ei) if ea is None else (x, ei, ea.requires_grad_())
    rep = _explain(conv, *inputs, programs=programs)
    assert [f.kind for f in rep.fused] == ["attention_dot"], rep
    assert rep.op_calls == {"attention_dot": 1}, rep.op_calls
    assert not rep.unfused, rep
    assert "attention_dot[logits, softmax, sum" in str(rep)
    assert ("(edge features)" in str(rep)) == (ea is not None)
    _close(conv, _compiled(conv, programs=programs), inputs)


def test_float64_is_tight():
    torch.manual_seed(0)
    conv = TransformerConv(F, 8, heads=4, edge_dim=5).double()
    x, ei, ea = _data(edge_dim=5)
    _close(conv, _compiled(conv), (x.double(), ei, ea.double()), tol=1e-10)


def test_bipartite_transformerconv():
    torch.manual_seed(0)
    conv = TransformerConv((F, 12), 8, heads=2, edge_dim=4)
    g = torch.Generator().manual_seed(3)
    xs, xd = torch.randn(N, F, generator=g), torch.randn(120, 12, generator=g)
    ei = torch.stack([torch.randint(0, N, (E,), generator=g), torch.randint(0, 120, (E,), generator=g)])
    ea = torch.randn(E, 4, generator=g)
    assert _explain(conv, (xs, xd), ei, ea).op_calls == {"attention_dot": 1}
    _close(conv, _compiled(conv), ((xs, xd), ei, ea))


@pytest.mark.parametrize("inner", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_two_layers_train_like_eager(inner):
    torch.manual_seed(0)

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = TransformerConv(F, 8, heads=4, edge_dim=6)
            self.c2 = TransformerConv(32, 8, heads=1, edge_dim=6)

        def forward(self, x, ei, ea):
            return self.c2(self.c1(x, ei, ea).relu(), ei, ea)

    model = Two()
    x, ei, ea = _data(edge_dim=6)
    if inner == "eager":
        assert _explain(model, x, ei, ea).op_calls == {"attention_dot": 2}
    _close(model, _compiled(model, inner), (x, ei, ea), tol=1e-4 if inner == "inductor" else 1e-5)


@pytest.mark.parametrize("edge_dim", [None, 16])
def test_chain_choice_keeps_the_chain_with_equal_results(edge_dim):
    torch.manual_seed(0)
    conv = TransformerConv(F, 8, heads=4, edge_dim=edge_dim)
    x, ei, ea = _data(edge_dim=edge_dim or 0)
    inputs = (x, ei) if ea is None else (x, ei, ea)
    rep = _explain(conv, *inputs, attention="chain")
    assert "attention_dot" not in rep.op_calls and "edge_softmax" in rep.op_calls, rep
    fused, chain = _compiled(conv, attention="fused"), _compiled(conv, attention="chain")
    torch.testing.assert_close(fused(*inputs), chain(*inputs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("edge_dim", [None, 16])
def test_attention_dropout_uses_the_dropout_ops_mask(edge_dim):
    """Training with attention dropout: the fused op drops exactly what the chain drops, in the
    forward and (the mask regenerated) the backward."""
    conv = TransformerConv(F, 8, heads=4, dropout=0.4, edge_dim=edge_dim)
    x, ei, ea = _data(edge_dim=edge_dim or 0)
    inputs = (x, ei) if ea is None else (x, ei, ea)
    fused, chain = _compiled(conv, attention="fused"), _compiled(conv, attention="chain")
    rep = _explain(conv, *inputs)
    assert rep.op_calls == {"attention_dot": 1} and "dropout" in str(rep)
    torch.manual_seed(7)
    a = fused(*inputs)
    torch.manual_seed(7)
    b = chain(*inputs)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(a)
    for u, v in zip(torch.autograd.grad(a, list(conv.parameters()), g),
                    torch.autograd.grad(b, list(conv.parameters()), g)):
        torch.testing.assert_close(u, v, rtol=1e-4, atol=1e-5)
    torch.manual_seed(8)
    assert not torch.allclose(fused(*inputs), a)


def test_coefficients_read_elsewhere_are_not_fused():
    torch.manual_seed(0)
    conv = TransformerConv(F, 8, heads=2, edge_dim=3)
    x, ei, ea = _data(edge_dim=3)

    class WithWeights(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x, ei, ea):
            out, (_, alpha) = self.conv(x, ei, ea, return_attention_weights=True)
            return out, alpha

    m = WithWeights()
    assert "attention_dot" not in _explain(m, x, ei, ea).op_calls
    (o1, a1), (o2, a2) = _compiled(m)(x, ei, ea), m(x, ei, ea)
    torch.testing.assert_close(o1, o2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a1, a2, rtol=1e-4, atol=1e-5)


def test_float16_keeps_the_chain():
    torch.manual_seed(0)
    conv = TransformerConv(F, 8, heads=2, edge_dim=3).to(torch.bfloat16)
    x, ei, ea = _data(edge_dim=3)
    rep = _explain(conv, x.to(torch.bfloat16), ei, ea.to(torch.bfloat16))
    assert "attention_dot" not in rep.op_calls, rep


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_chain_stays_and_says_why():
    torch.manual_seed(0)
    conv = TransformerConv(F, 8, heads=4).cuda()
    x, ei, _ = _data()
    rep = _explain(conv, x.cuda(), ei.cuda())
    assert "attention_dot" not in rep.op_calls and UNVERIFIED in str(rep)


@pytest.mark.parametrize("C,De,limit,block", [(8, 8, None, True), (32, 16, None, False), (8, 8, 0, False),
                                              (32, 16, 1 << 30, True)])
def test_edge_term_is_a_block_diagonal_product_where_small(C, De, limit, block, monkeypatch):
    """lin_edge's weight enters qe and the edge term's output as one matrix product with its
    block-diagonal form where that has at most BLOCK_DIAGONAL_MAX entries (4 x 8 with 8 edge
    features: 32 x 32), as einsums above (4 x 32 with 16: 128 x 64); both equal eager (the limit
    moved to take each way at each size), and the profile shows which ran."""
    from gnncompile.passes import attention_dot as fuse_pass

    if limit is not None:
        monkeypatch.setattr(fuse_pass, "BLOCK_DIAGONAL_MAX", limit)
    torch.manual_seed(0)
    conv = TransformerConv(F, C, heads=4, edge_dim=De)
    x, ei, ea = _data(edge_dim=De)
    compiled = _compiled(conv)
    _close(conv, compiled, (x, ei, ea))
    with torch.profiler.profile() as prof:
        compiled(x, ei, ea)
    names = {e.key for e in prof.key_averages()}
    assert "gnncompile::attention_dot" in names
    assert ("aten::einsum" not in names) == block and ("aten::block_diag" in names) == block
