"""gnncompile.data.PooledLoader: the same batches as torch_geometric.loader.DataLoader for the
same seed, buffers reused, workers. (The CUDA path, pinned buffers and the side-stream copy,
needs a GPU and is not exercised here.)"""
from __future__ import annotations

import warnings

import pytest
import torch

from gnncompile.data import PooledLoader
from gnncompile.data.synthetic import graph_dataset

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader

DS = graph_dataset(300, 3, 12, num_features=5, seed=3)


def _same(a, b, keys=("x", "edge_index", "y", "batch", "ptr")):
    assert a.num_graphs == b.num_graphs
    assert a.num_nodes == b.num_nodes
    for k in keys:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k
        assert a[k].stride() == b[k].stride(), k  # a compiled model sees the same layout (no recompile)


def _compare(ds, epochs=2, seed=0, pyg_kw=None, **kw):
    pyg_kw = dict(pyg_kw or {})
    loader = PooledLoader(ds, **kw)
    try:
        for ep in range(epochs):
            torch.manual_seed(seed + ep)
            expected = list(DataLoader(ds, **pyg_kw))
            torch.manual_seed(seed + ep)
            got = 0
            for a, b in zip(loader, expected):
                _same(a, b, keys=[k for k in b.keys() if isinstance(b[k], torch.Tensor)])
                got += 1
            assert got == len(expected) == len(loader)
            # the global RNG advanced exactly as PyG's loader advances it
            torch.manual_seed(seed + ep)
            list(DataLoader(ds, **pyg_kw))
            r1 = torch.rand(1)
            torch.manual_seed(seed + ep)
            list(loader)
            assert torch.equal(torch.rand(1), r1)
    finally:
        loader.close()


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_same_batches_as_pyg(shuffle, drop_last):
    kw = dict(batch_size=32, shuffle=shuffle, drop_last=drop_last)
    _compare(DS, pyg_kw=kw, pool_size=3, **kw)


def test_same_batches_with_generator():
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    loader = PooledLoader(DS, batch_size=50, shuffle=True, generator=g1, pool_size=6)  # 6 batches
    pyg = DataLoader(DS, batch_size=50, shuffle=True, generator=g2)
    for _ in range(3):
        got, expected = list(loader), list(pyg)  # each a full epoch
        assert len(got) == len(expected)
        for a, b in zip(got, expected):  # a pool of 6 slots keeps a whole epoch valid
            _same(a, b)


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_same_batches(persistent):
    kw = dict(batch_size=40, shuffle=True)
    _compare(DS, pyg_kw=kw, pool_size=3, num_workers=2, persistent_workers=persistent, **kw)


def test_abandoned_epoch_then_full_epoch():
    loader = PooledLoader(DS, batch_size=16, shuffle=True, pool_size=4, num_workers=2,
                          persistent_workers=True)
    try:
        it = iter(loader)
        next(it)
        next(it)
        del it
        torch.manual_seed(1)
        expected = list(DataLoader(DS, batch_size=16, shuffle=True))
        torch.manual_seed(1)
        for a, b in zip(loader, expected):
            _same(a, b)
    finally:
        loader.close()


def test_compiled_model_does_not_recompile_between_loaders():
    import gnncompile
    from torch._dynamo.utils import counters

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_geometric.nn import GINConv, global_add_pool

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = GINConv(torch.nn.Linear(5, 8))

        def forward(self, x, edge_index, batch):
            return global_add_pool(self.conv(x, edge_index), batch)

    torch._dynamo.reset()
    counters.clear()
    model = gnncompile.compile(Net(), dynamic=True)
    pooled = PooledLoader(DS, batch_size=40, shuffle=True, generator=torch.Generator().manual_seed(0))
    plain = DataLoader(DS, batch_size=40, shuffle=True, generator=torch.Generator().manual_seed(0))
    try:
        for a, b in zip(pooled, plain):
            torch.testing.assert_close(model(a.x, a.edge_index, a.batch), model(b.x, b.edge_index, b.batch))
    finally:
        pooled.close()
    assert counters["stats"]["unique_graphs"] == 1


def test_buffers_are_reused():
    loader = PooledLoader(DS, batch_size=30, shuffle=True, pool_size=2)
    ptrs = [b.x.data_ptr() for b in loader]
    assert len(set(ptrs)) == 2  # two slots, reused in turn
    assert ptrs[0] == ptrs[2] and ptrs[1] == ptrs[3]


