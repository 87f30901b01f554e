"""The semantics guard of the passes (gnncompile/passes/semantics.py): a rewrite never changes
what a model computes.

* every argument of every operation the passes read is listed with its handling (modelled,
  or the one value assumed), checked against torch's own schemas (enumeration), and a
  message using any other value computes what eager computes (parametrised over the list);
* in-place writes to a message, a gathered tensor or its source before the scatter, through
  views or not, keep the chain as written;
* rounding divisions are not true divisions.
Each case compares compiled and eager outputs and input gradients.
"""
from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.nn.functional as Fn

import gnncompile
from gnncompile.passes import semantics as S
from shared import _fresh_dynamo  # noqa: F401  (autouse)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.nn import MessagePassing

N, E, F = 12, 40, 4


def _graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(N * N, generator=g)[:E]  # no duplicate edges: max has no ties
    ei = torch.stack([pick // N, pick % N])
    x = torch.randn(N, F, generator=g, dtype=torch.float64) * 3
    w = torch.rand(E, generator=g, dtype=torch.float64) + 0.5
    return x, ei, w


class Msg(MessagePassing):
    """A layer whose message is ``fn(x_i, x_j, w)`` (w: one weight per edge, [E, 1])."""

    def __init__(self, fn, aggr="sum"):
        super().__init__(aggr=aggr)
        self.fn = fn
        self.lin = torch.nn.Linear(F, F, dtype=torch.float64)

    def forward(self, x, edge_index, w):
        return self.propagate(edge_index, x=self.lin(x), w=w.view(-1, 1))

    def message(self, x_i, x_j, w):
        return self.fn(x_i, x_j, w)


def _compare(fn, aggr="sum", backward=True):
    """compiled == eager (outputs; input and parameter gradients when eager's backward runs);
    returns the explain report. ``backward=False``: everything without autograd (messages that
    eager itself cannot differentiate: ``out=`` arguments)."""
    torch.manual_seed(0)
    model = Msg(fn, aggr)
    x, ei, w = _graph()
    x.requires_grad_(backward)
    w.requires_grad_(backward)
    with torch.set_grad_enabled(backward):
        out_e = model(x, ei, w)
        out_c = gnncompile.compile(model)(x, ei, w)
    torch.testing.assert_close(out_c, out_e, equal_nan=True)
    if backward:
        params = [x, w] + list(model.parameters())
        g = torch.randn_like(out_e)
        try:
            ge = torch.autograd.grad(out_e, params, g, allow_unused=True)
        except RuntimeError as e:  # eager's own backward refuses (an in-place write it saved)
            assert "inplace" in str(e)
            return gnncompile.explain(model, x, ei, w)
        gc = torch.autograd.grad(out_c, params, g, allow_unused=True)
        for a, b in zip(gc, ge):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, equal_nan=True)
    with torch.set_grad_enabled(backward):
        return gnncompile.explain(model, x, ei, w)


def _kept(rep) -> bool:
    """The message is computed as written: kept by the guard, or not read as a program at all."""
    text = str(rep)
    return rep.num_fused == 0 or "kept as written" in text or "written in place" in text


# ----------------------------------------------------------------------------- rounding division
@pytest.mark.parametrize("aggr", ["sum", "max"])
@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_rounding_division_is_not_a_true_division(mode, aggr):
    rep = _compare(lambda xi, xj, w: torch.div(xj, xi, rounding_mode=mode) + xj, aggr)
    assert "rounding_mode" in str(rep), str(rep)


# ----------------------------------------------------------------------------- in-place writes
def _add_(xi, xj, w):
    m = xj * 2
    m.add_(xi)
    return m


def _relu_result_unused(xi, xj, w):
    m = xj - xi
    Fn.relu(m, inplace=True)
    return m * 2


def _mul_after_weighting(xi, xj, w):
    m = xj * w
    m.mul_(2)
    return m


def _sigmoid_(xi, xj, w):
    m = torch.tanh(xj)
    m.sigmoid_()
    return m


def _through_a_view(xi, xj, w):
    m = xj * 1
    m.view(-1)[::3].zero_()
    return m + xi


def _setitem(xi, xj, w):
    m = xj + xi
    m[:, 0] = 5.0
    return m


def _iadd(xi, xj, w):
    m = xj * w
    m += xi
    return m


def _out_argument(xi, xj, w):
    m = xj * w
    torch.add(m, xi, out=m)
    return m


def _leaky_inplace_then_read(xi, xj, w):
    m = xj - xi
    h = Fn.leaky_relu(m, 0.3, inplace=True)
    return h + m


def _relu_result_used(xi, xj, w):
    return Fn.relu(xj - xi, inplace=True) * 3


# name -> (message, kept as written, differentiable: eager's own backward runs)
INPLACE = {
    "add_": (_add_, True, True), "relu-inplace-unused": (_relu_result_unused, True, True),
    "mul_-weighted": (_mul_after_weighting, True, True),
    # sigmoid_ overwrites what tanh's backward needs: eager's backward raises, and so does
    # AOTAutograd's trace of it; compared without autograd
    "sigmoid_": (_sigmoid_, True, False),
    "through-a-view": (_through_a_view, True, True), "setitem": (_setitem, True, True), "iadd": (_iadd, True, True),
    "out=": (_out_argument, True, False), "leaky-inplace-then-read": (_leaky_inplace_then_read, True, True),
    # the activation's return value is what is reduced: modelled, fused as a message program
    "relu-inplace-used": (_relu_result_used, False, True),
}


@pytest.mark.parametrize("aggr", ["sum", "max"])
@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_writes_keep_the_message_as_written(name, aggr):
    fn, kept, grad = INPLACE[name]
    rep = _compare(fn, aggr, backward=grad)
    if kept:
        assert _kept(rep), str(rep)
    else:
        assert rep.num_fused == 1 and not rep.unfused, str(rep)


def _gathered_rows(h, ei):
    return h.index_select(0, ei[0])


def test_source_written_after_the_gather():
    def f(x, ei):
        h = x * 1
        msg = _gathered_rows(h, ei)
        h.relu_()
        return torch.zeros(N, F, dtype=x.dtype).index_add_(0, ei[1], msg) + h

    x, ei, _ = _graph()
    torch.testing.assert_close(gnncompile.compile(f)(x, ei), f(x, ei))


def test_message_written_between_two_scatters():
    def f(x, ei):
        m = x.index_select(0, ei[0]) * 2
        a = torch.zeros(N, F, dtype=x.dtype).index_add_(0, ei[1], m)
        m.add_(5)
        b = torch.zeros(N, F, dtype=x.dtype).index_add_(0, ei[1], m)
        return a + 10 * b

    x, ei, _ = _graph()
    torch.testing.assert_close(gnncompile.compile(f)(x, ei), f(x, ei))


def test_index_written_in_place_is_not_fused():
    def f(x, ei):
        msg = x.index_select(0, ei[0])
        ei[1].clamp_(max=N - 2)
        return torch.zeros(N, F, dtype=x.dtype).index_add_(0, ei[1], msg)

    x, ei, _ = _graph()
    out_e = f(x, ei.clone())
    rep = gnncompile.explain(f, x, ei.clone())
    out_c = gnncompile.compile(f)(x, ei.clone())
    torch.testing.assert_close(out_c, out_e)
    assert rep.num_fused == 0 and "written in place" in str(rep), str(rep)


def test_writes_analysis():
    def f(x, j):
        a = x * 1
        v = a.view(-1)
        b = a + 1
        v.add_(1)  # writes a through its view
        c = b.clone()
        c.mul_(2)
        return a, b, c

    gms = []
    torch.compile(f, backend=lambda gm, ex: gms.append(gm) or gm.forward)(torch.ones(3, 2), None)
    g = gms[0].graph
    w = S.Writes(g)
    nodes = {n.name: n for n in g.nodes}
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    assert [n.target for n in w.writes_of(a)] == ["add_"]
    assert w.writes_of(b) == []
    assert [n.target for n in w.writes_of(c)] == ["mul_"]
    assert w.first_write(a, w.pos[a], w.pos[b]) is None  # b reads a before the write
    assert w.first_write(a, w.pos[b], len(w.pos)) is not None


# ----------------------------------------------------------------------------- signatures
def _torch_parameters(name: str):
    """Every parameter name torch gives operation ``name`` (tensor overloads of the aten schema,
    the torch.nn.functional signature), ``self`` spelled ``input``."""
    names = set()
    try:
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{name}")
    except RuntimeError:
        schemas = []
    for sch in schemas:
        args = sch.arguments
        if args and (args[0].name in ("self", "input", "tensors") or "Tensor" in str(args[0].type)):
            names |= {"input" if a.name == "self" else a.name for a in args}
    fn = getattr(Fn, name, None)
    if callable(fn):
        try:
            names |= set(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            pass
    return names


READ_BY_PASSES = S.MESSAGE_OPS + ("index_select", "scatter_add", "scatter_reduce", "index_add", "linear",
                                  "cat", "detach")


@pytest.mark.parametrize("name", READ_BY_PASSES)
def test_every_argument_torch_takes_is_listed(name):
    """Enumeration: every argument an operation the passes read can take is either modelled or
    refused (listed with the one value the passes assume); none is silently ignored."""
    if name in S.VALUE_PRESERVING:  # 'to': kept only when it changes neither dtype nor device
        return
    listed = {p for p, _ in S.SIGNATURES[name]}
    missing = _torch_parameters(name) - listed
    assert not missing, f"{name}: torch takes {sorted(missing)}, not listed in SIGNATURES"


def _assumed(name):
    return [(p, rule) for p, rule in S.SIGNATURES[name]
            if rule not in (S.OPERAND, S.PARAM, S.ANY, S.INPLACE, S.VARARGS)]


def test_the_table_lists_each_handling():
    table = {name: _assumed(name) for name in S.MESSAGE_OPS if name not in S.VALUE_PRESERVING}
    assert table["div"] == [("rounding_mode", None), ("out", None)]
    assert ("alpha", 1) in table["add"] and ("approximate", "none") in table["gelu"]


# A message built with every non-default value of every argument the builder does not model
# (it must be kept as written) or models as a parameter (fused, and equal).
def _o(xj):
    return torch.empty_like(xj)


NON_DEFAULT = {
    ("add", "alpha"): lambda xi, xj, w: torch.add(xj, xi, alpha=2.5),
    ("add", "out"): lambda xi, xj, w: torch.add(xj, xi, out=_o(xj)),
    ("sub", "alpha"): lambda xi, xj, w: torch.sub(xj, xi, alpha=-1.5),
    ("sub", "out"): lambda xi, xj, w: torch.sub(xj, xi, out=_o(xj)),
    ("rsub", "alpha"): lambda xi, xj, w: torch.rsub(xj, xi, alpha=3),
    ("mul", "out"): lambda xi, xj, w: torch.mul(xj, xi, out=_o(xj)),
    ("div", "rounding_mode"): lambda xi, xj, w: torch.div(xj, w, rounding_mode="floor"),
    ("div", "out"): lambda xi, xj, w: torch.div(xj, w, out=_o(xj)),
    ("pow", "out"): lambda xi, xj, w: torch.pow(xj, 2, out=_o(xj)),
    ("relu", "inplace"): lambda xi, xj, w: Fn.relu(xj - xi, inplace=True),
    ("sigmoid", "out"): lambda xi, xj, w: torch.sigmoid(xj, out=_o(xj)),
    ("tanh", "out"): lambda xi, xj, w: torch.tanh(xj, out=_o(xj)),
    ("exp", "out"): lambda xi, xj, w: torch.exp(xj, out=_o(xj)),
    ("log", "out"): lambda xi, xj, w: torch.log(w.expand_as(xj), out=_o(xj)) * xj,
    ("sqrt", "out"): lambda xi, xj, w: torch.sqrt(w.expand_as(xj), out=_o(xj)) * xj,
    ("neg", "out"): lambda xi, xj, w: torch.neg(xj, out=_o(xj)),
    ("abs", "out"): lambda xi, xj, w: torch.abs(xj, out=_o(xj)),
    ("leaky_relu", "negative_slope"): lambda xi, xj, w: Fn.leaky_relu(xj, 0.3),
    ("leaky_relu", "inplace"): lambda xi, xj, w: Fn.leaky_relu(xj + xi, 0.3, inplace=True),
    ("elu", "alpha"): lambda xi, xj, w: Fn.elu(xj, alpha=0.7),
    ("elu", "inplace"): lambda xi, xj, w: Fn.elu(xj + xi, inplace=True),
    ("softplus", "beta"): lambda xi, xj, w: Fn.softplus(xj, beta=2.0),
    ("softplus", "threshold"): lambda xi, xj, w: Fn.softplus(xj, threshold=0.5),
    ("gelu", "approximate"): lambda xi, xj, w: Fn.gelu(xj, approximate="tanh"),
    ("clamp", "min"): lambda xi, xj, w: torch.clamp(xj, min=-0.5),
    ("clamp", "max"): lambda xi, xj, w: torch.clamp(xj, max=0.5),
    ("clamp", "out"): lambda xi, xj, w: torch.clamp(xj, -1, 1, out=_o(xj)),
    ("leaky_relu", "out"): lambda xi, xj, w: torch._C._nn.leaky_relu(xj, 0.2, out=_o(xj)),
    ("elu", "out"): lambda xi, xj, w: torch._C._nn.elu(xj, 1.0, 1, 1, out=_o(xj)),
    ("elu", "scale"): lambda xi, xj, w: torch._C._nn.elu(xj, 1.0, 2.0, 1.0),
    ("elu", "input_scale"): lambda xi, xj, w: torch._C._nn.elu(xj, 1.0, 1.0, 0.5),
    ("softplus", "out"): lambda xi, xj, w: torch._C._nn.softplus(xj, 1, 20, out=_o(xj)),
    ("gelu", "out"): lambda xi, xj, w: torch._C._nn.gelu(xj, out=_o(xj)),
    ("clip", "out"): lambda xi, xj, w: torch.clip(xj, -1, 1, out=_o(xj)),
    ("negative", "out"): lambda xi, xj, w: torch.negative(xj, out=_o(xj)),
    ("clamp_min", "out"): lambda xi, xj, w: torch.clamp_min(xj, 0.1, out=_o(xj)),
    ("clamp_max", "out"): lambda xi, xj, w: torch.clamp_max(xj, 0.1, out=_o(xj)),
    ("clamp_min", "min"): lambda xi, xj, w: xj.clamp_min(0.1),
    ("clamp_max", "max"): lambda xi, xj, w: xj.clamp_max(0.1),
    ("stack", "out"): lambda xi, xj, w: torch.stack([xj], 1, out=torch.empty(xj.shape[0], 1, F,
                                                                           dtype=xj.dtype)).view(-1, F) * w,
    ("to", "dtype"): lambda xi, xj, w: (xj.to(torch.float32) * 2).to(torch.float64) + xi,
    ("to", "copy"): lambda xi, xj, w: xj.to(torch.float64, copy=True) * w,
}


@pytest.mark.parametrize("case", list(NON_DEFAULT), ids=lambda c: f"{c[0]}-{c[1]}")
def test_non_default_arguments_compute_what_eager_computes(case):
    name, param = case
    rule = dict(S.SIGNATURES.get(name, ())).get(param, S.ANY)
    # out= tensors cannot take part in autograd, in eager as anywhere: compared without it
    rep = _compare(NON_DEFAULT[case], "sum", backward=param != "out")
    if rule not in (S.OPERAND, S.PARAM, S.ANY, S.INPLACE, S.VARARGS):  # not modelled: kept as written
        assert _kept(rep), str(rep)


# arguments in torch's schemas that Python cannot pass (torch.rsub, torch.relu, torch.clone take
# no out=)
UNREACHABLE = {("rsub", "out"), ("relu", "out"), ("clone", "out")}


def test_non_default_cases_cover_every_assumed_value():
    covered = set(NON_DEFAULT) | UNREACHABLE
    for name in S.MESSAGE_OPS:
        if name in S.VALUE_PRESERVING or name in ("view", "flatten"):  # view's dtype, flatten's names: ANY / named dims
            continue
        for p, _ in _assumed(name):
            assert (name, p) in covered, (name, p)


# ----------------------------------------------------------------------------- special values
def _special(x):
    """x with NaN, +-inf, +-0 and a few exact values written into its first rows."""
    x = x.detach().clone()
    vals = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, -1.0, 1.0, 0.5],
                        dtype=x.dtype)
    x.view(-1)[: vals.numel() * 3: 3] = vals
    return x


