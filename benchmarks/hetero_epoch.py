"""Sampled mini-batch training of a heterogeneous model (to_hetero GraphSAGE): eager vs gnncompile.

    python -m benchmarks hetero_epoch            # 200k papers, ~1.4M edges of 6 types, 40 batches
    python -m benchmarks hetero_epoch --quick    # 20k papers, 8 batches

Graph (generated, shaped like OGB-MAG): papers (F = 128 features, 16 classes), authors,
institutions and fields of study; edge types ``paper cites paper`` (average in-degree 5),
``author writes paper`` (3 authors per paper), ``author affiliated_with institution``,
``paper has_topic field`` and the reverse of the last three (``rev_*``, as ``T.ToUndirected``
makes them), sources power-law distributed. Authors, institutions and fields have random
features of the same width (OGB-MAG's have none; models there learn embeddings). Loader:
``gnncompile.data.NeighborLoader(data, [10, 5], input_nodes=("paper", train), batch_size=512,
shuffle=True)``, the native heterogeneous sampler. Model: ``to_hetero(GraphSAGE((-1, -1), 128,
2, 16), metadata, aggr="sum")``; a step is forward, cross-entropy on the seed papers, backward,
Adam step.

Both models start from the same weights and train on the same batches, alternating per batch
(eager, compiled; the order swapped every other batch), after ``--warmup`` batches each
(compilation and the speed guard's first calls happen there; the first batch's losses are
compared). Reported: median step time of each over the timed batches, the ratio, the median
time to sample a batch, and Dynamo's recompilations during the timed batches (0 is wanted).
Writes benchmarks/results/hetero_epoch[_quick].{json,md}.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from pathlib import Path

import gnncompile
import torch

from . import _common

F, C, FANOUT = 128, 16, [10, 5]


def power_law_sources(n: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` node ids in [0, n), popular ones far more often (a Zipf-like weight 1 / rank^0.8)."""
    w = torch.arange(1, n + 1, dtype=torch.float64).pow(-0.8)
    ids = torch.multinomial(w, count, replacement=True, generator=gen)
    return torch.randperm(n, generator=gen)[ids]


