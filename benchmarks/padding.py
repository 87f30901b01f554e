"""What PooledLoader(pad_to_buckets) costs on the CPU: padding overhead per bucket count, the loader's epoch, a plain step.

    python -m benchmarks padding [--graphs 4000 --batch-size 128 --repeats 7] [--out benchmarks/results]

Molecule-sized graph classification (gnncompile.data.synthetic.graph_dataset: 10-40 nodes,
average degree 2.2, 32 features, 8 edge features), batches of --batch-size graphs, shuffled.

1. Padding overhead, per bucket count k (1, 2, 3, 4, 6): the buckets chosen from the data, and
   over one shuffled epoch the padded / real nodes and edges (``padding_stats()``). Exact counts,
   no timing.
2. The loader alone, one epoch (every batch requested, nothing done with it), unpadded and
   padded (k = 3), interleaved, median of --repeats epochs.
3. A plain training step (PyG GINEConv x 3, width 64, global_add_pool with size, cross-entropy,
   Adam) on the same epoch's batches, prebuilt, unpadded and padded (k = 3), interleaved, median
   of --repeats epochs: on the CPU padding is extra work and nothing else (there is no CUDA
   graph to gain), so this is its price.

Writes padding.json and padding.md to --out.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from . import _common


def _dataset(n: int):
    from gnncompile.data import graph_dataset

    ds = graph_dataset(n, 10, 40, num_features=32, num_classes=2, avg_degree=2.2, seed=0)
    g = torch.Generator().manual_seed(1)
    for d in ds:
        d.edge_attr = torch.randn(d.edge_index.size(1), 8, generator=g)
    return ds


def _model():
    from .cuda_graphs import _models

    return _models(8, classes=2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", type=int, default=4000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-timing", action="store_true", help="part 1 only (exact counts)")
    ap.add_argument("--out", default=os.path.join("benchmarks", "results"))
    args = ap.parse_args(argv)
    from gnncompile.data import PooledLoader

    torch.set_num_threads(args.threads)
    ds = _dataset(args.graphs)
    res = {"machine": _common.machine(), "cpu": _common.cpu_model(), "graphs": args.graphs, "batch_size": args.batch_size, "overhead": {}, "threads": args.threads}
    for k in (1, 2, 3, 4, 6):
        L = PooledLoader(ds, batch_size=args.batch_size, shuffle=True, pad_to_buckets=k,
                         generator=torch.Generator().manual_seed(0))
        for _ in L:
            pass
        res["overhead"][k] = L.padding_stats()
        L.close()
    if args.no_timing:
        args.repeats = 0
    # the loader alone, and a plain step, interleaved
    gen = lambda: torch.Generator().manual_seed(0)
    loaders = {"unpadded": PooledLoader(ds, batch_size=args.batch_size, shuffle=True, generator=gen()),
               "padded": PooledLoader(ds, batch_size=args.batch_size, shuffle=True, generator=gen(), pad_to_buckets=3)}
    batches = {v: [b.clone() for b in L] for v, L in loaders.items()}
    torch.manual_seed(0)
    base = _model()
    models = {v: copy.deepcopy(base) for v in loaders}
    opts = {v: torch.optim.Adam(m.parameters(), lr=1e-3) for v, m in models.items()}

    def step(v, b):
        opts[v].zero_grad(set_to_none=True)
        loss = F.cross_entropy(models[v](b), b.y, ignore_index=-100)
        loss.backward()
        opts[v].step()
        return loss.detach()

    load = [_common.loadavg()]
    first = {v: float(step(v, batches[v][0])) for v in loaders}
    loader_ms = {v: [] for v in loaders}
    step_ms = {v: [] for v in loaders}
    for _ in range(args.repeats):
        for v, L in loaders.items():
            t0 = time.perf_counter()
            for _b in L:
                pass
            loader_ms[v].append((time.perf_counter() - t0) * 1e3)
        for v in loaders:
            t0 = time.perf_counter()
            for b in batches[v]:
                step(v, b)
            step_ms[v].append((time.perf_counter() - t0) * 1e3 / len(batches[v]))
    load.append(_common.loadavg())
    res["loadavg_before_after"] = load
    q = lambda xs: {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "all": xs} if xs else None
    res["loader_epoch_ms"] = {v: q(x) for v, x in loader_ms.items()}
    res["step_ms"] = {v: q(x) for v, x in step_ms.items()}
    res["first_loss"] = first
    res["padded_stats_k3"] = res["overhead"][3]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "padding.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    lines = [f"# Padding to buckets on the CPU (`python -m benchmarks padding`)", "",
             f"{args.graphs} graphs of 10-40 nodes (average degree 2.2, 32 features, 8 edge features), batches of "
             f"{args.batch_size}, shuffled; {args.threads} threads; {res['cpu']}, torch {res['machine']['torch']}. "
             f"{_common.load_text(load)}.", "",
             "## Padding overhead over one epoch (exact counts)", "",
             "| buckets | chosen (nodes x edges) | node overhead | edge overhead | graph slots overhead |",
             "|---:|---|---:|---:|---:|"]
    for k, st in res["overhead"].items():
        bs = ", ".join(f"{a}x{b}" for a, b in st["buckets"])
        lines.append(f"| {k} | {bs} | {st['node_overhead']:.1%} | {st['edge_overhead']:.1%} | "
                     f"{st['graph_overhead']:.1%} |")
    lu, lp = res["loader_epoch_ms"]["unpadded"], res["loader_epoch_ms"]["padded"]
    su, sp = res["step_ms"]["unpadded"], res["step_ms"]["padded"]
    if lu is None:
        lines += ["", "(No timing: --no-timing.)", "",
                  f"First losses: unpadded {first['unpadded']:.6f}, padded {first['padded']:.6f}.", ""]
    else:
        lines += ["", f"## Time, 3 buckets, interleaved, median (min-max) of {args.repeats}", "",
                  "| | unpadded | padded (3 buckets) | padded / unpadded |", "|---|---:|---:|---:|",
                  f"| loader alone, epoch (ms) | {lu['median']:.1f} ({lu['min']:.1f}-{lu['max']:.1f}) | "
                  f"{lp['median']:.1f} ({lp['min']:.1f}-{lp['max']:.1f}) | {lp['median'] / lu['median']:.2f} |",
                  f"| plain GINE step, eager (ms) | {su['median']:.2f} ({su['min']:.2f}-{su['max']:.2f}) | "
                  f"{sp['median']:.2f} ({sp['min']:.2f}-{sp['max']:.2f}) | {sp['median'] / su['median']:.2f} |",
                  "", f"First losses: unpadded {first['unpadded']:.6f}, padded {first['padded']:.6f}.", ""]
    with open(os.path.join(args.out, "padding.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
