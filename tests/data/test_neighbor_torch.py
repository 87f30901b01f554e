"""The pure-PyTorch neighbor sampler (gnncompile.data.neighbor_torch): the contract's invariants
on small generated graphs, checked edge by edge against the CSC, plus uniformity and errors."""
from __future__ import annotations

import pytest
import torch

import gnncompile  # noqa: F401  (registers the native ops)
from gnncompile.data.neighbor_torch import sample_neighbors_torch
from gnncompile.data.synthetic import power_law_graph


def csc(ei: torch.Tensor, N: int):
    colptr, row, _ = torch.ops.gnncompile.build_csr(ei[1], ei[0], N, N)
    return colptr, row


@pytest.fixture(scope="module")
def graph():
    N = 300
    return N, csc(power_law_graph(N, 3000, seed=3), N)  # hubs of in-degree > 4 * 15


def check_sample(out, colptr, row, seeds, ks, replace):
    """Asserts every invariant of the contract (directed, not disjoint) on one sample."""
    node, r, c, edge, nsn, nse = out
    assert torch.equal(node[: seeds.numel()], seeds)
    assert node.unique().numel() == node.numel()
    assert nsn.tolist()[0] == seeds.numel() and int(nsn.sum()) == node.numel()
    assert len(nsn) == len(ks) + 1 and len(nse) == len(ks) and int(nse.sum()) == edge.numel()
    assert r.numel() == c.numel() == edge.numel()
    # every sampled edge is a real edge: source and destination map back through node
    assert torch.equal(row[edge], node[r])
    dst = node[c]
    assert bool(((colptr[dst] <= edge) & (edge < colptr[dst + 1])).all())
    deg = colptr.diff()
    n_lo, e_lo = 0, 0
    known = set(seeds.tolist())
    for h, k in enumerate(ks):
        n_hi, e_hi = n_lo + int(nsn[h]), e_lo + int(nse[h])
        cols, edges = c[e_lo:e_hi].tolist(), edge[e_lo:e_hi].tolist()
        # edges are grouped by frontier node, frontier = the nodes added by the previous hop
        assert cols == sorted(cols) and all(n_lo <= x < n_hi for x in cols)
        for f in range(n_lo, n_hi):
            mine = [e for x, e in zip(cols, edges) if x == f]
            d = int(deg[node[f]])
            if k == -1 or (not replace and d <= k):
                assert sorted(mine) == list(range(int(colptr[node[f]]), int(colptr[node[f]]) + d))
            elif replace:
                assert len(mine) == (k if d > 0 else 0)
            else:
                assert len(mine) == k and len(set(mine)) == k  # no in-edge twice
        # the new nodes: sources not seen before, in order of first appearance
        new = []
        for v in node[r[e_lo:e_hi]].tolist():
            if v not in known:
                known.add(v)
                new.append(v)
        assert node[n_hi:n_hi + int(nsn[h + 1])].tolist() == new
        n_lo, e_lo = n_hi, e_hi


@pytest.mark.parametrize("ks", [[15, 10], [3, 3, 3], [-1, 2], [0, 5], [60, 1]])
@pytest.mark.parametrize("replace", [False, True])
def test_invariants(graph, ks, replace):
    N, (colptr, row) = graph
    g = torch.Generator().manual_seed(len(ks) + 7 * replace)
    for _ in range(3):
        seeds = torch.randperm(N, generator=g)[:20]
        out = sample_neighbors_torch(colptr, row, seeds, ks, replace=replace, generator=g)
        check_sample(out, colptr, row, seeds, ks, replace)


def test_all_in_edges_when_fanout_is_large_or_minus_one(graph):
    N, (colptr, row) = graph
    seeds = torch.arange(0, N, 7)
    a = sample_neighbors_torch(colptr, row, seeds, [-1, -1])
    b = sample_neighbors_torch(colptr, row, seeds, [10**6, 10**6])
    for x, y in zip(a, b):  # deterministic: no randomness left
        assert torch.equal(x, y)
    assert int(a[5][0]) == int(colptr.diff()[seeds].sum())


def test_same_generator_seed_same_output(graph):
    N, (colptr, row) = graph
    seeds = torch.tensor([5, 17, 2, 250])
    run = [sample_neighbors_torch(colptr, row, seeds, [4, 3], generator=torch.Generator().manual_seed(s))
           for s in (11, 11, 12)]
    assert all(torch.equal(x, y) for x, y in zip(run[0], run[1]))
    assert not all(torch.equal(x, y) for x, y in zip(run[0], run[2]))


@pytest.mark.parametrize("deg,k,replace", [(12, 5, False), (40, 5, False), (6, 4, True)])
def test_uniform_choice(deg, k, replace):
    """Each in-edge of a node is picked with probability k / deg (keyed path: deg <= 4k, drawn
    path: deg > 4k, with replacement: k / deg expected picks)."""
    M = 300
    dst = torch.arange(M).repeat_interleave(deg)
    src = torch.arange(M, 2 * M).repeat_interleave(deg)  # node M + i: multi-edges, distinct positions
    colptr, row = csc(torch.stack([src, dst]), 2 * M)
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(deg)
    reps = 20
    for _ in range(reps):
        edge = sample_neighbors_torch(colptr, row, torch.arange(M), [k], replace, g)[3]
        counts += torch.bincount(edge % deg, minlength=deg)  # node i's in-edges: i*deg ... i*deg+deg-1
    expect = M * reps * k / deg
    sd = (expect * (1 - k / deg)) ** 0.5 if not replace else expect ** 0.5
    assert float((counts - expect).abs().max()) < 5 * sd, counts


def test_empty_seeds_and_isolated_nodes():
    colptr, row = csc(torch.tensor([[0], [1]]), 3)
    node, r, c, edge, nsn, nse = sample_neighbors_torch(colptr, row, torch.tensor([2, 1]), [5, 5])
    assert node.tolist() == [2, 1, 0] and edge.tolist() == [0] and nsn.tolist() == [2, 1, 0]
    assert nse.tolist() == [1, 0] and r.tolist() == [2] and c.tolist() == [1]
    out = sample_neighbors_torch(colptr, row, torch.empty(0, dtype=torch.int64), [2])
    assert out[0].numel() == 0 and out[4].tolist() == [0, 0] and out[5].tolist() == [0]


def test_bad_input(graph):
    N, (colptr, row) = graph
    with pytest.raises(IndexError, match="out of range"):
        sample_neighbors_torch(colptr, row, torch.tensor([0, N]), [2])
    with pytest.raises(IndexError, match="out of range"):
        sample_neighbors_torch(colptr, row, torch.tensor([-1]), [2])
    with pytest.raises(ValueError, match="num_neighbors"):
        sample_neighbors_torch(colptr, row, torch.tensor([0]), [2, -2])
    with pytest.raises(ValueError, match="no nodes"):
        sample_neighbors_torch(torch.zeros(1, dtype=torch.int64), torch.empty(0, dtype=torch.int64),
                               torch.tensor([0]), [2])
    with pytest.raises(ValueError, match="distinct"):
        sample_neighbors_torch(colptr, row, torch.tensor([3, 3]), [2])
    with pytest.raises(ValueError, match="int64"):
        sample_neighbors_torch(colptr.int(), row, torch.tensor([0]), [2])
    with pytest.raises(ValueError, match="colptr"):
        sample_neighbors_torch(colptr[:-1], row, torch.tensor([0]), [2])
