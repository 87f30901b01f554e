"""One epoch of sampled mini-batch GraphSAGE training: eager vs gnncompile, per loader setting.

    python benchmarks/neighbor_epoch.py                       # 1M nodes / 10M edges, 50k train seeds
    python benchmarks/neighbor_epoch.py --profile PATH        # also the loader settings of a profile
    python benchmarks/neighbor_epoch.py --quick               # 20k nodes, 1k train seeds, in-process

Graph: ``power_law_graph(N, 10 N, seed=0)`` with random features (F = 128) and 16 random
classes. Training set: a fixed random ``--train-fraction`` (default 5%) of the nodes; the whole
1M nodes would be ~980 batches per epoch, too slow here, so "one epoch" is one pass over that
training set (50k seeds = 49 batches of 1024). Loader: ``gnncompile.data.NeighborLoader(data,
[15, 10], input_nodes=train, shuffle=True, seed=0)``. Model: ``torch_geometric.nn.models.
GraphSAGE(128, 128, 2, 16)``; a step is forward on the batch, cross-entropy on its seeds,
backward, Adam step.

Variants (each a model variant x a loader setting):
  eager / gnncompile   the model as written / ``gnncompile.compile(model, dynamic=True,
                       profile=None)`` (``--dynamic none`` for automatic dynamic shapes)
  default              ``batch_size=1024``, the loader's defaults (no workers)
  profile              (with ``--profile``) the profile's loader settings (batch size, workers,
                       prefetch depth, ...; NeighborLoader(profile=...)), its thread count, and
                       for gnncompile its kernel knobs (``compile(profile=PATH)``)

Per variant (its own process, under MALLOC_MMAP_THRESHOLD_=65536, unless ``--in-process``):
``--warmup`` batches first (compilation happens there), then the first batch's loss is
checked against the eager model on the same batch, then one timed epoch (a new shuffle),
inside ``_common.read_peak_rss_delta``. Reported: seconds per epoch, seeds/s, peak RSS added
during the epoch, recompilations during the timed epoch (Dynamo's ``unique_graphs`` counter;
0 is wanted), the sampling-only time of an epoch (the loader iterated without training), and
the time to build the per-batch structure (CSR by destination + its transpose, what the
compiled graph's structure ops build once per batch) measured with
``gnncompile.ops.structure.build`` on the first ``--structure-batches`` batches, next to the
structure cache's build count. Writes benchmarks/results/neighbor_epoch[_quick].{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import gnncompile  # noqa: E402,F401  (the installed package; imported before anything else)
import torch  # noqa: E402

F, C, FANOUT = 128, 16, [15, 10]


# ----------------------------------------------------------------------------- one variant
def make_data(N: int, train_fraction: float):
    from torch_geometric.data import Data

    from gnncompile.data import power_law_graph

    ei = power_law_graph(N, 10 * N, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g)
    y = torch.randint(0, C, (N,), generator=g)
    train = torch.randperm(N, generator=g)[: max(1, int(N * train_fraction))]
    return Data(x=x, y=y, edge_index=ei, num_nodes=N), train


def make_loader(data, train, setting: str, opts):
    from gnncompile.data import NeighborLoader

    if setting == "profile":
        return NeighborLoader(data, FANOUT, input_nodes=train, shuffle=True, seed=0, profile=opts.profile)
    return NeighborLoader(data, FANOUT, input_nodes=train, shuffle=True, seed=0, batch_size=opts.batch_size)


def _loss(model, batch):
    out = model(batch.x, batch.edge_index)[: batch.batch_size]
    return torch.nn.functional.cross_entropy(out, batch.y[: batch.batch_size])


def structure_time(batches) -> float:
    """Median seconds to build one batch's CSR and its transpose (as the structure cache does)."""
    from gnncompile.ops import structure

    ts = []
    if batches:
        structure.build(*batches[0]).transposed(batches[0][1])  # first-call overheads
    for ei, n in batches:
        t0 = time.perf_counter()
        s = structure.build(ei, n)
        s.transposed(n)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def sampling_epoch(loader) -> float:
    t0 = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - t0


