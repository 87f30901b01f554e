"""When message programs are used (Settings.choices['programs'], $GNNCOMPILE_PROGRAMS): 'auto'
(the default) fuses them only where the measured rule (passes.match.programs_pay) says the
interpreter beats the ops as written, and explain names the reason where it does not;
'always' / 'never' fuse them everywhere / nowhere. Outputs and gradients equal eager's in every
mode."""
from __future__ import annotations

import warnings

import pytest
import torch

import gnncompile
from gnncompile import config
from gnncompile.passes.match import programs_pay
from gnncompile.settings import Settings
from shared import _fresh_dynamo, check_same  # noqa: F401  (autouse fixture)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.nn import GINEConv


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = GINEConv(torch.nn.Linear(16, 16), edge_dim=4)

    def forward(self, x, edge_index, edge_attr):
        return self.conv(x, edge_index, edge_attr)


def _inputs(n=60, degree=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    e = n * degree
    return (torch.randn(n, 16, generator=g, requires_grad=True), torch.randint(0, n, (2, e), generator=g),
            torch.randn(e, 4, generator=g))


def test_rule():
    """The interpreter's rule (GNNCOMPILE_CODEGEN=off: the suite's setting)."""
    assert programs_pay(1_000_000, 100_000)[0]  # degree 10, many edges
    assert programs_pay(200_000, 40_000)[0]  # degree 5
    assert programs_pay(60_000, 6_000)[0]  # degree 10
    assert not programs_pay(200_000, 100_000)[0]  # degree 2: loses at every measured size
    assert not programs_pay(60_000, 12_000)[0]  # degree 5, too few edges
    assert not programs_pay(3_000, None)[0]  # a pooling into a number of graphs read from the data
    assert programs_pay(None, 100)[0] and programs_pay(1_000_000, None)[0]  # unknown: as before the rule
    pays, why = programs_pay(6_600, 3_300)
    assert not pays and "6600 scattered rows" in why and "'programs': 'always'" in why
    assert "the interpreter beats" in why and "edges >= 150k at degree >= 4" in why


def test_rule_with_generated_kernels():
    """programs_pay under generated kernels keeps the interpreter's thresholds
    (match.GENERATED_MIN_EDGES: the zoo lost CGConv, AttentiveFP and PNAConv with a 10k-edge rule
    measured on GINE alone; cheap messages with an encoder inside take match.encoded_cheap_pays,
    tested below); the reason names what runs the programs."""
    for e, r in [(12_000, 6_000), (60_000, 12_000), (200_000, 100_000)]:
        assert programs_pay(e, r, generated=True)[0] == programs_pay(e, r, generated=False)[0], (e, r)
    assert programs_pay(200_000, 40_000, generated=True)[0]
    pays, why = programs_pay(6_600, 1_650, generated=True)
    assert not pays and "generated kernels beat" in why and "edges >= 150k at degree >= 4" in why


def test_rule_follows_the_codegen_setting(monkeypatch):
    """Without an explicit choice the reason names what runs the programs."""
    from gnncompile import codegen

    monkeypatch.setattr(codegen, "enabled", lambda: True)
    assert "generated kernels beat" in programs_pay(12_000, 6_000)[1]
    monkeypatch.setattr(codegen, "enabled", lambda: False)
    assert "the interpreter beats" in programs_pay(12_000, 6_000)[1]


def _program_fused(rep) -> bool:
    return any(f.kind == "message" for f in rep.fused)


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
def test_modes_on_a_small_low_degree_graph(mode):
    model = Layer()
    torch.manual_seed(0)
    compiled = gnncompile.compile(model, settings={"choices": {"programs": mode}})
    assert compiled.gnncompile_settings.programs == mode
    inputs = _inputs()
    check_same(model, compiled, inputs)
    rep = gnncompile.explain(compiled, *inputs)
    assert _program_fused(rep) == (mode == "always")
    reasons = " ".join(u.reason for u in rep.unfused)
    assert ("below the measured rule" in reasons) == (mode == "auto")


def test_environment_sets_the_default(monkeypatch):
    monkeypatch.delenv("GNNCOMPILE_GUARD", raising=False)  # (the suite turns the guard off)
    monkeypatch.delenv("GNNCOMPILE_SPMM_IMPL", raising=False)  # (the suite pins the native spmm)
    monkeypatch.delenv("GNNCOMPILE_EDGE_ENCODER", raising=False)  # (the suite puts encoders inside)
    monkeypatch.setenv("GNNCOMPILE_PROGRAMS", "never")
    assert Settings.from_config().programs == "never"
    monkeypatch.setenv("GNNCOMPILE_PROGRAMS", "auto")
    assert Settings.from_config().programs == "auto" and Settings.from_config().choices == ()
    monkeypatch.setenv("GNNCOMPILE_PROGRAMS", "sometimes")
    with pytest.raises(config.ConfigError, match="GNNCOMPILE_PROGRAMS"):
        config.current()


def test_bad_choice_is_a_clear_error():
    with pytest.raises(ValueError, match="programs"):
        Settings(choices=(("programs", "maybe"),))


class SigmoidEncoded(torch.nn.Module):
    """A message with an edge encoder inside and a transcendental operator: the 10k rule of cheap
    encoded messages does not apply."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 16)

    def forward(self, x, edge_index, edge_attr):
        msg = torch.sigmoid(x[edge_index[0]] + self.lin(edge_attr))
        return torch.zeros_like(x).index_add_(0, edge_index[1], msg)


def test_cheap_encoded_messages_pay_from_10k_edges_under_generated_kernels(monkeypatch):
    """match.ENCODED_MIN_EDGES: GINE's relu(x_j + lin(e)) with the encoder inside fuses from 10k
    edges at any degree under generated kernels (the zoo's GINEConv at 16k edges: 1.32x eager);
    not under the interpreter, not below 10k edges, not with a sigmoid in the message."""
    from gnncompile import codegen

    inputs = _inputs(n=5_000, degree=2)  # 10k edges, degree 2: below the general rule
    small = _inputs(n=4_000, degree=2)  # 8k edges
    settings = {"choices": {"programs": "auto", "edge_encoder": "inside"}}
    monkeypatch.setattr(codegen, "enabled", lambda: True)
    for model, inp, fused in [(Layer(), inputs, True), (Layer(), small, False), (SigmoidEncoded(), inputs, False)]:
        rep = gnncompile.explain(gnncompile.compile(model, settings=settings), *inp)
        assert _program_fused(rep) == fused, (type(model).__name__, inp[1].shape, str(rep))
        if not fused:
            assert "below the measured rule" in " ".join(u.reason for u in rep.unfused), str(rep)
    monkeypatch.setattr(codegen, "enabled", lambda: False)
    rep = gnncompile.explain(gnncompile.compile(Layer(), settings=settings), *inputs)
    assert not _program_fused(rep), str(rep)


class Stack(torch.nn.Module):
    """``layers`` GINE layers in one graph piece (one frame, no break)."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(GINEConv(torch.nn.Linear(16, 16), edge_dim=4) for _ in range(layers))

    def forward(self, x, edge_index, edge_attr):
        for conv in self.convs:
            x = conv(x, edge_index, edge_attr).relu()
        return x


def test_cheap_encoded_messages_count_together_in_a_piece(monkeypatch):
    """match.ENCODED_MIN_EDGES counts a piece's cheap encoded messages together, each of at
    least ENCODED_MIN_EDGES_EACH edges: three GINE layers of 6k edges fuse (the molecule batches'
    GINE), one layer of 6k does not, nor three of 4k (12k edges together, each below the floor);
    explain's reason says so; compiled equals eager where they fuse."""
    from gnncompile import codegen
    from gnncompile.passes.match import ENCODED_MIN_EDGES, ENCODED_MIN_EDGES_EACH

    assert ENCODED_MIN_EDGES_EACH < 6_000 < ENCODED_MIN_EDGES < 3 * 6_000
    assert 3 * 4_000 >= ENCODED_MIN_EDGES and 4_000 < ENCODED_MIN_EDGES_EACH
    monkeypatch.setattr(codegen, "enabled", lambda: True)
    settings = {"choices": {"programs": "auto", "edge_encoder": "inside"}}
    mid, small = _inputs(n=3_000, degree=2), _inputs(n=2_000, degree=2)  # 6k, 4k edges: below the general rule
    for layers, inp, fused in [(3, mid, 3), (1, mid, 0), (3, small, 0)]:
        torch.manual_seed(0)
        model = Stack(layers)
        compiled = gnncompile.compile(model, settings=settings)
        rep = gnncompile.explain(compiled, *inp)
        assert sum(f.kind == "message" for f in rep.fused) == fused, (layers, inp[1].shape, str(rep))
        reasons = " ".join(u.reason for u in rep.unfused)
        if not fused and inp is mid:
            assert "scatter >= 10000 edges together: here 1 of them, 6000 edges" in reasons, reasons
        if not fused and inp is small:
            assert "below ENCODED_MIN_EDGES_EACH" in reasons, reasons
        if fused:
            check_same(model, compiled, list(inp), rtol=1e-3, atol=1e-4)  # fp32 sums over 6k edges, 3 layers


class GENLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from torch_geometric.nn import GENConv

        self.conv = GENConv(16, 16, aggr="softmax", learn_t=True, edge_dim=4)

    def forward(self, x, edge_index, edge_attr):
        return self.conv(x, edge_index, edge_attr)


def test_softmax_aggregation_rule(monkeypatch):
    """match.SOFTMAX_MIN_EDGES: with programs 'auto' under generated kernels, GENConv's softmax
    aggregation is one message_softmax from 5000 edges; below, the chain as written stays
    (edge_softmax) and explain's notes say why; under the interpreter it is fused at any size.
    Compiled equals eager where it is fused."""
    import importlib

    match = importlib.import_module("gnncompile.passes.match")
    settings = {"choices": {"programs": "auto", "edge_encoder": "inside"}}
    big, small = _inputs(n=600, degree=10), _inputs(n=400, degree=10)  # 6000 and 4000 edges
    monkeypatch.setattr(match, "_generated", lambda: True)
    for inp, fused in [(big, True), (small, False)]:
        torch.manual_seed(0)
        model = GENLayer()
        compiled = gnncompile.compile(model, settings=settings)
        rep = gnncompile.explain(compiled, *inp)
        kinds = [f.kind for f in rep.fused]
        assert ("message_softmax" in kinds) == fused, str(rep)
        if fused:
            check_same(model, compiled, inp)
        else:
            assert "edge_softmax" in kinds and any("SOFTMAX_MIN_EDGES" in n for n in rep.notes), str(rep)
    monkeypatch.setattr(match, "_generated", lambda: False)
    rep = gnncompile.explain(gnncompile.compile(GENLayer(), settings=settings), *small)
    assert "message_softmax" in [f.kind for f in rep.fused], str(rep)


class Gathered(torch.nn.Module):
    """LEConv's kind of message, a cheap expression of gathered node rows (``a_j - b_i``); with
    ``variant`` 'sigmoid' a transcendental operator on it, with 'edge' a per-edge weight computed
    outside (an ``edge`` input), with 'shared' the message read outside the scatter too (PNA's
    several aggregations of one message): none is covered by match.GATHERED_MIN_EDGES."""

    def __init__(self, variant: str = "") -> None:
        super().__init__()
        self.variant = variant
        self.lin1, self.lin2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x, edge_index, edge_attr):
        msg = self.lin1(x)[edge_index[0]] - self.lin2(x)[edge_index[1]]
        if self.variant == "sigmoid":
            msg = torch.sigmoid(msg)
        elif self.variant == "edge":
            msg = msg * edge_attr.sum(-1, keepdim=True)
        out = torch.zeros_like(x).index_add_(0, edge_index[1], msg)
        return out + msg.mean() if self.variant == "shared" else out


def test_cheap_gathered_messages_pay_from_16k_edges_at_degree_4_under_generated_kernels(monkeypatch):
    """match.GATHERED_MIN_EDGES: a cheap message whose inputs are all gathered node rows (LEConv's
    a_j - b_i, PyG's LEConv itself) fuses from 16k edges at degree >= 4 under generated kernels,
    with outputs and gradients equal to eager's; not at 16k edges of degree 2 nor at 12k edges
    of degree 4 (explain says why), not with a sigmoid in it, not with a per-edge input computed
    outside, not where the message is read outside the scatter too, not under the interpreter."""
    from gnncompile import codegen
    from gnncompile.passes.match import GATHERED_MIN_EDGES
    from torch_geometric.nn import LEConv

    class LE(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = LEConv(16, 16)

        def forward(self, x, edge_index, edge_attr):
            return self.conv(x, edge_index)

    assert GATHERED_MIN_EDGES == ((16_000, 4.0),)
    settings = {"choices": {"programs": "auto"}}
    # 16k edges at degree 4; 12k at degree 4, 16k at degree 2: all below the general rule
    big, small, sparse = _inputs(n=4_000, degree=4), _inputs(n=3_000, degree=4), _inputs(n=8_000, degree=2)
    monkeypatch.setattr(codegen, "enabled", lambda: True)
    for build, inp, fused in [(Gathered, big, True), (LE, big, True), (Gathered, small, False),
                              (Gathered, sparse, False), (lambda: Gathered("sigmoid"), big, False),
                              (lambda: Gathered("edge"), big, False), (lambda: Gathered("shared"), big, False)]:
        torch.manual_seed(0)
        model = build()
        compiled = gnncompile.compile(model, settings=settings)
        rep = gnncompile.explain(compiled, *inp)
        assert _program_fused(rep) == fused, (type(model).__name__, getattr(model, "variant", ""), str(rep))
        reasons = " ".join(u.reason for u in rep.unfused)
        if fused:
            check_same(model, compiled, list(inp), rtol=1e-4, atol=1e-4)  # fp32 sums in another order
        else:
            assert "below the measured rule" in reasons, reasons
        if inp is small or inp is sparse:
            assert "below GATHERED_MIN_EDGES, 16k edges at degree >= 4" in reasons, reasons
    monkeypatch.setattr(codegen, "enabled", lambda: False)
    rep = gnncompile.explain(gnncompile.compile(Gathered(), settings=settings), *big)
    assert not _program_fused(rep), str(rep)
