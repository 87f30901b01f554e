"""Runtime adaptation: gnncompile.adapt.AdaptiveLoader vs every fixed setting, growing batches under a memory budget.

    python -m benchmarks adapt                     # the first pass (~5 min on 2 quiet cores)
    python -m benchmarks adapt --quick             # a smaller dataset, for a smoke test
    python -m benchmarks adapt --rounds 8          # then 7 more rounds of the best fixed of each kind vs adaptive
    python -m benchmarks adapt --workload denser   # graphs whose average degree grows with their size
    python -m benchmarks adapt --more-rounds NAME --rounds 5   # 4 more rounds after NAME's (a second locked stretch)

Data: ``gnncompile.data.synthetic.graph_dataset(--graphs, --min-nodes, --max-nodes, 16
features, average degree 4)``, sorted by node count, ascending, not shuffled: every epoch's
graphs grow from the smallest to the largest. Label: 1 when the graph's mean of feature 0 is
positive (graph_dataset's own label is decided by the node count alone here, which mean
pooling cannot see: sorted, the first half of every epoch was all 0 and the second all 1, so
its loss measured the order, not the learning; until 2026-12-05 the benchmark used it).
``--workload denser``: the same graphs (nodes, features, labels) with their edges drawn again at
an average degree linear in the node count, ``--min-degree`` (2) at ``--min-nodes`` to
``--max-degree`` (16) at ``--max-nodes``: larger graphs denser, as larger real graphs tend to
be, so a batch's edges per node (and its memory per node) grow through every epoch. Model: ``torch_geometric.nn.models.GIN(16, 64,
3)`` -> ``global_mean_pool`` -> ``Linear(64, 2)``, compiled with ``gnncompile.compile(model,
dynamic=True)``; step: forward, cross-entropy, backward, Adam (lr 1e-3).

Memory: the process's peak resident set in each step (``memory='rss'``: VmHWM reset per step,
see gnncompile.adapt: ``malloc_trim(0)`` and the block cache emptied before every 8th step, so
that step's growth shows; the allocator is the default one, as in training). The budget is
``--budget-mib`` above the resident set after warm-up (the model compiled, a few steps taken:
the same in every run), so it bounds what the training steps add. Every run (each fixed
setting, each repeat, each adaptive run) is a process of its own: nothing one run allocated or
compiled changes another's memory.

Fixed settings (each an AdaptiveLoader with one candidate: the same loader path, measuring, no
adaptation; given the memory budget too, so that its release guard (a clean start when the memory
held would cross it) works for them as for the adaptive run: until 2026-12-05 (s58) it did not, and
the comparison mixed the guard with the choice of size), seed 0: every graphs-per-batch size of ``--sizes`` (what a PyG DataLoader user
sets: ``batch_size``), every node budget of ``--node-sizes`` (``by='nodes'``: graphs packed
in order until the next would exceed the budget) and every edge budget of ``--edge-sizes``
(``by='edges'``). Within a kind, once a size's measured peak is over the budget the larger ones
are not run (reported as such: a larger batch of the same kind takes no less memory). The best
of each kind whose measured peak stays within the budget ("best fixed graphs", "... nodes",
"... edges") runs again with seeds 1 .. ``--seeds``-1 (other model initialisations: the
run-to-run noise of the loss); the fastest of the three is "the best fixed setting of all".

Adaptive (``--adaptive-by``, default ``nodes``): the adaptive loader over the node budgets of
``--node-sizes`` (or over ``--sizes`` with ``graphs``), starting at the smallest, ``--window``
steps per measurement, 5% hysteresis, 10% margin, the size up tried being the largest predicted
to fit, within 2.25x the work measured; learning-rate rescaling ``--lr-scaling`` (default
none: the run that settles on a node budget trains as the fixed run of that budget does, and
like it takes fewer, larger steps than small fixed batches, so its loss per graph seen lags
theirs early on; ``sqrt`` multiplies the lr by the square root of the size over the first
size at each size switch: measured on Zen 4 it made 2 of 5 runs stall at chance loss for three
epochs, adapt_zen4_s55_sqrt). The first pass also runs the adaptive loader of the other kind
once (reported, not in the rounds).

Each run also records what the compiler's speed guards kept (``model_guard``: the whole model,
compiled or eager, raced once on its first calls after the pieces decided; ``piece_guard``: each
piece's form per size class, with the nodes / edges of the calls it raced on; in the rounds as
``<side>_model_kept`` / ``<side>_piece_guard``): the adaptive run's first calls are its smallest
batches, and a class decided on 4096-node batches also covers its 8192-node ones
(adapt_zen4_s60a, adapt_steps_zen4_s60a).

Throughput: graphs per second over the ``--epochs`` epochs, everything included (loading,
measuring, adapting; compilation and warm-up excluded, the same in every run). Loss: the mean
loss per graph of each epoch and the loss curve against graphs seen; the adaptive run (seed 0)
is within the run-to-run noise in an epoch when its gap to the mean of the best fixed
setting's seeds is at most their spread (max - min).

``--rounds R`` (R > 1): after the first pass, R - 1 more rounds of the best fixed setting of
each kind (the first pass's, seed 0) and the adaptive run, each a fresh process, their order
rotating from round to round (interleaved: all sides see the same stretches of machine noise).
``--more-rounds NAME`` runs R - 1 further rounds after those of the results NAME (its arguments,
its first pass) and writes NAME again. Each ratio (adaptive / each best fixed) is the geometric mean of the R paired ratios with its 95% Student's t interval
(tuner.noise.ratio_interval), and the budget check covers every adaptive run.
Writes benchmarks/results/<--out, default adapt[_quick]>.{json,md,png}.
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


WORKLOADS = ("uniform", "denser")
KINDS = ("graphs", "nodes", "edges")
#: each kind's grid in the spec
GRID = {"graphs": "sizes", "nodes": "node_sizes", "edges": "edge_sizes"}
EDGE_SIZES = {"uniform": "8192,16384,32768,65536", "denser": "4096,8192,16384,32768,65536"}


def degree(spec, n: int) -> float:
    """The average degree of a graph of ``n`` nodes: 4 (workload 'uniform'); with 'denser',
    linear in the node count from ``min_degree`` at ``min_nodes`` to ``max_degree`` at
    ``max_nodes`` (larger graphs denser, as larger real graphs tend to be)."""
    if spec.get("workload", "uniform") == "uniform":
        return 4.0
    lo, hi = spec["min_nodes"], spec["max_nodes"]
    t = 0.0 if hi == lo else (n - lo) / (hi - lo)
    return spec["min_degree"] + t * (spec["max_degree"] - spec["min_degree"])


def _dataset(spec):
    from gnncompile.data import graph_dataset

    ds = graph_dataset(spec["graphs"], min_nodes=spec["min_nodes"], max_nodes=spec["max_nodes"], num_features=F,
                       seed=0)
    ds.sort(key=lambda d: d.num_nodes)
    if spec.get("workload", "uniform") == "denser":  # the edges drawn again, at the degree of the graph's size
        g = torch.Generator().manual_seed(1)
        for d in ds:
            n = int(d.num_nodes)
            m = max(1, int(n * degree(spec, n) / 2))
            src = torch.randint(0, n, (m,), generator=g)
            dst = torch.randint(0, n, (m,), generator=g)
            d.edge_index = torch.stack([torch.cat([src, dst]), torch.cat([dst, src])])
    for d in ds:  # a label the model can learn whatever the order (see the module docstring)
        d.y = torch.tensor([int(d.x[:, 0].mean() > 0)])
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


def _graph_step(cmodel, opt):
    """One training step on a batch of graphs: forward, cross-entropy, backward, the optimizer."""
    def step(b):
        out = cmodel(b.x, b.edge_index, b.batch, b.num_graphs)
        loss = torch.nn.functional.cross_entropy(out, b.y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step


def child(spec) -> dict:
    import gnncompile
    from gnncompile.adapt import AdaptiveLoader, RssMemory, Setting
    from gnncompile.data import PooledLoader

    torch.set_num_threads(spec["threads"])
    ds = _dataset(spec)
    model = _model(spec["seed"])
    cmodel = gnncompile.compile(model, dynamic=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    step = _graph_step(cmodel, opt)

    # warm-up (not timed): compile, and a few steps on small batches; then the optimizer restarts
    t0 = time.perf_counter()
    warm = PooledLoader(ds[:48], batch_size=16)
    for b in warm:
        step(b)
    warm.close()
    compile_s = time.perf_counter() - t0
    model.load_state_dict(_model(spec["seed"]).state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = _graph_step(cmodel, opt)  # the restarted optimizer
    gc.collect()
    probe = RssMemory()
    probe.start()
    base = probe.base
    budget = base + spec["budget_mib"] * 2**20
    by = spec["by"]
    if spec["mode"] == "fixed":
        # the budget too: one size cannot shrink, but the release guard (a clean start when the
        # memory held would cross the budget) keeps the allocator's creep out of its peak as in
        # the adaptive run, so the comparison measures the choice of size only
        L = AdaptiveLoader(ds, by=by, sizes=[spec["size"]], memory="rss", memory_budget=budget)
    else:
        sizes = spec[GRID[by]]
        L = AdaptiveLoader(ds, by=by, sizes=sizes, start=Setting(min(sizes), 2, 0), memory="rss",
                           memory_budget=budget, window=spec["window"], optimizer=opt, lr_scaling=spec["lr_scaling"])
    t0 = time.perf_counter()
    for _ in range(spec["epochs"]):
        for b in L:
            L.step_done(step(b))
    wall = time.perf_counter() - t0
    L.close()
    graphs = spec["epochs"] * len(ds)
    # what the whole-model speed guard kept (compiled or eager), timed on which calls: it races
    # once, on the first calls after the pieces decided (the adaptive run's are its smallest
    # batches), and that decision holds for every later size (adapt_steps_zen4_s60a.md)
    decisions = getattr(cmodel, "guard_decisions", lambda: [])()
    model_guard = [{"kept": d.kept, "recheck": bool(d.recheck), "compiled_ms": d.rewritten_ms,
                    "eager_ms": d.unrewritten_ms} for d in decisions if d.piece.startswith("the whole model")]
    # and each piece's per size class (nodes, edges of the calls it raced on, the form kept)
    piece_guard = [[d.nodes, d.edges, d.kept] for d in decisions if not d.piece.startswith("the whole model")]
    hist = L.history
    return {
        "mode": spec["mode"], "by": by, "size": spec.get("size"), "seed": spec["seed"], "wall_s": wall,
        "graphs_per_s": graphs / wall, "compile_s": compile_s, "steps": len(hist),
        "base_rss": base, "budget_rss": budget, "peak_rss": max(h["peak"] for h in hist),
        "peak_above_base_mib": (max(h["peak"] for h in hist) - base) / 2**20,
        "epoch_loss": _epoch_losses(hist, spec["epochs"]),
        "last_epoch_loss": _epoch_losses(hist, spec["epochs"])[-1],
        # per step: graphs, loss, size, nodes, edges, seconds, peak above base (MiB), a clean start (0/1)
        "curve": [[h["graphs"], h["loss"], h["size"], h["nodes"], h["edges"], round(h["seconds"], 6),
                   round((h["peak"] - base) / 2**20, 1), int(h["clean"])] for h in hist],
        "releases": L.releases,
        "log": L.log,
        "model_guard": model_guard,
        "piece_guard": piece_guard,
    }


def _epoch_losses(hist, epochs):
    """The mean loss per graph of each epoch (each step's loss is its batch's mean)."""
    out = []
    for e in range(epochs):
        hs = [h for h in hist if h["epoch"] == e]
        out.append(sum(h["loss"] * h["graphs"] for h in hs) / max(1, sum(h["graphs"] for h in hs)))
    return out


def _model_kept(r):
    """What the whole-model speed guard of run ``r`` kept last ('compiled' / 'eager'; None: no
    record, or no decision)."""
    g = r.get("model_guard")
    return g[-1]["kept"] if g else None


def _run(spec, timeout):
    cmd = _common.module_command("adapt") + ["--child", json.dumps(spec)]
    return _common.run_child(cmd, _common.timing_env(spec["threads"]), timeout)


def _label(r) -> str:
    if r["mode"] != "fixed":
        return f"adaptive ({r['by']})"
    return f"{r['size']} {r['by']}"


def _within(r) -> bool:
    return r["peak_rss"] <= r["budget_rss"]


def loss_check(adaptive: dict, seeds: list) -> dict:
    """The adaptive run against a fixed setting's runs of seeds 0, 1, ...: per epoch the gap
    |adaptive - mean over the fixed seeds| of the mean loss per graph and the noise (the seed
    spread: max - min over the fixed seeds); within the noise when gap <= noise. ``better``:
    the adaptive loss is below the fixed seeds' mean."""
    fixed = [r["epoch_loss"] for r in seeds]
    a = adaptive["epoch_loss"]
    mean = [statistics.fmean(f[e] for f in fixed) for e in range(len(a))]
    gaps = [abs(x - m) for x, m in zip(a, mean)]
    noise = [max(f[e] for f in fixed) - min(f[e] for f in fixed) for e in range(len(a))]
    within = [g <= n for g, n in zip(gaps, noise)]
    return {"gaps": gaps, "noise": noise, "within": within, "last_within": within[-1] if within else False,
            "epochs_within": sum(within), "better": [x < m for x, m in zip(a, mean)], "adaptive": a,
            "fixed_mean": mean, "fixed": fixed, "seeds": [r["seed"] for r in seeds]}


