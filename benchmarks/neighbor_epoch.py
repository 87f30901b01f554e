"""One epoch of sampled mini-batch GraphSAGE training: eager vs gnncompile, per loader setting.

    python -m benchmarks neighbor_epoch                       # 1M nodes / 10M edges, 50k train seeds
    python -m benchmarks neighbor_epoch --profile PATH        # also the loader settings of a profile
    python -m benchmarks neighbor_epoch --quick               # 20k nodes, 1k train seeds, in-process

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

Per loader setting, one process (unless ``--in-process``, as ``--quick`` is) holds both
models, each with its own loader of the same seed: ``--warmup`` batches each (compilation
happens there; the first batch's loss is checked against an eager copy of the model), then
``--epochs`` timed epochs of each, alternating, on the same batches (each epoch a new
shuffle; the median is reported), under the default allocator. Peak memory comes from one more
process per variant that repeats the warm-up and runs ``--memory-batches`` batches inside
``_common.read_peak_rss_delta`` under MALLOC_MMAP_THRESHOLD_=65536 (freed memory leaves the
process, so the high-water mark is the batches' own; that setting makes every large
allocation page-fault afresh, several times slower, so the timing run does not use it).

Reported: seconds per epoch, seeds/s, peak RSS added during training, recompilations during
the timed epochs (Dynamo's ``unique_graphs`` counter; 0 is wanted), the sampling-only time of
an epoch (the loader iterated without training), and the time to build the per-batch
structure (CSR by destination + its transpose, what the compiled graph's structure ops build
once per batch) measured with ``gnncompile.ops.structure.build`` on the first
``--structure-batches`` batches, next to the structure cache's build count. Writes
benchmarks/results/neighbor_epoch[_quick].{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Optional

import gnncompile  # noqa: F401  (the installed package; imported before anything else)
import torch

from . import _common

F, C, FANOUT = 128, 16, [15, 10]
MODELS = ("eager", "gnncompile")


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


def structure_time(batches, repeats: int = 3) -> float:
    """Median seconds to build one batch's CSR and its transpose (as the structure cache does),
    over ``repeats`` passes over ``batches``."""
    from gnncompile.ops import structure

    ts = []
    if batches:
        structure.build(*batches[0]).transposed(batches[0][1])  # first-call overheads
    for _ in range(repeats):
        for ei, n in batches:
            t0 = time.perf_counter()
            structure.build(ei, n).transposed(n)
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def sampling_epoch(loader) -> float:
    t0 = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - t0


class _Trainer:
    """A model variant, its optimizer and loader; ``step`` trains on one batch."""

    def __init__(self, data, train, model_kind: str, setting: str, opts) -> None:
        from torch_geometric.nn.models import GraphSAGE

        from gnncompile import profiles

        torch.set_num_threads(opts.threads)
        if setting == "profile":  # the profile's thread count (the compiled model carries its knobs)
            from gnncompile.settings import Settings

            threads = Settings.build(profiles.resolve(opts.profile)).threads
            if threads:
                torch.set_num_threads(threads)
        torch.manual_seed(0)
        model = GraphSAGE(F, 128, 2, C)
        self.ref = GraphSAGE(F, 128, 2, C)
        self.ref.load_state_dict(model.state_dict())
        dynamic = None if opts.dynamic == "none" else True
        self.run = model if model_kind == "eager" else gnncompile.compile(
            model, dynamic=dynamic, profile=opts.profile if setting == "profile" else None)
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        self.loader = make_loader(data, train, setting, opts)
        self.losses = []

    def step(self, batch) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = _loss(self.run, batch)
        loss.backward()
        self.opt.step()
        self.losses.append(float(loss))

    def warm_up(self, batches: int) -> dict:
        """The first ``batches`` batches of an epoch; checks the first loss against eager."""
        t0 = time.perf_counter()
        it = iter(self.loader)
        first = next(it)
        with torch.no_grad():
            expect = float(_loss(self.ref, first))
        self.step(first)
        for _, batch in zip(range(batches - 1), it):
            self.step(batch)
        del it
        if abs(self.losses[0] - expect) > 1e-4 * max(1.0, abs(expect)):
            raise AssertionError(f"first-batch loss {self.losses[0]} != eager {expect}")
        return {"warmup_s": time.perf_counter() - t0, "warmup_batches": batches,
                "first_loss": self.losses[0], "first_loss_eager": expect}

    def epoch(self, limit: Optional[int] = None, keep: int = 0):
        """One pass over the loader (``limit`` batches at most); returns the batch count and the
        first ``keep`` batches' (edge_index, num_nodes)."""
        kept, n = [], 0
        for batch in self.loader:
            if len(kept) < keep:
                kept.append((batch.edge_index.clone(), batch.num_nodes))
            self.step(batch)
            n += 1
            if limit is not None and n >= limit:
                break
        return n, kept


