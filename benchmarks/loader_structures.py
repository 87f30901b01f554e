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

Then, end to end, in one process per model (``--models``; GIN, GINE(edge_dim=8), GCN of
benchmarks/molecules.py, compiled once with ``gnncompile.compile(model, dynamic=True)`` and the
speed guard off, so that every loader feeds the same rewritten graph): epochs of the training step
(forward, cross-entropy, backward, Adam) over each loader in rotation (``--rotations`` times),
the median epoch per loader; and the model alone on prebuilt batches, each step on a fresh copy
of its edge_index, with and without the structure prepared before the timed step, alternating
step by step. Loaders: PooledLoader without workers (structures off / on), with 2 persistent
workers (off / on), PyG's DataLoader (plain / through ``prefetch_structures``).

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


LOADERS = ("pooled", "pooled+struct", "pooled-w2", "pooled-w2+struct", "pyg", "pyg+prefetch")


def end_to_end(kind: str, opts) -> dict:
    """One model (a child process: the speed guard off in its environment)."""
    import copy

    from gnncompile.data import PooledLoader, prefetch_structures
    from gnncompile.ops.structure import prepare_structure
    from torch_geometric.loader import DataLoader

    from .molecules import _loss, build_model, make_dataset

    torch.set_num_threads(opts.threads)
    ds = make_dataset(opts.graphs)
    model = build_model(kind)
    ref = copy.deepcopy(model)
    run = gnncompile.compile(model, dynamic=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    bs = opts.batch_size

    def step(b):
        opt.zero_grad(set_to_none=True)
        loss = _loss(run, b)
        loss.backward()
        opt.step()
        return loss

    def gen():
        return torch.Generator().manual_seed(0)

    loaders = {
        "pooled": PooledLoader(ds, batch_size=bs, shuffle=True, generator=gen(), structures=False),
        "pooled+struct": PooledLoader(ds, batch_size=bs, shuffle=True, generator=gen(), structures=True),
        "pooled-w2": PooledLoader(ds, batch_size=bs, shuffle=True, generator=gen(), num_workers=2,
                                  persistent_workers=True, structures=False),
        "pooled-w2+struct": PooledLoader(ds, batch_size=bs, shuffle=True, generator=gen(), num_workers=2,
                                         persistent_workers=True, structures=True),
    }
    pyg = DataLoader(ds, batch_size=bs, shuffle=True, generator=gen())
    iters = {name: (lambda l=l: iter(l)) for name, l in loaders.items()}
    iters["pyg"] = lambda: iter(pyg)
    iters["pyg+prefetch"] = lambda: prefetch_structures(pyg, depth=2)
    # numerical agreement first: the first batch against the eager model
    b0 = next(iter(DataLoader(ds, batch_size=bs)))
    with torch.no_grad():
        got, want = float(_loss(run, b0)), float(_loss(ref, b0))
    assert abs(got - want) <= 1e-4 * abs(want), (kind, got, want)
    for name in LOADERS:  # warm: compile, workers started
        for b in iters[name]():
            step(b)
    times = {name: [] for name in LOADERS}
    from gnncompile.ops import structure as S

    builds = {name: [] for name in LOADERS}
    for _ in range(opts.rotations):
        for name in LOADERS:
            b0_ = S.cache_info()["builds"]
            t0 = time.perf_counter()
            n = 0
            for b in iters[name]():
                step(b)
                n += 1
            times[name].append(time.perf_counter() - t0)
            builds[name].append((S.cache_info()["builds"] - b0_) / n)
    for l in loaders.values():
        l.close()
    # the model alone, fresh edge_index each step; prepared or not, alternating
    pre = [b.clone() for b in DataLoader(ds, batch_size=bs, shuffle=True, generator=gen())]
    alone = {"not prepared": [], "prepared": []}
    for r in range(opts.passes):
        for i, b in enumerate(pre):
            prepared = (i + r) % 2 == 0
            b.edge_index = b.edge_index.clone()
            if prepared:
                prepare_structure(b.edge_index, b.num_nodes)
            t0 = time.perf_counter()
            step(b)
            alone["prepared" if prepared else "not prepared"].append(time.perf_counter() - t0)
    return {"model": kind, "epoch_s": {k: statistics.median(v) for k, v in times.items()},
            "epoch_times_s": times, "step_builds_per_batch": {k: statistics.median(v) for k, v in builds.items()},
            "alone_step_s": {k: statistics.median(v) for k, v in alone.items()},
            "loss_check": [got, want], "batches": len(pre)}


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
    lines = ["In-process, per batch:", "", "| what | where it runs | us (median) |", "|---|---|---|"]
    lines += [f"| {text} | {where} | {p['us'][k]:.1f} |" for k, text, where in ROWS]
    us = p["us"]
    lines += ["", f"Per step in the main thread: without preparing, {us['lookup_miss']:.1f} us; with workers "
              f"preparing, {us['adopt'] + us['lookup_prepared'] + us['release']:.1f} us (adopt + hits + release); "
              f"with no workers, {us['prepare_inline'] + us['lookup_prepared'] + us['release']:.1f} us "
              f"(prepare + hits + release: the work moves out of the step, not off the main thread).", "",
              f"Molecule batches of {p['batch_size']} ({p['graphs']} generated graphs; mean {p['nodes_mean']:.0f} "
              f"nodes, {p['edges_mean']:.0f} edges), median over {p['repeats']} batches, each on a fresh "
              f"edge_index copy; {p['threads']} threads; CPU: {p['cpu']}; torch {p['machine']['torch']}. "
              f"Command: `{p['command']}`"]
    e2e = p.get("end_to_end", {})
    if e2e:
        lines += ["", "End to end (s / epoch, median of " + str(p["rotations"]) + " epochs per loader, loaders in "
                  "rotation in one process, one compiled model, speed guard off; in brackets the structure builds "
                  "per batch in the step):", "",
                  "| model | " + " | ".join(LOADERS) + " | model alone, fresh edge_index: not prepared / prepared, "
                  "ms / step |", "|---|" + "---|" * (len(LOADERS) + 1)]
        for kind, r in e2e.items():
            if "epoch_s" not in r:
                lines.append(f"| {kind} | error: {str(r.get('error', ''))[:200]} |" + " |" * len(LOADERS))
                continue
            cells = [f"{r['epoch_s'][n]:.4f} ({r['step_builds_per_batch'][n]:.0f})" for n in LOADERS]
            a = r["alone_step_s"]
            lines.append(f"| {kind} | " + " | ".join(cells) + f" | {a['not prepared'] * 1e3:.3f} / "
                         f"{a['prepared'] * 1e3:.3f} |")
        lines += ["", "Paired ratios (each rotation's epoch with the structures over the one without, same rotation; "
                  "median [min, max]; < 1 is faster):", "",
                  "| model | pooled+struct / pooled | pooled-w2+struct / pooled-w2 | pyg+prefetch / pyg |",
                  "|---|---|---|---|"]
        for kind, r in e2e.items():
            if "epoch_times_s" not in r:
                continue
            t = r["epoch_times_s"]
            cells = []
            for a, b in (("pooled", "pooled+struct"), ("pooled-w2", "pooled-w2+struct"), ("pyg", "pyg+prefetch")):
                rs = [y / x for x, y in zip(t[a], t[b])]
                cells.append(f"{statistics.median(rs):.3f} [{min(rs):.3f}, {max(rs):.3f}]")
            lines.append(f"| {kind} | " + " | ".join(cells) + " |")
        lines += ["", f"{p['graphs']} graphs, batches of {p['batch_size']} ({p['batches']} a epoch); the model alone over "
                  f"{p['passes']} passes, prepared and not prepared alternating step by step."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=4000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="gin,gine,gcn", help="end to end: comma list ('' for none)")
    ap.add_argument("--rotations", type=int, default=5, help="end to end: epochs per loader")
    ap.add_argument("--passes", type=int, default=4, help="model alone: passes over the batches")
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if opts.child:
        import json

        out = end_to_end(opts.child, opts)
        print("RESULT " + json.dumps(out), flush=True)
        return out
    p = measure(opts)
    p["command"] = _common.command("loader_structures", argv)
    p.update(rotations=opts.rotations, passes=opts.passes, end_to_end={})
    env = _common.timing_env(opts.threads)
    env["GNNCOMPILE_GUARD"] = "off"
    for kind in [m for m in opts.models.split(",") if m]:
        cmd = _common.module_command("loader_structures") + [
            "--child", kind, "--graphs", str(opts.graphs), "--batch-size", str(opts.batch_size), "--threads",
            str(opts.threads), "--rotations", str(opts.rotations), "--passes", str(opts.passes)]
        r = _common.run_child(cmd, env, opts.timeout, tail_chars=2000)
        p["end_to_end"][kind] = r
        if "epoch_s" in r:
            p["batches"] = r["batches"]
            print(kind, {k: round(v, 4) for k, v in r["epoch_s"].items()}, r["alone_step_s"], flush=True)
        else:
            print(kind, r, flush=True)
    _common.write_results(Path(opts.results_dir), "loader_structures", p, markdown)
    return p


if __name__ == "__main__":
    main()
