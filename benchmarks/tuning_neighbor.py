"""Tuning neighbor-sampled training: GraphSAGE on a generated power-law graph, mini-batches from
``gnncompile.data.NeighborLoader``.

1. runs a tuning study (``gnncompile.tuner.tune`` on a ``neighbor`` workload: batch size on a log
   scale in --batch-range, loader workers, prefetch depth, persistent workers, threads, the
   kernel knob and the inner compiler), which re-measures its best trials and the defaults
   (NeighborLoader with no workers and no prefetch at --default-batch-size, torch's threads as
   they are, default knobs and inner compiler) in turn, --confirm-rounds rounds, and keeps the
   highest median;
2. checks that the model compiled as chosen (gnncompile.compile with the chosen inner compiler)
   computes what the eager model computes on a sampled batch (output and gradients);
3. measures the chosen settings once more and counts torch compilations per timed chunk, to show
   that batches of varying size do not recompile the model after the warm-up;
4. splits the gain: the defaults, the defaults with the tuned thread count, then also the tuned
   batch size, and the tuned settings, measured in turn for --rounds rounds (medians).

Writes benchmarks/results/tuning_neighbor.{json,md} and the profile with its optimisation history
and parameter importance plots in benchmarks/results/tuning_profiles/. The study goes to a new
SQLite file unless --storage is given, so every trial reported ran in this run. Throughput is seed
nodes trained per second (forward, backward, Adam step on the batch's seeds) after warm-up.

    python -m benchmarks tuning_neighbor       # 200k nodes, 2M edges, fanout 15 10, 10 trials
    python -m benchmarks tuning_neighbor --num-nodes 20000 --num-edges 200000 --trials 3 --steps 6  # quick
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.simplefilter("ignore")

import torch  # noqa: E402

from gnncompile.hardware import device  # noqa: E402
from gnncompile.tuner import Workload, measure, tune  # noqa: E402
from gnncompile.tuner.workloads import build_model, default_settings, neighbor_data  # noqa: E402

from . import _common  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-nodes", type=int, default=200_000)
    ap.add_argument("--num-edges", type=int, default=2_000_000)
    ap.add_argument("--fanout", type=int, nargs="+", default=[15, 10])
    ap.add_argument("--train-fraction", type=float, default=0.1)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=480.0, help="seconds for the study")
    ap.add_argument("--steps", type=int, default=24, help="timed steps per measurement")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--default-batch-size", type=int, default=1024, help="the defaults' batch size")
    ap.add_argument("--batch-range", type=int, nargs=2, default=[128, 4096])
    ap.add_argument("--max-workers", type=int, default=2)
    ap.add_argument("--confirm-rounds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the gain split (0: skip)")
    ap.add_argument("--eager", action="store_true", help="tune for PyG's eager model")
    ap.add_argument("--storage", default=None, help="Optuna storage (default: a new SQLite file)")
    ap.add_argument("--out", default=str(_common.RESULTS))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    storage = args.storage or f"sqlite:///{Path(tempfile.mkdtemp(prefix='gnncompile-ntune-')) / 'studies.db'}"

    w = Workload(kind="neighbor", model="sage", layers=len(args.fanout), num_nodes=args.num_nodes,
                 num_edges=args.num_edges, fanout=list(args.fanout), train_fraction=args.train_fraction,
                 compiled=not args.eager, warmup=args.warmup, steps=args.steps, chunks=3)
    t0 = time.perf_counter()
    data, train = neighbor_data(w)
    props = device.detect()
    report = {"device": props, "device_key": device.device_key(props), "workload": w.signature_dict(),
              "torch": torch.__version__, "graph_seconds": time.perf_counter() - t0,
              "train_nodes": int(train.numel()), "steps": w.steps, "warmup": w.warmup,
              "loadavg_start": _common.loadavg(), "command": _common.command("tuning_neighbor", argv)}
    report["default_settings"] = default_settings(w, props, batch_size=args.default_batch_size)

    print(f"[1/4] tuning ({args.trials} trials, timeout {args.timeout}s)", flush=True)
    res = tune(w, trials=args.trials, timeout=args.timeout, storage=storage, out=out / "tuning_profiles",
               batch_size=args.default_batch_size, batch_range=tuple(args.batch_range),
               max_workers=args.max_workers, seed=0, confirm_rounds=args.confirm_rounds)
    report.update(_study_report(res))
    report["profile_settings"] = json.loads(Path(report["profile"]).read_text())["settings"]
    print(json.dumps({k: report[k] for k in ("best", "chosen", "tuned", "default", "trial_states")},
                     indent=1), flush=True)

    if w.compiled:
        inner = report["best"].get("inner") or "inductor"
        report["agreement"] = {inner: _agreement(w, inner)}
        print(f"[2/4] compiled ({inner}) vs eager on a sampled batch: {report['agreement']}", flush=True)
    print("[3/4] compilations per timed chunk with the chosen settings", flush=True)
    report["compiles_per_chunk"] = _compiles(w, report["best"])
    print(f"[4/4] where the gain comes from, {args.rounds} interleaved rounds", flush=True)
    report["split"] = _split(w, report["default_settings"], report["best"], args.rounds)
    report["seconds"] = time.perf_counter() - t0
    report["loadavg_end"] = _common.loadavg()
    _common.write_results(out, "tuning_neighbor", report, lambda r: _markdown(r, args), json_default=str)
    return 0


def _agreement(w: Workload, inner: str) -> dict:
    """Max |compiled - eager| of the model's output and of its gradients on one sampled batch."""
    import gnncompile
    from gnncompile.data import NeighborLoader

    data, train = neighbor_data(w)
    b = next(iter(NeighborLoader(data, list(w.fanout), input_nodes=train, batch_size=512, seed=w.seed)))
    torch.manual_seed(w.seed)
    model = build_model(w)
    torch._dynamo.reset()
    fwd = gnncompile.compile(model, profile=None, inner=inner)
    diffs = {}
    outs = []
    for f in (model, fwd):
        model.zero_grad()
        out = f(b.x, b.edge_index)
        torch.nn.functional.cross_entropy(out[:b.batch_size], b.y[:b.batch_size]).backward()
        outs.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    diffs["output"] = float((outs[0][0] - outs[1][0]).abs().max())
    diffs["grad"] = max(float((a - c).abs().max()) for a, c in zip(outs[0][1], outs[1][1]))
    diffs["ok"] = diffs["output"] < 1e-4 and diffs["grad"] < 1e-4
    if not diffs["ok"]:
        raise SystemExit(f"compiled ({inner}) and eager disagree: {diffs}")
    return diffs