def peak_only(data, train, model_kind: str, setting: str, opts) -> dict:
    """Warm-up, then the peak memory added by ``opts.peak_only`` training batches."""
    tr = _Trainer(data, train, model_kind, setting, opts)
    res = tr.warm_up(opts.warmup)
    res["peak_bytes"] = _common.read_peak_rss_delta(lambda: tr.epoch(opts.peak_only))
    res["peak_batches"] = opts.peak_only
    return res


def run_setting(data, train, setting: str, opts) -> dict:
    """Eager and compiled with one loader setting, in this process: warm-ups (with the agreement
    check), then ``--epochs`` timed epochs of each, alternating (eager first in even epochs),
    the same batches for both in each epoch (their loaders share the seed)."""
    from torch._dynamo.utils import counters

    from gnncompile.compiler import STATS
    from gnncompile.ops import structure

    counters.clear()
    trainers = {m: _Trainer(data, train, m, setting, opts) for m in MODELS}
    res = {m: tr.warm_up(opts.warmup) for m, tr in trainers.items()}
    graphs, backend, builds = counters["stats"]["unique_graphs"], STATS["graphs"], structure.cache_info()["builds"]
    times, last = {m: [] for m in MODELS}, {}
    for e in range(opts.epochs):
        for m in MODELS if e % 2 == 0 else MODELS[::-1]:
            t0 = time.perf_counter()
            if opts.in_process and e == 0:  # no separate memory run: this epoch's peak, in this process
                res[m]["peak_bytes"] = _common.read_peak_rss_delta(
                    lambda: last.update({m: trainers[m].epoch(keep=opts.structure_batches)}))
            else:
                last[m] = trainers[m].epoch(keep=opts.structure_batches)
            times[m].append(time.perf_counter() - t0)
    compiled = {"recompiles_in_epoch": counters["stats"]["unique_graphs"] - graphs,
                "graphs_compiled": counters["stats"]["unique_graphs"],
                "backend_compiles_in_epoch": STATS["graphs"] - backend,
                "structure_builds_per_epoch": (structure.cache_info()["builds"] - builds) / opts.epochs}
    struct_s = structure_time(last["gnncompile"][1])  # the same batches for both models
    for m, tr in trainers.items():
        n = last[m][0]
        epoch_s = statistics.median(times[m])
        res[m].update({"epoch_s": epoch_s, "epoch_times_s": times[m], "seeds_per_s": train.numel() / epoch_s,
                       "batches": n, "last_loss": tr.losses[-1],
                       "structure_s_per_batch": struct_s, "sampling_epoch_s": sampling_epoch(tr.loader),
                       "loader_settings": {k: v for k, v in tr.loader.settings.items() if v is not None},
                       "threads": torch.get_num_threads()})
        res[m].update(compiled if m == "gnncompile" else
                      {"recompiles_in_epoch": 0, "structure_builds_per_epoch": 0})  # eager: no Dynamo
    return res


# ----------------------------------------------------------------------------- driver
def child_args(opts) -> list:
    args = ["--nodes", str(opts.nodes), "--train-fraction", str(opts.train_fraction), "--batch-size",
            str(opts.batch_size), "--warmup", str(opts.warmup), "--epochs", str(opts.epochs), "--threads",
            str(opts.threads), "--dynamic", opts.dynamic, "--structure-batches", str(opts.structure_batches)]
    return args + (["--profile", opts.profile] if opts.profile else [])


def child(opts, what: list, memory: bool) -> dict:
    """``what`` (``--child SETTING`` or ``--child MODEL SETTING --peak-only N``) in a fresh
    process: timing under the default allocator; ``memory`` under MALLOC_MMAP_THRESHOLD_=65536."""
    env = _common.isolated_env() if memory else _common.timing_env()
    return _common.run_child(_common.module_command("neighbor_epoch") + what + child_args(opts), env, opts.timeout)


def run_all(opts) -> dict:
    results = {}
    for setting in ["default"] + (["profile"] if opts.profile else []):
        if opts.in_process:
            threads = torch.get_num_threads()
            try:
                res = run_setting(*make_data(opts.nodes, opts.train_fraction), setting, opts)
            finally:  # leave the calling process as it was
                torch._dynamo.reset()
                torch.set_num_threads(threads)
        else:
            res = child(opts, ["--child", setting], memory=False)
            res = {m: res[m] for m in MODELS} if "error" not in res else {m: res for m in MODELS}
            for m, r in res.items():
                if "epoch_s" in r:
                    mem = child(opts, ["--child", m, setting, "--peak-only", str(opts.memory_batches)], memory=True)
                    r.update({k: mem[k] for k in ("peak_bytes", "peak_batches")} if "peak_bytes" in mem
                             else {"peak_error": mem.get("error")})
        for m, r in res.items():
            key = f"{m}/{setting}"
            results[key] = r
            print(f"{key:<22} " + (f"{r['epoch_s']:.2f} s/epoch, {r['seeds_per_s']:.0f} seeds/s, peak "
                                   f"{r.get('peak_bytes', float('nan')) / 2**20:.0f} MiB, recompiles "
                                   f"{r['recompiles_in_epoch']}" if "epoch_s" in r else str(r)), flush=True)
    return results


