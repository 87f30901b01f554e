"""Regression tests: inputs on which the compiled model once computed something else than
eager, or failed where eager runs (each case: compiled == eager, forward and backward).

* an int32 ``edge_index`` through GATConv(edge_dim) (self loops' mean fill of edge features);
* a message with more learnable inputs than one backward pass of the kernels takes (17-24);
* NaN and infinities: max / min rows holding a NaN or a tie (EdgeConv, SAGE), an infinite
  upstream gradient at a node without in-edges, a NaN dropped by the compiled dropout.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import gnncompile
from shared import _fresh_dynamo  # noqa: F401  (autouse)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn
    from torch_geometric.nn import MessagePassing

NAN, INF = float("nan"), float("inf")


def _same(model, inputs, grad=None, rtol=1e-5, atol=1e-6):
    """compiled == eager: outputs, and input / parameter gradients for ``grad`` (random when
    None), NaN where eager has NaN."""
    params = [p for p in model.parameters() if p.requires_grad]
    floats = [a for a in inputs if torch.is_tensor(a) and a.is_floating_point() and a.requires_grad]
    out_e = model(*inputs)
    out_c = gnncompile.compile(model)(*inputs)
    torch.testing.assert_close(out_c, out_e, rtol=rtol, atol=atol, equal_nan=True)
    g = torch.randn_like(out_e) if grad is None else grad
    ge = torch.autograd.grad(out_e, params + floats, g, allow_unused=True)
    gc = torch.autograd.grad(out_c, params + floats, g, allow_unused=True)
    for a, b in zip(gc, ge):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True)


def test_int32_edge_index_with_edge_features():
    """GATConv(edge_dim) on an int32 edge_index: the mean fill of the self loops' edge features
    gathers by int64 positions into an int32 scatter (once: 'pair_csr: dst and src must be ...
    of one shape and dtype'). The reference is eager on the int64 edge_index: eager on the int32
    one gets the edge features' gradient wrong in torch 2.13 (scatter_add_'s backward with an
    int32 index), which the compiled model does not copy."""
    torch.manual_seed(0)
    model = gnn.GATConv(8, 4, heads=2, edge_dim=3)
    x = torch.randn(10, 8, requires_grad=True)
    ei = torch.randint(0, 10, (2, 30))
    ea = torch.randn(30, 3, requires_grad=True)
    g = torch.randn(10, 8)
    out_e = model(x, ei, ea)
    out_c = gnncompile.compile(model)(x, ei.int(), ea)
    torch.testing.assert_close(out_c, out_e)
    for a, b in zip(torch.autograd.grad(out_c, [x, ea], g), torch.autograd.grad(out_e, [x, ea], g)):
        torch.testing.assert_close(a, b)


class ManyInputs(MessagePassing):
    def __init__(self, k: int, f: int = 4):
        super().__init__(aggr="sum")
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(f)) for _ in range(k)])

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=x)

    def message(self, x_i, x_j):
        m = x_j
        for p in self.ps:
            m = m * p + x_i
        return m


@pytest.mark.parametrize("k", [15, 17, 24])
def test_message_with_many_learnable_inputs(k):
    """k parameters + x_i + x_j: more results than one message_sum_multi pass takes (16) and
    more registers than one batched derivative fits: the backward splits them (once:
    'message_sum_multi: 1 to 16 results, got 17')."""
    torch.manual_seed(0)
    model = ManyInputs(k)
    x = torch.randn(10, 4, requires_grad=True)
    ei = torch.randint(0, 10, (2, 40))
    _same(model, [x, ei], rtol=1e-4, atol=1e-5)
    rep = gnncompile.explain(model, x, ei)
    assert rep.num_fused == 1, str(rep)


@pytest.mark.parametrize("aggr", ["max", "min"])
def test_nan_in_a_max_row_reaches_every_edge_of_the_row(aggr):
    """EdgeConv: torch's scatter_reduce gives every message of a row whose extreme is NaN a NaN
    gradient; the fused op once routed the gradient to the NaN edge alone."""
    torch.manual_seed(0)
    model = gnn.EdgeConv(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)),
                         aggr=aggr)
    x = torch.randn(12, 2)
    x[2, 0] = NAN
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [7, 7, 7, 1, 1, 8, 8]])
    _same(model, [x.requires_grad_(), ei])


def test_max_ties_from_equal_rows():
    """Nodes 0 and 1 (and 2 and 3) have equal features: every maximum into node 5 (4) ties
    between two sources, and eager splits its gradient between them (the fused op once gave it
    all to the first)."""
    torch.manual_seed(0)
    model = gnn.SAGEConv(3, 4, aggr="max")
    x = torch.randn(6, 3)
    x[1], x[3] = x[0], x[2]
    ei = torch.tensor([[0, 1, 1, 2, 3, 3], [5, 5, 5, 4, 4, 4]])
    _same(model, [x.requires_grad_(), ei])


@pytest.mark.parametrize("layer", ["GCN", "SAGE-mean", "SAGE-max", "GINE", "PNA-linear", "GAT"])
def test_infinite_gradient_at_a_node_without_in_edges(layer):
    """Node 9 has no in-edge: an infinite upstream gradient there adds nothing to any input,
    in eager as in the compiled model (once NaN: inf * degree 0)."""
    torch.manual_seed(0)
    N, F = 10, 4
    ei = torch.tensor([[0, 1, 2, 3, 9, 9, 4], [1, 2, 3, 0, 0, 4, 5]])
    x = torch.randn(N, F, requires_grad=True)
    inputs = [x, ei]
    if layer == "GCN":
        model = gnn.GCNConv(F, F, add_self_loops=False)
    elif layer == "SAGE-mean":
        model = gnn.SAGEConv(F, F)
    elif layer == "SAGE-max":
        model = gnn.SAGEConv(F, F, aggr="max")
    elif layer == "GINE":
        model = gnn.GINEConv(torch.nn.Linear(F, F), edge_dim=3)
        inputs.append(torch.randn(ei.shape[1], 3, requires_grad=True))
    elif layer == "GAT":
        model = gnn.GATConv(F, F, add_self_loops=False)
    else:
        class Linear(MessagePassing):  # x_i + x_j: a message whose gradient is per destination row
            def __init__(self):
                super().__init__(aggr="sum")
                self.lin = torch.nn.Linear(F, F)

            def forward(self, x, edge_index):
                return self.propagate(edge_index, x=self.lin(x))

            def message(self, x_i, x_j):
                return x_i + 2 * x_j

        model = Linear()
    g = torch.randn(N, F)
    g[9] = INF
    g[6, 1] = -INF  # node 6 has neither in- nor out-edges
    _same(model, inputs, grad=g)


def test_compiled_dropout_keeps_nan():
    """A dropped NaN or infinity is NaN in torch (x * mask); the compiled dropout once wrote 0."""
    x = torch.tensor([NAN, INF, -INF, 1.0] * 64)
    seed = torch.tensor(3)
    out = torch.ops.gnncompile.dropout(x, 0.5, seed)
    kept = torch.ops.gnncompile.dropout(torch.ones_like(x), 0.5, seed) != 0  # the same mask
    special = ~torch.isfinite(x)
    assert bool((~kept & special).any()) and bool(torch.isnan(out[~kept & special]).all())
    assert bool((out[~kept & ~special] == 0).all()) and bool((out[kept & ~special] == 2).all())
    assert torch.equal(out[kept & special].isinf(), x[kept & special].isinf())
    from gnncompile.ops import reference

    torch.testing.assert_close(reference.dropout(x, 0.5, seed), out, equal_nan=True)


@pytest.mark.parametrize("aggr", ["max", "min"])
def test_max_over_relu_outputs(aggr):
    """A 2-layer GraphSAGE with max / min aggregation: the second layer reduces ReLU outputs, so
    most maxima tie at 0 between different sources (torch splits them, and counts PyG's zeros
    buffer there). The fused op drops the gradient of an extreme of 0 (relu_input: x's relu
    drops whatever reaches a 0 of x), and the parameter and input gradients equal eager's."""
    from torch_geometric.nn import models

    torch.manual_seed(0)
    model = models.GraphSAGE(6, 8, 2, 4, aggr=aggr)
    x = torch.randn(30, 6, requires_grad=True)
    ei = torch.randint(0, 30, (2, 150))
    _same(model, [x, ei])
    rep = gnncompile.explain(model, x, ei)
    assert rep.num_fused >= 2 and f"spmm[{aggr}, relu input]" in str(rep), str(rep)


