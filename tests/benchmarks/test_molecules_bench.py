"""benchmarks/molecules.py: the eager-allocator variant (the model as written under what compile()
turns on process-wide for a CPU model: huge pages and the block cache) is the model itself, with
the allocator settings applied; it is a known variant. Speed is not asserted."""
from __future__ import annotations

from benchmarks import molecules as M
from gnncompile.hardware import memory


def test_eager_allocator_is_the_model_with_the_allocator_settings(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "apply", lambda choice, devices: calls.append(("huge_pages", choice, devices)) or "x")
    monkeypatch.setattr(memory, "apply_cache", lambda choice, devices: calls.append(("cache", choice, devices)) or "y")
    model = M.build_model("gin")
    assert M.wrap(model, "eager-allocator") is model
    assert calls == [("huge_pages", "auto", {"cpu"}), ("cache", "auto", {"cpu"})]
    calls.clear()
    assert M.wrap(model, "eager") is model and calls == []
    assert "eager-allocator" in M.ALLOCATOR_VARIANTS


def test_legacy_loader_variant_gives_the_same_batches(monkeypatch):
    # the "before" of the loader's cut assembles the same batches as the current loader and PyG's
    import torch
    from torch_geometric.loader import DataLoader

    from gnncompile.data import PooledLoader
    from gnncompile.data.loader import _Store

    ds = M.make_dataset(40)
    now = [b.clone() for b in PooledLoader(ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2))]
    monkeypatch.setattr(_Store, "collate_into", _Store.collate_into)  # restored after the test
    monkeypatch.setattr(_Store, "make_batch", _Store.make_batch)
    M.use_legacy_loader()
    assert _Store.make_batch is M._legacy_make_batch and _Store.collate_into is M._legacy_collate_into
    before = [b.clone() for b in PooledLoader(ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2))]
    pyg = list(DataLoader(ds, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(2)))
    assert len(now) == len(before) == len(pyg) == 3
    for a, b, c in zip(now, before, pyg):
        for k in ("x", "edge_index", "edge_attr", "y", "batch", "ptr"):
            assert torch.equal(a[k], c[k]) and torch.equal(b[k], c[k]), k
        for k in c._slice_dict:
            assert torch.equal(a._slice_dict[k], c._slice_dict[k]) and torch.equal(b._slice_dict[k], c._slice_dict[k])
            assert torch.equal(a._inc_dict[k], c._inc_dict[k]) and torch.equal(b._inc_dict[k], c._inc_dict[k])
    assert "gnncompile-pooled-loader-before" in M.LOADER_VARIANTS


def test_combine_reports_paired_interval_and_loader_time():
    eager = [{"epoch_s": 1.0, "step_s": 0.010, "first_epoch_s": 1.0, "step_fresh_s": 0.01, "loader_s": 0.1,
              "graph_breaks": 0, "graphs_compiled": 0, "recompiles_after_first_epoch": 0,
              "breakdown_ms": dict.fromkeys(M.GROUPS, 0.0)} for _ in range(3)]
    runs = [dict(e, epoch_s=t, loader_s=0.01) for e, t in zip(eager, (0.5, 0.5, 0.5))]
    out = M.combine(runs, eager)
    assert out["eager_over_epoch_s"] == 2.0 and out["loader_s"] == 0.01
    iv = out["eager_over_epoch_s_interval"]
    assert abs(iv["ratio"] - 2.0) < 1e-9 and abs(iv["low"] - 2.0) < 1e-9 and iv["pairs"] == 3
    runs[0]["epoch_s"] = 0.4  # a spread: the interval widens around the geometric mean
    iv = M.combine(runs, eager)["eager_over_epoch_s_interval"]
    assert iv["low"] < iv["ratio"] < iv["high"] and iv["low"] < 2.0 < iv["high"]
