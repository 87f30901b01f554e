"""EdgeConv, DynamicEdgeConv and EdgeCNN compiled == eager. A max over their MLP's output (messages
computed beforehand) takes its gradient from gnncompile::extreme_edges_backward, torch's formula in
one pass per row: tied messages (duplicate edges), rows without edges, float32 and float64; next
to it the programs that keep the general max / min backward (an MLP ending in ReLU: zero ties; a
Linear alone, min); explain() names the op where it runs."""
from __future__ import annotations

import warnings

import pytest
import torch

import gnncompile
from shared import _fresh_dynamo, check_same  # noqa: F401  (_fresh_dynamo: autouse)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric.nn as gnn
    import torch_geometric.typing
    from torch_geometric.nn import models

N, E, F = 30, 150, 8
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-9, atol=1e-10)}
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])


def _graph(seed=0, duplicates=True):
    """Random edges into the first N - 4 nodes (the last four receive none), with every tenth edge
    repeated (duplicate edges: tied messages)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, N, (E,), generator=g)
    dst = torch.randint(0, N - 4, (E,), generator=g)
    ei = torch.stack([src, dst])
    if duplicates:
        ei = torch.cat([ei, ei[:, ::10]], 1)
    return ei


class KnnDynamicEdgeConv(gnn.DynamicEdgeConv):
    """DynamicEdgeConv with its k-nearest-neighbour graph computed by torch (cdist, topk): PyG's own
    calls pyg-lib's knn, which is not installed here. The messages, EdgeConv's, are its own."""

    def __init__(self, nn, k):
        old = torch_geometric.typing.WITH_KNN
        torch_geometric.typing.WITH_KNN = True
        try:
            super().__init__(nn, k)
        finally:
            torch_geometric.typing.WITH_KNN = old

    def forward(self, x):
        with torch.no_grad():
            nbr = torch.cdist(x, x).topk(self.k, largest=False).indices  # [N, k], each node itself included
        ei = torch.stack([nbr.reshape(-1), torch.arange(x.size(0), device=x.device).repeat_interleave(self.k)])
        return self.propagate(ei, x=(x, x))


def _mlp(last_relu=False):
    layers = [torch.nn.Linear(2 * F, F), torch.nn.ReLU(), torch.nn.Linear(F, F)]
    return torch.nn.Sequential(*(layers + [torch.nn.ReLU()] if last_relu else layers))


CASES = {
    "EdgeConv-ties": (lambda: gnn.EdgeConv(_mlp(), aggr="max"), True),
    # relu(edge): a program of its own, the general backward (its zero ties: nothing routed)
    "EdgeConv-relu-zero-ties": (lambda: gnn.EdgeConv(_mlp(last_relu=True), aggr="max"), True),
    # a Linear alone: a message program (x_i, the edge term, the bias), the general max / min backward
    "EdgeConv-linear-min-ties": (lambda: gnn.EdgeConv(torch.nn.Linear(2 * F, F), aggr="min"), True),
    "EdgeCNN": (lambda: models.EdgeCNN(F, 16, 2, 5), True),
    "DynamicEdgeConv": (lambda: KnnDynamicEdgeConv(_mlp(), k=4), False),
}


@DTYPES
@pytest.mark.parametrize("name", list(CASES))
def test_compiled_equals_eager(name, dtype):
    factory, takes_edges = CASES[name]
    torch.manual_seed(0)
    model = factory().to(dtype)
    x = torch.randn(N, F, dtype=dtype, generator=torch.Generator().manual_seed(1)).requires_grad_()
    inputs = [x, _graph()] if takes_edges else [x]
    check_same(model, gnncompile.compile(model), inputs, **TOL[dtype])


def test_explain_names_the_one_pass_backward():
    torch.manual_seed(0)
    model = models.EdgeCNN(F, 16, 2, 5)
    rep = gnncompile.explain(model, torch.randn(N, F), _graph())
    segments = [f for f in rep.fused if f.kind == "segment"]
    assert len(segments) == 2, str(rep)
    assert all("extreme_edges_backward" in f.note for f in segments), str(rep)
    # a mean over the same messages has no such backward, and explain does not claim one
    rep = gnncompile.explain(gnn.EdgeConv(_mlp(), aggr="mean"), torch.randn(N, F), _graph())
    assert not any("extreme_edges_backward" in f.note for f in rep.fused), str(rep)


def test_backward_runs_the_op():
    """The compiled EdgeConv's backward calls the one-pass op (not the fast form's [M, F] passes)."""
    torch.manual_seed(0)
    model = gnn.EdgeConv(_mlp(), aggr="max")
    x = torch.randn(N, F, requires_grad=True)
    out = gnncompile.compile(model)(x, _graph())
    with torch.profiler.profile() as prof:
        out.sum().backward()
    names = {e.name for e in prof.events()}
    assert "gnncompile::extreme_edges_backward" in names
    assert "gnncompile::message_arg_formula" not in names
