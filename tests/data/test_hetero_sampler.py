"""Heterogeneous neighbor sampling (issue 32, point 5): ``gnncompile::hetero_neighbor_sample`` is
bit-for-bit the reference, per-edge-type fanouts hold, batches have PyG's layout, bad input is
refused with a clear error, and a compiled ``to_hetero`` model trains on the batches without
recompiling."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

from gnncompile.data import NeighborLoader, NeighborSampler
from gnncompile.ops import reference, targets
from gnncompile.ops import structure as _structure

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import HeteroData
    from torch_geometric.sampler import NumNeighbors

CITES, WRITES, REV, AFFIL = ("paper", "cites", "paper"), ("author", "writes", "paper"), \
    ("paper", "rev_writes", "author"), ("author", "affil", "inst")


def hetero_graph(papers=300, authors=200, insts=20, seed=0, F=8) -> HeteroData:
    g = torch.Generator().manual_seed(seed)

    def ei(ns, nd, E):
        return torch.stack([torch.randint(0, ns, (E,), generator=g), torch.randint(0, nd, (E,), generator=g)])

    d = HeteroData()
    d["paper"].x = torch.randn(papers, F, generator=g)
    d["paper"].y = torch.randint(0, 3, (papers,), generator=g)
    d["author"].x = torch.randn(authors, F, generator=g)
    d["inst"].x = torch.randn(insts, F, generator=g)
    d[CITES].edge_index = ei(papers, papers, 6 * papers)
    d[CITES].edge_attr = torch.randn(6 * papers, 3, generator=g)
    d[WRITES].edge_index = ei(authors, papers, 3 * papers)
    d[REV].edge_index = d[WRITES].edge_index.flip(0)
    d[AFFIL].edge_index = ei(authors, insts, authors)
    d["inst", "employs", "author"].edge_index = d[AFFIL].edge_index.flip(0)
    return d


def op_inputs(d: HeteroData, pairs: bool):
    types = d.node_types
    cps, rows, perms = [], [], []
    for et in d.edge_types:
        st = _structure.build(d[et].edge_index, d[et[2]].num_nodes)
        cps.append(st.rowptr)
        if pairs:
            rows.append(torch.stack([st.col, st.perm], 1).int())
            perms.append(None)
        else:
            rows.append(st.col)
            perms.append(st.perm)
    return (cps, rows, perms, [types.index(et[0]) for et in d.edge_types],
            [types.index(et[2]) for et in d.edge_types], [d[t].num_nodes for t in types])


FANOUTS = [([3, 2], False), ([3, 2], True), ([-1, 1], False), ([0, 4], False), ([5, 0, 2], True), ([1], False)]


@pytest.mark.parametrize("pairs", [True, False])
@pytest.mark.parametrize("fan,replace", FANOUTS)
def test_native_equals_reference_bit_for_bit(fan, replace, pairs):
    d = hetero_graph()
    cps, rows, perms, src, dst, nn = op_inputs(d, pairs)
    T = len(cps)
    flat = [k + t % 2 if k > 0 else k for t in range(T) for k in fan]  # differs between edge types
    seeds = torch.tensor([5, 17, 3, 250, 17 + 1])
    args = (src, dst, nn, seeds, d.node_types.index("paper"), flat, len(fan), replace, 1234)
    a = targets.HETERO_NEIGHBOR_SAMPLE(cps, rows, perms, *args)
    b = reference.hetero_neighbor_sample(cps, rows, perms, *args)
    for xa, xb in zip(a[:4], b[:4]):
        assert len(xa) == len(xb)
        for x, y in zip(xa, xb):
            assert torch.equal(x, y)
    assert torch.equal(a[4], b[4]) and torch.equal(a[5], b[5])
    assert a[4].shape == (len(nn), len(fan) + 1) and a[5].shape == (T, len(fan))
    # another seed draws another sample (where anything is drawn at random)
    c = targets.HETERO_NEIGHBOR_SAMPLE(cps, rows, perms, *args[:-1], 99)
    if fan[0] > 0:  # (hop 0 draws nothing with fanout 0: nothing random follows)
        assert any(not torch.equal(x, y) for x, y in zip(a[3], c[3]))


def check_batch(b, d: HeteroData, input_type: str):
    n = b[input_type].batch_size
    assert torch.equal(b[input_type].n_id[:n], b[input_type].input_id)
    for t in d.node_types:
        assert torch.equal(b[t].x, d[t].x[b[t].n_id])
        assert sum(b[t].num_sampled_nodes) == b[t].n_id.numel()
        assert b[t].n_id.unique().numel() == b[t].n_id.numel()  # each node once per type
    for et in d.edge_types:
        src, dst = b[et].edge_index
        full = d[et].edge_index[:, b[et].e_id]
        assert torch.equal(b[et[0]].n_id[src], full[0]) and torch.equal(b[et[2]].n_id[dst], full[1])
        assert sum(b[et].num_sampled_edges) == b[et].edge_index.size(1)
    assert torch.equal(b[CITES].edge_attr, d[CITES].edge_attr[b[CITES].e_id])


def hop_of_nodes(b, t):
    return torch.repeat_interleave(torch.arange(len(b[t].num_sampled_nodes)), torch.tensor(b[t].num_sampled_nodes))


def test_fanout_per_edge_type_and_hop_layout():
    d = hetero_graph()
    fan = {CITES: [4, 2], WRITES: [2, 3], REV: [3, 1], AFFIL: [1, 1], ("inst", "employs", "author"): [-1, 2]}
    loader = NeighborLoader(d, fan, input_nodes=("paper", torch.arange(100)), batch_size=32, shuffle=True, seed=7)
    batches = list(loader)
    assert len(batches) == 4 and batches[-1]["paper"].batch_size == 4
    for b in batches:
        check_batch(b, d, "paper")
        assert b["paper"].num_sampled_nodes[0] == b["paper"].batch_size
        assert all(b[t].num_sampled_nodes[0] == 0 for t in ("author", "inst"))
        for et, ks in fan.items():
            dst_hop = hop_of_nodes(b, et[2])
            assert len(b[et].num_sampled_edges) == 2
            col = b[et].edge_index[1]
            start = 0
            for h, k in enumerate(ks):
                cnt = b[et].num_sampled_edges[h]
                c = col[start:start + cnt]
                start += cnt
                assert (dst_hop[c] == h).all()  # hop h draws for the nodes hop h - 1 added
                per_node = torch.bincount(c, minlength=b[et[2]].n_id.numel())
                deg = torch.bincount(d[et].edge_index[1], minlength=d[et[2]].num_nodes)[b[et[2]].n_id]
                want = deg if k < 0 else deg.clamp(max=k)
                frontier = dst_hop == h
                assert torch.equal(per_node[frontier], want[frontier])
                e = b[et].e_id[start - cnt:start]
                for v in c.unique():  # without replacement: distinct edges per node
                    assert e[c == v].unique().numel() == (c == v).sum()


def test_same_seed_same_batches_other_seed_other_batches_and_one_list_for_all_types():
    d = hetero_graph()
    kw = dict(input_nodes="paper", batch_size=50, shuffle=True)
    a = [b["author"].n_id for b in NeighborLoader(d, [3, 2], seed=1, **kw)]
    b = [b["author"].n_id for b in NeighborLoader(d, [3, 2], seed=1, **kw)]
    c = [b["author"].n_id for b in NeighborLoader(d, [3, 2], seed=2, **kw)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(x.numel() == y.numel() and torch.equal(x, y) for x, y in zip(a, c))
    same = NeighborSampler(d, {et: [3, 2] for et in d.edge_types}, seed=5)
    one = NeighborSampler(d, [3, 2], seed=5)
    x, y = same.sample(torch.arange(10), 11, "paper"), one.sample(torch.arange(10), 11, "paper")
    assert all(torch.equal(x[i][k], y[i][k]) for i in range(4) for k in x[i])
    by_name = NeighborSampler(d, NumNeighbors({"paper__cites__paper": [1, 1]}, default=[3, 2]), seed=5)
    assert by_name.num_neighbors[CITES] == [1, 1] and by_name.num_neighbors[WRITES] == [3, 2]


def test_bad_input_raises_clear_errors():
    d = hetero_graph()
    with pytest.raises(ValueError, match="no fanout for the edge types"):
        NeighborLoader(d, {CITES: [2]}, input_nodes="paper")
    with pytest.raises(ValueError, match="does not have"):
        NeighborLoader(d, {("paper", "nope", "paper"): [2], **{et: [2] for et in d.edge_types}}, input_nodes="paper")
    with pytest.raises(ValueError, match="same number of hops"):
        NeighborLoader(d, {et: [2] * (1 + (et == CITES)) for et in d.edge_types}, input_nodes="paper")
    with pytest.raises(TypeError, match="list of ints"):
        NeighborLoader(d, {et: [2.5] for et in d.edge_types}, input_nodes="paper")
    with pytest.raises(ValueError, match=">= 0, or -1"):
        NeighborLoader(d, [2, -4], input_nodes="paper")
    with pytest.raises(ValueError, match="input_nodes is a node type"):
        NeighborLoader(d, [2], input_nodes=None)
    with pytest.raises(ValueError, match="'venue' is not a node type"):
        NeighborLoader(d, [2], input_nodes=("venue", torch.arange(3)))
    with pytest.raises(ValueError, match="directed, not disjoint"):
        NeighborLoader(d, [2], input_nodes="paper", disjoint=True)
    with pytest.raises(IndexError, match="seed node 300"):
        next(iter(NeighborLoader(d, [2], input_nodes=("paper", torch.tensor([1, 300])), batch_size=2)))
    bad = copy.copy(d)
    bad[WRITES].edge_index = torch.tensor([[0, 200], [1, 2]])  # author 200 of 200
    with pytest.raises(IndexError, match="source"):
        NeighborLoader(bad, [2], input_nodes="paper")
    bad[WRITES].edge_index = torch.tensor([[0, 1], [1, 2]], dtype=torch.float)
    with pytest.raises(TypeError, match="integers"):
        NeighborLoader(bad, [2], input_nodes="paper")
    sampler = NeighborSampler(d, [2])
    with pytest.raises(ValueError, match="node type"):
        sampler.sample(torch.arange(3), 0)
    with pytest.raises(ValueError, match=r"colptr of edge type \d+ has \d+ entries for"):
        cps, rows, perms, src, dst, nn = op_inputs(d, True)
        targets.HETERO_NEIGHBOR_SAMPLE(cps[1:] + cps[:1], rows, perms, src, dst, nn, torch.arange(3), 0,
                                       [1] * len(cps), 1, False, 0)


def test_graph_left_intact_and_unreached_types_are_empty():
    d = hetero_graph()
    before = {et: d[et].edge_index.clone() for et in d.edge_types}
    b = next(iter(NeighborLoader(d, {et: [2] if et != REV else [0] for et in d.edge_types},
                                 input_nodes="paper", batch_size=8)))
    assert all(torch.equal(d[et].edge_index, before[et]) for et in d.edge_types)
    assert b["author"].num_sampled_nodes == [0, b["author"].n_id.numel()] and b["author"].n_id.numel() > 0
    assert b["inst"].n_id.numel() == 0 and b[AFFIL].edge_index.size(1) == 0  # one hop: no author frontier yet
    check_batch(b, d, "paper")


@pytest.mark.slow
def test_compiled_to_hetero_trains_on_sampled_batches_without_recompiling():
    import gnncompile
    from torch._dynamo.utils import counters
    from torch_geometric.nn import to_hetero
    from torch_geometric.nn.models import GraphSAGE

    torch._dynamo.reset()
    d = hetero_graph(papers=2000, authors=1500, insts=50, F=16)
    torch.manual_seed(0)
    model = to_hetero(GraphSAGE((-1, -1), 32, 2, 3), d.metadata(), aggr="sum")
    loader = NeighborLoader(d, [6, 3], input_nodes="paper", batch_size=64, shuffle=True, seed=0)
    first = next(iter(loader))
    model(first.x_dict, first.edge_index_dict)  # lazy shapes
    ref = copy.deepcopy(model)
    compiled = gnncompile.compile(model, dynamic=True)
    opt, opt_ref = torch.optim.SGD(model.parameters(), lr=0.05), torch.optim.SGD(ref.parameters(), lr=0.05)
    frames = []
    for i, b in enumerate(loader):
        n = b["paper"].batch_size
        out = compiled(b.x_dict, b.edge_index_dict)["paper"][:n]
        want = ref(b.x_dict, b.edge_index_dict)["paper"][:n]
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
        for o, m in ((opt, out), (opt_ref, want)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m, b["paper"].y[:n]).backward()
            o.step()
        frames.append(counters["frames"]["ok"])
        if i == 7:
            break
    assert len(set(frames[2:])) == 1, f"recompiled after warm-up: frames per step {frames}"
    report = gnncompile.explain(model, b.x_dict, b.edge_index_dict)
    assert report.num_graph_breaks == 0 and len(report.fused) >= 2 * len(d.edge_types) and not report.unfused