def make_graph(papers: int, seed: int = 0):
    from torch_geometric.data import HeteroData

    g = torch.Generator().manual_seed(seed)
    n = {"paper": papers, "author": papers, "institution": max(papers // 100, 10), "field": max(papers // 50, 10)}
    d = HeteroData()
    for t, k in n.items():
        d[t].x = torch.randn(k, F, generator=g)
    d["paper"].y = torch.randint(0, C, (papers,), generator=g)

    def edges(src: str, dst: str, count: int):  # power-law sources, uniform destinations
        return torch.stack([power_law_sources(n[src], count, g), torch.randint(0, n[dst], (count,), generator=g)])

    d["paper", "cites", "paper"].edge_index = edges("paper", "paper", 5 * papers)
    d["author", "writes", "paper"].edge_index = edges("author", "paper", 3 * papers)
    d["author", "affiliated_with", "institution"].edge_index = torch.stack(
        [torch.arange(n["author"]), torch.randint(0, n["institution"], (n["author"],), generator=g)])
    d["paper", "has_topic", "field"].edge_index = torch.stack(
        [torch.arange(papers), torch.randint(0, n["field"], (papers,), generator=g)])
    for src, rel, dst in list(d.edge_types):
        if src != dst:
            d[dst, f"rev_{rel}", src].edge_index = d[src, rel, dst].edge_index.flip(0)
    return d


def _loss(model, b):
    n = b["paper"].batch_size
    out = model(b.x_dict, b.edge_index_dict)["paper"][:n]
    return torch.nn.functional.cross_entropy(out, b["paper"].y[:n])


def run(opts) -> dict:
    from torch._dynamo.utils import counters
    from torch_geometric.nn import to_hetero
    from torch_geometric.nn.models import GraphSAGE

    from gnncompile.data import NeighborLoader

    torch.set_num_threads(opts.threads)
    d = make_graph(opts.papers)
    gen = torch.Generator().manual_seed(1)
    train = torch.randperm(opts.papers, generator=gen)[: opts.batch_size * (opts.warmup + opts.batches)]
    loader = NeighborLoader(d, FANOUT, input_nodes=("paper", train), batch_size=opts.batch_size, shuffle=True,
                            seed=0)
    t0 = time.perf_counter()
    batches = []
    sample_s = []
    it = iter(loader)
    for _ in range(len(loader)):
        t = time.perf_counter()
        batches.append(next(it))
        sample_s.append(time.perf_counter() - t)
    print(f"graph and {len(batches)} batches ready in {time.perf_counter() - t0:.1f} s", flush=True)
    torch.manual_seed(0)
    eager = to_hetero(GraphSAGE((-1, -1), F, 2, C), d.metadata(), aggr="sum")
    with torch.no_grad():
        eager(batches[0].x_dict, batches[0].edge_index_dict)  # lazy shapes
    model = copy.deepcopy(eager)
    compiled = gnncompile.compile(model, dynamic=True)
    runners = {"eager": (eager, torch.optim.Adam(eager.parameters(), lr=1e-3)),
               "gnncompile": (compiled, torch.optim.Adam(model.parameters(), lr=1e-3))}
    times = {k: [] for k in runners}
    first = {}
    graphs_before = None
    for i, b in enumerate(batches):
        order = list(runners) if i % 2 == 0 else list(runners)[::-1]
        if i == opts.warmup:
            graphs_before = counters["stats"]["unique_graphs"]
        for name in order:
            m, opt = runners[name]
            t = time.perf_counter()
            opt.zero_grad()
            loss = _loss(m, b)
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t
            if i == 0:
                first[name] = float(loss)
            if i >= opts.warmup:
                times[name].append(dt)
        if i % 5 == 0 or i == len(batches) - 1:
            print(f"  batch {i + 1}/{len(batches)}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    decisions = compiled.guard_decisions() if hasattr(compiled, "guard_decisions") else None
    b = batches[-1]
    return {
        "config": {"papers": opts.papers, "batch_size": opts.batch_size, "fanout": FANOUT, "warmup": opts.warmup,
                   "timed_batches": len(times["eager"]), "threads": opts.threads,
                   "node_types": {t: d[t].num_nodes for t in d.node_types},
                   "edge_types": {"__".join(et): d[et].edge_index.size(1) for et in d.edge_types}},
        "batch_nodes": {t: b[t].num_nodes for t in b.node_types},
        "batch_edges": {"__".join(et): b[et].edge_index.size(1) for et in b.edge_types},
        "first_loss": first,
        "step_ms": {k: 1e3 * v for k, v in med.items()},
        "speedup": med["eager"] / med["gnncompile"],
        "sample_ms": 1e3 * statistics.median(sample_s),
        "recompiles_after_warmup": counters["stats"]["unique_graphs"] - graphs_before,
        "guard": [str(x) for x in decisions or []],
        "cpu": _common.cpu_model(),
        "machine": _common.machine(),
    }


def markdown(p: dict) -> str:
    c = p["config"]
    lines = [
        "# Heterogeneous sampled training: to_hetero GraphSAGE, eager vs gnncompile",
        "",
        f"CPU: {p['cpu']}, {c['threads']} threads. Generated OGB-MAG-like graph: "
        + ", ".join(f"{k} {v}" for k, v in c["node_types"].items()) + " nodes; "
        + ", ".join(f"{k} {v}" for k, v in c["edge_types"].items()) + " edges.",
        f"Native heterogeneous NeighborLoader, fanout {c['fanout']} on every edge type, batch {c['batch_size']} "
        f"papers; {c['warmup']} warm-up batches, then {c['timed_batches']} timed batches, eager and compiled "
        f"alternating on the same batches. First-batch losses: eager {p['first_loss']['eager']:.6f}, "
        f"gnncompile {p['first_loss']['gnncompile']:.6f}.",
        "",
        "| variant | step (median) | vs eager |",
        "|---|---:|---:|",
        f"| eager (PyG) | {p['step_ms']['eager']:.1f} ms | 1.00x |",
        f"| gnncompile.compile | {p['step_ms']['gnncompile']:.1f} ms | {p['speedup']:.2f}x |",
        "",
        f"Sampling one batch (median): {p['sample_ms']:.1f} ms. Recompilations during the timed batches: "
        f"{p['recompiles_after_warmup']}. Last batch: "
        + ", ".join(f"{k} {v}" for k, v in p["batch_nodes"].items()) + " nodes.",
        "Speed guard (what the compiled model kept, per piece and size class, then for the whole call):",
        "",
        *([f"- {line}" for line in p["guard"]] or ["- no decision yet (fewer calls than the guard's warm-up)"]),
        "",
        f"Command: `{p['command']}`",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks hetero_epoch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20k papers, 8 batches")
    ap.add_argument("--papers", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--batches", type=int, default=None, help="timed batches")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    opts = ap.parse_args(argv)
    opts.papers = opts.papers or (20_000 if opts.quick else 200_000)
    opts.warmup = opts.warmup if opts.warmup is not None else (4 if opts.quick else 30)
    opts.batches = opts.batches or (4 if opts.quick else 40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = run(opts)
    p["command"] = _common.command("hetero_epoch", argv)
    _common.write_results(Path(opts.out), "hetero_epoch_quick" if opts.quick else "hetero_epoch", p, markdown)
    return p


if __name__ == "__main__":
    main()
