"""CompiledModule._capture_switch: where a captured scalar (an unbacked size) ended a graph piece
at a data-dependent guard, the compiled module compiles the model again once with scalar reads
left to eager; models without such a break keep capturing; capture_dynamic=False never switches;
the switched module stays exact over batches of other sizes, and its guard decisions are those
of the backend it runs."""
from __future__ import annotations

import torch
from torch_geometric.utils import to_dense_batch

import gnncompile
from gnncompile.compiler import backend as _backend
from shared import _fresh_dynamo  # noqa: F401  (_fresh_dynamo resets Dynamo before each test)


class DenseAttention(torch.nn.Module):
    """Self-attention over each graph's nodes: to_dense_batch's padded length (a scalar read from
    ``batch``) is the attention's length, which torch's attention compares with 1."""

    def __init__(self, dim=16, heads=4):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x, batch):
        h, mask = to_dense_batch(self.lin(x), batch)
        h, _ = self.attn(h, h, h, key_padding_mask=~mask, need_weights=False)
        return h[mask] + x


class Readout(torch.nn.Module):
    """A scalar read that compiles (global_add_pool's size): no data-dependent guard."""

    def __init__(self, dim=16):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)

    def forward(self, x, batch):
        from torch_geometric.nn import global_add_pool

        return global_add_pool(self.lin(x).relu(), batch)


class Branch(torch.nn.Module):
    """A Python branch on a captured size: a data-dependent break outside torch's attention,
    which leaves the capture as it is."""

    def __init__(self, dim=16):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)

    def forward(self, x, batch):
        from torch_geometric.nn import global_add_pool

        n = int(batch.max()) + 1
        if n == 1:
            return self.lin(x).sum(0, keepdim=True)
        return global_add_pool(self.lin(x), batch, size=n)


def _inputs(sizes, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = torch.cat([torch.full((s,), i) for i, s in enumerate(sizes)])
    return torch.randn(len(batch), dim, generator=g), batch


def _compile(model, **settings):
    return gnncompile.compile(model, inner="eager", settings={"choices": {"guard": "off"}, **settings})


def _check(model, compiled, inputs):
    torch.testing.assert_close(compiled(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)


def test_a_data_dependent_break_compiles_the_model_again_once():
    torch.manual_seed(0)
    model = DenseAttention()
    compiled = _compile(model)
    first = compiled._backend
    assert compiled._capture is True and compiled.capture_note == ""
    _check(model, compiled, _inputs([5, 9, 7]))
    assert first.data_dependent_breaks, "the attention's guard on the padded length broke the graph"
    assert compiled._capture == _backend.CAPTURE_OUTPUTS
    assert compiled._backend is not first and not compiled._backend.data_dependent_breaks
    # batches of other sizes (other padded lengths, one graph of a single node) stay exact, and
    # the module does not switch again
    switched = compiled._backend
    for sizes in ([3, 12], [1], [8, 8, 8, 2]):
        _check(model, compiled, _inputs(sizes, seed=len(sizes)))
    assert compiled._backend is switched and compiled._capture == _backend.CAPTURE_OUTPUTS
    # torch's flags are restored after every call
    cfg = torch._dynamo.config
    assert not cfg.capture_scalar_outputs and not cfg.capture_dynamic_output_shape_ops


def test_gradients_after_the_switch_equal_eager():
    torch.manual_seed(0)
    model = DenseAttention()
    compiled = _compile(model)
    for sizes in ([4, 6], [7, 3, 5]):
        x, batch = _inputs(sizes)
        x.requires_grad_(True)
        g = torch.randn(len(batch), 16)
        got = torch.autograd.grad(compiled(x, batch), [x, *model.parameters()], g)
        want = torch.autograd.grad(model(x, batch), [x, *model.parameters()], g)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert compiled._capture == _backend.CAPTURE_OUTPUTS


def test_no_switch_without_a_data_dependent_break():
    torch.manual_seed(0)
    model = Readout()
    compiled = _compile(model)
    _check(model, compiled, _inputs([5, 9, 7]))
    assert compiled._capture is True and compiled.capture_note == ""
    assert not compiled._backend.data_dependent_breaks


def test_a_data_dependent_break_outside_attention_does_not_switch():
    torch.manual_seed(0)
    model = Branch()
    compiled = _compile(model)
    _check(model, compiled, _inputs([5, 9, 7]))
    assert compiled._capture is True and compiled.capture_note == ""
    rep = gnncompile.explain(compiled, *_inputs([5, 9, 7]))
    assert any(_backend.DATA_DEPENDENT in b.reason for b in rep.graph_breaks), rep
    assert any("capture_dynamic='outputs'" in n for n in rep.notes), rep.notes


def test_capture_off_never_switches():
    torch.manual_seed(0)
    model = DenseAttention()
    compiled = _compile(model, capture_dynamic=False)
    _check(model, compiled, _inputs([5, 9, 7]))
    assert compiled._capture is False and compiled.capture_note == ""


def test_guard_decisions_come_from_the_backend_it_runs():
    torch.manual_seed(0)
    model = DenseAttention()
    compiled = gnncompile.compile(model, inner="eager", settings={"choices": {"guard": "time"}})
    x, batch = _inputs([6, 9, 4])
    first = compiled._backend
    compiled(x, batch)
    assert compiled._capture == _backend.CAPTURE_OUTPUTS and compiled._backend is not first
    for _ in range(60):  # the pieces' races, then the whole model's (25 calls at most to warm up)
        compiled(x, batch)
    decisions = compiled.guard_decisions()
    mine = compiled._backend.guard_decisions()
    earlier = first.guard_decisions()  # pieces of the first compile Dynamo still runs, if any
    assert compiled._earlier == [first]
    assert mine and decisions[:-1] == earlier + mine, decisions
    assert any("dense_attention" in d.piece for d in mine), mine  # the piece the switch made
    assert decisions[-1].piece.startswith("the whole model"), decisions
