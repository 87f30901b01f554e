"""benchmarks.neighbor_order: the hand-written transform-first form computes what PyG's GraphSAGE
computes (up to rounding, the same parameters, gradients too), refuses other depths, and the
benchmark runs end to end on a tiny graph."""
from __future__ import annotations

import json

import pytest
import torch
from torch_geometric.nn.models import GraphSAGE

from benchmarks import neighbor_order


def _graph(n=300, e=2000, f=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, f, generator=g), torch.randint(0, n, (2, e), generator=g)


def test_transform_first_matches_pyg():
    torch.manual_seed(0)
    m = GraphSAGE(16, 64, 2, 2)
    x, ei = _graph()
    tf = neighbor_order._transform_first(m)
    a, b = m(x, ei), tf(x, ei)
    assert a.shape == b.shape == (300, 2)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    # the same parameter tensors: the gradient of one loss reaches the same parameters
    ga = torch.autograd.grad(a.square().sum(), list(m.parameters()))
    gb = torch.autograd.grad(b.square().sum(), list(m.parameters()))
    for p, q in zip(ga, gb):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)
    # a changed bias changes both: the bias is read, not copied
    with torch.no_grad():
        m.convs[1].lin_l.bias += 1.0
    torch.testing.assert_close(tf(x, ei), m(x, ei), rtol=1e-5, atol=1e-5)


def test_transform_first_refuses_three_layers():
    with pytest.raises(ValueError, match="two layers"):
        neighbor_order._transform_first(GraphSAGE(16, 64, 3, 2))


@pytest.mark.slow
def test_neighbor_order_tiny(tmp_path):
    assert neighbor_order.main(["--num-nodes", "3000", "--num-edges", "20000", "--fanout", "4", "3",
                                "--batch-size", "64", "--rounds", "2", "--steps", "2", "--warmup", "2",
                                "--folder", str(tmp_path), "--out", "no"]) == 0
    r = json.loads((tmp_path / "no.json").read_text())
    assert set(r["arms"]) == {"base", "transform_first", "eager"}
    assert r["arms"]["base"]["ratio"] is None
    for k in ("transform_first", "eager"):
        q = r["arms"][k]["ratio"]
        assert len(r["arms"][k]["runs"]) == 2 and q["pairs"] == 2 and q["low"] <= q["ratio"] <= q["high"]
    assert 0 <= r["max_abs_diff"] <= 1e-4 * max(1.0, r["max_abs_output"])
    md = (tmp_path / "no.md").read_text()
    assert "| transform_first |" in md and "not bit for bit" in md


def test_neighbor_order_refuses_three_hops(capsys):
    with pytest.raises(SystemExit):
        neighbor_order.main(["--fanout", "4", "3", "2"])
    assert "two hops" in capsys.readouterr().err