# ----------------------------------------------------------------------------- found by fuzzing
class _Message(MessagePassing):
    """A layer whose message is ``fn(x_i, x_j, w)`` (float64, no weights of its own)."""

    def __init__(self, fn, aggr):
        super().__init__(aggr=aggr)
        self.fn = fn

    def forward(self, x, edge_index, w):
        return self.propagate(edge_index, x=x, w=w)

    def message(self, x_i, x_j, w):
        return self.fn(x_i, x_j, w)


def _small_graph():
    torch.manual_seed(0)
    x = torch.randn(6, 4, dtype=torch.float64)
    ei = torch.tensor([[1, 2, 3, 0, 1, 4, 5, 3], [0, 0, 0, 1, 2, 2, 4, 4]])
    w = torch.rand(ei.shape[1], 1, dtype=torch.float64) + 0.25
    return x, ei, w


def test_relu_keeps_a_negative_zero():
    """torch.relu(-0.0) is -0.0 (so is clamp_min(-0.0, 0)): a division by the ReLU of a signed
    zero gives -inf, and a sum of it with +inf is NaN in both (fuzzing seed 1411)."""
    x, ei, w = _small_graph()
    w[1, 0], w[0, 0] = -0.0, 0.0  # edges 0 and 1 reach node 0: 1 / relu(w) = +inf and -inf
    model = _Message(lambda xi, xj, w: xj.abs() / torch.relu(w) + xi.abs() / w.clamp_min(0.0), "sum")
    _same(model, [x.requires_grad_(), ei, w])
    out = gnncompile.compile(model)(x, ei, w)
    assert torch.isnan(out[0]).all()


