"""Batch structures prepared by the loaders (PooledLoader(structures=...), prefetch_structures):
the compiled model's structure ops hit them by identity, with no build and no validation in the
step, and never for another edge_index (in-place edits, writes behind the version counter,
slots filled again)."""
from __future__ import annotations

import warnings

import pytest
import torch

import gnncompile
from gnncompile.data import PooledLoader, prefetch_structures
from gnncompile.data.synthetic import graph_dataset
from gnncompile.ops import structure as S

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader

DS = graph_dataset(96, 3, 12, num_features=5, seed=5)
ops = torch.ops.gnncompile


def _lookup(ei, n):
    """What a compiled model's structure ops hand out for ``ei``, and the cache / validation
    counts they moved."""
    i0, v0 = S.cache_info(), S.validation_count()
    csr = ops.cached_csr(ei, n)
    csc = ops.cached_csc(ei, n, n)
    x = torch.randn(n, 4)
    gnncompile.ops.spmm(ei, x)  # a kernel reads the structure: validates it unless trusted
    i1 = S.cache_info()
    # builds by lookups (a loader's thread preparing the next batch meanwhile counts in "prepared")
    builds = i1["builds"] - i0["builds"]
    return csr, csc, builds, i1["identity_hits"] - i0["identity_hits"], S.validations_since(v0)


def _expected(ei, n):
    s = S.build(ei.clone(), n)
    return (s.rowptr, s.col, s.perm), S.transpose_structure(s.rowptr, s.col, s.perm, n)


def _equal(got, want):
    return all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("workers", [0, 2])
def test_prepared_structures_hit_without_build_or_validation(workers):
    loader = PooledLoader(DS, batch_size=16, shuffle=True, num_workers=workers, structures=True)
    try:
        for _ in range(2):
            n = 0
            for b in loader:
                csr, csc, builds, hits, validations = _lookup(b.edge_index, b.num_nodes)
                want_csr, want_csc = _expected(b.edge_index, b.num_nodes)
                assert _equal(csr, want_csr) and _equal(csc, want_csc)
                assert (builds, validations) == (0, 0)
                assert hits >= 2
                n += 1
            assert n == len(loader)
    finally:
        loader.close()


def test_same_batches_with_and_without_structures():
    a = PooledLoader(DS, batch_size=16, shuffle=False, num_workers=2, structures=True)
    b = PooledLoader(DS, batch_size=16, shuffle=False, num_workers=0, structures=False)
    try:
        for x, y in zip(a, b):
            for k in ("x", "edge_index", "batch", "ptr", "y"):
                assert torch.equal(x[k], y[k]) and x[k].stride() == y[k].stride()
    finally:
        a.close()
        b.close()


def test_without_structures_the_step_builds():
    loader = PooledLoader(DS, batch_size=16, num_workers=0, structures=False)
    b = next(iter(loader))
    _, _, builds, _, _ = _lookup(b.edge_index, b.num_nodes)
    assert builds == 1
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("how", ["inplace", "numpy"])
def test_edit_after_delivery_is_not_served_the_prepared_structure(workers, how):
    S.clear_cache()  # no shared entry of an earlier test's equal content
    loader = PooledLoader(DS, batch_size=16, num_workers=workers, structures=True)
    try:
        b = next(iter(loader))
        ei = b.edge_index
        n = b.num_nodes
        prepared = S.CACHE._live[id(ei)].by_num_dst[n]
        new = (int(ei[0, 0]) + 1) % n
        if how == "inplace":
            ei[0, 0] = new  # moves the version counter
        else:
            ei.numpy()[0, 0] = new  # behind it: the CPU content check catches it
        csr, csc, builds, _, _ = _lookup(ei, n)
        assert builds == 1 and csr[1] is not prepared.col
        want_csr, want_csc = _expected(ei, n)
        assert _equal(csr, want_csr) and _equal(csc, want_csc)
    finally:
        loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_slot_filled_again_drops_the_prepared_entry(workers):
    S.clear_cache()
    loader = PooledLoader(DS, batch_size=16, shuffle=False, pool_size=2, num_workers=workers, structures=True)
    try:
        it = iter(loader)
        first = next(it)
        ei = first.edge_index
        s = S.CACHE._live[id(ei)].by_num_dst[first.num_nodes]
        versions = [t._version for t in (s.rowptr, s.col, s.perm)]
        next(it)
        next(it)  # first's slot is filled again
        assert id(ei) not in S.CACHE._live  # the prepared entry is gone
        if workers:  # the structure lay in the slot: its tensors are marked changed
            assert all(t._version > v for t, v in zip((s.rowptr, s.col, s.perm), versions))
        # first's edge_index now holds another batch: a lookup builds from what it holds
        n = int(ei.max()) + 1
        csr, _, builds, _, _ = _lookup(ei, n)
        assert builds == 1 and _equal(csr, _expected(ei, n)[0])
    finally:
        loader.close()


