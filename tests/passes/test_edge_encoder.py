"""Edge encoders inside message programs (ops/program.py, side ``enc``; passes/messages.py).

A linear map of narrow edge features whose output only a message reads (GINE's ``lin(edge_attr)``)
is computed per edge inside the kernels: compiled == eager (outputs, every gradient, float32 and
float64, sum / mean / max / min), the ``E x W`` output is never allocated in the forward pass,
and where the map is not an encoder (too wide, read elsewhere, written in place) it is read as
computed, as before.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import gnncompile
from gnncompile.hardware import memory
from gnncompile.ops import program as P
from shared import _fresh_dynamo, check_same  # noqa: F401  (_fresh_dynamo: autouse)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn
    from torch_geometric.nn import MessagePassing

N, E, F, D = 30, 120, 8, 5
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-9, atol=1e-10)}


def _inputs(dtype, D_=D, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, F, generator=g, dtype=dtype).requires_grad_()
    src = torch.randint(0, N, (E,), generator=g)
    dst = torch.randint(0, N, (E,), generator=g)
    ea = torch.randn(E, D_, generator=g, dtype=dtype).requires_grad_()
    return x, torch.stack([src, dst]), ea


class EncodedMessage(MessagePassing):
    """``act(x_j + lin(edge_attr))`` aggregated by ``aggr``; with ``leak``, the encoded edges are
    also returned (read outside the message)."""

    def __init__(self, aggr="sum", D_=D, bias=True, leak=False, inplace=False):
        super().__init__(aggr=aggr)
        self.lin = torch.nn.Linear(D_, F, bias=bias)
        self.leak, self.inplace = leak, inplace

    def forward(self, x, edge_index, edge_attr):
        e = self.lin(edge_attr)
        if self.inplace:
            e.mul_(2.0)
        out = self.propagate(edge_index, x=x, e=e)
        return out + e.sum() if self.leak else out

    def message(self, x_j, e):
        return torch.tanh(x_j + e) * x_j


def _details(model, inputs):
    rep = gnncompile.explain(model, *inputs)
    return [f.detail for f in rep.fused if f.kind == "message"], rep


def _encoded(details) -> bool:
    return any("lin(edge)" in d for d in details)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("aggr", ["sum", "mean", "max", "min"])
def test_encoder_inside_equals_eager(aggr, dtype):
    torch.manual_seed(0)
    model = EncodedMessage(aggr).to(dtype)
    inputs = _inputs(dtype)
    check_same(model, gnncompile.compile(model), list(inputs), **TOL[dtype])
    if dtype == torch.float32:
        details, rep = _details(model, inputs)
        assert _encoded(details), str(rep)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_gine_encoder_inside(dtype):
    torch.manual_seed(0)
    model = gnn.GINEConv(torch.nn.Sequential(torch.nn.Linear(F, F), torch.nn.ReLU(), torch.nn.Linear(F, F)),
                         edge_dim=D).to(dtype)
    inputs = _inputs(dtype)
    check_same(model, gnncompile.compile(model), list(inputs), **TOL[dtype])
    details, rep = _details(model, inputs)
    assert details == ["relu+add(x_j,lin(edge))"], str(rep)


def test_encoder_without_bias():
    torch.manual_seed(0)
    model = EncodedMessage(bias=False).double()
    inputs = _inputs(torch.float64)
    check_same(model, gnncompile.compile(model), list(inputs), **TOL[torch.float64])
    assert _encoded(_details(model, inputs)[0])


@pytest.mark.parametrize("case", ["wide", "read elsewhere", "written in place"])
def test_not_an_encoder_reads_as_computed(case):
    """Features wider than 32, an encoded output another op reads, or one written in place: the
    message reads the map's output as computed (per edge), still fused, still equal."""
    torch.manual_seed(0)
    D_ = 40 if case == "wide" else D
    model = EncodedMessage(D_=D_, leak=case == "read elsewhere", inplace=case == "written in place").double()
    inputs = _inputs(torch.float64, D_=D_)
    check_same(model, gnncompile.compile(model), list(inputs), **TOL[torch.float64])
    details, rep = _details(model, inputs)
    assert details and not _encoded(details), str(rep)


def test_no_edge_by_feature_tensor_in_forward():
    """The encoder's [E, F] output is never allocated in the compiled forward pass (eager's is):
    every op's output over the forward, seen by the profiler, is narrower than E x F."""
    torch.manual_seed(0)
    E_, F_ = 4000, 64
    model = gnn.GINEConv(torch.nn.Linear(F_, F_), edge_dim=8)
    x, ei, ea = torch.randn(300, F_), torch.randint(0, 300, (2, E_)), torch.randn(E_, 8)
    compiled = gnncompile.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, ei, ea), model(x, ei, ea), rtol=1e-4, atol=1e-5)

    def largest(fn):  # (the block cache compile() turns on hides reused blocks from the profiler)
        with memory.cache_suspended(), \
                torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            with torch.no_grad():
                fn(x, ei, ea)
        return max(e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0)

    wide = E_ * F_ * 4
    assert largest(model) >= wide  # eager allocates the encoder's output (the check can fail)
    assert largest(compiled) < wide


