"""Runtime adaptation under a growing fanout: AdaptiveNeighborLoader vs every fixed seed batch size, a memory budget.

    python -m benchmarks adapt_fanout                  # the first pass: every fixed size, seeds, adaptive
    python -m benchmarks adapt_fanout --rounds 4       # then 3 more rounds of every fixed size within budget vs adaptive
    python -m benchmarks adapt_fanout --more-rounds NAME --rounds 5   # 4 more rounds after NAME's (a second locked stretch)
    python -m benchmarks adapt_fanout --quick          # a small graph, for a smoke test

Workload: node classification with neighbor sampling. Graph: ``power_law_graph(--nodes,
--edges)`` (gnncompile.data.synthetic; default 20k nodes, 1M edges: dense enough that a larger
fanout samples more, where 100k nodes / 1M edges saturate near 60-75 nodes + edges per seed
whatever the fanout), 16 random features; label: the argmax over 4 classes of a fixed random
projection of the node's features plus the mean of its in-neighbours' (learnable by SAGE).
Training nodes: ``--train`` of them (a fixed random subset). Model: PyG ``GraphSAGE(16, 64, 2
layers, 4)`` compiled with ``gnncompile.compile(model, dynamic=True)``; step: forward,
cross-entropy on the seeds, backward, Adam (lr 3e-3).

The curriculum (``--fanouts``, ``--epochs-per-fanout``): fanout [5, 5] for 8 epochs, then
[10, 10], [20, 20], [40, 40] (8 epochs each), set between epochs on the same loader with
``AdaptiveNeighborLoader.set_num_neighbors`` (no restart) in every run, fixed or adaptive.
Until s59 the default was 2 epochs a fanout: 8 epochs of 8192 seeds, 128 steps at 512 seeds a
batch and about 3 s of training, shorter than any real training run, in which a new fanout's
first window and trials were a quarter of its steps (``--epochs-per-fanout 2`` runs it). 8
epochs a fanout (512 steps at 512 seeds, 2048 at 128) keep one ``--rounds 8`` invocation
near 8-10 minutes on the 2-core Zen 4; the graph, the budget, the sizes and the guard are
unchanged, and the fixed runs train the same epochs.

Memory: the process's peak resident set in each step (``memory='rss'``, see gnncompile.adapt).
The budget is ``--budget-mib`` above the resident set after warm-up (compiled, two steps at
each fanout; the same in every run). Every run is a process of its own.

Fixed settings (an AdaptiveNeighborLoader with one size: the same loader path, measuring, no
adaptation; what a NeighborLoader user sets as ``batch_size``), seed 0: every size of
``--sizes``. They get the budget too: one size cannot shrink, but the loader's release guard
(a step starts clean, malloc_trim, when the memory held plus the peak's recent creep would
cross the budget) applies to them as to the adaptive run; without it the allocator's creep
between clean readings put even 128 seeds a batch at 164 MiB above base over 8 epochs.
gnncompile's block cache of freed large allocations is off in every run (``--buffer-cache``,
``$GNNCOMPILE_BUFFER_CACHE``): neighbor batches change shape every step, so the cache missed
and its idle blocks stayed resident next to the step's fresh ones, doubling the peak of a step
without a clean start (512 seeds a batch: 149 MiB above base with it, 115 MiB without, at the
same speed); under an RSS budget it is memory the budget cannot steer. The loader's batch guard
(``--batch-guard``, default on here, in every run; the library's opt-in ``batch_guard=True``: a
step starts clean when the memory held plus the sampled batch's modelled growth would cross the
budget; see AdaptiveNeighborLoader) covers the rises of the peak without a clean start that the
creep guard cannot foresee (s60), at a price: 0.69x the seeds/s of 512 seeds a batch, 0.76x the
adaptive run's, in two interleaved pairs each, less across whole invocations (about 5-30% in all;
adapt_fanout_rises_zen4_s60b.md). ``--mmap-threshold``
sets MALLOC_MMAP_THRESHOLD_ in every run (a measurement of the allocator's share, not a default). The best whose measured peak stays within the budget over the whole run runs
again with seeds 1 .. ``--seeds``-1 (model initialisation and seed order: the loss noise).
Adaptive: the adaptive loader over ``--sizes``, starting at the smallest, ``--window`` steps
per measurement, 5% hysteresis, 10% margin, rates in seeds per second; learning-rate rescaling
``--lr-scaling`` (default none: the lr is the same in every run; 'sqrt' / 'linear' scale the
adaptive run's lr by the size over the first size's, or its square root).

Ceiling: from the first pass, each fanout at the fixed size that trained it fastest among those
within the budget at that fanout, switched for free (``oracle``): what no choice of sizes beats,
against the best fixed size over the whole run.

Throughput: seeds per second over all epochs (sampling, measuring, adapting included;
compilation and warm-up excluded). Loss: the mean loss per seed of each epoch; the adaptive
run (seed 0) is within the noise in an epoch when its gap to the mean of the best fixed
size's seeds is at most their spread (max - min).

Work per seed: the fixed runs' measured nodes + edges per seed of their full batches, per size
and fanout, against ``gnncompile.adapt.NeighborWorkModel`` computed on the same graph (and the
change of fanout: measured ratio, the model's, the fanouts' bound's).

``--rounds R`` (R > 1): R - 1 more rounds of every fixed size that stayed within the budget in
the first pass (seed 0; until s59 only the best of them) and the adaptive run, fresh processes,
the order reversed every other round; the ratio adaptive / fixed, for each of those sizes, is the
geometric mean of the R paired ratios with its 95% Student's t interval, the budget check covers
every run, and the table names the sizes within the budget in every round and the fastest of
them (a size on the budget's edge in the first pass is no longer the only comparison).
``--more-rounds NAME --rounds R``: R - 1 further rounds after those in NAME.json (its arguments). Writes benchmarks/results/<--out, default
adapt_fanout[_quick]>.{json,md,png}.
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
from typing import Optional

import torch

from . import _common
from .adapt import _binned, _within, loss_check, loss_lines

F, HIDDEN, C = 16, 64, 4


def _graph(spec):
    from gnncompile.data.synthetic import power_law_graph

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_geometric.data import Data

    n = spec["nodes"]
    ei = power_law_graph(n, spec["edges"], seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, F, generator=g)
    agg = torch.zeros(n, F).index_add_(0, ei[1], x[ei[0]])
    deg = torch.bincount(ei[1], minlength=n).clamp(min=1).unsqueeze(1)
    w1, w2 = torch.randn(F, C, generator=g), torch.randn(F, C, generator=g)
    y = (x @ w1 + (agg / deg) @ w2).argmax(1)
    train = torch.randperm(n, generator=g)[:spec["train"]]
    return Data(x=x, edge_index=ei, y=y, num_nodes=n), train


def _model(seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_geometric.nn.models import GraphSAGE

    torch.manual_seed(seed)
    return GraphSAGE(F, HIDDEN, 2, C)


def _schedule(spec):
    """The fanout of each epoch."""
    return [list(f) for f in spec["fanouts"] for _ in range(spec["epochs_per_fanout"])]


def child(spec) -> dict:
    import gnncompile
    from gnncompile.adapt import AdaptiveNeighborLoader, RssMemory, Setting

    torch.set_num_threads(spec["threads"])
    data, train = _graph(spec)
    model = _model(spec["seed"])
    cmodel = gnncompile.compile(model, dynamic=True)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def step(b):
        k = int(b.batch_size)
        out = cmodel(b.x, b.edge_index)
        loss = torch.nn.functional.cross_entropy(out[:k], b.y[:k])
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    sched = _schedule(spec)
    # warm-up (not timed): compile, two steps at each fanout; then the model and optimizer restart
    t0 = time.perf_counter()
    for fan in spec["fanouts"]:
        warm = AdaptiveNeighborLoader(data, list(fan), input_nodes=train[:256], sizes=[128], memory=None)
        for b in warm:
            warm.step_done(step(b))
    compile_s = time.perf_counter() - t0
    model.load_state_dict(_model(spec["seed"]).state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    gc.collect()
    probe = RssMemory()
    probe.start()
    base = probe.base
    budget = base + spec["budget_mib"] * 2**20
    sizes = spec["sizes"]
    if spec["mode"] == "fixed":
        # the budget too: one size cannot shrink, but the release guard (a clean start when the
        # memory held would cross the budget) keeps the allocator's creep out of its peak as in
        # the adaptive run
        L = AdaptiveNeighborLoader(data, sched[0], input_nodes=train, sizes=[spec["size"]], shuffle=True,
                                   seed=spec["seed"], memory="rss", memory_budget=budget,
                                   batch_guard=spec.get("batch_guard", False))
    else:
        lr_scaling = spec.get("lr_scaling")
        L = AdaptiveNeighborLoader(data, sched[0], input_nodes=train, sizes=sizes, start=Setting(min(sizes), 2, 0),
                                   shuffle=True, seed=spec["seed"], memory="rss", memory_budget=budget,
                                   window=spec["window"], batch_guard=spec.get("batch_guard", False),
                                   optimizer=opt if lr_scaling else None, lr_scaling=lr_scaling)
    epoch_s = []
    t0 = time.perf_counter()
    for fan in sched:
        L.set_num_neighbors(fan)
        te = time.perf_counter()
        for b in L:
            L.step_done(step(b))
        epoch_s.append(time.perf_counter() - te)
    wall = time.perf_counter() - t0
    hist = L.history
    E = len(sched)
    seeds = E * int(train.numel())
    ep_loss = [_mean_loss(hist, e) for e in range(E)]
    return {
        "mode": spec["mode"], "size": spec.get("size"), "seed": spec["seed"], "wall_s": wall,
        "seeds_per_s": seeds / wall, "compile_s": compile_s, "steps": len(hist),
        "base_rss": base, "budget_rss": budget, "peak_rss": max(h["peak"] for h in hist),
        "peak_above_base_mib": (max(h["peak"] for h in hist) - base) / 2**20,
        "epoch_loss": ep_loss, "last_epoch_loss": ep_loss[-1],
        "epochs": [{"fanout": sched[e], "seconds": epoch_s[e], "seeds_per_s": int(train.numel()) / epoch_s[e],
                    "sizes": sorted({h["size"] for h in hist if h["epoch"] == e}),
                    "peak_above_base_mib": (max(h["peak"] for h in hist if h["epoch"] == e) - base) / 2**20,
                    "work_per_seed": sum(h["nodes"] + h["edges"] for h in hist if h["epoch"] == e)
                    / max(1, sum(h["graphs"] for h in hist if h["epoch"] == e))}
                   for e in range(E)],
        # per step: seeds, loss, size, nodes, edges, seconds, peak above base (MiB), a clean start (0/1), epoch,
        # the resident set at the step's start above base (MiB)
        "curve": [[h["graphs"], h["loss"], h["size"], h["nodes"], h["edges"], round(h["seconds"], 6),
                   round((h["peak"] - base) / 2**20, 1), int(h["clean"]), h["epoch"],
                   round((h["base"] - base) / 2**20, 1)] for h in hist],
        "releases": L.releases, "batch_releases": L.batch_releases, "batch_drops": L.batch_drops,
        "log": L.log,
    }


def work_table(spec: dict, fixed: list) -> list:
    """Per fixed size and fanout: the measured nodes + edges per seed of its full batches (all
    its epochs at that fanout), gnncompile.adapt.NeighborWorkModel's prediction for that size
    and fanout (computed here from the same graph) and the fanouts' bound 1 + 2 (f1 + f1 f2)."""
    from gnncompile.adapt import AdaptiveNeighborLoader, NeighborWorkModel

    data, train = _graph(spec)
    model = NeighborWorkModel(data.edge_index, int(data.num_nodes), train)
    rows = []
    for r in fixed:
        if "error" in r:
            continue
        for f in spec["fanouts"]:
            eps = {e for e, info in enumerate(r["epochs"]) if info["fanout"] == list(f)}
            cs = [c for c in r["curve"] if c[8] in eps and c[0] == r["size"]]
            if not cs:
                continue
            rows.append({"size": r["size"], "fanout": list(f),
                         "measured": sum(c[3] + c[4] for c in cs) / sum(c[0] for c in cs),
                         "model": model.per_seed(r["size"], f), "bound": AdaptiveNeighborLoader._fanout_bound(f)})
    return rows


