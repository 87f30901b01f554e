"""The native neighbor sampler (gnncompile::neighbor_sample), NeighborSampler and NeighborLoader."""
from __future__ import annotations

import contextlib
import json
import resource
import time
import warnings

import numpy as np

import pytest
import torch

from gnncompile.data import NeighborLoader, NeighborSampler
from gnncompile.data.synthetic import power_law_graph
from gnncompile.ops import reference

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Data
    from torch_geometric.loader import NodeLoader
    from torch_geometric.nn.models import GraphSAGE

ops = torch.ops.gnncompile


def graph(N=600, E=6000, seed=1, F=8):
    ei = power_law_graph(N, E, seed=seed)
    g = torch.Generator().manual_seed(seed)
    return Data(x=torch.randn(N, F, generator=g), edge_index=ei, y=torch.randint(0, 4, (N,), generator=g),
                edge_attr=torch.randn(ei.size(1), 3, generator=g))


def csc(data):
    N = data.num_nodes
    return ops.build_csr(data.edge_index[1], data.edge_index[0], N, N)


CONFIGS = [  # num_neighbors, replace, directed, disjoint
    ([5, 3], False, True, False),
    ([5, 3], True, True, False),
    ([-1, 2], False, True, False),
    ([4, 4], False, True, True),
    ([3, 2], False, False, False),
    ([0, 3], False, True, False),
    ([], False, True, False),
    ([2, 2, 2], True, True, True),
]


