"""Runtime adaptation: gnncompile.adapt.AdaptiveLoader vs every fixed batch size, growing batches under a memory budget.

    python -m benchmarks adapt                     # the default run (~5 min on 2 quiet cores)
    python -m benchmarks adapt --quick             # a smaller dataset, for a smoke test
    python -m benchmarks adapt --rounds 5          # then 4 more rounds of best fixed vs adaptive, interleaved

Data: ``gnncompile.data.synthetic.graph_dataset(--graphs, --min-nodes, --max-nodes, 16
features, average degree 4)``, sorted by node count, ascending, not shuffled: every epoch's
batches grow from the smallest graphs to the largest. Model: ``torch_geometric.nn.models.GIN(16,
64, 3)`` -> ``global_mean_pool`` -> ``Linear(64, 2)``, compiled with ``gnncompile.compile(model,
dynamic=True)``; step: forward, cross-entropy, backward, Adam (lr 1e-3).

Memory: the process's peak resident set in each step (``memory='rss'``: VmHWM reset per step,
see gnncompile.adapt: ``malloc_trim(0)`` before each step returns the heap's freed memory, so
a step's growth shows; the allocator is the default one, as in training). The budget is ``--budget-mib`` above the resident set after
warm-up (the model compiled, a few steps taken: the same in every run), so it bounds what the
training steps add. Every run (each fixed size, each repeat, the adaptive run) is a process of
its own: nothing one run allocated or compiled changes another's memory.

Runs: each batch size of ``--sizes`` fixed (an AdaptiveLoader with one candidate: the same
loader path, measuring, no adaptation), seed 0; the best fixed size whose measured peak stays
within the budget again with seed 1 (another model initialisation: the run-to-run noise of the
loss); the adaptive loader over the same sizes (``by='graphs'``, start at the smallest,
``--window`` steps per measurement, 5% hysteresis, 10% margin, learning rate rescaled by the
square root of the batch size ratio, ``--lr-scaling``: it takes fewer, larger steps). Throughput: graphs per second
over the ``--epochs`` epochs, everything included (loading, measuring, adapting). Loss: the mean
loss per graph of the last epoch, and the loss curve against graphs seen.

``--rounds R`` (R > 1): after that first round, R - 1 more rounds of the best fixed size (the
first round's, seed 0) and the adaptive run, each a fresh process, their order alternating from
round to round (interleaved: both sides see the same stretches of machine noise). The ratio
adaptive / best fixed is then the geometric mean of the R paired ratios with its 95% Student's t
interval (gnncompile.tuner.noise.ratio_interval), and the budget check covers every adaptive run.
Writes benchmarks/results/adapt[_quick].{json,md,png}.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from . import _common

F, HIDDEN, LAYERS = 16, 64, 3


def _dataset(spec):
    from gnncompile.data import graph_dataset

    ds = graph_dataset(spec["graphs"], min_nodes=spec["min_nodes"], max_nodes=spec["max_nodes"], num_features=F,
                       seed=0)
    ds.sort(key=lambda d: d.num_nodes)
    return ds


def _model(seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_geometric.nn import GIN, global_mean_pool

    torch.manual_seed(seed)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gin = GIN(F, HIDDEN, LAYERS)
            self.out = torch.nn.Linear(HIDDEN, 2)

        def forward(self, x, edge_index, batch, num_graphs: int):
            return self.out(global_mean_pool(self.gin(x, edge_index), batch, num_graphs))

    return Net()


def child(spec) -> dict:
    import gnncompile
    from gnncompile.adapt import AdaptiveLoader, RssMemory, Setting
    from gnncompile.data import PooledLoader

    torch.set_num_threads(spec["threads"])
    ds = _dataset(spec)
    model = _model(spec["seed"])
    cmodel = gnncompile.compile(model, dynamic=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(b):
        out = cmodel(b.x, b.edge_index, b.batch, b.num_graphs)
        loss = torch.nn.functional.cross_entropy(out, b.y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    # warm-up (not timed): compile, and a few steps on small batches; then the optimizer restarts
    t0 = time.perf_counter()
    warm = PooledLoader(ds[:48], batch_size=16)
    for b in warm:
        step(b)
    warm.close()
    compile_s = time.perf_counter() - t0
    model.load_state_dict(_model(spec["seed"]).state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gc.collect()
    probe = RssMemory()
    probe.start()
    base = probe.base
    budget = base + spec["budget_mib"] * 2**20
    sizes = spec["sizes"]
    if spec["mode"] == "fixed":
        L = AdaptiveLoader(ds, sizes=[spec["size"]], memory="rss")
    else:
        L = AdaptiveLoader(ds, sizes=sizes, start=Setting(min(sizes), 2, 0), memory="rss", memory_budget=budget,
                           window=spec["window"], optimizer=opt, lr_scaling=spec["lr_scaling"])
    t0 = time.perf_counter()
    for _ in range(spec["epochs"]):
        for b in L:
            L.step_done(step(b))
    wall = time.perf_counter() - t0
    L.close()
    graphs = spec["epochs"] * len(ds)
    hist = L.history
    last = [h for h in hist if h["epoch"] == spec["epochs"] - 1]
    return {
        "mode": spec["mode"], "size": spec.get("size"), "seed": spec["seed"], "wall_s": wall,
        "graphs_per_s": graphs / wall, "compile_s": compile_s, "steps": len(hist),
        "base_rss": base, "budget_rss": budget, "peak_rss": max(h["peak"] for h in hist),
        "peak_above_base_mib": (max(h["peak"] for h in hist) - base) / 2**20,
        "last_epoch_loss": sum(h["loss"] * h["graphs"] for h in last) / sum(h["graphs"] for h in last),
        "curve": [[h["graphs"], h["loss"], h["size"], h["nodes"], h["edges"]] for h in hist],
        "log": L.log,
    }


def _run(spec, timeout):
    cmd = _common.module_command("adapt") + ["--child", json.dumps(spec)]
    return _common.run_child(cmd, _common.timing_env(spec["threads"]), timeout)


def markdown(p: dict) -> str:
    a = p["args"]
    lines = [f"# Runtime adaptation: growing batches under a memory budget\n",
             f"`{p['command']}`  \n{p['cpu']}, {a['threads']} threads, torch {p['machine']['torch']}.  "
             f"\n{_common.load_text(p['loadavg_before_after'])}\n",
             f"{a['graphs']} graphs of {a['min_nodes']}-{a['max_nodes']} nodes (average degree 4), sorted by size "
             f"ascending, {a['epochs']} epochs; adaptive lr scaling: {a['lr_scaling']}; compiled GIN ({F} -> {HIDDEN} x {LAYERS}) + mean pool + linear, Adam. "
             f"Memory budget: {a['budget_mib']} MiB of peak RSS above the resident set after warm-up.\n",
             "| run | batch (graphs) | graphs/s | wall s | steps | peak above base MiB | within budget | "
             "last-epoch loss |", "|---|---|---|---|---|---|---|---|"]
    for r in p["fixed"] + p["repeats"] + [p["adaptive"]]:
        if "error" in r:
            lines.append(f"| {r.get('label', '?')} | | error: {r['error'][:80]} | | | | | |")
            continue
        size = r["size"] if r["mode"] == "fixed" else "adaptive " + "/".join(map(str, a["sizes"]))
        ok = "yes" if r["peak_rss"] <= r["budget_rss"] else "**no (over budget: excluded)**"
        lines.append(f"| {r['mode']} seed {r['seed']} | {size} | {r['graphs_per_s']:.0f} | {r['wall_s']:.1f} | "
                     f"{r['steps']} | {r['peak_above_base_mib']:.0f} | {ok} | {r['last_epoch_loss']:.4f} |")
    s = p.get("summary", {})
    if s:
        lines += ["", f"**Best fixed within budget: {s['best_fixed_size']} graphs per batch, "
                  f"{s['best_fixed_graphs_per_s']:.0f} graphs/s. Adaptive: {s['adaptive_graphs_per_s']:.0f} graphs/s = "
                  f"{s['speedup']:.2f}x**, peak {s['adaptive_peak_above_base_mib']:.0f} MiB above base "
                  f"(budget {a['budget_mib']} MiB: {'within' if s['adaptive_within_budget'] else 'OVER'}).",
                  "",
                  f"Loss (last epoch, mean per graph): adaptive {s['adaptive_loss']:.4f}, best fixed seed 0 "
                  f"{s['fixed_loss_seed0']:.4f}, seed 1 {s['fixed_loss_seed1']:.4f}: |adaptive - fixed| = "
                  f"{s['loss_gap']:.4f} against run-to-run noise |seed 1 - seed 0| = {s['loss_noise']:.4f} "
                  f"({'within' if s['loss_within_noise'] else 'outside'} the noise)."]
    rd = p.get("rounds")
    if rd:
        iv = rd["interval"] or {}
        low, high = iv.get("low"), iv.get("high")
        span = f"[{low:.2f}, {high:.2f}]" if low is not None else "(one pair: no interval)"
        lines += ["", f"## Interleaved rounds: best fixed ({s['best_fixed_size']} graphs) vs adaptive", "",
                  "| round | order | fixed graphs/s | adaptive graphs/s | ratio | adaptive peak above base MiB | "
                  "adaptive last-epoch loss |", "|---|---|---|---|---|---|---|"]
        for r in rd["pairs"]:
            if r["fixed_error"] or r["adaptive_error"]:
                lines.append(f"| {r['round']} | {r['order']} | error: {(r['fixed_error'] or r['adaptive_error'])[:60]} "
                             f"| | | | |")
                continue
            lines.append(f"| {r['round']} | {r['order']} | {r['fixed_graphs_per_s']:.0f} | "
                         f"{r['adaptive_graphs_per_s']:.0f} | {r['adaptive_graphs_per_s'] / r['fixed_graphs_per_s']:.2f} | "
                         f"{r['adaptive_peak_above_base_mib']:.0f} | {r['adaptive_last_epoch_loss']:.4f} |")
        if iv:
            lines += ["", f"**Adaptive / best fixed over {iv['pairs']} interleaved rounds: {iv['ratio']:.2f}x "
                      f"(geometric mean), 95% interval {span}; median {rd['median_ratio']:.2f}x.** Adaptive runs over "
                      f"the {a['budget_mib']} MiB budget: {rd['adaptive_over_budget']} of {rd['adaptive_runs']} "
                      f"(largest peak {rd['adaptive_max_peak_above_base_mib']:.0f} MiB above base); the fixed size's "
                      f"runs over it: {rd['fixed_over_budget']}."]
    ad = p["adaptive"]
    if "log" in ad:
        lines += ["", "## The adaptive run's switches", "", "| step | epoch | kind | from | to | gain | predicted MiB "
                  "above base | reason |", "|---|---|---|---|---|---|---|---|"]
        for e in ad["log"]:
            pred = "" if e["predicted_bytes"] is None else f"{(e['predicted_bytes'] - ad['base_rss']) / 2**20:.0f}"
            gain = "" if e["gain"] is None else f"{e['gain']:.3f}"
            lines.append(f"| {e['step']} | {e['epoch']} | {e['kind']} | {e['from']['size']} | {e['to']['size']} | "
                         f"{gain} | {pred} | {e['reason']} |")
    lines += ["", "Throughput: graphs / wall seconds over all epochs (loading, measuring and adapting included; "
              "compilation and warm-up excluded, the same in every run). A fixed size whose measured peak exceeds "
              "the budget is reported and excluded from 'best fixed'. The adaptive run's sizes are the fixed grid."]
    return "\n".join(lines) + "\n"


def _rounds(base: dict, best: dict, adaptive: dict, rounds: int, timeout: float) -> dict:
    """Rounds 2..R of best fixed vs adaptive (fresh processes, order alternating); round 1 is the
    first pass's pair. The paired ratios' geometric mean and 95% interval, every adaptive run's
    peak against the budget."""
    from gnncompile.tuner import noise

    pairs = [{"round": 1, "order": "fixed first", "fixed": best, "adaptive": adaptive}]
    for k in range(2, rounds + 1):
        order = ["adaptive", "fixed"] if k % 2 == 0 else ["fixed", "adaptive"]
        got = {}
        for side in order:
            spec = dict(base, mode=side, seed=0, **({"size": best["size"]} if side == "fixed" else {}))
            got[side] = _run(spec, timeout)
        print(f"round {k}: fixed {got['fixed'].get('graphs_per_s', got['fixed'].get('error'))}, adaptive "
              f"{got['adaptive'].get('graphs_per_s', got['adaptive'].get('error'))} graphs/s", file=sys.stderr)
        pairs.append({"round": k, "order": f"{order[0]} first", **got})
    ok = [p for p in pairs if "error" not in p["fixed"] and "error" not in p["adaptive"]]
    iv = noise.ratio_interval([p["adaptive"]["graphs_per_s"] for p in ok], [p["fixed"]["graphs_per_s"] for p in ok])
    ads = [p["adaptive"] for p in ok]
    return {
        "pairs": [{"round": p["round"], "order": p["order"],
                   **{f"{side}_{k}": p[side].get(k) for side in ("fixed", "adaptive")
                      for k in ("graphs_per_s", "peak_above_base_mib", "last_epoch_loss", "error")}}
                  for p in pairs],
        "interval": iv,
        "median_ratio": statistics.median(p["adaptive"]["graphs_per_s"] / p["fixed"]["graphs_per_s"] for p in ok)
        if ok else None,
        "adaptive_max_peak_above_base_mib": max((a["peak_above_base_mib"] for a in ads), default=None),
        "adaptive_over_budget": sum(a["peak_rss"] > a["budget_rss"] for a in ads),
        "adaptive_runs": len(ads),
        "fixed_over_budget": sum(p["fixed"]["peak_rss"] > p["fixed"]["budget_rss"] for p in ok),
    }


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    runs = [r for r in p["fixed"] + [p["adaptive"]] if "error" not in r]
    labels = [str(r["size"]) if r["mode"] == "fixed" else "adaptive" for r in runs]
    colors = ["tab:gray" if r["peak_rss"] > r["budget_rss"] else ("tab:green" if r["mode"] != "fixed" else "tab:blue")
              for r in runs]
    ax1.bar(labels, [r["graphs_per_s"] for r in runs], color=colors)
    ax1.set_xlabel("batch size (graphs); gray: over the memory budget")
    ax1.set_ylabel("graphs / s")
    ax1.set_title("throughput")
    s = p.get("summary")
    curves = [("adaptive", p["adaptive"])]
    if s:
        curves += [(f"fixed {s['best_fixed_size']} seed {r['seed']}", r) for r in p["fixed"] + p["repeats"]
                   if "error" not in r and r["size"] == s["best_fixed_size"]]
    for name, r in curves:
        if "curve" not in r:
            continue
        seen, xs, ys = 0, [], []
        for g, loss, *_ in r["curve"]:
            seen += g
            xs.append(seen)
            ys.append(loss)
        k = max(1, len(ys) // 40)  # smoothed: a running mean over ~1/40 of the run
        sm = [statistics.fmean(ys[max(0, i - k + 1):i + 1]) for i in range(len(ys))]
        ax2.plot(xs, sm, label=name)
    ax2.set_xlabel("graphs seen")
    ax2.set_ylabel("loss (running mean)")
    ax2.set_title("loss curves")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks adapt", description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", type=int, default=1200)
    ap.add_argument("--min-nodes", type=int, default=8)
    ap.add_argument("--max-nodes", type=int, default=600)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--sizes", default="8,16,32,64,128")
    ap.add_argument("--budget-mib", type=int, default=150)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--lr-scaling", default="sqrt", choices=["none", "linear", "sqrt"],
                    help="the adaptive run's learning-rate rescaling (default sqrt)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of best fixed vs adaptive (the first runs every fixed size), interleaved")
    ap.add_argument("--out", default=None)
    ap.add_argument("--results-dir", type=Path, default=_common.RESULTS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))))
        return 0
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.quick:
        args.graphs, args.max_nodes, args.epochs = 300, 200, 1
    sizes = sorted(int(s) for s in args.sizes.split(","))
    base = {"graphs": args.graphs, "min_nodes": args.min_nodes, "max_nodes": args.max_nodes, "epochs": args.epochs,
            "budget_mib": args.budget_mib, "threads": args.threads, "sizes": sizes, "window": args.window,
            "lr_scaling": None if args.lr_scaling == "none" else args.lr_scaling}
    load0 = _common.loadavg()
    fixed = []
    for s in sizes:
        r = _run(dict(base, mode="fixed", size=s, seed=0), args.timeout)
        r.setdefault("label", f"fixed {s}")
        print(f"fixed {s}: {r.get('graphs_per_s', r.get('error'))} graphs/s, peak above base "
              f"{r.get('peak_above_base_mib', float('nan')):.0f} MiB", file=sys.stderr)
        fixed.append(r)
    ok = [r for r in fixed if "error" not in r and r["peak_rss"] <= r["budget_rss"]]
    best = max(ok, key=lambda r: r["graphs_per_s"]) if ok else None
    repeats = []
    if best is not None:
        r = _run(dict(base, mode="fixed", size=best["size"], seed=1), args.timeout)
        r.setdefault("label", f"fixed {best['size']} seed 1")
        repeats.append(r)
    adaptive = _run(dict(base, mode="adaptive", seed=0), args.timeout)
    adaptive.setdefault("label", "adaptive")
    payload = {"command": _common.command("adapt", argv), "cpu": _common.cpu_model(), "machine": _common.machine(),
               "args": base, "fixed": fixed, "repeats": repeats, "adaptive": adaptive,
               "loadavg_before_after": [load0, _common.loadavg()]}
    if best is not None and "error" not in adaptive and repeats and "error" not in repeats[0]:
        gap = abs(adaptive["last_epoch_loss"] - best["last_epoch_loss"])
        noise = abs(repeats[0]["last_epoch_loss"] - best["last_epoch_loss"])
        payload["summary"] = {
            "best_fixed_size": best["size"], "best_fixed_graphs_per_s": best["graphs_per_s"],
            "adaptive_graphs_per_s": adaptive["graphs_per_s"],
            "speedup": adaptive["graphs_per_s"] / best["graphs_per_s"],
            "adaptive_peak_above_base_mib": adaptive["peak_above_base_mib"],
            "adaptive_within_budget": adaptive["peak_rss"] <= adaptive["budget_rss"],
            "adaptive_loss": adaptive["last_epoch_loss"], "fixed_loss_seed0": best["last_epoch_loss"],
            "fixed_loss_seed1": repeats[0]["last_epoch_loss"], "loss_gap": gap, "loss_noise": noise,
            "loss_within_noise": gap <= noise,
        }
        if args.rounds > 1:
            payload["rounds"] = _rounds(base, best, adaptive, args.rounds, args.timeout)
    name = args.out or ("adapt_quick" if args.quick else "adapt")
    _common.write_results(args.results_dir, name, payload, markdown, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