def loss_lines(lc: dict, heading: str, fanouts=None) -> list:
    """The markdown lines of a :func:`loss_check` result under ``heading``: per epoch the adaptive
    loss, each fixed seed's, their mean, the gap and the noise (a fanout column where given)."""
    fan_head, fan_rule = ("fanout | ", "---|") if fanouts else ("", "")
    lines = ["", heading, "",
             "| epoch | " + fan_head + "adaptive | " + " | ".join(f"fixed seed {sd}" for sd in lc["seeds"])
             + " | fixed mean | gap adaptive - mean | noise (seed spread) | within |",
             "|---|" + fan_rule + "---|" + "---|" * len(lc["seeds"]) + "---|---|---|---|"]
    for e in range(len(lc["gaps"])):
        verdict = "yes" if lc["within"][e] else ("no (lower)" if lc["better"][e] else "no (higher)")
        lines.append(f"| {e} | " + (f"{fanouts[e]} | " if fanouts else "") + f"{lc['adaptive'][e]:.4f} | "
                     + " | ".join(f"{f[e]:.4f}" for f in lc["fixed"])
                     + f" | {lc['fixed_mean'][e]:.4f} | {lc['gaps'][e]:.4f} | {lc['noise'][e]:.4f} | {verdict} |")
    lines.append(f"\nWithin the run-to-run noise in {lc['epochs_within']} of {len(lc['gaps'])} epochs "
                 f"(last epoch: {'within' if lc['last_within'] else 'outside'}).")
    return lines