@pytest.mark.parametrize("fan,replace,directed,disjoint", CONFIGS)
def test_native_equals_reference_bit_for_bit(fan, replace, directed, disjoint):
    data = graph()
    cp, row, _ = csc(data)
    seeds = torch.cat([torch.randperm(600, generator=torch.Generator().manual_seed(0))[:40],
                       torch.tensor([7, 7])])  # a repeated seed too
    got = ops.neighbor_sample(cp, row, seeds, fan, replace, directed, disjoint, 12345)
    want = reference.neighbor_sample(cp, row, seeds, fan, replace, directed, disjoint, 12345)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def per_hop_edges(out):
    node, row, col, edge, batch, n_nodes, n_edges = out
    bounds = torch.tensor([0] + n_edges.tolist()).cumsum(0)
    return [(row[a:b], col[a:b], edge[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("replace", [False, True])
def test_sampled_edges_exist_fanout_and_uniqueness(replace):
    data = graph()
    cp, row, perm = csc(data)
    seeds = torch.arange(0, 600, 13)
    fan = [6, 4]
    out = ops.neighbor_sample(cp, row, seeds, fan, replace, True, False, 7)
    node, srow, scol, slot, _, n_nodes, n_edges = out
    assert torch.equal(node[: seeds.numel()], seeds)  # seeds first, in order
    assert node.unique().numel() == node.numel()  # no node twice (no repeated seeds here)
    assert n_nodes.sum() == node.numel() and n_edges.sum() == slot.numel()
    # every sampled edge is a real edge: its slot's source and destination
    assert torch.equal(row[slot], node[srow])
    dst_of_slot = torch.repeat_interleave(torch.arange(600), cp[1:] - cp[:-1])
    assert torch.equal(dst_of_slot[slot], node[scol])
    deg = cp[1:] - cp[:-1]
    frontier_start = 0
    for hop, (r, c, s) in enumerate(per_hop_edges(out)):
        frontier = torch.arange(frontier_start, frontier_start + int(n_nodes[hop]))
        counts = torch.bincount(c - frontier_start, minlength=frontier.numel())
        want = deg[node[frontier]] if replace else deg[node[frontier]].clamp(max=fan[hop])
        if replace:
            want = torch.where(want > 0, torch.full_like(want, fan[hop]), want)
        assert torch.equal(counts, want), f"fanout not respected at hop {hop}"
        if not replace:  # no slot twice for a destination
            assert torch.unique(torch.stack([c, s]), dim=1).size(1) == s.numel()
        frontier_start += int(n_nodes[hop])


def test_minus_one_takes_every_in_edge():
    data = graph(N=300, E=2000)
    cp, row, _ = csc(data)
    seeds = torch.tensor([0, 5, 17])
    out = ops.neighbor_sample(cp, row, seeds, [-1], False, True, False, 0)
    want = torch.cat([torch.arange(cp[v], cp[v + 1]) for v in seeds.tolist()])
    assert torch.equal(out[3], want)


def test_without_replacement_draws_uniformly():
    # one hub with 40 in-edges, 4 drawn per call: each edge should come up ~10% of the time
    E = 40
    ei = torch.stack([torch.arange(1, E + 1), torch.zeros(E, dtype=torch.long)])
    cp, row, _ = ops.build_csr(ei[1], ei[0], E + 1, E + 1)
    counts = torch.zeros(E)
    trials = 3000
    for s in range(trials):
        slot = ops.neighbor_sample(cp, row, torch.tensor([0]), [4], False, True, False, s)[3]
        assert slot.unique().numel() == 4
        counts += torch.bincount(slot, minlength=E).float()
    expected = trials * 4 / E
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 90, f"chi-square {chi2:.1f} over 39 degrees of freedom: the draw is not uniform"


def test_same_seed_same_sample_other_seed_other_sample():
    data = graph()
    cp, row, _ = csc(data)
    seeds = torch.arange(50)
    a = ops.neighbor_sample(cp, row, seeds, [5, 5], False, True, False, 1)
    b = ops.neighbor_sample(cp, row, seeds, [5, 5], False, True, False, 1)
    c = ops.neighbor_sample(cp, row, seeds, [5, 5], False, True, False, 2)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[3], c[3])


def test_sample_does_not_depend_on_threads():
    data = graph(N=5000, E=60000)
    cp, row, _ = csc(data)
    seeds = torch.arange(0, 5000, 2)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = ops.neighbor_sample(cp, row, seeds, [10, 5], False, True, False, 3)
        torch.set_num_threads(max(2, old))
        b = ops.neighbor_sample(cp, row, seeds, [10, 5], False, True, False, 3)
    finally:
        torch.set_num_threads(old)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_disjoint_trees_stay_apart():
    data = graph()
    cp, row, _ = csc(data)
    seeds = torch.tensor([3, 3, 40])
    node, srow, scol, _, batch, _, _ = ops.neighbor_sample(cp, row, seeds, [4, 4], False, True, True, 5)
    assert torch.equal(batch[:3], torch.arange(3))
    assert torch.equal(batch[srow], batch[scol])  # every edge inside one tree
    for b in range(3):  # no node twice within a tree
        mine = node[batch == b]
        assert mine.unique().numel() == mine.numel()


def test_induced_subgraph_has_every_edge_between_sampled_nodes():
    data = graph(N=200, E=1500)
    cp, row, _ = csc(data)
    node, srow, scol, slot, _, _, _ = ops.neighbor_sample(cp, row, torch.tensor([1, 2]), [3, 3], False, False,
                                                          False, 9)
    ei = data.edge_index
    inside = torch.isin(ei[0], node) & torch.isin(ei[1], node)
    assert slot.numel() == int(inside.sum())
    got = set(zip(node[srow].tolist(), node[scol].tolist()))
    assert got == set(zip(ei[0, inside].tolist(), ei[1, inside].tolist()))


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("impl", ["native", "reference"])
def test_bad_input_raises(impl):
    f = ops.neighbor_sample if impl == "native" else reference.neighbor_sample
    data = graph(N=50, E=300)
    cp, row, _ = csc(data)
    with pytest.raises(IndexError, match="seed node 50 .*out of range for a graph of 50 nodes"):
        f(cp, row, torch.tensor([1, 50]), [3], False, True, False, 0)
    with pytest.raises(IndexError, match="seed node -1"):
        f(cp, row, torch.tensor([-1]), [3], False, True, False, 0)
    with pytest.raises(ValueError, match="num_neighbors entries must be >= 0, or -1"):
        f(cp, row, torch.tensor([1]), [3, -2], False, True, False, 0)
    with pytest.raises(ValueError, match="not supported with disjoint"):
        f(cp, row, torch.tensor([1]), [3], False, False, True, 0)
    with pytest.raises(TypeError, match="int64"):
        f(cp.int(), row.int(), torch.tensor([1], dtype=torch.int32), [3], False, True, False, 0)
    empty = torch.zeros(1, dtype=torch.long)
    with pytest.raises(IndexError, match="graph of 0 nodes"):
        f(empty, torch.zeros(0, dtype=torch.long), torch.tensor([0]), [3], False, True, False, 0)


def test_malformed_structure_raises_not_crashes():
    cp = torch.tensor([0, 5, 2, 6])  # decreasing
    row = torch.tensor([0, 1, 2, 0, 1, 2])
    with pytest.raises(ValueError, match="colptr must be non-decreasing"):
        ops.neighbor_sample(cp, row, torch.tensor([1]), [2], False, True, False, 0)
    cp = torch.tensor([0, 2, 4, 6])
    with pytest.raises(IndexError, match="row holds node 99"):
        ops.neighbor_sample(cp, torch.tensor([0, 99, 1, 2, 0, 1]), torch.tensor([0]), [-1], False, True, False, 0)


# ----------------------------------------------------------------------------- huge fanouts
@contextlib.contextmanager
def address_space(extra: int):
    """Inside, this process may map only ``extra`` more bytes (RLIMIT_AS): a sampler that
    allocates a hop it cannot hold fails at once instead of growing until the OOM killer ends
    the run."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * resource.getpagesize()
    limit = size + extra if hard == resource.RLIM_INFINITY else min(hard, size + extra)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("impl", ["native", "reference"])
def test_huge_fanout_with_replacement_is_refused_before_allocating(impl):
    """Fanout 2^31 with replacement for one seed grew the native op to ~24 GB until the OOM
    killer ended the process: each hop's draws, times the bytes the op keeps per sampled edge,
    are now compared with the memory available before anything is allocated, and a sum of
    draws past int64 is caught, not wrapped."""
    f = ops.neighbor_sample if impl == "native" else reference.neighbor_sample
    cp, row = torch.tensor([0, 2, 3]), torch.tensor([1, 0, 0])  # node 0 <- 1, 0; node 1 <- 0
    t0 = time.monotonic()
    with address_space(1 << 30):
        with pytest.raises(ValueError, match=r"hop 0 would sample 2147483648 edges \(fanout 2147483648 with "
                                             r"replacement, frontier of 1 nodes\): 2147483648 x \d+ bytes, "
                                             r"but \d+ bytes are available"):
            f(cp, row, torch.tensor([0]), [2**31], True, True, False, 0)
        with pytest.raises(ValueError, match=r"hop 1 would sample 1099511627776 edges \(fanout 1099511627776 "
                                             r"with replacement, frontier of 1 nodes\)"):
            f(cp, row, torch.tensor([0]), [-1, 2**40], True, True, False, 0)
        with pytest.raises(ValueError, match=r"hop 0 would sample more than 2\^63 - 1 edges \(fanout "
                                             r"4611686018427387904 with replacement, frontier of 3 nodes\)"):
            f(cp, row, torch.tensor([0, 1, 0]), [2**62], True, True, False, 0)
    assert time.monotonic() - t0 < 2.0
    # without replacement a fanout takes at most the in-degree: any fanout is fine
    out = f(cp, row, torch.tensor([0]), [2**62, 2**31], False, True, False, 0)
    assert out[0].tolist() == [0, 1] and out[6].tolist() == [2, 1]
    out = f(cp, row, torch.tensor([0, 1]), [3, -1], True, True, False, 9)  # small fanouts as before
    assert out[6].tolist() == [6, 0]


def test_fanout_entries_must_be_ints():
    """A float fanout was truncated (2.5 -> 2) and a string split into digits ('15' -> [1, 5])."""
    data = graph(N=50, E=300)
    for bad in ([2.5], [3, "2"], "15", [None]):
        with pytest.raises(TypeError, match="num_neighbors must be a list of ints"):
            NeighborSampler(data, bad)
        with pytest.raises(TypeError, match="num_neighbors must be a list of ints"):
            NeighborLoader(data, bad)
    with pytest.raises(ValueError, match=r"num_neighbors entries must be at most 2\^63 - 1"):
        NeighborSampler(data, [2**63])
    assert NeighborSampler(data, (np.int64(3), torch.tensor(2), -1)).num_neighbors == [3, 2, -1]
    assert NeighborSampler(data, [2**40], replace=False).sample(torch.tensor([0]), seed=0)[0].numel() >= 1


def test_loader_rejects_bad_arguments():
    data = graph(N=50, E=300)
    with pytest.raises(ValueError, match=">= 0, or -1"):
        NeighborLoader(data, [5, -3])
    with pytest.raises(TypeError, match="list of ints"):
        NeighborLoader(data, ["a"])
    with pytest.raises(TypeError, match="heterogeneous"):
        NeighborLoader(data, {"a": [1]})
    with pytest.raises(IndexError, match="seed node 60"):
        next(iter(NeighborLoader(data, [2], input_nodes=torch.tensor([1, 60]), batch_size=2)))
    bad = Data(x=torch.randn(5, 2), edge_index=torch.tensor([[0, 9], [1, 2]]))
    with pytest.raises(IndexError, match="source"):
        NeighborLoader(bad, [2])
    with pytest.raises(TypeError, match="sampler"):
        NeighborLoader(data, [2], sampler=[0, 1])


def test_edgeless_graph_gives_seeds_only():
    data = Data(x=torch.randn(4, 2), edge_index=torch.zeros(2, 0, dtype=torch.long))
    b = next(iter(NeighborLoader(data, [3, 3], batch_size=4)))
    assert b.n_id.tolist() == [0, 1, 2, 3] and b.edge_index.size(1) == 0
    assert b.num_sampled_nodes == [4, 0, 0] and b.num_sampled_edges == [0, 0]


# ----------------------------------------------------------------------------- loader
def check_batch(b, data):
    assert torch.equal(b.n_id[: b.batch_size], b.input_id)  # all nodes as inputs: input_id = node id
    src, dst = b.n_id[b.edge_index[0]], b.n_id[b.edge_index[1]]
    assert torch.equal(data.edge_index[:, b.e_id], torch.stack([src, dst]))
    assert torch.equal(b.x, data.x[b.n_id]) and torch.equal(b.edge_attr, data.edge_attr[b.e_id])
    assert sum(b.num_sampled_nodes) == b.num_nodes and sum(b.num_sampled_edges) == b.num_edges


def test_loader_batches_are_pyg_batches():
    data = graph()
    loader = NeighborLoader(data, [5, 3], batch_size=64, shuffle=True, seed=3)
    seen = []
    for b in loader:
        check_batch(b, data)
        assert b.num_sampled_nodes[0] == b.batch_size
        seen.append(b.input_id)
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(600))  # one pass over the inputs


def test_loader_input_mask_and_node_loader_interface():
    data = graph()
    mask = torch.zeros(600, dtype=torch.bool)
    mask[::7] = True
    ids = mask.nonzero().view(-1)
    b = next(iter(NeighborLoader(data, [4], input_nodes=mask, batch_size=16)))
    assert torch.equal(b.n_id[:16], ids[:16])
    assert torch.equal(b.input_id, ids[:16])  # PyG: a mask's input_id is the node ids
    # the sampler is a PyG BaseSampler: NodeLoader takes it as it is
    nl = NodeLoader(data, node_sampler=NeighborSampler(data, [4, 2], seed=0), batch_size=32)
    b = next(iter(nl))
    check_batch(b, data)


def test_loader_same_batches_with_0_and_2_workers_and_epochs_differ():
    data = graph()
    kw = dict(num_neighbors=[5, 3], batch_size=100, shuffle=True, seed=11)
    a = [b.n_id for b in NeighborLoader(data, **kw)]
    loader = NeighborLoader(data, num_workers=2, persistent_workers=True, **kw)
    b = [x.n_id for x in loader]
    c = [x.n_id for x in loader]  # the second epoch
    assert len(a) == len(b) == 6 and all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(b, c))
    again = [x.n_id for x in NeighborLoader(data, **kw)]
    assert all(torch.equal(x, y) for x, y in zip(a, again))


def test_trim_to_layer_gives_the_same_seed_outputs():
    data = graph()
    torch.manual_seed(0)
    model = GraphSAGE(8, 16, 2, 4).eval()
    b = next(iter(NeighborLoader(data, [5, 3], batch_size=32, seed=1)))
    full = model(b.x, b.edge_index)[: b.batch_size]
    trimmed = model(b.x, b.edge_index, num_sampled_nodes_per_hop=b.num_sampled_nodes,
                    num_sampled_edges_per_hop=b.num_sampled_edges)[: b.batch_size]
    torch.testing.assert_close(trimmed, full)


def test_profile_settings_apply(tmp_path):
    from gnncompile import profiles
    from gnncompile.hardware import device

    props = device.detect()
    doc = profiles.make(props, {"kind": "neighbor", "model": "sage"},
                        {"batch_size": 48, "num_workers": 2, "pool_size": 6, "pin_memory": False,
                         "persistent_workers": True, "threads": 1, "knobs": []})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    data = graph()
    loader = NeighborLoader(data, [3], profile=str(path))
    assert loader.batch_size == 48 and loader.num_workers == 2 and loader.prefetch_factor == 3
    assert loader.persistent_workers
    loader = NeighborLoader(data, [3], batch_size=10, num_workers=0, profile=str(path))  # given wins
    assert loader.batch_size == 10 and loader.num_workers == 0 and not loader.persistent_workers


def test_compiled_sage_on_sampled_batches_fuses_and_stops_recompiling():
    import gnncompile
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    data = graph(N=3000, E=30000, F=16)
    torch.manual_seed(0)
    model = GraphSAGE(16, 32, 2, 4)
    ref = GraphSAGE(16, 32, 2, 4)
    ref.load_state_dict(model.state_dict())
    compiled = gnncompile.compile(model, dynamic=True)
    frames = []
    for i, b in enumerate(NeighborLoader(data, [8, 4], batch_size=64, shuffle=True, seed=0)):
        out = compiled(b.x, b.edge_index)
        torch.testing.assert_close(out, ref(b.x, b.edge_index), rtol=1e-4, atol=1e-5)
        out[: b.batch_size].sum().backward()
        frames.append(counters["frames"]["ok"])
        if i == 9:
            break
    assert len({b for b in frames[2:]}) == 1, f"recompiled after warm-up: frames per step {frames}"
    report = gnncompile.explain(model, b.x, b.edge_index)
    assert report.num_graph_breaks == 0 and len(report.fused) >= 2 and not report.unfused


@pytest.mark.parametrize("fan,replace,directed,disjoint", CONFIGS[:5])
def test_edge_ids_from_pairs_equal_edge_ids_from_perm(fan, replace, directed, disjoint):
    data = graph()
    cp, row, perm = csc(data)
    pairs = torch.stack([row, perm], 1).int()
    seeds = torch.arange(0, 600, 15)
    by_perm = ops.neighbor_sample(cp, row, seeds, fan, replace, directed, disjoint, 4, perm)
    by_pairs = ops.neighbor_sample(cp, pairs, seeds, fan, replace, directed, disjoint, 4)
    slots = ops.neighbor_sample(cp, row, seeds, fan, replace, directed, disjoint, 4)
    ref = reference.neighbor_sample(cp, pairs, seeds, fan, replace, directed, disjoint, 4)
    for a, b, c in zip(by_perm, by_pairs, ref):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert torch.equal(by_perm[3], perm[slots[3]])
    with pytest.raises(ValueError, match="either in the pairs or as perm"):
        ops.neighbor_sample(cp, pairs, seeds, fan, replace, directed, disjoint, 4, perm)
