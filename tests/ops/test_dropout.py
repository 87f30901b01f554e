"""gnncompile::dropout (native/cpu/dropout.cpp) and the pass that puts it in compiled graphs
(passes/canonical.py fast_dropout)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv

import gnncompile
from gnncompile.compiler import backend
from gnncompile.ops import reference, targets


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_native_equals_reference_bit_for_bit(dtype):
    x = torch.randn(123, 45).to(dtype)
    for seed in (0, 7, -3, 1 << 61):
        s = torch.tensor(seed)
        assert torch.equal(targets.DROPOUT(x, 0.3, s), reference.dropout(x, 0.3, s))


def test_rate_scale_threads_and_seeds():
    x = torch.ones(200_000)
    y = targets.DROPOUT(x, 0.25, torch.tensor(11))
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.75) < 0.005
    assert torch.all(y[kept] == 1 / 0.75)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = targets.DROPOUT(x, 0.25, torch.tensor(11))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, y)
    assert not torch.equal(targets.DROPOUT(x, 0.25, torch.tensor(12)), y)
    # neighbouring elements are not correlated (a weak counter hash would show here)
    k = kept.float()
    assert abs(torch.corrcoef(torch.stack([k[:-1], k[1:]]))[0, 1].item()) < 0.01


def test_backward_reuses_the_mask():
    x = torch.randn(64, 8, requires_grad=True)
    s = torch.tensor(5)
    y = targets.DROPOUT(x, 0.5, s)
    g = torch.randn_like(y)
    y.backward(g)
    torch.testing.assert_close(x.grad, (y != 0).float() * g * 2.0)
    torch.library.opcheck(targets.DROPOUT, (torch.randn(20, 3, requires_grad=True), 0.25, torch.tensor(5)))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_bad_p(p):
    with pytest.raises(ValueError, match="p must be in"):
        targets.DROPOUT(torch.ones(3), p, torch.tensor(1))


def test_bad_seed():
    with pytest.raises((ValueError, RuntimeError), match="seed"):
        targets.DROPOUT(torch.ones(3), 0.5, torch.tensor([1, 2]))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = GCNConv(12, 8), GCNConv(8, 3)

    def forward(self, x, ei):
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, ei).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, ei)


def test_compiled_graphs_use_it_seeded_by_torch():
    torch.manual_seed(0)
    m = _Net()
    x, ei = torch.randn(50, 12), torch.randint(0, 50, (2, 200))
    c = gnncompile.compile(m, inner="eager")
    with backend.collect() as reps:
        torch.manual_seed(1)
        a = c(x, ei)
    assert sum(r.dropouts for r in reps) == 2
    torch.manual_seed(1)
    assert torch.equal(c(x, ei), a)  # torch.manual_seed makes runs repeat
    assert not torch.equal(c(x, ei), a)  # a new mask each call
    a.sum().backward()
    assert m.conv1.lin.weight.grad.abs().sum() > 0
    m.eval()
    torch.testing.assert_close(c(x, ei), m(x, ei))  # eval: no dropout at all


def test_not_for_inductor():
    torch.manual_seed(0)
    m = _Net()
    x, ei = torch.randn(50, 12), torch.randint(0, 50, (2, 200))
    with backend.collect() as reps:
        gnncompile.compile(m, inner="inductor")(x, ei)
    assert sum(r.dropouts for r in reps) == 0
