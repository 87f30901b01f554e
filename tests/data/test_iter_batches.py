"""PooledLoader.iter_batches (explicit batches, the adaptive loader's hook) and reconfigure."""
from __future__ import annotations

import warnings

import pytest
import torch

from gnncompile.data import PooledLoader, graph_dataset

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Batch


def _data(n=30):
    ds = graph_dataset(n, min_nodes=3, max_nodes=25, num_features=4, seed=1)
    for i, d in enumerate(ds):
        d.gid = torch.tensor([i])
    return ds


def _same(a, b):
    for k in ("x", "edge_index", "y", "batch", "ptr", "gid"):
        assert torch.equal(a[k], b[k]), k
    assert a.num_graphs == b.num_graphs


@pytest.mark.parametrize("workers", [0, 1])
def test_iter_batches_gives_the_batches_asked_for_and_grows_its_slots(workers):
    ds = _data()
    L = PooledLoader(ds, batch_size=2, pool_size=2, num_workers=workers)
    plan = [[0, 1], [5, 3, 2, 9, 11, 12, 13], [29], list(range(14, 29))]  # more graphs than batch_size
    got = [b.clone() for b in L.iter_batches(plan)]
    assert len(got) == len(plan)
    for b, ids in zip(got, plan):
        _same(b, Batch.from_data_list([ds[i] for i in ids]))
    # the plain epoch still works after the slots grew
    assert sum(b.num_graphs for b in L) == len(ds)
    L.close()


def test_iter_batches_ends_the_previous_pass_and_rejects_bad_batches():
    ds = _data(10)
    L = PooledLoader(ds, batch_size=3)
    it = L.iter_batches([[0], [1]])
    next(it)
    it2 = L.iter_batches([[2, 3]])
    with pytest.raises(RuntimeError, match="ended by a newer iter"):
        next(it)
    assert next(it2).gid.tolist() == [2, 3]
    for bad in ([[]], [[10]], [[-1]], [[1.5]], [[True]], "ab", 3, [5]):
        with pytest.raises(ValueError):
            L.iter_batches(bad)


def test_reconfigure_changes_pool_and_workers_between_passes():
    ds = _data(20)
    L = PooledLoader(ds, batch_size=4, pool_size=2, num_workers=0)
    ref = [b.gid.tolist() for b in L]
    L.reconfigure(pool_size=3, num_workers=1)
    assert (L.pool_size, L.num_workers) == (3, 1)
    assert [b.gid.tolist() for b in L] == ref
    L.reconfigure(num_workers=0, pool_size=1)
    assert (L.pool_size, L.num_workers) == (1, 0)
    assert [b.gid.tolist() for b in L] == ref
    with pytest.raises(ValueError):
        L.reconfigure(pool_size=0)
    with pytest.raises(ValueError):
        L.reconfigure(num_workers=-1)
    L.close()