def test_encoder_bad_inputs():
    """The op refuses an encoder without its weight and bias, or of the wrong shapes."""
    from gnncompile.ops.structure import build
    s = build(torch.randint(0, N, (2, E)), N)
    x, a = torch.randn(N, F), torch.randn(E, D)
    wt, b = torch.randn(D, F), torch.randn(1, F)
    code, consts = P.encode(P.node("add", P.inp(0), P.inp(1)))
    op = torch.ops.gnncompile.message_reduce

    def call(ins, sides):
        return op(s.rowptr, s.col, s.perm, ins, sides, code, consts, F, "sum", [], [], None)

    good = call([x, a, wt, b], [P.COL, P.ENC, P.CONST, P.CONST])[0]
    ref = call([x, a @ wt + b], [P.COL, P.EDGE])[0]
    torch.testing.assert_close(good, ref, rtol=1e-5, atol=1e-5)
    for ins, sides in [([x, a], [P.COL, P.ENC]),
                       ([x, a, wt, b], [P.COL, P.ENC, P.ROW, P.CONST]),
                       ([x, a[:-1], wt, b], [P.COL, P.ENC, P.CONST, P.CONST]),
                       ([x, a, wt[:-1], b], [P.COL, P.ENC, P.CONST, P.CONST]),
                       ([x, a, torch.randn(D, 3), torch.randn(1, 3)], [P.COL, P.ENC, P.CONST, P.CONST]),
                       ([x, a, wt, torch.randn(1, F + 1)], [P.COL, P.ENC, P.CONST, P.CONST])]:
        with pytest.raises((ValueError, RuntimeError)):
            call(ins, sides)


def test_outside_choice_reads_the_map_as_computed():
    """settings choices['edge_encoder'] = 'outside' (GNNCOMPILE_EDGE_ENCODER=outside): the map is
    computed as written and read per edge."""
    torch.manual_seed(0)
    model = gnn.GINEConv(torch.nn.Linear(F, F), edge_dim=D).double()
    inputs = _inputs(torch.float64)
    compiled = gnncompile.compile(model, settings={"choices": {"edge_encoder": "outside", "programs": "always"}})
    check_same(model, compiled, list(inputs), **TOL[torch.float64])
    rep = gnncompile.explain(compiled, *inputs)
    details = [f.detail for f in rep.fused if f.kind == "message"]
    assert details == ["relu+add(x_j,edge)"], str(rep)
    with pytest.raises(ValueError, match="edge_encoder"):
        gnncompile.compile(model, settings={"choices": {"edge_encoder": "sideways"}})


def test_no_edge_by_feature_tensor_in_backward():
    """Nor in the compiled backward pass (the encoder's gradients come from
    message_encoder_grad, which accumulates them per chunk: ops/message.py), where eager's
    backward allocates the [E, F] gradient of the map's output: every allocation of the backward,
    seen by the profiler, is narrower than E x F; the gradients are eager's."""
    torch.manual_seed(0)
    E_, F_ = 4000, 64
    model = gnn.GINEConv(torch.nn.Linear(F_, F_), edge_dim=8)
    x, ei = torch.randn(300, F_), torch.randint(0, 300, (2, E_))
    ea = torch.randn(E_, 8, requires_grad=True)
    compiled = gnncompile.compile(model)

    def grads(fn):
        out = fn(x, ei, ea)
        g = torch.randn_like(out, generator=torch.Generator().manual_seed(1))
        params = [ea] + list(model.parameters())
        with memory.cache_suspended(), \
                torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            res = torch.autograd.grad(out, params, g)
        return res, max(e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0)

    ref, eager_peak = grads(model)
    got, compiled_peak = grads(compiled)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    wide = E_ * F_ * 4
    assert eager_peak >= wide  # eager allocates the [E, F] gradient (the check can fail)
    assert compiled_peak < wide
    from gnncompile.ops import message
    message.ENCODER_GRAD = "per_edge"  # the value gradient per edge: the old path allocates it
    try:
        torch._dynamo.reset()
        old, old_peak = grads(gnncompile.compile(model))
    finally:
        message.ENCODER_GRAD = "accumulate"
    for a, b in zip(old, ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert old_peak >= wide


def test_a_message_several_reductions_read_keeps_the_map_outside():
    """One encoded message under two reductions (each its own program): the map is read as
    computed once instead of being computed inside each program (PNA's case), still equal."""
    torch.manual_seed(0)
    model = EncodedMessage(aggr=["sum", "max"]).double()
    inputs = _inputs(torch.float64)
    check_same(model, gnncompile.compile(model), list(inputs), **TOL[torch.float64])
    details, rep = _details(model, inputs)
    assert len(details) == 2 and not _encoded(details), str(rep)