def _work_lines(rows: list, fanouts: list) -> list:
    if not rows:
        return []
    sizes = sorted({r["size"] for r in rows})
    at = {(r["size"], tuple(r["fanout"])): r for r in rows}
    lines = ["", "## Work per seed: measured vs the work model (the fixed runs' full batches)", "",
             "Nodes + edges per seed, measured / predicted by `NeighborWorkModel` (error). Then the change of "
             "fanout: measured ratio of the work per seed, the model's, the fanouts' bound's.", "",
             "| seeds per batch | " + " | ".join(_fan(f) for f in fanouts) + " |",
             "|---|" + "---|" * len(fanouts)]
    for size in sizes:
        cells = []
        for f in fanouts:
            r = at.get((size, tuple(f)))
            cells.append("" if r is None else f"{r['measured']:.1f} / {r['model']:.1f} ({r['model'] / r['measured'] - 1:+.1%})")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    lines += ["", "| seeds per batch | " + " | ".join(f"{_fan(a)} -> {_fan(b)}" for a, b in zip(fanouts, fanouts[1:]))
              + " |", "|---|" + "---|" * (len(fanouts) - 1)]
    for size in sizes:
        cells = []
        for a, b in zip(fanouts, fanouts[1:]):
            ra, rb = at.get((size, tuple(a))), at.get((size, tuple(b)))
            cells.append("" if ra is None or rb is None else
                         f"{rb['measured'] / ra['measured']:.2f} / {rb['model'] / ra['model']:.2f} / "
                         f"{rb['bound'] / ra['bound']:.2f}")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return lines