def _study_report(res) -> dict:
    trials = []
    for t in res["study"].get_trials():
        trials.append({"number": t.number, "state": t.state.name.lower(), "value": t.value,
                       "settings": t.user_attrs.get("settings"), "peak_memory": t.user_attrs.get("peak_memory"),
                       "error": t.user_attrs.get("error"),
                       "seconds": t.duration.total_seconds() if t.duration else None})
    states = {}
    for t in trials:
        states[t["state"]] = states.get(t["state"], 0) + 1
    return {"best": res["best"], "chosen": res.get("chosen"), "tuned": res["tuned"], "default": res["default"],
            "confirm": res.get("confirm"), "profile": str(res["profile_path"]),
            "plots": [str(p) for p in res["plots"]], "study": res["name"], "trials": trials,
            "trial_states": states, "study_seconds": res["elapsed_s"]}


def _compiles(w: Workload, settings: dict) -> list:
    """torch's count of compiled graphs after each timed chunk of one measurement."""
    from torch._dynamo.utils import counters

    counters.clear()
    seen = []
    measure(w, settings, report=lambda c, v: seen.append(int(counters["stats"]["unique_graphs"])))
    return seen


SPLIT = (("defaults", "defaults"), ("threads", "defaults + the best trial's threads"),
         ("threads_batch", "defaults + the best trial's threads and batch size"),
         ("tuned", "the best trial's settings"))


def _split(w: Workload, defaults: dict, best: dict, rounds: int) -> dict:
    """The defaults, then the tuned threads, then also the tuned batch size, then every tuned
    setting, measured in turn ``rounds`` times; medians and ratios to the defaults' median."""
    import statistics

    rows = {"defaults": defaults, "threads": {**defaults, "threads": best["threads"]},
            "threads_batch": {**defaults, "threads": best["threads"], "batch_size": best["batch_size"]},
            "tuned": best}
    runs, load = {k: [] for k in rows}, []
    for r in range(rounds):
        for k, st in rows.items():
            runs[k].append(measure(w, st)[0])
        load.append(_common.loadavg()[0])
        print(f"  round {r}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in runs.items()) +
              f" seeds/s; load {load[-1]:.1f}", flush=True)
    if not rounds:
        return {}
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {"settings": rows, "runs": runs, "median": med, "loadavg_after_round": load,
            "ratio": {k: med[k] / med["defaults"] for k in rows}}


