"""GIN graph classification over mini-batches of small graphs: eager vs gnncompile (vs inductor).

    python -m benchmarks gin_batches                 # 2048 graphs, batches of 128, 3 timed epochs
    python -m benchmarks gin_batches --quick         # 256 graphs, 1 timed epoch, in-process
    python -m benchmarks gin_batches --variants eager,gnncompile

Data (generated, no downloads; ``make_dataset``): ``--graphs`` molecule-sized graphs of 10-40
nodes, each a random spanning tree (node i joined to a random earlier node) plus random extra
edges up to an average degree of 3 (class 0) or 5 (class 1), made undirected (both directions,
duplicates and self loops removed); node features N(0, 1) of width 32. Loader:
``torch_geometric.loader.DataLoader(batch_size=--batch-size, shuffle=True)`` with a seeded
generator, so every variant sees the same batches in the same order; each epoch reshuffles, so
batch sizes (nodes, edges) change from batch to batch. Model: ``torch_geometric.nn.models.GIN(32,
64, 3, 64)`` -> ``global_add_pool(h, batch, num_graphs)`` -> ``Linear(64, 2)`` (the graph count
is passed, as with torch.compile, so the pool needs no data-dependent ``batch.max()``). Step:
forward, cross-entropy, backward, Adam (lr 1e-3).

Variants:
  eager                    the model as written
  gnncompile               ``gnncompile.compile(model, dynamic=True)``
  gnncompile-static-first  ``gnncompile.compile(model)`` (dynamic=None: the first batch compiles
                           for its exact sizes, the second recompiles with symbolic sizes)
  gnncompile-aot_eager     ``gnncompile.compile(model, dynamic=True, inner="aot_eager")`` (and
  gnncompile-inductor      ``inner="inductor"``): the inner compiler forced instead of 'auto'
  inductor                 ``torch.compile(model, dynamic=True)``
The model is built once (seed 0) and deep-copied per variant (and for an eager reference);
each variant runs in its own process (``--in-process``, as ``--quick`` is: one process,
``torch._dynamo.reset()`` between variants). Per variant: one warm-up pass over all batches
(compilation happens there: reported as compile / first-pass time, with the first step's
time), the first step's loss checked against the eager reference on the same batch (1e-4
relative), then ``--repeats`` timed epochs, every step timed; reported: median step time,
eager / variant, median epoch time, recompilations during the timed epochs (Dynamo's
``unique_graphs`` counter) and graph breaks. Writes benchmarks/results/gin_batches[_quick].
{json,md,png}. Timings on a shared machine are noisy: compare ratios from the same run.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings
from pathlib import Path

import gnncompile  # (the installed package; imported before anything else)
import torch

from . import _common

F, HIDDEN, LAYERS, C = 32, 64, 3, 2
VARIANTS = ("eager", "gnncompile", "gnncompile-static-first", "gnncompile-aot_eager", "gnncompile-inductor",
            "inductor")


# ----------------------------------------------------------------------------- data and model
def make_dataset(num_graphs: int, seed: int = 0) -> list:
    """``num_graphs`` random connected graphs of 10-40 nodes (see the module docstring)."""
    from torch_geometric.data import Data
    from torch_geometric.utils import coalesce, remove_self_loops

    g = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(torch.randint(10, 41, (1,), generator=g))
        y = int(torch.randint(0, C, (1,), generator=g))
        tree_src = torch.arange(1, n)
        tree_dst = (torch.rand(n - 1, generator=g) * tree_src).long()  # a random earlier node
        extra = max(0, (3 + 2 * y) * n // 2 - (n - 1))  # undirected edges beyond the tree
        src = torch.cat([tree_src, torch.randint(0, n, (extra,), generator=g)])
        dst = torch.cat([tree_dst, torch.randint(0, n, (extra,), generator=g)])
        ei = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
        ei, _ = remove_self_loops(ei)
        ei = coalesce(ei, num_nodes=n)
        graphs.append(Data(x=torch.randn(n, F, generator=g), edge_index=ei, y=torch.tensor([y]), num_nodes=n))
    return graphs


def make_loader(dataset: list, batch_size: int):
    from torch_geometric.loader import DataLoader

    return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))


class GINClassifier(torch.nn.Module):
    def __init__(self) -> None:
        from torch_geometric.nn.models import GIN

        super().__init__()
        self.gnn = GIN(F, HIDDEN, LAYERS, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, C)

    def forward(self, x, edge_index, batch, num_graphs: int):
        from torch_geometric.nn import global_add_pool

        return self.head(global_add_pool(self.gnn(x, edge_index), batch, num_graphs))


def build_model() -> GINClassifier:
    torch.manual_seed(0)
    return GINClassifier()


def wrap(model, variant: str):
    if variant == "eager":
        return model
    if variant == "gnncompile":
        return gnncompile.compile(model, dynamic=True)
    if variant == "gnncompile-static-first":
        return gnncompile.compile(model, dynamic=None)
    if variant.startswith("gnncompile-"):
        return gnncompile.compile(model, dynamic=True, inner=variant.split("-", 1)[1])
    if variant == "inductor":
        return torch.compile(model, dynamic=True)
    raise ValueError(f"unknown variant {variant!r}")


def _loss(run, b):
    return torch.nn.functional.cross_entropy(run(b.x, b.edge_index, b.batch, b.num_graphs), b.y)


# ----------------------------------------------------------------------------- one variant
def measure(variant: str, model0: GINClassifier, dataset: list, opts) -> dict:
    """Warm-up pass (with the first-loss check), then ``opts.repeats`` timed epochs."""
    from torch._dynamo.utils import counters

    from gnncompile.compiler import STATS

    torch.set_num_threads(opts.threads)
    counters.clear()
    ref, model = copy.deepcopy(model0), copy.deepcopy(model0)
    run = wrap(model, variant)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = make_loader(dataset, opts.batch_size)
    losses = []

    def step(b) -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = _loss(run, b)
        loss.backward()
        opt.step()
        losses.append(float(loss))
        return time.perf_counter() - t0

    first_step_s, expect, ref_s = None, None, 0.0
    t0 = time.perf_counter()
    for b in loader:
        if first_step_s is None:  # the eager reference's loss on the first batch (not timed)
            t1 = time.perf_counter()
            with torch.no_grad():
                expect = float(_loss(ref, b))
            ref_s = time.perf_counter() - t1
            first_step_s = step(b)
        else:
            step(b)
    warmup_s = time.perf_counter() - t0 - ref_s
    first, batches = losses[0], len(losses)
    if abs(first - expect) > 1e-4 * abs(expect):  # relative
        raise AssertionError(f"{variant}: first-batch loss {first} != eager {expect}")
    graphs, backend = counters["stats"]["unique_graphs"], STATS["graphs"]
    breaks = sum(counters["graph_break"].values())
    step_times, epoch_times = [], []
    for _ in range(opts.repeats):
        t0 = time.perf_counter()
        step_times += [step(b) for b in loader]
        epoch_times.append(time.perf_counter() - t0)
    compiled = variant != "eager"
    return {"variant": variant, "step_s": statistics.median(step_times), "step_min_s": min(step_times),
            "epoch_s": statistics.median(epoch_times), "epoch_times_s": epoch_times,
            "batches_per_epoch": batches, "warmup_s": warmup_s, "first_step_s": first_step_s,
            "first_loss": first, "first_loss_eager": expect, "last_loss": losses[-1],
            "graphs_compiled": counters["stats"]["unique_graphs"] if compiled else 0,
            "recompiles_in_epochs": counters["stats"]["unique_graphs"] - graphs if compiled else 0,
            "backend_compiles_in_epochs": STATS["graphs"] - backend if variant.startswith("gnncompile") else 0,
            "graph_breaks": breaks if compiled else 0, "threads": torch.get_num_threads()}


def child(variant: str, opts) -> dict:
    """``variant`` in a fresh process; its result or {"error": ...}."""
    cmd = _common.module_command("gin_batches") + [
        "--child", variant, "--graphs", str(opts.graphs), "--batch-size", str(opts.batch_size),
        "--repeats", str(opts.repeats), "--threads", str(opts.threads)]
    return _common.run_child(cmd, _common.timing_env(opts.threads), opts.timeout, tail_chars=10_000)


def run_all(opts, variants) -> dict:
    results = {}
    dataset = make_dataset(opts.graphs) if opts.in_process else None
    model0 = build_model() if opts.in_process else None
    for v in variants:
        if opts.in_process:
            threads = torch.get_num_threads()
            try:
                r = measure(v, model0, dataset, opts)
            except Exception as e:  # reported, the other variants still run
                r = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
            finally:  # leave the calling process as it was
                torch._dynamo.reset()
                torch.set_num_threads(threads)
        else:
            r = child(v, opts)
        results[v] = r
        print(f"{v:<24} " + (f"{r['step_s'] * 1e3:.2f} ms/step, epoch {r['epoch_s']:.2f} s, warm-up "
                              f"{r['warmup_s']:.1f} s, first loss {r['first_loss']:.6f} (eager "
                              f"{r['first_loss_eager']:.6f}), recompiles {r['recompiles_in_epochs']}"
                              if "step_s" in r else str(r)), flush=True)
    eager = results.get("eager", {})
    for r in results.values():
        if "step_s" in r and "step_s" in eager:
            r["eager_over_this"] = eager["step_s"] / r["step_s"]
    return results


# ----------------------------------------------------------------------------- report
def markdown(p: dict) -> str:
    head = ["variant", "ms / step (median)", "eager / this", "s / epoch", "compile: warm-up pass s",
            "first step s", "recompiles in timed epochs", "graphs compiled", "graph breaks",
            "first loss (eager)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v, r in p["results"].items():
        if "step_s" not in r:
            lines.append(f"| {v} | error: {r.get('error')} |" + " |" * (len(head) - 2))
            continue
        cells = [v, f"{r['step_s'] * 1e3:.2f}", f"{r['eager_over_this']:.2f}x" if "eager_over_this" in r else "n/a",
                 f"{r['epoch_s']:.2f}", f"{r['warmup_s']:.1f}", f"{r['first_step_s']:.2f}",
                 str(r["recompiles_in_epochs"]), str(r["graphs_compiled"]), str(r["graph_breaks"]),
                 f"{r['first_loss']:.6f} ({r['first_loss_eager']:.6f})"]
        lines.append("| " + " | ".join(cells) + " |")
    m, d = p["machine"], p["dataset"]
    lines += ["", f"{d['graphs']} generated graphs ({d['nodes_min']}-{d['nodes_max']} nodes, mean "
              f"{d['nodes_mean']:.1f} nodes / {d['edges_mean']:.1f} directed edges per graph, F = {F}, "
              f"{C} classes), DataLoader batch_size {p['batch_size']} shuffled ({p['batches_per_epoch']} "
              f"batches / epoch); GIN({F}, {HIDDEN}, {LAYERS}, {HIDDEN}) + global_add_pool + "
              f"Linear({HIDDEN}, {C}), Adam. Per variant: one warm-up pass over all batches "
              f"(compilation; its time and the first step's are the compile columns), then "
              f"{p['repeats']} timed epochs; median over all timed steps. Recompiles: Dynamo's "
              f"unique_graphs during the timed epochs (0 is wanted). Inner compiler (gnncompile): "
              f"{p['inner']}. {p['threads']} threads, {'one process' if p['in_process'] else 'a process per variant'}. "
              f"torch {m['torch']}. {_common.load_text(p['loadavg_before_after'])} (a shared machine). "
              f"Command: `{p['command']}`"]
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k, r in p["results"].items() if "step_s" in r]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(2 + 2.2 * len(keys), 3.6))
    for ax, vals, unit in ((a1, [p["results"][k]["step_s"] * 1e3 for k in keys], "median ms / step"),
                           (a2, [p["results"][k]["warmup_s"] for k in keys], "warm-up (compile) pass, s")):
        ax.bar(range(len(keys)), vals, color="tab:blue")
        for i, val in enumerate(vals):
            ax.text(i, val, f"{val:.1f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(keys)), keys, fontsize=7, rotation=15)
        ax.set_ylabel(unit)
    fig.suptitle(f"GIN, {p['dataset']['graphs']} graphs, batch {p['batch_size']}, {p['threads']} threads",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="256 graphs, 1 timed epoch, in-process")
    ap.add_argument("--graphs", type=int, default=None, help="default 2048 (quick 256)")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=None, help="timed epochs (default 3, quick 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    ap.add_argument("--in-process", action="store_true", help="all variants in this process")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per variant process")
    ap.add_argument("--out", default=None)
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if opts.graphs is None:
        opts.graphs = 256 if opts.quick else 2048
    if opts.repeats is None:
        opts.repeats = 1 if opts.quick else 3
    opts.in_process = opts.in_process or opts.quick
    if opts.child:
        torch.set_num_threads(opts.threads)
        out = measure(opts.child, build_model(), make_dataset(opts.graphs), opts)
        print("RESULT " + json.dumps(out), flush=True)
        return out
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variants {bad}; known: {', '.join(VARIANTS)}")
    from gnncompile import config as _cfg
    from gnncompile.compiler import backend as _be

    load_before = _common.loadavg()
    results = run_all(opts, variants)
    ds = make_dataset(opts.graphs)
    nodes = [d.num_nodes for d in ds]
    payload = {"machine": _common.machine(), "loadavg_before_after": [load_before, _common.loadavg()],
               "dataset": {"graphs": opts.graphs, "nodes_min": min(nodes), "nodes_max": max(nodes),
                           "nodes_mean": sum(nodes) / len(nodes),
                           "edges_mean": sum(d.num_edges for d in ds) / len(ds),
                           "class_counts": torch.bincount(torch.cat([d.y for d in ds]), minlength=C).tolist()},
               "batch_size": opts.batch_size, "batches_per_epoch": -(-opts.graphs // opts.batch_size),
               "repeats": opts.repeats, "threads": opts.threads, "in_process": opts.in_process,
               "variants": variants, "inner": (_cfg.current().inner or
                                                    f"auto (eager below {_be.AUTO_INDUCTOR_MIN_SIZE} "
                                                    "nodes + edges, else inductor; -<inner> variants force one)"),
               "results": results,
               "command": _common.command("gin_batches", argv)}
    name = opts.out or ("gin_batches_quick" if opts.quick else "gin_batches")
    _common.write_results(Path(opts.results_dir), name, payload, markdown, plot)
    return payload


if __name__ == "__main__":
    main()