SPECIAL = {
    "relu": lambda xi, xj, w: torch.relu(xj) * w,
    "elu": lambda xi, xj, w: Fn.elu(xj) * w,
    "clamp": lambda xi, xj, w: torch.clamp(xj, -0.5, 0.5) * w,
    "pow-sqrt": lambda xi, xj, w: xj ** 0.5 + xj ** 2 + xj ** -1,
    "pow-tensor": lambda xi, xj, w: torch.pow(w, xj) + torch.pow(xj.abs(), w),
    "times-zero": lambda xi, xj, w: xj * 0.0 + xi,
    "zero-divided": lambda xi, xj, w: 0.0 / xj + xi,
    "log-div": lambda xi, xj, w: torch.log(xj.abs()) / (xi + 2),
}


@pytest.mark.parametrize("name", list(SPECIAL))
def test_special_values_as_eager(name):
    """NaN, infinities and signed zeros in the features and an infinite upstream gradient give
    the values and gradients eager gives (torch's backward selects where it selects: relu and
    clamp give 0 for an infinite gradient where their input is cut, elu and relu pass a NaN
    input's gradient)."""
    torch.manual_seed(0)
    model = Msg(SPECIAL[name], "sum")
    x, ei, w = _graph()
    x = _special(x).requires_grad_()
    w.requires_grad_()
    with torch.no_grad():  # the features the messages see, special values included
        model.lin.weight.copy_(torch.eye(F, dtype=torch.float64))
        model.lin.bias.zero_()
    out_e = model(x, ei, w)
    out_c = gnncompile.compile(model)(x, ei, w)
    torch.testing.assert_close(out_c, out_e, equal_nan=True)
    g = torch.randn_like(out_e)
    g[0, 0], g[1, 1] = float("inf"), -float("inf")
    ge = torch.autograd.grad(out_e, [x, w], g, allow_unused=True)
    gc = torch.autograd.grad(out_c, [x, w], g, allow_unused=True)
    for a, b in zip(gc, ge):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, equal_nan=True)


