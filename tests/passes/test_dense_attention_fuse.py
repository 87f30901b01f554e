"""passes/dense_attention.py: nn.MultiheadAttention's call (F.multi_head_attention_forward, as
Dynamo keeps it) becomes gnncompile::dense_attention inside GPSConv and in a plain attention
model, in training and in eval, computing what eager does (outputs and gradients); left as written,
with the reason in explain, where the op does not compute the same thing or is not the faster
(attention dropout in training, the weights returned, an attn_mask, a large head dim)."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.nn as gnn

import gnncompile
from gnncompile.passes.dense_attention import MAX_HEAD_DIM
from shared import _fresh_dynamo  # noqa: F401  (_fresh_dynamo resets Dynamo before each test)


def _compiled(model, attention="fused", dynamic=True):
    return gnncompile.compile(model, inner="eager", settings={"capture_dynamic": dynamic,
                                                              "choices": {"guard": "off", "attention": attention}})


def _explain(model, *inputs, attention="fused", dynamic=True):
    return gnncompile.explain(gnncompile.compile(model, settings={"capture_dynamic": dynamic,
                                                                  "choices": {"attention": attention}}), *inputs)


def _close(model, compiled, inputs, tol=1e-5):
    params = [p for p in model.parameters() if p.requires_grad]
    out_c, out_e = compiled(*inputs), model(*inputs)
    torch.testing.assert_close(out_c, out_e, rtol=tol, atol=tol * out_e.abs().max().item())
    g = torch.randn_like(out_e)
    got = torch.autograd.grad(out_c, params, g)
    want = torch.autograd.grad(out_e, params, g)
    scale = max(b.abs().max().item() for b in want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * scale)


def _gps_inputs(n=240, graphs=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    ei = torch.randint(0, n, (2, 4 * n), generator=g)
    batch = torch.sort(torch.randint(0, graphs, (n,), generator=g)).values  # ragged graph sizes
    return x, ei, batch


def _gps(heads=4):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32))
    return gnn.GPSConv(32, gnn.GINConv(mlp), heads=heads)


def _kinds(rep):
    return [f.kind for f in rep.fused]


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_gpsconv_attention_is_rewritten_and_computes_what_eager_does(mode):
    # capture_dynamic=False: to_dense_batch's sizes come in as graph inputs (graph breaks before)
    model = _gps()
    getattr(model, mode)()
    inputs = _gps_inputs()
    rep = _explain(model, *inputs, dynamic=False)
    assert _kinds(rep).count("dense_attention") == 1, rep
    assert rep.op_calls.get("dense_attention") == 1, rep.op_calls
    assert "dense_attention[4 heads of 8, key padding mask]" in str(rep)
    assert not [u for u in rep.unfused if u.op == "multi_head_attention"], rep
    _close(model, _compiled(model, dynamic=False), inputs)


def test_gpsconv_with_dynamic_capture_is_compiled_again_and_fuses():
    # With the default capture_dynamic=True, to_dense_batch's padded length is an unbacked size and
    # Dynamo breaks the graph at MultiheadAttention's call (torch's attention compares it with 1).
    # The compiled module then compiles again with scalar reads left to eager, and the attention
    # fuses; explain says so; compiled still equals eager.
    model = _gps()
    inputs = _gps_inputs()
    rep = _explain(model, *inputs)
    assert _kinds(rep).count("dense_attention") == 1, rep
    assert not any("multi_head_attention_forward" in b for b in map(str, rep.graph_breaks)), rep
    assert any(n.startswith("scalar reads left to eager") for n in rep.notes), rep.notes
    compiled = _compiled(model)
    _close(model, compiled, inputs)
    assert compiled._capture == "outputs" and "data-dependent guard" in compiled.capture_note
    assert compiled.capture_note in gnncompile.explain(compiled, *inputs).notes


class _Plain(torch.nn.Module):
    """A plain self-attention over a padded batch [B, L, E] (batch_first) with a padding mask."""

    def __init__(self, embed=24, heads=3, dropout=0.0, need_weights=False, batch_first=True, kdim=None):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(embed, heads, dropout=dropout, batch_first=batch_first,
                                                kdim=kdim, vdim=kdim)
        self.need_weights, self.batch_first = need_weights, batch_first

    def forward(self, x, kpm, attn_mask=None, kv=None):
        if not self.batch_first:
            x = x.transpose(0, 1)
        kv = x if kv is None else kv
        out, _ = self.attn(x, kv, kv, key_padding_mask=kpm, need_weights=self.need_weights, attn_mask=attn_mask)
        return out


def _plain_inputs(B=4, L=30, E=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, E, generator=g)
    kpm = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        kpm[b, L - 5 * b:] = True
    return x, kpm


@pytest.mark.parametrize("batch_first", [True, False])
def test_plain_multihead_attention_is_rewritten(batch_first):
    torch.manual_seed(0)
    model = _Plain(batch_first=batch_first)
    x, kpm = _plain_inputs()
    rep = _explain(model, x, kpm)
    assert _kinds(rep) == ["dense_attention"], rep
    _close(model, _compiled(model), (x, kpm))


def test_separate_projections_and_cross_attention_are_rewritten():
    torch.manual_seed(0)
    model = _Plain(kdim=16)
    x, _ = _plain_inputs(L=20)
    kv, kpm = _plain_inputs(L=26, E=16, seed=1)
    rep = _explain(model, x, kpm, None, kv)
    assert _kinds(rep) == ["dense_attention"], rep
    _close(model, _compiled(model), (x, kpm, None, kv))


def test_dropout_in_training_is_left_with_its_reason_and_eval_is_rewritten():
    torch.manual_seed(0)
    model = _Plain(dropout=0.1).train()
    x, kpm = _plain_inputs()
    rep = _explain(model, x, kpm)
    assert "dense_attention" not in _kinds(rep)
    assert "attention dropout in training (p=0.1)" in str(rep), rep
    model.eval()
    rep = _explain(model, x, kpm)
    assert _kinds(rep) == ["dense_attention"], rep
    with torch.no_grad():
        torch.testing.assert_close(_compiled(model)(x, kpm), model(x, kpm), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case, reason", [
    ("big_head", f"head dim 48 > {MAX_HEAD_DIM}"),
    ("weights", "need_weights=True"),
    ("attn_mask", "attn_mask given"),
])
def test_left_as_written_with_the_reason(case, reason):
    torch.manual_seed(0)
    model = _Plain(embed=96, heads=2) if case == "big_head" else _Plain(need_weights=case == "weights")
    x, kpm = _plain_inputs(E=96 if case == "big_head" else 24)
    args = (x, kpm)
    if case == "attn_mask":
        args = (x, kpm, torch.zeros(30, 30, dtype=torch.bool))
    rep = _explain(model, *args)
    assert "dense_attention" not in _kinds(rep)
    assert reason in str(rep), rep
    compiled = _compiled(model)
    torch.testing.assert_close(compiled(*args), model(*args))


def test_choice_chain_leaves_it():
    model = _gps()
    rep = _explain(model, *_gps_inputs(), attention="chain", dynamic=False)
    assert "dense_attention" not in _kinds(rep)
