"""Where an edge encoder goes: ``Settings.choices['edge_encoder']`` ('auto', the default; 'inside';
'outside'; ``$GNNCOMPILE_EDGE_ENCODER``) and the rule of 'auto' (passes/messages.py,
``encoder_inside``): inside where its depth D (times 4/3 where its input needs a gradient) is at
most min(W, 40) / 2, else outside, with the reason in explain. The suite runs with GNNCOMPILE_EDGE_ENCODER=inside
(conftest.py): these tests ask for the mode they test.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import gnncompile
from gnncompile import config
from gnncompile.passes.messages import encoder_inside
from gnncompile.settings import Settings
from shared import _fresh_dynamo, check_same  # noqa: F401  (_fresh_dynamo: autouse)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn

N, E, F, D = 30, 120, 32, 5
DEEP = 13  # 13 <= 32 / 2, but 13 * 4 / 3 > 16: inside without a gradient, outside with one
TOL = dict(rtol=1e-9, atol=1e-10)


def _graph(D_=D, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, F, generator=g, dtype=torch.float64).requires_grad_()
    ei = torch.randint(0, N, (2, E), generator=g)
    ea = torch.randn(E, D_, generator=g, dtype=torch.float64)
    return x, ei, ea


class Learned(torch.nn.Module):
    """GINEConv whose edge features come from a learned map: the encoder's input needs a gradient."""

    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(D, DEEP)
        self.conv = gnn.GINEConv(torch.nn.Linear(F, F), edge_dim=DEEP)

    def forward(self, x, edge_index, edge_attr):
        return self.conv(x, edge_index, torch.relu(self.pre(edge_attr)))


def _compile(model, mode):
    choices = {"guard": "off", "programs": "always"}
    if mode is not None:
        choices["edge_encoder"] = mode
    return gnncompile.compile(model, settings={"choices": choices})


def _messages(compiled, inputs):
    rep = gnncompile.explain(compiled, *inputs)
    return [f.detail for f in rep.fused if f.kind == "message"]


def test_rule():
    # width 32: depth up to 16 inside, up to 12 where the input needs a gradient
    assert encoder_inside("auto", 16, 32, False) == (True, "")
    assert encoder_inside("auto", 12, 32, True) == (True, "")
    inside, why = encoder_inside("auto", 13, 32, True)
    assert not inside and "needs a gradient" in why and "> 16" in why
    inside, why = encoder_inside("auto", 32, 32, True)  # SchNet's filter
    assert not inside and "depth 32" in why
    assert not encoder_inside("auto", 17, 32, False)[0]
    # wider maps: the limit grows with the width up to 40 columns (Zen 4, encode_block:
    # benchmarks/results/encoder_rule_zen4_s54.md; with the old cap of 64 depth 16 with the
    # gradient went inside at width 128, measured 0.91-0.97x of outside)
    assert encoder_inside("auto", 16, 128, False)[0]  # GINE, 1M
    assert encoder_inside("auto", 8, 128, True)[0]
    inside, why = encoder_inside("auto", 16, 128, True)
    assert not inside and "> 20 (min(width, 40) / 2)" in why
    assert not encoder_inside("auto", 32, 128, False)[0]
    assert encoder_inside("auto", 20, 40, False)[0] and not encoder_inside("auto", 21, 40, False)[0]
    assert encoder_inside("auto", 20, 1024, False)[0] and not encoder_inside("auto", 21, 1024, False)[0]
    assert encoder_inside("auto", 21, 64, False) == encoder_inside("auto", 21, 1024, False)
    assert not encoder_inside("auto", 3, 4, False)[0] and encoder_inside("auto", 2, 4, False)[0]
    # the overrides decide alone
    assert encoder_inside("inside", 32, 32, True) == (True, "")
    assert encoder_inside("outside", 1, 128, False)[0] is False
    with pytest.raises(ValueError, match="edge encoder mode"):
        encoder_inside("sideways", 8, 32, False)


def test_auto_is_the_default():
    assert Settings().edge_encoder == "auto"
    assert config.Config().edge_encoder == "auto"
    with config.override(edge_encoder="auto"):
        assert "edge_encoder" not in dict(Settings.from_config().choices)  # the default: not recorded
    with pytest.raises(ValueError, match="edge_encoder"):
        Settings().replace(choices={"edge_encoder": "sideways"})


def test_auto_keeps_gine_inside():
    """GINE reads its edge features as given (no gradient), D 5 <= 32 / 2: 'auto' puts the map inside."""
    torch.manual_seed(0)
    model = gnn.GINEConv(torch.nn.Linear(F, F), edge_dim=D).double()
    inputs = list(_graph())
    compiled = _compile(model, "auto")
    check_same(model, compiled, inputs, **TOL)
    assert _messages(compiled, inputs) == ["relu+add(x_j,lin(edge))"]