# ----------------------------------------------------------------------------- precision
@pytest.mark.parametrize("layer", ["PointNetConv", "PointTransformerConv", "EdgeConv"])
def test_differences_of_gathered_rows_keep_their_precision(layer):
    """``linear(pos_j - pos_i)`` is not rewritten into ``linear(pos)_j - linear(pos)_i`` by
    default: with coordinates sharing a large offset (5e5, as in UTM / LiDAR point clouds) that
    cancels every digit of the difference in float32. Compiled float32 stays as close to a
    float64 reference as eager float32; ``reassociate=True`` is the documented opt-in."""
    import torch_geometric.nn as gnn

    torch.manual_seed(0)
    n, e = 200, 1600
    pos = torch.randn(n, 3) * 5 + 5e5
    x = torch.randn(n, 8)
    ei = torch.randint(0, n, (2, e))
    make = {"PointNetConv": lambda: gnn.PointNetConv(local_nn=torch.nn.Linear(8 + 3, 16)),
            "PointTransformerConv": lambda: gnn.PointTransformerConv(8, 16),
            "EdgeConv": lambda: gnn.EdgeConv(torch.nn.Linear(6, 16), aggr="max")}[layer]
    args = (pos,) if layer == "EdgeConv" else (x, pos)
    model = make()
    ref = make().double()
    ref.load_state_dict(model.state_dict())
    want = ref(*(a.double() for a in args), ei)
    err_eager = (model(*args, ei).double() - want).abs().max().item()
    err = (gnncompile.compile(model)(*args, ei).double() - want).abs().max().item()
    assert err <= 4 * err_eager + 1e-6, (err, err_eager)
    if layer == "EdgeConv":  # its output holds W x_i itself, as large as the offset: no contrast
        return
    torch._dynamo.reset()
    err_fast = (gnncompile.compile(model, reassociate=True)(*args, ei).double() - want).abs().max().item()
    assert err_fast > 100 * err_eager  # what the opt-in trades (here: a cancellation)


def test_docs_page_is_the_table():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "semantics.md").read_text()
    assert page.endswith(S.table()), "docs/semantics.md is stale: regenerate its table from semantics.table()"