def _mean_loss(hist, e):
    hs = [h for h in hist if h["epoch"] == e]
    return sum(h["loss"] * h["graphs"] for h in hs) / max(1, sum(h["graphs"] for h in hs))


def _run(spec, timeout):
    cmd = _common.module_command("adapt_fanout") + ["--child", json.dumps(spec)]
    env = _common.timing_env(spec["threads"])
    env["GNNCOMPILE_BUFFER_CACHE"] = spec.get("buffer_cache", "off")
    if spec.get("mmap_threshold") is not None:
        env["MALLOC_MMAP_THRESHOLD_"] = str(int(spec["mmap_threshold"]))
    return _common.run_child(cmd, env, timeout)


def _best(runs):
    ok = [r for r in runs if "error" not in r and _within(r)]
    return max(ok, key=lambda r: r["seeds_per_s"]) if ok else None


def _fan(f) -> str:
    return "[" + ", ".join(map(str, f)) + "]"


def oracle(fixed: list, budget_mib: float, best_size: Optional[int]) -> Optional[dict]:
    """The ceiling of adaptation on this run's first pass: each fanout at the fixed size that
    trained it fastest (seconds over its epochs) among those whose every epoch at that fanout
    peaked within the budget, switching for free at a change of fanout, no trial or measurement.
    Against the best fixed size within the budget over the whole run (``best_size``): the ratio
    no adaptive run on this workload and budget can beat by choosing sizes."""
    per = {}
    for r in fixed:
        if "error" in r:
            continue
        for e in r["epochs"]:
            d = per.setdefault(tuple(e["fanout"]), {}).setdefault(r["size"], [0.0, 0.0])
            d[0] += e["seconds"]
            d[1] = max(d[1], e["peak_above_base_mib"])
    choice, total, best_total = [], 0.0, 0.0
    for f, sizes in per.items():
        ok = {v: t for v, (t, peak) in sizes.items() if peak <= budget_mib}
        if not ok or best_size not in sizes:
            return None
        v = min(ok, key=ok.get)
        choice.append({"fanout": list(f), "size": v, "seconds": ok[v], "best_fixed_seconds": sizes[best_size][0]})
        total += ok[v]
        best_total += sizes[best_size][0]
    if not choice or total <= 0:
        return None
    return {"choice": choice, "seconds": total, "best_fixed_seconds": best_total, "ratio": best_total / total,
            "best_size": best_size}


