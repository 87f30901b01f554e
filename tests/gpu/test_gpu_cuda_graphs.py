"""GraphedStep on CUDA: captured training steps on padded batches (PooledLoader(pad_to_buckets))
give the losses and parameters of the plain steps; its refusals. Written without a GPU: first
run by tests/gpu/run.sh on a lent GPU."""
from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

from gnncompile.cuda_graphs import GraphedStep
from gnncompile.data import PooledLoader, graph_dataset

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.nn import GINConv, GINEConv, global_add_pool

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEV = "cuda"


def _data(n=300, edge_dim=0):
    ds = graph_dataset(n, min_nodes=10, max_nodes=40, num_features=16, num_classes=3, avg_degree=2.2, seed=0)
    if edge_dim:
        g = torch.Generator().manual_seed(1)
        for d in ds:
            d.edge_attr = torch.randn(d.edge_index.size(1), edge_dim, generator=g)
    return ds


class Net(torch.nn.Module):
    def __init__(self, edge_dim=0, dropout=0.0):
        super().__init__()
        mlp = lambda i, o: torch.nn.Sequential(torch.nn.Linear(i, o), torch.nn.ReLU(), torch.nn.Linear(o, o))
        self.edge_dim = edge_dim
        if edge_dim:
            self.convs = torch.nn.ModuleList([GINEConv(mlp(16, 32), edge_dim=edge_dim),
                                              GINEConv(mlp(32, 32), edge_dim=edge_dim)])
        else:
            self.convs = torch.nn.ModuleList([GINConv(mlp(16, 32)), GINConv(mlp(32, 32))])
        self.drop = torch.nn.Dropout(dropout)
        self.head = torch.nn.Linear(32, 3)

    def forward(self, b):
        h = b.x
        for c in self.convs:
            h = (c(h, b.edge_index, b.edge_attr) if self.edge_dim else c(h, b.edge_index)).relu()
        return self.head(self.drop(global_add_pool(h, b.batch, size=b.num_graphs)))


def _loss(m, b):
    return F.cross_entropy(m(b), b.y, ignore_index=-100)


def _batches(ds, epochs=2, bs=32):
    L = PooledLoader(ds, batch_size=bs, shuffle=True, pad_to_buckets=3, generator=torch.Generator().manual_seed(0))
    out = [b.clone().to(DEV) for _ in range(epochs) for b in L]
    return out, L.buckets


@pytest.mark.parametrize("edge_dim", [0, 4])
def test_captured_steps_equal_plain_steps(edge_dim):
    torch.manual_seed(0)
    batches, buckets = _batches(_data(edge_dim=edge_dim))
    a = Net(edge_dim).to(DEV)
    b = copy.deepcopy(a)
    oa = torch.optim.Adam(a.parameters(), lr=1e-2, capturable=True)
    ob = torch.optim.Adam(b.parameters(), lr=1e-2, capturable=True)
    step = GraphedStep(a, oa, _loss)
    assert step.mode == "cuda_graph"
    la, lb = [], []
    for batch in batches:
        la.append(step(batch))
        ob.zero_grad(set_to_none=True)
        loss = _loss(b, batch)
        loss.backward()
        ob.step()
        lb.append(loss.detach())
    la, lb = torch.stack(la), torch.stack(lb)
    shapes = {(x.x.size(0), x.edge_index.size(1)) for x in batches}
    assert step.captures == len(shapes) and step.replays == len(batches)
    print(f"edge_dim={edge_dim}: {len(batches)} steps, {step.captures} graphs, buckets {buckets}; "
          f"max |loss diff| {float((la - lb).abs().max()):.3g}")
    # the same math; atomics in scatter_add_ may order sums differently from run to run
    torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-5)
    assert float(la[-1]) < float(la[0])
    for x, y in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(x, y, rtol=1e-3, atol=1e-4)


def test_cuda_loader_pads_as_the_cpu_loader():
    ds = _data(n=100, edge_dim=4)
    cpu = [b.clone() for b in PooledLoader(ds, batch_size=16, pad_to_buckets=2)]
    gpu = [b.clone() for b in PooledLoader(ds, batch_size=16, pad_to_buckets=2, device=DEV, pin_memory=True)]
    assert len(cpu) == len(gpu)
    for p, q in zip(cpu, gpu):
        for k in ("x", "edge_index", "edge_attr", "y", "batch", "ptr", "graph_mask", "node_mask", "edge_mask"):
            assert q[k].device.type == "cuda" and torch.equal(p[k], q[k].cpu()), k


def test_refusals_on_cuda():
    batches, _ = _batches(_data(n=64), epochs=1)
    m = Net().to(DEV)
    with pytest.raises(ValueError, match="capturable=True"):
        GraphedStep(m, torch.optim.Adam(m.parameters(), capturable=False), _loss)
    d = Net(dropout=0.5).to(DEV)
    before = [p.detach().clone() for p in d.parameters()]
    rng = torch.cuda.get_rng_state()
    step = GraphedStep(d, torch.optim.Adam(d.parameters(), capturable=True), _loss)
    with pytest.raises(ValueError, match="random numbers"):
        step(batches[0])
    assert all(torch.equal(p, q) for p, q in zip(d.parameters(), before))  # the warm-up was undone
    assert torch.equal(torch.cuda.get_rng_state(), rng)
    step = GraphedStep(d, torch.optim.Adam(d.parameters(), capturable=True), _loss, allow_random=True)
    assert all(torch.isfinite(step(b)) for b in batches)


def test_a_capture_that_syncs_fails_clearly():
    # in a subprocess: a failed capture must not leave this process's CUDA context in doubt
    code = textwrap.dedent("""
        import torch, torch.nn.functional as F
        from torch_geometric.nn import global_add_pool
        from gnncompile.cuda_graphs import GraphedStep
        from gnncompile.data import PooledLoader, graph_dataset
        b = next(iter(PooledLoader(graph_dataset(20, num_features=4), batch_size=8, pad_to_buckets=1))).to("cuda")
        m = torch.nn.Linear(4, 2).cuda()
        w = m.weight.detach().clone()
        step = GraphedStep(m, torch.optim.SGD(m.parameters(), lr=0.1), lambda m, b:
                           F.cross_entropy(global_add_pool(m(b.x), b.batch), b.y, ignore_index=-100))  # no size=
        try:
            step(b)
        except RuntimeError as e:
            assert "capturing the step failed" in str(e), e
            assert torch.equal(m.weight, w)
            print("refused")
        else:
            print("captured")  # a PyG whose readout does not sync: nothing to refuse
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] in ("refused", "captured")