def run_variant(data, train, model_kind: str, setting: str, opts) -> dict:
    """Warm-up, agreement check, one timed epoch; see the module docstring."""
    from torch._dynamo.utils import counters
    from torch_geometric.nn.models import GraphSAGE

    from gnncompile.compiler import STATS
    from gnncompile.hardware import profiles
    from gnncompile.ops import structure

    torch.set_num_threads(opts.threads)
    if setting == "profile":
        profiles.resolve(opts.profile).apply(threads=True)
    torch.manual_seed(0)
    model = GraphSAGE(F, 128, 2, C)
    ref = GraphSAGE(F, 128, 2, C)
    ref.load_state_dict(model.state_dict())
    dynamic = None if opts.dynamic == "none" else True
    run = model if model_kind == "eager" else gnncompile.compile(
        model, dynamic=dynamic, profile=opts.profile if setting == "profile" else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = make_loader(data, train, setting, opts)
    counters.clear()
    losses = []

    def step(batch):
        opt.zero_grad(set_to_none=True)
        loss = _loss(run, batch)
        loss.backward()
        opt.step()
        losses.append(float(loss))

    t0 = time.perf_counter()
    it = iter(loader)
    first = next(it)
    with torch.no_grad():
        expect = float(_loss(ref, first))
    step(first)
    for _, batch in zip(range(opts.warmup - 1), it):
        step(batch)
    warm_s = time.perf_counter() - t0
    del it
    if abs(losses[0] - expect) > 1e-4 * max(1.0, abs(expect)):
        raise AssertionError(f"{model_kind}: first-batch loss {losses[0]} != eager {expect}")
    graphs_before = counters["stats"]["unique_graphs"]
    backend_before = STATS["graphs"]
    builds_before = structure.cache_info()["builds"]
    kept, n_batches = [], [0]

    def epoch():
        for batch in loader:
            if len(kept) < opts.structure_batches:
                kept.append((batch.edge_index.clone(), batch.num_nodes))
            step(batch)
            n_batches[0] += 1

    t0 = time.perf_counter()
    peak = _common.read_peak_rss_delta(epoch)
    epoch_s = time.perf_counter() - t0
    return {"epoch_s": epoch_s, "seeds_per_s": train.numel() / epoch_s, "peak_bytes": peak,
            "batches": n_batches[0], "warmup_s": warm_s, "warmup_batches": opts.warmup,
            "first_loss": losses[0], "first_loss_eager": expect, "last_loss": losses[-1],
            "recompiles_in_epoch": counters["stats"]["unique_graphs"] - graphs_before,
            "graphs_compiled": counters["stats"]["unique_graphs"],
            "backend_compiles_in_epoch": STATS["graphs"] - backend_before,
            "structure_builds_in_epoch": structure.cache_info()["builds"] - builds_before,
            "structure_s_per_batch": structure_time(kept), "sampling_epoch_s": sampling_epoch(loader),
            "loader_settings": {k: v for k, v in loader.settings.items() if v is not None},
            "threads": torch.get_num_threads()}


# ----------------------------------------------------------------------------- driver
def variants(opts):
    settings = ["default"] + (["profile"] if opts.profile else [])
    return [(m, s) for s in settings for m in ("eager", "gnncompile")]


def child_args(opts) -> list:
    args = ["--nodes", str(opts.nodes), "--train-fraction", str(opts.train_fraction), "--batch-size",
            str(opts.batch_size), "--warmup", str(opts.warmup), "--threads", str(opts.threads),
            "--dynamic", opts.dynamic, "--structure-batches", str(opts.structure_batches)]
    return args + (["--profile", opts.profile] if opts.profile else [])


def run_all(opts) -> dict:
    results = {}
    data = train = None
    for model_kind, setting in variants(opts):
        key = f"{model_kind}/{setting}"
        if opts.in_process:
            if data is None:
                data, train = make_data(opts.nodes, opts.train_fraction)
            try:
                results[key] = run_variant(data, train, model_kind, setting, opts)
            finally:
                torch._dynamo.reset()
        else:
            cmd = [sys.executable, __file__, "--child", model_kind, setting] + child_args(opts)
            p = subprocess.run(cmd, capture_output=True, text=True, env=_common.isolated_env(),
                               timeout=opts.timeout)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
            results[key] = (json.loads(lines[-1][7:]) if p.returncode == 0 and lines else
                            {"error": ((p.stderr or p.stdout).strip().splitlines() or ["failed"])[-1]})
        r = results[key]
        print(f"{key:<22} " + (f"{r['epoch_s']:.2f} s/epoch, {r['seeds_per_s']:.0f} seeds/s, peak "
                               f"{r['peak_bytes'] / 2**20:.0f} MiB, recompiles {r['recompiles_in_epoch']}"
                               if "epoch_s" in r else str(r)), flush=True)
    return results


def markdown(p: dict) -> str:
    head = ["variant", "s / epoch", "seeds / s", "vs eager", "peak MiB", "recompiles in epoch",
            "sampling-only s / epoch", "structure ms / batch (builds in epoch)", "first loss (eager)",
            "warm-up s", "loader settings"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, r in p["results"].items():
        if "epoch_s" not in r:
            lines.append(f"| {key} | error: {r.get('error')} |" + " |" * (len(head) - 2))
            continue
        eager = p["results"].get("eager/" + key.split("/")[1], {})
        ratio = f"{eager['epoch_s'] / r['epoch_s']:.2f}x" if "epoch_s" in eager else "n/a"
        cells = [key, f"{r['epoch_s']:.2f}", f"{r['seeds_per_s']:.0f}", ratio, f"{r['peak_bytes'] / 2**20:.0f}",
                 str(r["recompiles_in_epoch"]), f"{r['sampling_epoch_s']:.2f}",
                 f"{r['structure_s_per_batch'] * 1e3:.2f} ({r['structure_builds_in_epoch']})",
                 f"{r['first_loss']:.5f} ({r['first_loss_eager']:.5f})", f"{r['warmup_s']:.1f}",
                 ", ".join(f"{k}={v}" for k, v in r["loader_settings"].items()) + f", threads={r['threads']}"]
        lines.append("| " + " | ".join(cells) + " |")
    m = p["machine"]
    lines += ["", f"One epoch = one pass over {p['train_seeds']:,} training seeds (a fixed random "
              f"{p['train_fraction']:.0%} of the {p['nodes']:,} nodes of power_law_graph({p['nodes']:,}, "
              f"{10 * p['nodes']:,}, seed=0)), fanout {FANOUT}, GraphSAGE(128, 128, 2, 16), Adam; "
              f"gnncompile.compile(dynamic={p['dynamic']}), inner compiler {p['inner']}. Timed after "
              f"{p['warmup']} warm-up batches (compilation); 'vs eager' = eager s / variant s with the "
              f"same loader setting. Structure: median time to build one batch's CSR + transpose "
              f"(gnncompile.ops.structure.build), with the structure cache's builds during the epoch. "
              f"Peak: resident memory added during the epoch. torch {m['torch']}. Command: `{p['command']}`"]
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k, r in p["results"].items() if "epoch_s" in r]
    fig, ax = plt.subplots(figsize=(1.5 + 1.4 * len(keys), 3.5))
    sampling = [p["results"][k]["sampling_epoch_s"] for k in keys]
    total = [p["results"][k]["epoch_s"] for k in keys]
    ax.bar(keys, total, label="epoch (sampling + training)")
    ax.bar(keys, sampling, label="sampling only (separate pass)", alpha=0.7)
    for i, v in enumerate(total):
        ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("seconds per epoch")
    ax.set_title(f"GraphSAGE, {p['train_seeds']:,} seeds, N={p['nodes']:,}, fanout {FANOUT}", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20k nodes, 1k train seeds (batch 512), in-process")
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--train-fraction", type=float, default=0.05)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--profile", default=None, help="a profile file whose loader settings are a variant")
    ap.add_argument("--dynamic", choices=("true", "none"), default="true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--structure-batches", type=int, default=10)
    ap.add_argument("--in-process", action="store_true", help="run the variants in this process")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--out", default=None)
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if opts.nodes is None:
        opts.nodes = 20_000 if opts.quick else 1_000_000
    if opts.batch_size is None:
        opts.batch_size = 512 if opts.quick else 1024
    opts.in_process = opts.in_process or opts.quick
    if opts.child:
        data, train = make_data(opts.nodes, opts.train_fraction)
        print("RESULT " + json.dumps(run_variant(data, train, *opts.child, opts)), flush=True)
        return {}
    from gnncompile.compiler import DEFAULT_INNER

    results = run_all(opts)
    payload = {"machine": _common.machine(), "nodes": opts.nodes, "train_fraction": opts.train_fraction,
               "train_seeds": max(1, int(opts.nodes * opts.train_fraction)), "fanout": FANOUT,
               "batch_size": opts.batch_size, "dynamic": opts.dynamic, "warmup": opts.warmup,
               "inner": DEFAULT_INNER, "profile": opts.profile, "results": results,
               "command": " ".join(["python", "benchmarks/neighbor_epoch.py"]
                                   + list(sys.argv[1:] if argv is None else argv))}
    name = opts.out or ("neighbor_epoch_quick" if opts.quick else "neighbor_epoch")
    out = Path(opts.results_dir)
    _common.write_json(out / f"{name}.json", payload)
    md = markdown(payload)
    (out / f"{name}.md").write_text(md)
    print(md)
    try:
        plot(payload, out / f"{name}.png")
    except Exception as e:  # matplotlib missing: the table is the result
        print(f"(no plot: {e})")
    return payload


if __name__ == "__main__":
    main()