def _fmt(s) -> str:
    keys = ("batch_size", "num_workers", "pool_size", "persistent_workers", "threads", "knobs", "inner")
    return ", ".join(f"{k}={s.get(k)}" for k in keys if k in s)


def _markdown(r, args) -> str:
    wl, c = r["workload"], r.get("confirm") or {}
    lines = [
        f"# Tuning neighbor-sampled training: GraphSAGE, {wl['num_nodes']:,} nodes, {wl['num_edges']:,} edges",
        "",
        f"Device: `{r['device_key']}`; torch {r['torch']}. Fanout {wl['fanout']}, {r['train_nodes']:,} training "
        f"seeds, {wl['layers']}-layer GraphSAGE (hidden {wl['hidden']}, {wl['num_features']} features), "
        f"{'compiled' if wl['compiled'] else 'eager'}. Throughput: seed nodes trained per second after "
        f"{r['warmup']} warm-up steps, {r['steps']} timed steps per measurement.",
        "",
        f"Command: `{r['command']}` ({r['seconds']:.0f} s). "
        f"Load average (1 min) at the start / end: {r['loadavg_start'][0]:.1f} / {r['loadavg_end'][0]:.1f} on "
        f"{os.cpu_count()} CPUs (the machine was shared with other jobs).",
        "",
        "| | settings | seeds/s (median) | runs |",
        "|---|---|---|---|",
        f"| defaults: NeighborLoader, no workers, no prefetch, batch {args.default_batch_size} | "
        f"threads={r['default_settings']['threads']}, knobs={r['default_settings']['knobs']}, inner=default | "
        f"{r['default']:.0f} | {', '.join(f'{v:.0f}' for v in c.get('default', []))} |",
        f"| best trial of the study, re-measured | {_fmt(r['best'])} | {r['tuned']:.0f} | "
        f"{', '.join(f'{v:.0f}' for v in c.get('tuned', []))} |",
        "",
        f"Best trial / defaults: **{r['tuned'] / r['default']:.2f}x** (medians of {len(c.get('default', []))} "
        "re-measurements of the 3 best trials and the defaults in turn, in the same run). The profile holds "
        f"the {r['chosen']}: {_fmt(r['profile_settings'])}.",
        "",
    ]
    if "agreement" in r:
        lines += ["Compiled vs eager on one sampled batch (max abs difference, output / gradients): " +
                  "; ".join(f"{k} {v['output']:.1e} / {v['grad']:.1e}" for k, v in r["agreement"].items()) + ".", ""]
    sp = r.get("split") or {}
    if sp:
        lines += ["Where the gain comes from (each row measured in turn with the others, "
                  f"{len(sp['runs']['defaults'])} rounds; medians; 1-min load average after each round: "
                  f"{', '.join(f'{v:.1f}' for v in sp['loadavg_after_round'])}):", "",
                  "| | seeds/s (median) | vs defaults | runs |", "|---|---|---|---|"]
        lines += [f"| {label} | {sp['median'][k]:.0f} | {sp['ratio'][k]:.2f}x | "
                  f"{', '.join(f'{v:.0f}' for v in sp['runs'][k])} |" for k, label in SPLIT]
        lines.append("")
    cc = r["compiles_per_chunk"]
    lines += [f"Compiled graphs after each timed chunk (the best trial's settings): {cc} " +
              ("(constant: no recompilation after the warm-up, though every batch has its own size)."
               if len(set(cc)) == 1 else "(it changed: the model recompiled during the timed steps)."), "",
              f"Study: {r['trial_states']} in {r['study_seconds']:.0f} s; trials:", "",
              "| trial | state | seeds/s | settings | peak RSS growth (MB) |", "|---|---|---|---|---|"]
    for t in r["trials"]:
        val = f"{t['value']:.0f}" if t["value"] is not None else "-"
        mem = f"{t['peak_memory'] / 2**20:.0f}" if t["peak_memory"] is not None else "-"
        lines.append(f"| {t['number']} | {t['state']} | {val} | {_fmt(t['settings'] or {})} | {mem} |")
    lines += ["", f"Profile: `{Path(r['profile']).name}` (tuning_profiles/, with its history and importance PNGs).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