def test_other_attributes_follow_batch_and_scalars():
    g = torch.Generator().manual_seed(0)
    ds = []
    for i in range(40):
        n = 2 + i % 5
        ds.append(Data(x=torch.randn(n, 3, generator=g), edge_index=torch.randint(0, n, (2, 2 * n), generator=g),
                       edge_attr=torch.randn(2 * n, 2, generator=g), y=i % 3, w=float(i),
                       pos=torch.randn(n, 2, generator=g), graph_feat=torch.randn(1, 4, generator=g)))
    kw = dict(batch_size=7, shuffle=True, follow_batch=["edge_attr"])
    _compare(ds, epochs=1, pyg_kw=kw, **kw)


def test_unsupported_attributes_fall_back_to_pyg_collate():
    ds = [Data(x=torch.randn(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]]), name=f"g{i}") for i in range(10)]
    with pytest.warns(UserWarning, match="no pooling"):
        loader = PooledLoader(ds, batch_size=4)
    expected = list(DataLoader(ds, batch_size=4))
    for a, b in zip(loader, expected):
        _same(a, b, keys=("x", "edge_index", "batch"))
        assert a.name == b.name


def test_bad_arguments():
    for kw in ({"batch_size": 0}, {"pool_size": 0}, {"num_workers": -1}):
        with pytest.raises(ValueError):
            PooledLoader(DS, **kw)


# ------------------------------------------------------------- the Batch object itself
def _graphs_with_num_nodes(n=60):
    g = torch.Generator().manual_seed(4)
    out = []
    for i in range(n):
        k = 2 + i % 7
        out.append(Data(x=torch.randn(k, 3, generator=g), edge_index=torch.randint(0, k, (2, 2 * k), generator=g),
                        edge_attr=torch.randn(2 * k, 2, generator=g), y=torch.tensor([i % 3]), num_nodes=k))
    return out


@pytest.mark.parametrize("follow", [None, ["edge_attr"]])
def test_batch_bookkeeping_as_pyg(follow):
    # what PyG's own methods read from a batch (slices, increments, node counts) is PyG's
    ds = _graphs_with_num_nodes()
    kw = dict(batch_size=13, shuffle=True, follow_batch=follow)
    torch.manual_seed(5)
    expected = list(DataLoader(ds, **kw))
    torch.manual_seed(5)
    loader = PooledLoader(ds, pool_size=len(expected), **kw)
    for a, b in zip(loader, expected):
        assert type(a) is type(b)
        assert set(a._store._mapping) == set(b._store._mapping)
        assert set(a._store.__dict__) == set(b._store.__dict__)
        assert a.num_graphs == b.num_graphs and a._num_nodes == b._num_nodes
        for d in ("_slice_dict", "_inc_dict"):
            da, db = getattr(a, d), getattr(b, d)
            assert set(da) == set(db), d
            for k in db:
                assert torch.equal(da[k], db[k]), (d, k)
        for ga, gb in list(zip(a.to_data_list(), b.to_data_list())) + [(a.get_example(2), b.get_example(2))]:
            assert ga.num_nodes == gb.num_nodes
            for k in ("x", "edge_index", "edge_attr", "y"):
                assert torch.equal(ga[k], gb[k]), k


def test_batch_factory_writes_what_setattr_writes():
    from torch_geometric.data import Batch

    from gnncompile.data.loader import _BatchFactory

    x, ei, ptr = torch.randn(4, 2), torch.tensor([[0, 1], [1, 2]]), torch.tensor([0, 4])
    attrs = [("x", x), ("edge_index", ei), ("num_nodes", 4), ("ptr", ptr)]
    private = [("_num_graphs", 1), ("_slice_dict", {"x": ptr})]
    got = _BatchFactory(Data)(attrs, private)
    want = Batch(_base_cls=Data)
    for k, v in attrs + private:
        setattr(want, k, v)
    assert type(got) is type(want)
    assert list(got._store._mapping) == list(want._store._mapping)
    assert all(got._store._mapping[k] is v for k, v in want._store._mapping.items())
    assert set(got.__dict__) == set(want.__dict__)
    assert {k: v for k, v in got._store.__dict__.items() if k not in ("_mapping", "_parent")} == \
        {k: v for k, v in want._store.__dict__.items() if k not in ("_mapping", "_parent")}
    assert got._store._parent() is got


def test_batch_factory_known_setters_only_write_the_mapping():
    # the setters the factory bypasses write the storage's mapping and nothing else
    from gnncompile.data.loader import _BatchFactory
    from torch_geometric.data.storage import GlobalStorage

    known = _BatchFactory._known_setters()
    assert ("Data", "x") in known and ("GlobalStorage", "num_nodes") in known
    for (owner, k), fset in known.items():
        d = Data()
        before = dict(d._store.__dict__)
        value = torch.arange(3)
        fset(d if owner == "Data" else d._store, value)
        assert list(d._store._mapping) == [k] and d._store._mapping[k] is value, (owner, k)
        assert {n for n in d._store.__dict__ if n != "_mapping"} == {n for n in before if n != "_mapping"}
    assert isinstance(getattr(GlobalStorage, "num_nodes"), property)