def test_a_value_shared_with_a_kept_operation_gets_one_gradient():
    """``t0 = exp(-x_i)`` feeds both an operation the guard keeps as written (a sub with
    alpha=-0.5, computed by torch) and the fused part of a min message. Eager sums t0's gradient
    from both readers before multiplying by exp's derivative (inf at x = -inf: inf); recomputed
    in the kernel, the fused share 0 times inf would be NaN. The kernel reads t0 as computed
    (fuzzing seed 1197)."""
    def fn(xi, xj, w):
        t0 = torch.exp(-xi)
        return torch.sub(t0, t0, alpha=-0.5) - t0.clamp_min(0.0).clamp_max(0.5) + w

    x, ei, w = _small_graph()
    x[0, 0] = -INF
    model = _Message(fn, "min")
    _same(model, [x.requires_grad_(), ei, w], grad=torch.ones(6, 4, dtype=torch.float64))
    xs = x.detach().clone().requires_grad_()
    gx, = torch.autograd.grad(gnncompile.compile(model)(xs, ei, w), xs, torch.ones(6, 4, dtype=torch.float64))
    assert gx[0, 0] == -INF
    assert "read as computed" in str(gnncompile.explain(model, x, ei, w))


@pytest.mark.parametrize("aggr", ["max", "min"])
def test_relu_message_with_an_infinite_derivative_below(aggr):
    """``relu(pow(|w| + 0.5, x_j))`` with x_j = -inf: the message is 0, relu's backward selects 0
    for it, and pow's derivative at -inf times that 0 is NaN in eager, for a winner and a loser
    alike. The fused max / min keeps that NaN rather than dropping the zeros' gradient (fuzzing
    seed 1463)."""
    x, ei, w = _small_graph()
    x[1], x[4], x[3, 2], x[2, 1] = -INF, -INF, INF, NAN
    w[0], w[4], w[5] = 1.0, 1.0, 0.75  # 1.5 ** -inf = 0: all of row 0's minima, row 2's maxima
    model = _Message(lambda xi, xj, w: torch.relu(torch.pow(w.abs() + 0.5, xj)), aggr)
    _same(model, [x.requires_grad_(), ei, w.requires_grad_()])