def test_auto_keeps_an_encoder_whose_input_needs_grad_outside_and_says_why():
    """D 13 and W 32: outside where its input needs a gradient (13 * 4 / 3 > 16), with the reason
    in explain; inside in no-grad calls, where nothing needs one."""
    torch.manual_seed(0)
    model = Learned().double()
    inputs = list(_graph())
    compiled = _compile(model, "auto")
    check_same(model, compiled, inputs, **TOL)
    details = _messages(compiled, inputs)
    assert len(details) == 1 and details[0].startswith("relu+add(x_j,edge)"), details
    assert "edge encoder" in details[0] and f"({DEEP} -> {F} features) computed outside" in details[0] \
        and "needs a gradient" in details[0], details
    # the same model in no-grad calls: nothing needs a gradient, the map goes inside
    with torch.no_grad():
        rep = gnncompile.explain(_compile(model, "auto"), *inputs)
    assert [f.detail for f in rep.fused if f.kind == "message"] == ["relu+add(x_j,lin(edge))"], str(rep)


@pytest.mark.parametrize("mode, model_kind, inside", [("inside", "learned", True), ("outside", "gine", False)])
def test_overrides(mode, model_kind, inside):
    torch.manual_seed(0)
    model = (Learned() if model_kind == "learned" else gnn.GINEConv(torch.nn.Linear(F, F), edge_dim=D)).double()
    inputs = list(_graph())
    compiled = _compile(model, mode)
    check_same(model, compiled, inputs, **TOL)
    details = _messages(compiled, inputs)
    assert len(details) == 1 and ("lin(edge)" in details[0]) == inside, details
    assert "computed outside" not in details[0]  # an override needs no reason


def test_environment_choice_survives_a_settings_dict():
    """$GNNCOMPILE_EDGE_ENCODER (here config.override) is kept when compile() is given other
    choices: a settings dict's choices merge key by key (they replaced every choice before, so a
    benchmark run with the variable set measured the default)."""
    model = gnn.GINEConv(torch.nn.Linear(F, F), edge_dim=D).double()
    with config.override(edge_encoder="outside"):
        compiled = gnncompile.compile(model, settings={"choices": {"guard": "off"}})
        assert compiled.gnncompile_settings.edge_encoder == "outside"
        assert dict(compiled.gnncompile_settings.choices)["guard"] == "off"
        given = gnncompile.compile(model, settings={"choices": {"edge_encoder": "inside"}})
        assert given.gnncompile_settings.edge_encoder == "inside"
    inputs = list(_graph())
    with config.override(edge_encoder="outside"):
        assert _messages(_compile(model, None), inputs) == ["relu+add(x_j,edge)"]


class _Radius(torch.nn.Module):
    """Every pair of nodes of one graph closer than ``cutoff``, with their distance (SchNet's
    interaction graph in plain torch)."""

    def __init__(self, cutoff):
        super().__init__()
        self.cutoff = cutoff

    def forward(self, pos, batch):
        d = torch.cdist(pos, pos)
        near = (d < self.cutoff) & (batch[:, None] == batch[None, :])
        near &= ~torch.eye(pos.size(0), dtype=torch.bool, device=pos.device)
        dst, src = near.nonzero().t()
        return torch.stack([src, dst]), d[dst, src]


@pytest.mark.parametrize("mode", ["auto", "inside"])
def test_schnet_equals_eager(mode):
    """SchNet (its filter lin2(ssp(lin1(rbf))) * C: the encoder's input needs a gradient):
    outputs and every gradient equal eager's, the encoder outside under 'auto' (with the reason)
    and inside when asked."""
    from torch_geometric.nn.models import SchNet

    torch.manual_seed(0)
    model = SchNet(hidden_channels=16, num_filters=16, num_interactions=2, num_gaussians=8, cutoff=1.5,
                   interaction_graph=_Radius(1.5)).double()
    g = torch.Generator().manual_seed(0)
    z = torch.randint(1, 10, (40,), generator=g)
    pos = torch.rand(40, 3, generator=g, dtype=torch.float64) * 2
    batch = torch.arange(2).repeat_interleave(20)
    compiled = _compile(model, mode)
    out_c, out_e = compiled(z, pos, batch), model(z, pos, batch)
    torch.testing.assert_close(out_c, out_e, **TOL)
    params = list(model.parameters())
    gc = torch.autograd.grad(out_c.square().sum(), params)
    ge = torch.autograd.grad(out_e.square().sum(), params)
    for a, b in zip(gc, ge):
        torch.testing.assert_close(a, b, **TOL)
    details = _messages(compiled, [z, pos, batch])
    assert len(details) == 2, details
    for d in details:
        if mode == "auto":
            assert "lin(edge)" not in d and "(16 -> 16 features) computed outside" in d and "gradient" in d, d
        else:
            assert "lin(edge)" in d and "computed outside" not in d, d
