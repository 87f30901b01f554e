"""The batch structure prepared by the loader (issue 24 point 2), in-process micro figures.

    python -m benchmarks loader_structures              # molecule batches of 128, 2 threads

On the molecule batches of ``benchmarks/molecules.py`` (4000 generated graphs, batches of 128:
~3200 nodes, ~6500 edges), the median (over ``--repeats`` batches, each on a fresh copy of its
edge_index, as a loader hands out) of:

* the step's structure lookups, ``cached_csr`` + ``cached_csc`` as a compiled GIN step calls
  them, when nothing was prepared (a miss: fingerprint, build_csr, transpose) and when the loader
  prepared the structure (two identity hits);
* what the loader pays instead: with no workers, ``StructureCache.prepare`` in the main thread;
  with workers, the worker's build into the slot (one thread, in the worker process) and the
  parent's adoption (``PooledLoader._hand_structure``: six tensors on the slot, the native
  record, the cache entry) and release (``_unhand``).

Writes benchmarks/results/loader_structures.{json,md}.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import gnncompile  # noqa: F401
import torch

from . import _common


def _median_us(samples):
    return statistics.median(samples) * 1e6


def measure(opts) -> dict:
    from gnncompile.data import PooledLoader
    from gnncompile.data.loader import _build_structure_into
    from gnncompile.ops import structure as S
    from torch_geometric.loader import DataLoader

    from .molecules import make_dataset

    torch.set_num_threads(opts.threads)
    ds = make_dataset(opts.graphs)
    batches = [b.clone() for b in DataLoader(ds, batch_size=opts.batch_size, shuffle=True,
                                             generator=torch.Generator().manual_seed(0))]
    ops = torch.ops.gnncompile
    res = {k: [] for k in ("lookup_miss", "lookup_prepared", "prepare_inline", "worker_build",
                           "adopt", "release")}
    S.clear_cache()
    for i in range(opts.repeats):
        b = batches[i % len(batches)]
        n = b.num_nodes
        ei = b.edge_index.clone()
        t0 = time.perf_counter()
        ops.cached_csr(ei, n)
        ops.cached_csc(ei, n, n)
        res["lookup_miss"].append(time.perf_counter() - t0)
        ei = b.edge_index.clone()
        t0 = time.perf_counter()
        S.CACHE.prepare(ei, n)
        res["prepare_inline"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ops.cached_csr(ei, n)
        ops.cached_csc(ei, n, n)
        res["lookup_prepared"].append(time.perf_counter() - t0)
    # the workers' path, both halves in this process (the worker's on one thread, as in a worker)
    loader = PooledLoader(ds, batch_size=opts.batch_size, num_workers=1, structures=True)
    store = loader._store
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(1))
    for i in range(opts.repeats):
        idx = order[(i * opts.batch_size) % (len(ds) - opts.batch_size):][:opts.batch_size]
        used = store.collate_into(idx, loader._host[0])
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        _build_structure_into(store, loader._host[0], used, loader._sbufs[0])
        res["worker_build"].append(time.perf_counter() - t0)
        torch.set_num_threads(opts.threads)
        batch = store.make_batch(idx, loader._host[0], used)
        t0 = time.perf_counter()
        loader._hand_structure(0, batch, used)
        res["adopt"].append(time.perf_counter() - t0)
        v0, i0 = S.validation_count(), S.cache_info()
        ops.cached_csr(batch.edge_index, batch.num_nodes)
        ops.cached_csc(batch.edge_index, batch.num_nodes, batch.num_nodes)
        assert S.validations_since(v0) == 0 and S.cache_info()["builds"] == i0["builds"]
        t0 = time.perf_counter()
        loader._unhand(0)
        res["release"].append(time.perf_counter() - t0)
    loader.close()
    nodes = statistics.mean(b.num_nodes for b in batches)
    edges = statistics.mean(b.num_edges for b in batches)
    return {"us": {k: _median_us(v) for k, v in res.items()}, "repeats": opts.repeats, "threads": opts.threads,
            "batch_size": opts.batch_size, "graphs": opts.graphs, "nodes_mean": nodes, "edges_mean": edges,
            "cpu": _common.cpu_model(), "machine": _common.machine()}


ROWS = (("lookup_miss", "step: cached_csr + cached_csc, nothing prepared (miss: build)", "in the step"),
        ("lookup_prepared", "step: cached_csr + cached_csc, prepared by the loader (identity hits)", "in the step"),
        ("prepare_inline", "loader, no workers: StructureCache.prepare", "main thread, before the step"),
        ("worker_build", "loader, workers: build into the slot (1 thread)", "worker process"),
        ("adopt", "loader, workers: parent adopts (_hand_structure)", "main thread, at delivery"),
        ("release", "loader: slot handed out again (_unhand)", "main thread, at next()"))


def markdown(p: dict) -> str:
    lines = ["| what | where it runs | us (median) |", "|---|---|---|"]
    lines += [f"| {text} | {where} | {p['us'][k]:.1f} |" for k, text, where in ROWS]
    us = p["us"]
    lines += ["", f"Per step in the main thread: without preparing, {us['lookup_miss']:.1f} us; with workers "
              f"preparing, {us['adopt'] + us['lookup_prepared'] + us['release']:.1f} us (adopt + hits + release); "
              f"with no workers, {us['prepare_inline'] + us['lookup_prepared'] + us['release']:.1f} us "
              f"(prepare + hits + release: the work moves out of the step, not off the main thread).", "",
              f"Molecule batches of {p['batch_size']} ({p['graphs']} generated graphs; mean {p['nodes_mean']:.0f} "
              f"nodes, {p['edges_mean']:.0f} edges), median over {p['repeats']} batches, each on a fresh "
              f"edge_index copy; {p['threads']} threads; CPU: {p['cpu']}; torch {p['machine']['torch']}. "
              f"Command: `python -m benchmarks loader_structures`"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=4000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    p = measure(opts)
    _common.write_results(Path(opts.results_dir), "loader_structures", p, markdown)
    return p


if __name__ == "__main__":
    main()