def markdown(p: dict) -> str:
    a = p["args"]
    grid = "/".join(map(str, a[GRID[a["adaptive_by"]]]))
    kinds = [k for k in KINDS if a.get(GRID[k]) is not None]
    if a.get("workload", "uniform") == "denser":
        density = (f"average degree growing with the node count, {a['min_degree']:g} at {a['min_nodes']} nodes to "
                   f"{a['max_degree']:g} at {a['max_nodes']} (workload 'denser')")
    else:
        density = "average degree 4"
    lines = [f"# Runtime adaptation: growing batches under a memory budget\n",
             f"`{p['command']}`  \n{p['cpu']}, {a['threads']} threads, torch {p['machine']['torch']}.  "
             f"\n{_common.load_text(p['loadavg_before_after'])}\n",
             f"{a['graphs']} graphs of {a['min_nodes']}-{a['max_nodes']} nodes ({density}), sorted by size "
             f"ascending, {a['epochs']} epochs; compiled GIN ({F} -> {HIDDEN} x {LAYERS}) + mean pool + linear, Adam "
             f"(lr 1e-3). Memory budget: {a['budget_mib']} MiB of peak RSS above the resident set after warm-up. "
             f"Adaptive: by='{a['adaptive_by']}' over {grid} (starting at the smallest), window {a['window']}, "
             f"learning-rate rescaling: {a['lr_scaling'] or 'none'}.\n",
             "## First pass: every fixed setting, the adaptive runs\n",
             "| run | setting | seed | graphs/s | wall s | steps | peak above base MiB | within budget | "
             "last-epoch loss | guard's clean starts |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in p["fixed"] + p["repeats"] + [p["adaptive"]] + ([p["adaptive_other"]] if p.get("adaptive_other") else []):
        if "error" in r:
            lines.append(f"| {r.get('label', '?')} | | | error: {r['error'][:80]} | | | | | | |")
            continue
        kind = "fixed" if r["mode"] == "fixed" else "adaptive"
        setting = _label(r) if kind == "fixed" else f"by {r['by']}: " + "/".join(map(str, a[GRID[r["by"]]]))
        ok = "yes" if _within(r) else "**no (over budget: excluded)**"
        lines.append(f"| {kind} | {setting} | {r['seed']} | {r['graphs_per_s']:.0f} | {r['wall_s']:.2f} | "
                     f"{r['steps']} | {r['peak_above_base_mib']:.0f} | {ok} | {r['last_epoch_loss']:.4f} | "
                     f"{r.get('releases', '')} |")
    for r in p.get("skipped", []):
        lines.append(f"| fixed | {_label(r)} | {r['seed']} | not run: {r['skipped']} | | | | | | |")
    s = p.get("summary", {})
    names = {"graphs": "graphs per batch", "nodes": "node budget", "edges": "edge budget"}
    if s:
        lines.append("")
        for k, name in ((k, names[k]) for k in kinds):
            b = s.get(f"best_{k}")
            if b is None:
                lines.append(f"Best fixed {name} within budget: none.")
                continue
            lines.append(f"- **Best fixed {name} within budget: {b['size']}** ({b['graphs_per_s']:.0f} graphs/s, "
                         f"peak {b['peak_above_base_mib']:.0f} MiB above base). Adaptive (first pass): "
                         f"{s['adaptive_graphs_per_s']:.0f} graphs/s = **{s[f'speedup_vs_{k}']:.2f}x** it.")
        if s.get("best_kind"):
            lines.append(f"- The best fixed setting of all within budget: **{s['best_' + s['best_kind']]['size']} "
                         f"{s['best_kind']}** (the baseline the issue names).")
        lines.append(f"- Adaptive peak {s['adaptive_peak_above_base_mib']:.0f} MiB above base (budget "
                     f"{a['budget_mib']} MiB: {'within' if s['adaptive_within_budget'] else 'OVER'}).")
        if s.get("other") is not None:
            o = s["other"]
            lines.append(f"- The other adaptive run (by='{o['by']}'): {o['graphs_per_s']:.0f} graphs/s = "
                         + ", ".join(f"{o[f'speedup_vs_{k}']:.2f}x the best fixed {k}" for k in kinds
                                     if o.get(f"speedup_vs_{k}"))
                         + f", peak {o['peak_above_base_mib']:.0f} MiB above base "
                         f"({'within' if o['within_budget'] else 'OVER'} the budget).")
        for k in kinds:
            lc = s.get(f"loss_vs_{k}")
            if not lc:
                continue
            b = s[f"best_{k}"]
            lines += loss_lines(lc, f"### Loss: adaptive vs the best fixed {k} setting "
                                    f"({_label(dict(b, mode='fixed', by=k))}), seeds {', '.join(map(str, lc['seeds']))}")
    rd = p.get("rounds")
    if rd:
        fs = [k for k in rd["sides"] if k != "adaptive"]
        lines += ["", "## Interleaved rounds: " + ", ".join(f"best fixed {k}" for k in fs) + ", adaptive", "",
                  "| round | order | " + " | ".join(f"fixed {k} graphs/s" for k in fs) + " | adaptive graphs/s | "
                  + " | ".join(f"adaptive / {k}" for k in fs) + " | adaptive peak above base MiB | adaptive last-epoch "
                  "loss |", "|---|---|" + "---|" * (2 * len(fs) + 3)]

        def f(v, fmt):
            return "" if v is None else format(v, fmt)

        for r in rd["pairs"]:
            err = [r[f"{k}_error"] for k in rd["sides"] if r.get(f"{k}_error")]
            if err:
                lines.append(f"| {r['round']} | {r['order']} | error: {err[0][:60]} |" + " |" * (2 * len(fs) + 2))
                continue
            ad = r["adaptive_graphs_per_s"]
            fx = [r.get(f"{k}_graphs_per_s") for k in fs]
            lines.append(f"| {r['round']} | {r['order']} | " + " | ".join(f(v, ".0f") for v in fx) + f" | {ad:.0f} | "
                         + " | ".join(f(v and ad / v, ".2f") for v in fx) + " | "
                         f"{r['adaptive_peak_above_base_mib']:.0f} | {r['adaptive_last_epoch_loss']:.4f} |")
        lines.append("")
        for k in fs:
            iv = rd.get(f"vs_{k}")
            if not iv:
                continue
            span = f"[{iv['low']:.2f}, {iv['high']:.2f}]" if iv.get("low") is not None else "(one pair: no interval)"
            lines.append(f"- **Adaptive / best fixed {k} ({s[f'best_{k}']['size']}) over {iv['pairs']} interleaved "
                         f"rounds: {iv['ratio']:.2f}x** (geometric mean), 95% interval {span}; median "
                         f"{rd[f'median_vs_{k}']:.2f}x.")
        if s.get("best_kind") and rd.get(f"vs_{s['best_kind']}"):
            iv = rd[f"vs_{s['best_kind']}"]
            lines.append(f"- Against the best fixed setting of all ({s['best_' + s['best_kind']]['size']} "
                         f"{s['best_kind']}): **{iv['ratio']:.2f}x**, 95% interval "
                         + (f"[{iv['low']:.2f}, {iv['high']:.2f}]" if iv.get("low") is not None else "(none)")
                         + (" (the issue's 1.2x: met with confidence)." if iv.get("low") is not None and iv["low"] >= 1.2
                            else " (the issue's 1.2x: not shown)."))
        lines.append(f"- Adaptive runs over the {a['budget_mib']} MiB budget: {rd['adaptive_over_budget']} of "
                     f"{rd['adaptive_runs']} (largest peak {rd['adaptive_max_peak_above_base_mib']:.0f} MiB above "
                     f"base); the best fixed runs over it: {rd['fixed_over_budget']}. Adaptive last-epoch losses "
                     f"over the rounds: {rd['adaptive_loss_min']:.4f} - {rd['adaptive_loss_max']:.4f}.")
        me = rd.get("model_eager") or {}
        if any(n for _, n in me.values()):
            lines.append("- Runs whose whole-model speed guard kept the model as written (eager) for the rest of the "
                         "run: " + ", ".join(f"{k} {e} of {n}" for k, (e, n) in me.items() if n) + ".")
    for key, title in (("adaptive", "The adaptive run's switches"), ("adaptive_other", "The other adaptive run's switches")):
        ad = p.get(key)
        if not ad or "log" not in ad:
            continue
        lines += ["", f"## {title} (by='{ad['by']}', first pass)", "", "| step | epoch | kind | from | to | gain | "
                  "predicted MiB above base | reason |", "|---|---|---|---|---|---|---|---|"]
        for e in ad["log"]:
            pred = "" if e["predicted_bytes"] is None else f"{(e['predicted_bytes'] - ad['base_rss']) / 2**20:.0f}"
            gain = "" if e["gain"] is None else f"{e['gain']:.3f}"
            lines.append(f"| {e['step']} | {e['epoch']} | {e['kind']} | {e['from']['size']} | {e['to']['size']} | "
                         f"{gain} | {pred} | {e['reason']} |")
    lines += ["", "Throughput: graphs / wall seconds over all epochs (loading, measuring and adapting included; "
              "compilation and warm-up excluded, the same in every run). A fixed setting whose measured peak exceeds "
              "the budget is reported and excluded from 'best fixed'. The adaptive run's sizes are the fixed grid of "
              "its kind. Loss: mean loss per graph of each epoch; noise: the spread (max - min) of the best fixed "
              "setting's seeds; within when |adaptive - their mean| <= it."]
    return "\n".join(lines) + "\n"


SIDES = KINDS + ("adaptive",)


def _rounds(base: dict, first: dict, rounds: int, timeout: float, prior: list = None) -> dict:
    """Rounds 2..R of the best fixed setting of each kind (graphs, node budget, edge budget) and
    the adaptive run (fresh processes, the order rotating); round 1 is the first pass's runs
    (``prior``: the rounds of an earlier invocation, flattened as in the payload, instead: the
    new ones continue their numbering). Each paired ratio's geometric mean and 95% interval,
    every adaptive run's peak against the budget."""
    from gnncompile.tuner import noise

    fields = ("graphs_per_s", "peak_above_base_mib", "last_epoch_loss", "error")
    sides = [k for k in SIDES if first.get(k) is not None]
    specs = {k: dict(base, mode="fixed", by=k, seed=0, size=first[k]["size"]) for k in KINDS if first.get(k)}
    specs["adaptive"] = dict(base, mode="adaptive", by=base["adaptive_by"], seed=0)

    def flat(rnd, order, got):
        a = got.get("adaptive", {})
        return {"round": rnd, "order": " > ".join(order),
                **{f"{side}_{k}": got[side].get(k) for side in sides for k in fields},
                **{f"{side}_releases": got[side].get("releases") for side in sides},
                # the whole-model guard's last decision (compiled / eager), where recorded
                **{f"{side}_model_kept": _model_kept(got[side]) for side in sides},
                **{f"{side}_piece_guard": got[side].get("piece_guard") for side in sides},
                # the adaptive run's switches and per step (size, work, peak above base MiB, clean):
                # what an overshoot of the budget is diagnosed from
                "adaptive_log": a.get("log"),
                "adaptive_steps": [[c[2], c[3] + c[4], c[6], c[7]] for c in a.get("curve") or [] if len(c) >= 8]}

    pairs = list(prior) if prior else [flat(1, sides, first)]
    start = len(pairs) + 1
    for k in range(start, start + rounds - 1):
        order = sides[(k - 1) % len(sides):] + sides[:(k - 1) % len(sides)]
        got = {side: _run(specs[side], timeout) for side in order}
        print(f"round {k}: " + ", ".join(f"{side} {got[side].get('graphs_per_s', got[side].get('error'))}"
                                         for side in order), file=sys.stderr)
        pairs.append(flat(k, order, got))
    ok = [p for p in pairs if not any(p.get(f"{side}_error") for side in sides)]
    out = {"sides": sides, "pairs": pairs}
    for side in KINDS:
        if side in sides:
            out[f"vs_{side}"] = noise.ratio_interval([p["adaptive_graphs_per_s"] for p in ok],
                                                     [p[f"{side}_graphs_per_s"] for p in ok])
            out[f"median_vs_{side}"] = statistics.median(p["adaptive_graphs_per_s"] / p[f"{side}_graphs_per_s"]
                                                         for p in ok) if ok else None

    def over(p, side):
        return p[f"{side}_peak_above_base_mib"] > base["budget_mib"]

    peaks = [p["adaptive_peak_above_base_mib"] for p in ok]
    losses = [p["adaptive_last_epoch_loss"] for p in ok]
    out.update({
        "adaptive_max_peak_above_base_mib": max(peaks, default=None),
        "adaptive_over_budget": sum(over(p, "adaptive") for p in ok),
        "adaptive_runs": len(ok),
        "fixed_over_budget": sum(over(p, side) for p in ok for side in sides if side != "adaptive"),
        "adaptive_loss_min": min(losses, default=None),
        "adaptive_loss_max": max(losses, default=None),
        # per side: the runs whose whole-model guard kept the model as written (eager), of those recorded
        "model_eager": {side: [sum(p.get(f"{side}_model_kept") == "eager" for p in ok),
                               sum(p.get(f"{side}_model_kept") is not None for p in ok)] for side in sides},
    })
    return out


def _binned(curve, width):
    """(graphs seen, mean loss per graph) over bins of ``width`` graphs."""
    xs, ys, seen, acc, n = [], [], 0, 0.0, 0
    for g, loss, *_ in curve:
        seen += g
        acc += loss * g
        n += g
        if n >= width:
            xs.append(seen)
            ys.append(acc / n)
            acc, n = 0.0, 0
    if n:
        xs.append(seen)
        ys.append(acc / n)
    return xs, ys


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 4.8))
    runs = [r for r in p["fixed"] + [p["adaptive"]] + ([p["adaptive_other"]] if p.get("adaptive_other") else [])
            if "error" not in r]
    labels = [_label(r).replace(" graphs", " g").replace(" nodes", " n").replace(" edges", " e") for r in runs]
    kc = {"graphs": "tab:blue", "nodes": "tab:orange", "edges": "tab:purple"}
    colors = ["tab:gray" if not _within(r) else ("tab:green" if r["mode"] != "fixed" else kc[r["by"]])
              for r in runs]
    ax1.bar(labels, [r["graphs_per_s"] for r in runs], color=colors)
    ax1.set_ylabel("graphs / s")
    ax1.set_title("throughput (blue: graphs per batch, orange: node budget, purple: edge budget,\n"
                  "green: adaptive, gray: over the budget)", fontsize=9)
    ax1.tick_params(axis="x", rotation=60, labelsize=8)
    ax2.bar(labels, [r["peak_above_base_mib"] for r in runs], color=colors)
    ax2.axhline(p["args"]["budget_mib"], color="red", linestyle="--", label="budget")
    ax2.set_ylabel("peak RSS above base, MiB")
    ax2.set_title("measured peak per run")
    ax2.tick_params(axis="x", rotation=60, labelsize=8)
    ax2.legend()
    width = max(1, p["args"]["graphs"] // 5)
    s = p.get("summary") or {}
    runs_by_key = p["fixed"] + p["repeats"]
    for k, color in kc.items():
        b = s.get(f"best_{k}")
        if not b:
            continue
        for r in runs_by_key:
            if "error" in r or r["by"] != k or r["size"] != b["size"]:
                continue
            xs, ys = _binned(r["curve"], width)
            ax3.plot(xs, ys, color=color, alpha=1.0 if r["seed"] == 0 else 0.45,
                     linestyle="-" if r["seed"] == 0 else ":", label=f"fixed {_label(r)} seed {r['seed']}")
    if "curve" in p["adaptive"]:
        xs, ys = _binned(p["adaptive"]["curve"], width)
        ax3.plot(xs, ys, color="tab:green", linewidth=2, label=f"adaptive ({p['adaptive']['by']}) seed 0")
    ax3.set_xlabel("graphs seen")
    ax3.set_ylabel(f"mean loss per graph (bins of {width} graphs)")
    ax3.set_title("loss curves")
    ax3.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _best(runs):
    ok = [r for r in runs if "error" not in r and _within(r)]
    return max(ok, key=lambda r: r["graphs_per_s"]) if ok else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks adapt", description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", type=int, default=1200)
    ap.add_argument("--min-nodes", type=int, default=8)
    ap.add_argument("--max-nodes", type=int, default=600)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--sizes", default="8,16,32,64,128", help="fixed graphs-per-batch sizes (the by='graphs' grid)")
    ap.add_argument("--node-sizes", default="1024,2048,4096,8192,16384",
                    help="fixed node budgets (the by='nodes' grid)")
    ap.add_argument("--edge-sizes", default=None,
                    help="fixed edge budgets (the by='edges' grid; default per workload: uniform "
                         f"{EDGE_SIZES['uniform']}, denser {EDGE_SIZES['denser']})")
    ap.add_argument("--workload", default="uniform", choices=list(WORKLOADS),
                    help="uniform: average degree 4 (the default); denser: the average degree grows with the node "
                         "count from --min-degree to --max-degree")
    ap.add_argument("--min-degree", type=float, default=2.0)
    ap.add_argument("--max-degree", type=float, default=16.0)
    ap.add_argument("--adaptive-by", default="nodes", choices=list(KINDS),
                    help="the adaptive run of the rounds (the other kind runs once in the first pass)")
    ap.add_argument("--budget-mib", type=int, default=150)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=3, help="seeds of each best fixed setting (the loss noise), >= 2")
    ap.add_argument("--lr-scaling", default="none", choices=["none", "linear", "sqrt"],
                    help="the adaptive runs' learning-rate rescaling (default none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of best fixed graphs, best fixed nodes and adaptive (the first runs every fixed "
                         "setting), interleaved")
    ap.add_argument("--more-rounds", default=None, metavar="NAME",
                    help="no first pass: load results NAME.json (its arguments and first pass), run --rounds - 1 "
                         "more interleaved rounds after its own, write NAME again (a second locked stretch)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--results-dir", type=Path, default=_common.RESULTS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))))
        return 0
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.seeds < 2:
        ap.error(f"--seeds must be >= 2 (the noise needs a second seed), got {args.seeds}")
    if args.more_rounds:
        path = args.results_dir / f"{args.more_rounds}.json"
        p = json.loads(path.read_text())
        if "summary" not in p:
            ap.error(f"{path} has no first pass to continue from")
        s = p["summary"]
        first = {k: s[f"best_{k}"] for k in KINDS if s.get(f"best_{k}")}
        first["adaptive"] = p["adaptive"]
        p["rounds"] = _rounds(p["args"], first, args.rounds, args.timeout, (p.get("rounds") or {}).get("pairs"))
        p["command"] += f"; then {_common.command('adapt', argv)}"
        p["loadavg_before_after"][1] = _common.loadavg()
        _common.write_results(args.results_dir, args.out or args.more_rounds, p, markdown, plot)
        return 0
    if args.quick:
        args.graphs, args.max_nodes, args.epochs = 300, 200, 1
    sizes = sorted(int(s) for s in args.sizes.split(","))
    node_sizes = sorted(int(s) for s in args.node_sizes.split(","))
    edge_sizes = sorted(int(s) for s in (args.edge_sizes or EDGE_SIZES[args.workload]).split(","))
    if args.min_degree <= 0 or args.max_degree <= 0:
        ap.error("--min-degree and --max-degree must be > 0")
    base = {"graphs": args.graphs, "min_nodes": args.min_nodes, "max_nodes": args.max_nodes, "epochs": args.epochs,
            "budget_mib": args.budget_mib, "threads": args.threads, "sizes": sizes, "node_sizes": node_sizes,
            "edge_sizes": edge_sizes, "workload": args.workload, "min_degree": args.min_degree,
            "max_degree": args.max_degree,
            "window": args.window, "adaptive_by": args.adaptive_by, "seeds": args.seeds,
            "lr_scaling": None if args.lr_scaling == "none" else args.lr_scaling}
    load0 = _common.loadavg()
    fixed, best, skipped = [], {}, []
    for by in KINDS:
        mine, over = [], None
        for v in base[GRID[by]]:
            if over is not None:  # a larger batch of the same kind takes no less memory
                skipped.append({"mode": "fixed", "by": by, "size": v, "seed": 0,
                                "skipped": f"{over} {by} was over the budget already"})
                continue
            r = _run(dict(base, mode="fixed", by=by, size=v, seed=0), args.timeout)
            r.setdefault("label", f"fixed {v} {by}")
            print(f"fixed {v} {by}: {r.get('graphs_per_s', r.get('error'))} graphs/s, peak above base "
                  f"{r.get('peak_above_base_mib', float('nan')):.0f} MiB", file=sys.stderr)
            mine.append(r)
            if "error" not in r and not _within(r):
                over = v
        fixed += mine
        best[by] = _best(mine)
    repeats = []
    for k in KINDS:
        if best[k] is None:
            continue
        for seed in range(1, args.seeds):
            r = _run(dict(base, mode="fixed", by=k, size=best[k]["size"], seed=seed), args.timeout)
            r.setdefault("label", f"fixed {best[k]['size']} {k} seed {seed}")
            repeats.append(r)
    other = "graphs" if args.adaptive_by == "nodes" else "nodes"
    adaptive = _run(dict(base, mode="adaptive", by=args.adaptive_by, seed=0), args.timeout)
    adaptive.setdefault("label", f"adaptive ({args.adaptive_by})")
    adaptive_other = _run(dict(base, mode="adaptive", by=other, seed=0), args.timeout)
    adaptive_other.setdefault("label", f"adaptive ({other})")
    payload = {"command": _common.command("adapt", argv), "cpu": _common.cpu_model(), "machine": _common.machine(),
               "args": base, "fixed": fixed, "repeats": repeats, "adaptive": adaptive,
               "adaptive_other": adaptive_other, "skipped": skipped, "loadavg_before_after": [load0, None]}
    if "error" not in adaptive and any(best.values()):
        summary = {"adaptive_graphs_per_s": adaptive["graphs_per_s"],
                   "adaptive_peak_above_base_mib": adaptive["peak_above_base_mib"],
                   "adaptive_within_budget": _within(adaptive)}
        kinds = [k for k in KINDS if best[k] is not None]
        if kinds:
            summary["best_kind"] = max(kinds, key=lambda k: best[k]["graphs_per_s"])
        for k in KINDS:
            b = best[k]
            if b is None:
                continue
            summary[f"best_{k}"] = {"size": b["size"], "graphs_per_s": b["graphs_per_s"],
                                    "peak_above_base_mib": b["peak_above_base_mib"]}
            summary[f"speedup_vs_{k}"] = adaptive["graphs_per_s"] / b["graphs_per_s"]
            seeds = [b] + [r for r in repeats if "error" not in r and r["by"] == k]
            if len(seeds) >= 2:
                summary[f"loss_vs_{k}"] = loss_check(adaptive, seeds)
        if "error" not in adaptive_other:
            summary["other"] = {"by": other, "graphs_per_s": adaptive_other["graphs_per_s"],
                                "peak_above_base_mib": adaptive_other["peak_above_base_mib"],
                                "within_budget": _within(adaptive_other),
                                **{f"speedup_vs_{k}": adaptive_other["graphs_per_s"] / best[k]["graphs_per_s"]
                                   for k in KINDS if best[k] is not None}}
        payload["summary"] = summary
        if args.rounds > 1:
            payload["rounds"] = _rounds(base, dict(best, adaptive=adaptive), args.rounds, args.timeout)
    payload["loadavg_before_after"][1] = _common.loadavg()
    name = args.out or ("adapt_quick" if args.quick else "adapt")
    _common.write_results(args.results_dir, name, payload, markdown, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
