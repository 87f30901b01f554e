"""gnncompile::loop_attr: the per-edge attributes after ``remaining_self_loops`` where they need a
gradient. Forward and gradient equal PyG's ``add_remaining_self_loops``, also where a node carries
several self loops (PyG's indexed assignment hands node v's loop gradient to every loop v -> v; a
plain gather gave it to the last one only: GCNConv's edge_weight gradient was off by up to 2.35)."""
import copy

import pytest
import torch
from torch_geometric.utils import add_remaining_self_loops
from torch_geometric.utils.loop import compute_loop_attr

import gnncompile  # noqa: F401  (registers the ops)
from gnncompile.ops import loops


def _graph(seed, n=12, e=40, extra_loops=((2, 2), (2, 2), (2, 2), (5, 5), (0, 0))):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    if extra_loops:
        ei = torch.cat([ei, torch.tensor(list(zip(*extra_loops)))], dim=1)
    return ei[:, torch.randperm(ei.size(1), generator=g)], n


def _ours(ei, a, fill, n):
    out, pos = torch.ops.gnncompile.remaining_self_loops(ei, n)
    return out, torch.ops.gnncompile.loop_attr(a, compute_loop_attr(ei, a, n, False, fill), ei, pos)


@pytest.mark.parametrize("fill", [1.0, 2.0, "mean", "add"])
@pytest.mark.parametrize("shape", [(), (3, )])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_forward_and_gradient_equal_pyg(seed, shape, fill):
    ei, n = _graph(seed)
    a0 = torch.randn((ei.size(1), ) + shape, generator=torch.Generator().manual_seed(seed + 10))
    g = None
    res = []
    for fn in (add_remaining_self_loops, _ours):
        a = a0.clone().requires_grad_(True)
        out, attr = fn(ei, a, fill, n)
        if g is None:
            g = torch.randn(attr.shape, generator=torch.Generator().manual_seed(seed + 20))
        (attr * g).sum().backward()
        res.append((out, attr.detach(), a.grad))
    (o1, v1, g1), (o2, v2, g2) = res
    assert torch.equal(o1, o2) and torch.equal(v1, v2)
    assert torch.equal(g1, g2)  # fails with the plain gather: node 2's first two loops got 0


def test_a_learnable_fill_value_gets_pyg_gradient():
    ei, n = _graph(3)
    a0 = torch.randn(ei.size(1), 2)
    grads = []
    for fn in (add_remaining_self_loops, _ours):
        a = a0.clone().requires_grad_(True)
        fill = torch.tensor([0.5, -1.0], requires_grad=True)
        _, attr = fn(ei, a, fill, n)
        attr.pow(2).sum().backward()
        grads.append((a.grad, fill.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_opcheck():
    ei, n = _graph(4, extra_loops=((1, 1), ))
    out, pos = torch.ops.gnncompile.remaining_self_loops(ei, n)
    a = torch.randn(ei.size(1), 4, dtype=torch.float64, requires_grad=True)
    fill = torch.ones(n, 4, dtype=torch.float64)
    torch.library.opcheck(torch.ops.gnncompile.loop_attr.default, (a, fill, ei, pos))


def test_compiled_gcn_edge_weight_gradient_equals_eager():
    """The model-level symptom: a compiled GCN whose edge weights need a gradient, on a graph
    whose node 2 has three self loops."""
    from torch_geometric.nn import GCNConv

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = GCNConv(8, 8), GCNConv(8, 4)

        def forward(self, x, ei, w):
            return self.c2(self.c1(x, ei, w).relu(), ei, w)

    ei, n = _graph(5)
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(1))
    w0 = torch.rand(ei.size(1), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    model = M()
    ref = copy.deepcopy(model)
    compiled = gnncompile.compile(model, settings={"choices": {"guard": "off"}})
    grads = []
    for m in (ref, compiled):
        w = w0.clone().requires_grad_(True)
        m(x, ei, w).sum().backward()
        grads.append(w.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-5)


def test_without_a_gradient_the_graph_keeps_the_plain_gather():
    assert "loop_attr" in loops.__all__
    ei, n = _graph(6)
    a = torch.randn(ei.size(1))
    out, pos = torch.ops.gnncompile.remaining_self_loops(ei, n)
    plain = torch.cat([a, compute_loop_attr(ei, a, n, False, 1.0)]).index_select(0, pos)
    assert torch.equal(torch.ops.gnncompile.loop_attr(a, compute_loop_attr(ei, a, n, False, 1.0), ei, pos), plain)