def markdown(p: dict) -> str:
    head = ["variant", "s / epoch", "seeds / s", "vs eager", "peak MiB", "recompiles in timed epochs",
            "sampling-only s / epoch", "structure ms / batch (cache builds / epoch)", "first loss (eager)",
            "warm-up s", "loader settings"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, r in p["results"].items():
        if "epoch_s" not in r:
            lines.append(f"| {key} | error: {r.get('error')} |" + " |" * (len(head) - 2))
            continue
        eager = p["results"].get("eager/" + key.split("/")[1], {})
        ratio = f"{eager['epoch_s'] / r['epoch_s']:.2f}x" if "epoch_s" in eager else "n/a"
        cells = [key, f"{r['epoch_s']:.2f}", f"{r['seeds_per_s']:.0f}", ratio,
                 f"{r['peak_bytes'] / 2**20:.0f}" if "peak_bytes" in r else "n/a",
                 str(r["recompiles_in_epoch"]), f"{r['sampling_epoch_s']:.2f}",
                 f"{r['structure_s_per_batch'] * 1e3:.2f} ({r['structure_builds_per_epoch']:.0f})",
                 f"{r['first_loss']:.5f} ({r['first_loss_eager']:.5f})", f"{r['warmup_s']:.1f}",
                 ", ".join(f"{k}={v}" for k, v in r["loader_settings"].items()) + f", threads={r['threads']}"]
        lines.append("| " + " | ".join(cells) + " |")
    m = p["machine"]
    lines += ["", f"One epoch = one pass over {p['train_seeds']:,} training seeds (a fixed random "
              f"{p['train_fraction']:.0%} of the {p['nodes']:,} nodes of power_law_graph({p['nodes']:,}, "
              f"{10 * p['nodes']:,}, seed=0)), fanout {FANOUT}, GraphSAGE(128, 128, 2, 16), Adam; "
              f"gnncompile.compile(dynamic={p['dynamic']}), inner compiler {p['inner']}. Timed after "
              f"{p['warmup']} warm-up batches (compilation), median of {p['epochs']} epochs; 'vs eager' = eager s / variant s with the "
              f"same loader setting. Structure: median time to build one batch's CSR + transpose "
              f"(gnncompile.ops.structure.build), with the structure cache's builds during the epoch. "
              f"Peak: resident memory added over {p['memory_batches']} training batches (a separate process "
              f"under MALLOC_MMAP_THRESHOLD_=65536; --quick: the epoch, in-process). Timing under the "
              f"default allocator. torch {m['torch']}. {_common.load_text(p['loadavg_before_after'])} (a shared "
              f"machine). Command: `{p['command']}`"]
    if p.get("profile"):
        lines.append(f"\nProfile {p['profile']}: settings {p['profile_settings']}, tuned on workload "
                     f"{p['profile_workload']}.")
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
    ap.add_argument("--epochs", type=int, default=None, help="timed epochs, median reported (default 3, quick 1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--structure-batches", type=int, default=10)
    ap.add_argument("--memory-batches", type=int, default=10, help="batches in the peak-memory run")
    ap.add_argument("--in-process", action="store_true", help="run the variants in this process")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--out", default=None)
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--peak-only", type=int, default=0, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if opts.nodes is None:
        opts.nodes = 20_000 if opts.quick else 1_000_000
    if opts.epochs is None:
        opts.epochs = 1 if opts.quick else 3
    if opts.batch_size is None:
        opts.batch_size = 512 if opts.quick else 1024
    opts.in_process = opts.in_process or opts.quick
    if opts.child:
        data, train = make_data(opts.nodes, opts.train_fraction)
        out = peak_only(data, train, *opts.child, opts) if opts.peak_only else run_setting(data, train, *opts.child, opts)
        print("RESULT " + json.dumps(out), flush=True)
        return {}
    from gnncompile import config as _cfg

    load_before = _common.loadavg()
    results = run_all(opts)
    payload = {"machine": _common.machine(), "loadavg_before_after": [load_before, _common.loadavg()],
               "nodes": opts.nodes, "train_fraction": opts.train_fraction,
               "train_seeds": max(1, int(opts.nodes * opts.train_fraction)), "fanout": FANOUT,
               "batch_size": opts.batch_size, "dynamic": opts.dynamic, "memory_batches": opts.memory_batches,
               "warmup": opts.warmup, "epochs": opts.epochs,
               "inner": _cfg.current().inner or "auto (chosen per graph piece by its size)", "profile": opts.profile,
               "results": results, "command": _common.command("neighbor_epoch", argv)}
    if opts.profile:
        from gnncompile import profiles

        prof = profiles.resolve(opts.profile)
        payload["profile_settings"], payload["profile_workload"] = prof.settings, prof.workload
    name = opts.out or ("neighbor_epoch_quick" if opts.quick else "neighbor_epoch")
    _common.write_results(Path(opts.results_dir), name, payload, markdown, plot)
    return payload


if __name__ == "__main__":
    main()