def markdown(p: dict) -> str:
    a = p["args"]
    sched = ", ".join(f"{_fan(f)} x{a['epochs_per_fanout']}" for f in a["fanouts"])
    lines = ["# Runtime adaptation: a growing fanout under a memory budget\n",
             f"`{p['command']}`  \n{p['cpu']}, {a['threads']} threads, torch {p['machine']['torch']}.  "
             f"\n{_common.load_text(p['loadavg_before_after'])}\n",
             f"Power-law graph of {a['nodes']} nodes / {a['edges']} edges, {F} features, {C} classes; {a['train']} "
             f"training seeds an epoch; compiled GraphSAGE ({F} -> {HIDDEN}, 2 layers), Adam (lr 3e-3). Fanout "
             f"curriculum: {sched} (set between epochs with `set_num_neighbors`, same loader). Memory budget: "
             f"{a['budget_mib']} MiB of peak RSS above the resident set after warm-up (gnncompile's block cache: "
             f"{a.get('buffer_cache', 'auto')}). Adaptive: seed batch sizes "
             f"{'/'.join(map(str, a['sizes']))} (starting at the smallest), window {a['window']}, rates in seeds/s, "
             f"learning-rate rescaling: {a.get('lr_scaling') or 'none'}. Batch guard (a clean start when the memory "
             f"held plus the sampled batch's modelled growth would cross the budget): "
             f"{'on' if a.get('batch_guard', False) else 'off'}, in every run. Allocator: "
             f"{'MALLOC_MMAP_THRESHOLD_=' + str(a['mmap_threshold']) if a.get('mmap_threshold') is not None else 'glibc defaults'}.\n",
             "## First pass: every fixed seed batch size, the adaptive run\n",
             "| run | seeds per batch | seed | seeds/s | wall s | steps | peak above base MiB | within budget | "
             "last-epoch loss | seeds/s per fanout |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in p["fixed"] + p["repeats"] + [p["adaptive"]]:
        if "error" in r:
            lines.append(f"| {r.get('label', '?')} | | | error: {r['error'][:80]} | | | | | | |")
            continue
        kind = "fixed" if r["mode"] == "fixed" else "adaptive"
        setting = str(r["size"]) if kind == "fixed" else "/".join(map(str, a["sizes"]))
        ok = "yes" if _within(r) else "**no (over budget: excluded)**"
        per = " / ".join(f"{statistics.fmean(e['seeds_per_s'] for e in r['epochs'] if e['fanout'] == list(f)):.0f}"
                         for f in a["fanouts"])
        lines.append(f"| {kind} | {setting} | {r['seed']} | {r['seeds_per_s']:.0f} | {r['wall_s']:.2f} | "
                     f"{r['steps']} | {r['peak_above_base_mib']:.0f} | {ok} | {r['last_epoch_loss']:.4f} | {per} |")
    s = p.get("summary", {})
    if s:
        b = s.get("best")
        lines.append("")
        if b is None:
            lines.append("Best fixed size within budget: none.")
        else:
            lines.append(f"- **Best fixed seed batch size within budget: {b['size']}** ({b['seeds_per_s']:.0f} "
                         f"seeds/s, peak {b['peak_above_base_mib']:.0f} MiB above base). Adaptive (first pass): "
                         f"{s['adaptive_seeds_per_s']:.0f} seeds/s = **{s['speedup']:.2f}x** it.")
        lines.append(f"- Adaptive peak {s['adaptive_peak_above_base_mib']:.0f} MiB above base (budget "
                     f"{a['budget_mib']} MiB: {'within' if s['adaptive_within_budget'] else 'OVER'}).")
        o = oracle(p["fixed"], a["budget_mib"], b["size"]) if b else None
        if o:
            picks = ", ".join(f"{_fan(c['fanout'])} at {c['size']}" for c in o["choice"])
            lines.append(f"- Ceiling (first pass): each fanout at its fastest fixed size within the budget ({picks}), "
                         f"switching for free, trains in {o['seconds']:.2f} s against {o['best_fixed_seconds']:.2f} s "
                         f"for {o['best_size']}: **{o['ratio']:.2f}x**, the most any choice of sizes reaches here.")
        ad = p["adaptive"]
        lines += ["", "### Per epoch (first pass): the adaptive run and the best fixed size", "",
                  "| epoch | fanout | adaptive sizes | adaptive seeds/s | adaptive peak MiB | adaptive work/seed | "
                  "fixed seeds/s | fixed peak MiB |", "|---|---|---|---|---|---|---|---|"]
        bf = s.get("best_run")
        for e, ea in enumerate(ad["epochs"]):
            ef = bf["epochs"][e] if bf else None
            lines.append(f"| {e} | {_fan(ea['fanout'])} | {'/'.join(map(str, ea['sizes']))} | {ea['seeds_per_s']:.0f} | "
                         f"{ea['peak_above_base_mib']:.0f} | {ea['work_per_seed']:.0f} | "
                         + (f"{ef['seeds_per_s']:.0f} | {ef['peak_above_base_mib']:.0f} |" if ef else " | |"))
        lc = s.get("loss")
        if lc:
            lines += loss_lines(lc, f"### Loss: adaptive vs the best fixed size ({b['size']}), seeds "
                                    f"{', '.join(map(str, lc['seeds']))}",
                                [_fan(ad["epochs"][e]["fanout"]) for e in range(len(lc["gaps"]))])
    rd = p.get("rounds")
    if rd:
        lines += ["", "## Interleaved rounds: fixed sizes vs adaptive (the best fixed size's columns)", "",
                  "| round | order | fixed seeds/s | adaptive seeds/s | adaptive / fixed | adaptive peak above base MiB | "
                  "fixed peak MiB | adaptive last-epoch loss | fixed last-epoch loss |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rd["pairs"]:
            if r.get("error"):
                lines.append(f"| {r['round']} | {r['order']} | error: {r['error'][:60]} | | | | | | |")
                continue
            lines.append(f"| {r['round']} | {r['order']} | {r['fixed_seeds_per_s']:.0f} | {r['adaptive_seeds_per_s']:.0f} "
                         f"| {r['adaptive_seeds_per_s'] / r['fixed_seeds_per_s']:.2f} | "
                         f"{r['adaptive_peak_above_base_mib']:.0f} | {r['fixed_peak_above_base_mib']:.0f} | "
                         f"{r['adaptive_last_epoch_loss']:.4f} | {r['fixed_last_epoch_loss']:.4f} |")
        iv = rd.get("ratio")
        lines.append("")
        if iv:
            span = f"[{iv['low']:.2f}, {iv['high']:.2f}]" if iv.get("low") is not None else "(one pair: no interval)"
            lines.append(f"- **Adaptive / best fixed ({s['best']['size']}) over {iv['pairs']} interleaved rounds: "
                         f"{iv['ratio']:.2f}x** (geometric mean), 95% interval {span}; median {rd['median']:.2f}x.")
        vs = rd.get("vs_size") or {}
        if vs:
            inside = rd.get("within_all_rounds") or []
            lines += ["", "### Adaptive against every fixed size the rounds ran (those within the budget in the first "
                      "pass)", "",
                      "| fixed seeds per batch | rounds | fixed runs over the budget | fixed largest peak MiB | fixed "
                      "seeds/s (geometric mean) | adaptive / fixed | 95% interval | median | fixed last-epoch loss |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for v in vs.values():
                r = v["ratio"] or {}
                span = f"[{r['low']:.2f}, {r['high']:.2f}]" if r.get("low") is not None else ""
                lines.append(f"| {v['size']} | {v['runs']} | {v['over_budget']} | {v['max_peak_above_base_mib']:.0f} | "
                             f"{v['geomean_seeds_per_s']:.0f} | {r.get('ratio', float('nan')):.2f}x | {span} | "
                             f"{v['median']:.2f}x | {v['loss_min']:.4f} - {v['loss_max']:.4f} |")
            bw = rd.get("best_within_all")
            lines += ["", f"- Fixed sizes within the budget in every round: "
                      f"{', '.join(map(str, inside)) if inside else 'none'}"
                      + (f"; the fastest of them: **{bw}**, adaptive / {bw}: **{vs[str(bw)]['ratio']['ratio']:.2f}x**"
                         if bw is not None and vs[str(bw)]['ratio'] else "") + "."]
        lines.append(f"- Adaptive runs over the {a['budget_mib']} MiB budget: {rd['adaptive_over_budget']} of "
                     f"{rd['adaptive_runs']} (largest peak {rd['adaptive_max_peak_above_base_mib']:.0f} MiB above "
                     f"base); best fixed runs over it: {rd['fixed_over_budget']} of {rd['adaptive_runs']}. Last-epoch "
                     f"loss over the rounds: adaptive {rd['adaptive_loss_min']:.4f} - {rd['adaptive_loss_max']:.4f}, "
                     f"fixed {rd['fixed_loss_min']:.4f} - {rd['fixed_loss_max']:.4f}.")
        for r in rd["pairs"]:
            for side in ("adaptive", "fixed"):
                ps = r.get(f"{side}_peak_step")
                if r.get("error") or r.get(f"{side}_within", True) or not ps:
                    continue
                b = ps["before"]
                prev = "" if b is None else (f"; the step before: {b['peak_mib']:.1f} MiB at {b['size']} seeds"
                                             f"{', clean' if b['clean'] else ''}")
                lines.append(f"- Round {r['round']}, {side} over the budget: peak {ps['peak_mib']:.1f} MiB at step "
                             f"{ps['step']} (epoch {ps['epoch']}, {ps['size']} seeds"
                             f"{', a clean start' if ps['clean'] else ''}){prev}.")
    lines += _work_lines(p.get("work_model") or [], a["fanouts"])
    ad = p.get("adaptive")
    if ad and "log" in ad:
        sched_e = [e["fanout"] for e in ad["epochs"]]
        lines += ["", "## The adaptive run's switches (first pass)", "",
                  "| step | epoch | fanout | kind | from | to | gain (seeds/s) | predicted MiB above base | reason |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for e in ad["log"]:
            pred = "" if e["predicted_bytes"] is None else f"{(e['predicted_bytes'] - ad['base_rss']) / 2**20:.0f}"
            gain = "" if e["gain"] is None else f"{e['gain']:.3f}"
            fan = _fan(sched_e[e["epoch"]]) if 0 <= e["epoch"] < len(sched_e) else ""
            lines.append(f"| {e['step']} | {e['epoch']} | {fan} | {e['kind']} | {e['from']['size']} | {e['to']['size']} "
                         f"| {gain} | {pred} | {e['reason']} |")
    lines += ["", "Throughput: training seeds / wall seconds over all epochs (sampling, measuring and adapting "
              "included; compilation and warm-up excluded, the same in every run). A fixed size whose measured peak "
              "exceeds the budget in any epoch is reported and excluded from 'best fixed'. Loss: mean loss per seed "
              "of each epoch; noise: the spread (max - min) of the best fixed size's seeds; within when |adaptive - "
              "their mean| <= it."]
    return "\n".join(lines) + "\n"


def _row(k: int, order: str, best_size: int, got: dict) -> dict:
    """One round's record: the adaptive run against the best fixed size (``fixed_*``, as
    before) and every fixed size of the round (``fixed_by_size``); ``got`` maps 'adaptive' and
    each size to its run."""
    err = next((r["error"] for r in got.values() if "error" in r), None)
    row = {"round": k, "order": order, "error": err}
    if err is not None:
        return row
    for side, r in (("fixed", got[best_size]), ("adaptive", got["adaptive"])):
        for key in ("seeds_per_s", "peak_above_base_mib", "last_epoch_loss"):
            row[f"{side}_{key}"] = r[key]
        row[f"{side}_within"] = _within(r)
        row[f"{side}_peak_step"] = _peak_step(r)
    row["adaptive_log"] = got["adaptive"].get("log")
    row["adaptive_releases"] = got["adaptive"].get("releases")
    row["fixed_by_size"] = {str(v): {"seeds_per_s": r["seeds_per_s"], "peak_above_base_mib": r["peak_above_base_mib"],
                                     "last_epoch_loss": r["last_epoch_loss"], "within": _within(r),
                                     "releases": r.get("releases"), "peak_step": _peak_step(r)}
                            for v, r in got.items() if v != "adaptive"}
    return row


def _summarise(pairs: list, sizes: list, best_size: int) -> dict:
    """The rounds' figures: the adaptive run against the first pass's best fixed size
    (``ratio``, ``median``) and against every fixed size the rounds ran (``vs_size``: its ratio
    with the interval, its runs over the budget); ``within_all_rounds``: the sizes none of whose
    runs crossed the budget; ``best_within_all``: the fastest of them (geometric mean of its
    seeds/s over the rounds)."""
    from gnncompile.tuner import noise

    ok = [p for p in pairs if not p.get("error")]
    out = {"pairs": pairs, "sizes": sizes, "best_size": best_size,
           "ratio": noise.ratio_interval([p["adaptive_seeds_per_s"] for p in ok], [p["fixed_seeds_per_s"] for p in ok]),
           "median": statistics.median(p["adaptive_seeds_per_s"] / p["fixed_seeds_per_s"] for p in ok) if ok else None}
    vs = {}
    for v in sizes:
        rs = [(p["adaptive_seeds_per_s"], p["fixed_by_size"][str(v)]) for p in ok if str(v) in p.get("fixed_by_size", {})]
        if not rs:
            continue
        vs[str(v)] = {"size": v, "runs": len(rs),
                      "ratio": noise.ratio_interval([a for a, _ in rs], [f["seeds_per_s"] for _, f in rs]),
                      "median": statistics.median(a / f["seeds_per_s"] for a, f in rs),
                      "geomean_seeds_per_s": statistics.geometric_mean(f["seeds_per_s"] for _, f in rs),
                      "over_budget": sum(not f["within"] for _, f in rs),
                      "max_peak_above_base_mib": max(f["peak_above_base_mib"] for _, f in rs),
                      "loss_min": min(f["last_epoch_loss"] for _, f in rs),
                      "loss_max": max(f["last_epoch_loss"] for _, f in rs)}
    out["vs_size"] = vs
    out["within_all_rounds"] = [v["size"] for v in vs.values() if v["over_budget"] == 0]
    inside = [v for v in vs.values() if v["over_budget"] == 0]
    out["best_within_all"] = max(inside, key=lambda v: v["geomean_seeds_per_s"])["size"] if inside else None
    ads = ok
    out.update({
        "adaptive_max_peak_above_base_mib": max((a["adaptive_peak_above_base_mib"] for a in ads), default=None),
        "adaptive_over_budget": sum(not a["adaptive_within"] for a in ads),
        "adaptive_runs": len(ads),
        "fixed_over_budget": sum(not a["fixed_within"] for a in ads),
        "adaptive_loss_min": min((a["adaptive_last_epoch_loss"] for a in ads), default=None),
        "adaptive_loss_max": max((a["adaptive_last_epoch_loss"] for a in ads), default=None),
        "fixed_loss_min": min((a["fixed_last_epoch_loss"] for a in ads), default=None),
        "fixed_loss_max": max((a["fixed_last_epoch_loss"] for a in ads), default=None),
    })
    return out


def _rounds(base: dict, first: dict, rounds: int, timeout: float, sizes: list, best_size: int,
            before: Optional[list] = None) -> dict:
    """Rounds of every fixed size in ``sizes`` (the first pass's sizes within the budget; seed
    0) and the adaptive run, fresh processes, the order reversed every other round; round 1 is
    the first pass's runs (``first``: 'adaptive' and each size's run). ``before``: the rows of
    rounds already run (``--more-rounds``): R - 1 more follow them."""
    specs = {v: dict(base, mode="fixed", size=v, seed=0) for v in sizes}
    specs["adaptive"] = dict(base, mode="adaptive", seed=0)
    pairs = list(before) if before else [_row(1, "fixed > adaptive", best_size, first)]
    k0 = len(pairs)
    for k in range(k0 + 1, k0 + rounds):
        order = sorted(sizes) + ["adaptive"]
        if k % 2 == 0:
            order = order[::-1]
        got = {}
        for side in order:
            got[side] = _run(specs[side], timeout)
        label = " > ".join("adaptive" if side == "adaptive" else f"fixed {side}" for side in order)
        print(f"round {k}: " + ", ".join(f"{side} {got[side].get('seeds_per_s', got[side].get('error'))}"
                                         for side in order), file=sys.stderr)
        pairs.append(_row(k, label, best_size, got))
    return _summarise(pairs, sizes, best_size)


def _peak_step(r: dict):
    """Where a run's peak was: its step, seeds per batch, epoch, clean start and peak above base
    (MiB), and the same of the step before (None for the first); None without a curve."""
    c = r.get("curve") or []
    if not c:
        return None
    i = max(range(len(c)), key=lambda k: c[k][6])

    def one(k):
        return {"step": k, "size": c[k][2], "epoch": c[k][8], "clean": bool(c[k][7]), "peak_mib": c[k][6]}

    return {**one(i), "before": one(i - 1) if i > 0 else None}


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 4, figsize=(21, 4.8))
    runs = [r for r in p["fixed"] + [p["adaptive"]] if "error" not in r]
    labels = [str(r["size"]) if r["mode"] == "fixed" else "adaptive" for r in runs]
    colors = ["tab:gray" if not _within(r) else ("tab:green" if r["mode"] != "fixed" else "tab:blue") for r in runs]
    axs[0].bar(labels, [r["seeds_per_s"] for r in runs], color=colors)
    axs[0].set_ylabel("seeds / s")
    axs[0].set_xlabel("seeds per batch")
    axs[0].set_title("throughput (blue: fixed, green: adaptive, gray: over the budget)", fontsize=9)
    axs[1].bar(labels, [r["peak_above_base_mib"] for r in runs], color=colors)
    axs[1].axhline(p["args"]["budget_mib"], color="red", linestyle="--", label="budget")
    axs[1].set_ylabel("peak RSS above base, MiB")
    axs[1].set_title("measured peak per run")
    axs[1].legend()
    s = p.get("summary") or {}
    b = s.get("best")
    width = max(1, p["args"]["train"] // 4)
    if b:
        for r in p["fixed"] + p["repeats"]:
            if "error" in r or r["size"] != b["size"]:
                continue
            xs, ys = _binned(r["curve"], width)
            axs[2].plot(xs, ys, color="tab:blue", alpha=1.0 if r["seed"] == 0 else 0.45,
                        linestyle="-" if r["seed"] == 0 else ":", label=f"fixed {r['size']} seed {r['seed']}")
    ad = p["adaptive"]
    if "curve" in ad:
        xs, ys = _binned(ad["curve"], width)
        axs[2].plot(xs, ys, color="tab:green", linewidth=2, label="adaptive seed 0")
        axs[2].set_xlabel("seeds seen")
        axs[2].set_ylabel(f"mean loss per seed (bins of {width})")
        axs[2].set_title("loss curves")
        axs[2].legend(fontsize=7)
        steps = list(range(len(ad["curve"])))
        axs[3].step(steps, [c[2] for c in ad["curve"]], where="post", color="tab:green", label="adaptive seeds/batch")
        if b:
            axs[3].axhline(b["size"], color="tab:blue", linestyle="--", label=f"best fixed ({b['size']})")
        ep = [c[8] for c in ad["curve"]]
        for i in range(1, len(ep)):
            if ep[i] != ep[i - 1]:
                axs[3].axvline(i, color="0.8", linewidth=0.8)
        for e, info in enumerate(ad["epochs"]):
            first = ep.index(e) if e in ep else None
            if first is not None and (e == 0 or info["fanout"] != ad["epochs"][e - 1]["fanout"]):
                axs[3].text(first, max(c[2] for c in ad["curve"]) * 1.02, _fan(info["fanout"]), fontsize=7)
        axs[3].set_yscale("log", base=2)
        axs[3].set_xlabel("step")
        axs[3].set_title("the adaptive run's seed batch size (epochs: gray lines)")
        axs[3].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _fanouts(text: str):
    out = []
    for part in text.split(";"):
        f = [int(v) for v in part.split(",")]
        if not f or any(v < 1 for v in f):
            raise ValueError(f"--fanouts: {part!r} is not a list of ints >= 1")
        out.append(f)
    if len({len(f) for f in out}) != 1:
        raise ValueError("--fanouts: every fanout needs the same number of hops")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks adapt_fanout", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=20000)
    ap.add_argument("--edges", type=int, default=1000000)
    ap.add_argument("--train", type=int, default=8192, help="training seeds an epoch")
    ap.add_argument("--fanouts", default="5,5;10,10;20,20;40,40", help="the curriculum: fanouts separated by ';'")
    ap.add_argument("--epochs-per-fanout", type=int, default=8,
                    help="epochs at each fanout (default 8; 2 until s59: see the module docstring)")
    ap.add_argument("--sizes", default="128,256,512,1024,2048,4096,8192", help="seed batch sizes (fixed and adaptive)")
    ap.add_argument("--budget-mib", type=int, default=128)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--buffer-cache", default="off",
                    help="$GNNCOMPILE_BUFFER_CACHE of every run (default off: see the module docstring)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the best fixed size (the loss noise), >= 2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of every fixed size within the budget in the first pass and the adaptive run (the "
                         "first is the first pass)")
    ap.add_argument("--more-rounds", default=None, metavar="NAME",
                    help="no first pass: load results NAME.json (its arguments, first pass and rounds), run --rounds - "
                         "1 more rounds after its own, write NAME again (or --out): a second locked stretch")
    ap.add_argument("--batch-guard", choices=("on", "off"), default="on",
                    help="AdaptiveNeighborLoader(batch_guard=...) in every run, fixed and adaptive (default on)")
    ap.add_argument("--lr-scaling", choices=("none", "sqrt", "linear"), default="none",
                    help="the adaptive runs' learning-rate rescaling (default none)")
    ap.add_argument("--mmap-threshold", type=int, default=None, metavar="BYTES",
                    help="MALLOC_MMAP_THRESHOLD_ of every run (default: glibc's dynamic threshold)")
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
    if args.epochs_per_fanout < 1:
        ap.error("--epochs-per-fanout must be >= 1")
    if args.more_rounds:
        path = args.results_dir / f"{args.more_rounds}.json"
        if not path.exists():
            ap.error(f"--more-rounds: {path} does not exist")
        p = json.loads(path.read_text())
        if not p.get("rounds") or "pairs" not in p["rounds"] or "sizes" not in p["rounds"]:
            ap.error(f"{path} has no rounds to continue from (run --rounds >= 2 first)")
        if args.rounds < 2:
            ap.error("--more-rounds needs --rounds >= 2 (R - 1 more rounds)")
        rd = p["rounds"]
        p["rounds"] = _rounds(p["args"], {}, args.rounds, args.timeout, rd["sizes"], rd["best_size"], rd["pairs"])
        p["command"] += f"; then {_common.command('adapt_fanout', argv)}"
        p["loadavg_before_after"][1] = _common.loadavg()
        _common.write_results(args.results_dir, args.out or args.more_rounds, p, markdown, plot)
        return 0
    try:
        fanouts = _fanouts(args.fanouts)
    except ValueError as e:
        ap.error(str(e))
    if args.quick:
        args.nodes, args.edges, args.train, args.epochs_per_fanout = 3000, 60000, 1024, 1
    sizes = sorted(int(s) for s in args.sizes.split(","))
    base = {"nodes": args.nodes, "edges": args.edges, "train": args.train, "fanouts": fanouts,
            "epochs_per_fanout": args.epochs_per_fanout, "budget_mib": args.budget_mib, "threads": args.threads,
            "sizes": sizes, "window": args.window, "seeds": args.seeds, "buffer_cache": args.buffer_cache,
            "batch_guard": args.batch_guard == "on", "lr_scaling": None if args.lr_scaling == "none" else args.lr_scaling,
            "mmap_threshold": args.mmap_threshold}
    load0 = _common.loadavg()
    fixed = []
    for v in sizes:
        r = _run(dict(base, mode="fixed", size=v, seed=0), args.timeout)
        r.setdefault("label", f"fixed {v}")
        print(f"fixed {v}: {r.get('seeds_per_s', r.get('error'))} seeds/s, peak above base "
              f"{r.get('peak_above_base_mib', float('nan')):.0f} MiB", file=sys.stderr)
        fixed.append(r)
    best = _best(fixed)
    repeats = []
    if best is not None:
        for seed in range(1, args.seeds):
            r = _run(dict(base, mode="fixed", size=best["size"], seed=seed), args.timeout)
            r.setdefault("label", f"fixed {best['size']} seed {seed}")
            repeats.append(r)
    adaptive = _run(dict(base, mode="adaptive", seed=0), args.timeout)
    adaptive.setdefault("label", "adaptive")
    print(f"adaptive: {adaptive.get('seeds_per_s', adaptive.get('error'))} seeds/s", file=sys.stderr)
    payload = {"command": _common.command("adapt_fanout", argv), "cpu": _common.cpu_model(),
               "machine": _common.machine(), "args": base, "fixed": fixed, "repeats": repeats, "adaptive": adaptive,
               "loadavg_before_after": [load0, None]}
    if "error" not in adaptive:
        summary = {"adaptive_seeds_per_s": adaptive["seeds_per_s"],
                   "adaptive_peak_above_base_mib": adaptive["peak_above_base_mib"],
                   "adaptive_within_budget": _within(adaptive), "best": None}
        if best is not None:
            summary["best"] = {"size": best["size"], "seeds_per_s": best["seeds_per_s"],
                               "peak_above_base_mib": best["peak_above_base_mib"]}
            summary["best_run"] = {"epochs": best["epochs"]}
            summary["speedup"] = adaptive["seeds_per_s"] / best["seeds_per_s"]
            summary["ceiling"] = oracle(fixed, args.budget_mib, best["size"])
            seeds = [best] + [r for r in repeats if "error" not in r]
            if len(seeds) >= 2:
                summary["loss"] = loss_check(adaptive, seeds)
        payload["summary"] = summary
        if args.rounds > 1 and best is not None:
            inside = [r for r in fixed if "error" not in r and _within(r)]
            first = {r["size"]: r for r in inside}
            first["adaptive"] = adaptive
            payload["rounds"] = _rounds(base, first, args.rounds, args.timeout, [r["size"] for r in inside],
                                        best["size"])
    payload["loadavg_before_after"][1] = _common.loadavg()
    payload["work_model"] = work_table(base, fixed)
    name = args.out or ("adapt_fanout_quick" if args.quick else "adapt_fanout")
    _common.write_results(args.results_dir, name, payload, markdown, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
