"""Tuned settings vs PyG's DataLoader defaults: mini-batch graph classification, GIN.

On a generated dataset of --num-graphs graphs of 10-40 nodes (gnncompile.data.synthetic.graph_dataset):

1. tunes at a fixed batch size of 128 (--trials / --timeout), which also measures the defaults;
2. measures, in the same run and interleaved (--rounds rounds, medians), the tuned settings
   against ``torch_geometric.loader.DataLoader(dataset, batch_size=128, shuffle=True)`` with
   its defaults (num_workers=0, torch's thread count as it is) training PyG's eager model, plus
   two rows that split the gain: the tuned loader settings with the eager model, and PyG's
   loader with the model compiled as tuned;
3. tunes again with the batch size free in 32-512 (--range-trials) and reports what it found.

The tuned pipeline trains ``gnncompile.compile(model)`` (the tuner also picks the inner compiler
and the kernel knob); ``--eager`` tunes the loader and threads only, for the eager model.

Writes benchmarks/results/tuning.{json,md,png}, and the two profiles with their optimisation
history and parameter importance plots in benchmarks/results/tuning_profiles/. The studies go
to a new SQLite file unless --storage is given, so every trial reported ran in this run.
Throughput is graphs per second of training (forward, backward, Adam step) after warm-up.

    python -m benchmarks tuning                     # the full run (20k graphs)
    python -m benchmarks tuning --num-graphs 2000 --trials 4 --range-trials 4 --rounds 1  # quick
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

warnings.simplefilter("ignore")

import torch  # noqa: E402

from gnncompile.hardware import device  # noqa: E402
from gnncompile.tuner import Workload, measure, tune  # noqa: E402
from gnncompile.tuner.workloads import dataset_for, default_settings  # noqa: E402

from . import _common  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-graphs", type=int, default=20000)
    ap.add_argument("--model", default="gin")
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--range-trials", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per study")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved head-to-head rounds")
    ap.add_argument("--steps", type=int, default=150, help="timed steps per measurement")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--eager", action="store_true", help="tune for PyG's eager model (no gnncompile.compile)")
    ap.add_argument("--storage", default=None,
                    help="Optuna storage (default: a new SQLite file in a temporary folder, so that every "
                         "trial reported was run by this run of the script)")
    ap.add_argument("--out", default=str(_common.RESULTS))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.storage is None:
        import tempfile

        args.storage = f"sqlite:///{Path(tempfile.mkdtemp(prefix='gnncompile-tuning-')) / 'studies.db'}"

    w = Workload(kind="graphs", model=args.model, num_graphs=args.num_graphs, min_nodes=10, max_nodes=40,
                 compiled=not args.eager, warmup=args.warmup, steps=args.steps, chunks=3)
    t0 = time.perf_counter()
    dataset_for(w)
    gen_s = time.perf_counter() - t0
    props = device.detect()
    report = {"device": props, "device_key": device.device_key(props), "workload": w.signature_dict(),
              "torch": torch.__version__, "dataset_seconds": gen_s, "command": _common.command("tuning", argv)}

    print(f"[1/3] tuning at batch size 128 ({args.trials} trials, timeout {args.timeout}s)", flush=True)
    prof_dir = out / "tuning_profiles"  # the profiles and their history / importance plots
    fixed = tune(w, trials=args.trials, timeout=args.timeout, storage=args.storage, out=prof_dir,
                 batch_size=128, seed=0)
    report["fixed"] = {"best": fixed["best"], "tuned": fixed["tuned"], "default": fixed["default"],
                       "profile": str(fixed["profile_path"]), "study": fixed["name"],
                       "trials": _states(fixed["study"])}
    print(json.dumps(report["fixed"], indent=1), flush=True)

    print(f"[2/3] head to head, {args.rounds} interleaved rounds", flush=True)
    base = {**default_settings(w, props, batch_size=128), "compiled": False}
    tuned_settings = dict(fixed["best"])
    # where the gain comes from: the tuned loader settings with PyG's eager model, and PyG's
    # loader with the model compiled as tuned
    rows = {"baseline": base, "tuned": tuned_settings,
            "tuned_loader_eager": {**tuned_settings, "compiled": False}}
    if w.compiled:
        rows["pyg_loader_compiled"] = {**base, "compiled": True, "knobs": tuned_settings.get("knobs"),
                                       "inner": tuned_settings.get("inner"),
                                       "threads": tuned_settings.get("threads") or base["threads"]}
    runs = {k: [] for k in rows}
    for r in range(args.rounds):
        for k, s in rows.items():
            runs[k].append(measure(w, s)[0])
        print(f"  round {r}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in runs.items()) + " graphs/s", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    pair = {k: statistics.median([a / b for a, b in zip(v, runs["baseline"])]) for k, v in runs.items()}
    report["head_to_head"] = {"baseline": "torch_geometric.loader.DataLoader(batch_size=128, shuffle=True), "
                              f"num_workers=0, {base['threads']} threads, eager model",
                              "settings": rows, "runs": runs, "median": med,
                              "ratio": med["tuned"] / med["baseline"], "ratio_of_rounds": pair,
                              "steps": args.steps, "warmup": args.warmup}
    print(f"  ratio (medians): {med['tuned'] / med['baseline']:.2f}x vs PyG defaults; median of the "
          f"per-round ratios {pair['tuned']:.2f}x", flush=True)

    print(f"[3/3] tuning with batch size in 32-512 ({args.range_trials} trials)", flush=True)
    rng = tune(w, trials=args.range_trials, timeout=args.timeout, storage=args.storage, out=prof_dir,
               batch_size=128, batch_range=(32, 512), seed=0)
    report["range"] = {"best": rng["best"], "tuned": rng["tuned"], "default": rng["default"],
                       "profile": str(rng["profile_path"]), "study": rng["name"], "trials": _states(rng["study"])}
    print(json.dumps(report["range"], indent=1), flush=True)
    report["seconds"] = time.perf_counter() - t0

    _common.write_results(out, "tuning", report, _markdown, _plot, json_default=str)
    return 0


def _plot(r, path) -> None:
    """Bars: median graphs/s per configuration; dots: every round."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    h = r["head_to_head"]
    keys = [k for k in ("baseline", "tuned_loader_eager", "pyg_loader_compiled", "tuned") if k in h["runs"]]
    labels = {"baseline": "PyG DataLoader\ndefaults, eager", "tuned_loader_eager": "tuned loader,\neager model",
              "pyg_loader_compiled": "PyG DataLoader,\ncompiled (tuned)", "tuned": "tuned\n(loader + compile)"}
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, k in enumerate(keys):
        ax.bar(i, h["median"][k], color="#4C72B0" if k == "tuned" else "#9DB4D6")
        ax.scatter([i] * len(h["runs"][k]), h["runs"][k], color="k", s=10, zorder=3)
        ax.text(i, h["median"][k] * 1.02, f"{h['median'][k] / h['median']['baseline']:.2f}x", ha="center")
    ax.set_xticks(range(len(keys)), [labels[k] for k in keys])
    ax.set_ylabel("training throughput (graphs/s)")
    ax.set_title(f"GIN, {r['workload']['num_graphs']} graphs, batch 128, {r['device_key']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _states(study):
    c = {}
    for t in study.get_trials(deepcopy=False):
        c[t.state.name.lower()] = c.get(t.state.name.lower(), 0) + 1
    return c


def _fmt(s):
    keys = ("batch_size", "pool_size", "num_workers", "persistent_workers", "threads", "knobs", "inner")
    return ", ".join(f"{k}={s.get(k)}" for k in keys if k in s and (k != "inner" or s.get("compiled", True)))


_LABELS = {
    "baseline": "PyG DataLoader(batch_size=128) defaults, eager model",
    "tuned_loader_eager": "tuned loader settings (PooledLoader), eager model",
    "pyg_loader_compiled": "PyG DataLoader(batch_size=128), gnncompile.compile with the tuned inner/knobs/threads",
    "tuned": "tuned, batch 128",
}


def _markdown(r) -> str:
    h = r["head_to_head"]
    n = len(h["runs"]["baseline"])
    lines = [
        f"# Tuning: {r['workload']['model'].upper()}, {r['workload']['num_graphs']} graphs of 10-40 nodes",
        "",
        f"Device: `{r['device_key']}`; torch {r['torch']}. Training throughput (graphs/s: forward, backward, "
        f"Adam step) after {h['warmup']} warm-up steps, {h['steps']} timed steps per measurement; the "
        f"configurations were measured in turn, {n} rounds.",
        "",
        "| | settings | graphs/s (median) | vs PyG defaults (ratio of medians) | median of per-round ratios |",
        "|---|---|---|---|---|",
    ]
    for k in ("baseline", "tuned_loader_eager", "pyg_loader_compiled", "tuned"):
        if k not in h["runs"]:
            continue
        lines.append(f"| {_LABELS[k]} | {_fmt(h['settings'][k]) if k != 'baseline' else 'num_workers=0, threads=' + str(h['settings'][k]['threads'])} | "
                     f"{h['median'][k]:.0f} | {h['median'][k] / h['median']['baseline']:.2f}x | {h['ratio_of_rounds'][k]:.2f}x |")
    if r["range"].get("tuned") and r["range"].get("default"):
        lines += ["", f"Batch size free in 32-512: the tuner chose {_fmt(r['range']['best'])}: "
                  f"{r['range']['tuned']:.0f} graphs/s vs {r['range']['default']:.0f} for the untuned defaults at batch 128 (PyG DataLoader, the model compiled with no profile) "
                  f"(medians of the re-measurements in that study: {r['range']['tuned'] / r['range']['default']:.2f}x)."]
    lines += ["", "Runs, in order: " + "; ".join(f"{k} {', '.join(f'{v:.0f}' for v in vs)}" for k, vs in h["runs"].items()) + ".",
              "", f"Fixed-batch study: {r['fixed']['trials']}; range study: {r['range']['trials']}.", ""]
    if "command" in r:
        lines += [f"Command: `{r['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