def test_batch_factory_calls_a_subclass_setter():
    # a data class of the user's with its own setter for an attribute: the setter runs
    from gnncompile.data.loader import _BatchFactory

    calls = []

    class MyData(Data):
        @property
        def x(self):
            return self["x"]

        @x.setter
        def x(self, v):
            calls.append(v.shape)
            self._store.x = v * 1

    ds = [MyData(x=torch.ones(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]])) for _ in range(6)]
    calls.clear()
    b = next(iter(PooledLoader(ds, batch_size=4)))
    assert calls == [torch.Size([12, 2])]
    assert torch.equal(b.x, torch.ones(12, 2))
    assert not _BatchFactory(MyData)._is_plain("x") and _BatchFactory(MyData)._is_plain("edge_index")


# ------------------------------------------------------------- the collation kernels
from gnncompile.ops import _native  # noqa: E402
from gnncompile.ops import reference  # noqa: E402
from gnncompile.ops.schemas import ops  # noqa: E402

native_only = pytest.mark.skipif(not _native.native_loaded(), reason="native module not built")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8,
                                   torch.bool, torch.float16])
@pytest.mark.parametrize("shape", [(), (3,), (2, 4)])
@pytest.mark.parametrize("with_inc", [False, True])
def test_collate_rows_matches_reference(dtype, shape, with_inc):
    if with_inc and dtype in (torch.bool, torch.float16):
        pytest.skip("the loader adds increments only to the dtypes the kernel covers")
    g = torch.Generator().manual_seed(1)
    sizes = torch.randint(0, 6, (40,), generator=g)  # includes empty graphs
    starts = torch.cumsum(sizes, 0) - sizes
    values = (torch.randn(int(sizes.sum()), *shape, generator=g) * 50).to(dtype)
    incs = torch.randint(0, 9, (40,), generator=g) if with_inc else None
    idx = torch.randperm(40, generator=g)[:17]
    cap = int(sizes[idx].sum()) + 3
    a = torch.full((cap, *shape), 7).to(dtype)
    b = a.clone()
    ops.collate_rows(values, starts, sizes, idx, a, incs)
    reference.collate_rows(values, starts, sizes, idx, b, incs)
    assert torch.equal(a, b)
    assert torch.equal(a[-3:], torch.full((3, *shape), 7).to(dtype))  # nothing past the batch written


def test_segment_ids_matches_reference():
    sizes = torch.tensor([3, 0, 2, 5, 1])
    idx = torch.tensor([3, 1, 0, 4])
    out, ptr = torch.full((12,), -1), torch.full((6,), -1)
    ops.segment_ids(sizes, idx, out, ptr)
    assert out[:9].tolist() == [0] * 5 + [2] * 3 + [3]
    assert ptr[:5].tolist() == [0, 5, 5, 8, 9]
    out2, ptr2 = torch.full((12,), -1), torch.full((6,), -1)
    reference.segment_ids(sizes, idx, out2, ptr2)
    assert torch.equal(out, out2) and torch.equal(ptr, ptr2)


@native_only
def test_collation_kernels_reject_bad_input_without_writing():
    sizes = torch.tensor([2, 3])
    starts = torch.tensor([0, 2])
    values = torch.arange(5.0)
    out = torch.full((5,), -1.0)
    with pytest.raises(IndexError, match="out of range"):
        ops.collate_rows(values, starts, sizes, torch.tensor([0, 2]), out)
    with pytest.raises(IndexError, match="spans rows"):
        ops.collate_rows(values, torch.tensor([0, 3]), sizes, torch.tensor([1]), out)
    with pytest.raises(ValueError, match="out holds"):
        ops.collate_rows(values, starts, sizes, torch.tensor([0, 1, 1]), out)
    with pytest.raises(TypeError, match="dtype"):
        ops.collate_rows(values, starts, sizes, torch.tensor([0]), out.long())
    with pytest.raises(IndexError, match="out of range"):
        ops.segment_ids(sizes, torch.tensor([-1]), torch.empty(5, dtype=torch.long), torch.empty(3, dtype=torch.long))
    assert torch.equal(out, torch.full((5,), -1.0))  # every check ran before any write


def test_loader_without_native_kernels_gives_same_batches(monkeypatch):
    # the torch reference path (what runs when the native module is missing) collates the same
    monkeypatch.setattr(ops, "collate_rows", reference.collate_rows, raising=False)
    monkeypatch.setattr(ops, "segment_ids", reference.segment_ids, raising=False)
    kw = dict(batch_size=32, shuffle=True)
    _compare(DS, epochs=1, pyg_kw=kw, **kw)