def test_bad_edge_index_still_raises_in_the_model():
    ds = [Data(x=torch.randn(4, 2), edge_index=torch.tensor([[0, 1], [1, 2]])) for _ in range(8)]
    ds[-1] = Data(x=torch.randn(4, 2), edge_index=torch.tensor([[0, 1], [1, 7]]))  # past the batch's nodes
    for workers in (0, 2):
        loader = PooledLoader(ds, batch_size=8, num_workers=workers, structures=True)
        b = next(iter(loader))
        with pytest.raises(IndexError):
            ops.cached_csr(b.edge_index, b.num_nodes)
        loader.close()


def test_structures_argument_and_default():
    for bad in ("yes", None, 1):
        with pytest.raises(ValueError, match="structures"):
            PooledLoader(DS, batch_size=16, structures=bad)
    for workers in (0, 1):
        off = PooledLoader(DS, batch_size=16, num_workers=workers)
        assert off._structures is False and off._sbufs is None
        b = next(iter(off))
        assert id(b.edge_index) not in S.CACHE._live  # nothing prepared
        off.close()
    on = PooledLoader(DS, batch_size=16, num_workers=1, structures=True)
    assert on._structures is True and on._sbufs is not None
    on.close()


def test_adopt_worker_structure_checks_what_it_can():
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    s = S.build(ei, 3)
    rowptr = s.rowptr.clone()
    rowptr[-1] = 2  # does not end at E
    if gnncompile.ops._native.native_loaded():
        with pytest.raises(ValueError, match="number of edges"):
            ops.adopt_worker_structure(rowptr, s.col.clone(), s.perm.clone(), 3)


def test_prefetch_structures_with_pyg_loader():
    torch.manual_seed(0)
    want = list(DataLoader(DS, batch_size=16, shuffle=True))
    torch.manual_seed(0)
    got = 0
    for b, w in zip(prefetch_structures(DataLoader(DS, batch_size=16, shuffle=True), depth=2), want):
        assert torch.equal(b.edge_index, w.edge_index) and torch.equal(b.x, w.x)
        csr, csc, builds, hits, validations = _lookup(b.edge_index, b.num_nodes)
        assert (builds, validations) == (0, 0) and hits >= 2
        want_csr, want_csc = _expected(b.edge_index, b.num_nodes)
        assert _equal(csr, want_csr) and _equal(csc, want_csc)
        got += 1
    assert got == len(want)


def test_prefetch_structures_errors():
    with pytest.raises(ValueError, match="PooledLoader"):
        next(prefetch_structures(PooledLoader(DS, batch_size=16)))
    with pytest.raises(ValueError, match="depth"):
        next(prefetch_structures([], depth=0))

    def bad():
        yield DS[0]
        raise KeyError("boom")

    it = prefetch_structures(bad())
    assert next(it) is DS[0]
    with pytest.raises(KeyError, match="boom"):
        next(it)


def test_compiled_model_steps_build_and_validate_nothing():
    from torch_geometric.nn import GINConv, global_add_pool

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GINConv(torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)))
            self.head = torch.nn.Linear(8, 2)

        def forward(self, x, edge_index, batch):
            return self.head(global_add_pool(self.conv(x, edge_index).relu(), batch))

    torch.manual_seed(0)
    model = Net()
    run = gnncompile.compile(model, dynamic=True)
    loader = PooledLoader(DS, batch_size=16, shuffle=True, num_workers=2, structures=True)
    try:
        for i, b in enumerate(loader):
            i0, v0 = S.cache_info(), S.validation_count()
            out = run(b.x, b.edge_index, b.batch)
            out.sum().backward()
            i1 = S.cache_info()
            if i > 0:  # (the first step compiles)
                assert i1["builds"] == i0["builds"] and S.validations_since(v0) == 0
                assert i1["identity_hits"] > i0["identity_hits"]
            with torch.no_grad():
                assert torch.allclose(out, model(b.x, b.edge_index, b.batch), atol=1e-5)
    finally:
        loader.close()

