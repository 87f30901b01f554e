"""Issue 28's step gap: the adaptive run's steps against the fixed run's at the same size (8192 nodes), per step.

    python -m benchmarks adapt_steps                          # adaptive, fixed, after-history: 2 rounds
    python -m benchmarks adapt_steps --modes adaptive,fixed --rounds 3

The workload, model, warm-up and budget of ``python -m benchmarks adapt`` (its defaults: 1200
graphs of 8-600 nodes sorted by size, compiled GIN, 4 epochs, 150 MiB), each run a process of
its own, the modes interleaved round by round:

* ``adaptive``: the adaptive loader of the benchmark (by='nodes' over 1024-16384, starting at 1024);
* ``fixed``: the fixed 8192-node budget (one candidate, the same loader path and release guard);
* ``history``: the fixed 8192-node run after 9 untimed steps at each of 1024, 2048, 4096, 8192 and
  16384 nodes (the sizes the adaptive run passes through, outside any adaptive loader): what the
  process's history alone does to the 8192-node steps.

Per step: the wall time from ``step_done`` to ``step_done`` (the loader's own ``seconds``), the
time to get the batch, the training step, ``step_done`` itself, minor page faults and user /
system CPU time of the training step (``resource.getrusage``), the release guard's clean start.
From epoch 1 on, the adaptive run at 8192 nodes and the fixed run take the same batches
(the plan restarts at each epoch's first graph), so their medians compare like with like.
Also per run: what the whole-model speed guard kept (compiled or eager) and on which calls'
times. Writes benchmarks/results/<--out>.{json,md}.
"""
from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

from . import _common

MODES = ("adaptive", "fixed", "history")
SIZES = [1024, 2048, 4096, 8192, 16384]


def child(spec) -> dict:
    import gnncompile
    from gnncompile.adapt import AdaptiveLoader, RssMemory, Setting
    from gnncompile.data import PooledLoader

    from . import adapt as B

    torch.set_num_threads(spec["threads"])
    ds = B._dataset(spec)
    model = B._model(0)
    cmodel = gnncompile.compile(model, dynamic=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    step = B._graph_step(cmodel, opt)

    warm = PooledLoader(ds[:48], batch_size=16)  # the adapt benchmark's warm-up
    for b in warm:
        step(b)
    warm.close()
    if spec["mode"] == "history":
        for size in SIZES:
            H = AdaptiveLoader(ds, by="nodes", sizes=[size], memory=None)
            for i, b in enumerate(H):
                step(b)
                if i >= 8:
                    break
            H.close()
    model.load_state_dict(B._model(0).state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = B._graph_step(cmodel, opt)  # the restarted optimizer
    gc.collect()
    probe = RssMemory()
    probe.start()
    base = probe.base
    budget = base + spec["budget_mib"] * 2**20
    if spec["mode"] == "adaptive":
        L = AdaptiveLoader(ds, by="nodes", sizes=SIZES, start=Setting(SIZES[0], 2, 0), memory="rss",
                           memory_budget=budget, window=8, optimizer=opt, lr_scaling=None)
    else:
        L = AdaptiveLoader(ds, by="nodes", sizes=[8192], memory="rss", memory_budget=budget)
    rows = []
    huge = []  # AnonHugePages (MiB) at each epoch's end: how much of the heap huge pages back
    t0 = time.perf_counter()
    for epoch in range(spec["epochs"]):
        it = iter(L)
        while True:
            ta = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                break
            tb = time.perf_counter()
            ra = resource.getrusage(resource.RUSAGE_SELF)
            loss = step(b)
            rc = resource.getrusage(resource.RUSAGE_SELF)
            tc = time.perf_counter()
            L.step_done(loss)
            td = time.perf_counter()
            h = L.history[-1]
            # epoch, size, nodes, edges, clean, seconds, get batch s, train step s, step_done s,
            # minor faults, user s, system s (the training step), peak above base MiB
            rows.append([epoch, h["size"], h["nodes"], h["edges"], int(h["clean"]), h["seconds"], tb - ta, tc - tb,
                         td - tc, rc.ru_minflt - ra.ru_minflt, rc.ru_utime - ra.ru_utime, rc.ru_stime - ra.ru_stime,
                         round((h["peak"] - base) / 2**20, 1), rc.ru_nivcsw - ra.ru_nivcsw])
        huge.append(_anon_huge_mib())
    wall = time.perf_counter() - t0
    L.close()
    decisions = cmodel.guard_decisions()
    whole = [d for d in decisions if d.piece.startswith("the whole model")]
    return {"mode": spec["mode"], "wall_s": wall, "graphs_per_s": spec["epochs"] * len(ds) / wall,
            "releases": L.releases, "rows": rows, "anon_huge_mib": huge,
            "log": [[e["step"], e["kind"], e["from"]["size"], e["to"]["size"]] for e in L.log],
            "model_guard": [{"kept": d.kept, "recheck": bool(d.recheck), "compiled_ms": d.rewritten_ms,
                             "eager_ms": d.unrewritten_ms} for d in whole],
            "piece_guard": [[d.nodes, d.edges, d.kept] for d in decisions if not d.piece.startswith("the whole model")]}


def _anon_huge_mib():
    """The process's anonymous memory backed by transparent huge pages, MiB (None where unknown)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def summary(r: dict) -> dict:
    """The run's figures at 8192 nodes from epoch 1 on (the batches both modes share): median
    step of the steps that did not start clean, of those that did, their counts, the median
    minor faults and user time of a step that did not start clean; and seconds per size."""
    rows = [x for x in r["rows"] if x[0] >= 1 and x[1] == 8192]
    plain = [x for x in rows if not x[4]]
    clean = [x for x in rows if x[4]]

    def med(xs, i, f=1e3):
        return statistics.median(x[i] for x in xs) * f if xs else None

    per_size = {}
    for x in r["rows"]:
        s = per_size.setdefault(str(x[1]), [0, 0.0])
        s[0] += 1
        s[1] += x[5]
    return {"steps_8192": len(rows), "clean_8192": len(clean), "plain_ms": med(plain, 7), "clean_ms": med(clean, 7),
            "plain_faults": med(plain, 9, 1), "plain_user_ms": med(plain, 10), "done_ms": med(rows, 8),
            "get_ms": med(rows, 6), "preempted": sum(x[13] for x in rows if len(x) > 13), "seconds_8192": sum(x[5] for x in rows), "per_size": per_size,
            "model_kept": r["model_guard"][0]["kept"] if r.get("model_guard") else None,
            "rechecked": any(d["recheck"] for d in r.get("model_guard", []))}


def markdown(p: dict) -> str:
    a = p["args"]
    lines = [f"# Issue 28: the adaptive run's steps against the fixed run's at 8192 nodes\n",
             f"`{p['command']}`  \n{p['cpu']}, {a['threads']} threads, torch {p['machine']['torch']}.  "
             f"\n{_common.load_text(p['loadavg_before_after'])}\n",
             "The `python -m benchmarks adapt` workload (1200 graphs of 8-600 nodes sorted by size, compiled GIN, "
             f"{a['epochs']} epochs, {a['budget_mib']} MiB budget); modes: adaptive (1024-16384 nodes), fixed 8192 "
             "nodes, history (fixed 8192 after 9 untimed steps at each of 1024-16384). Step figures: 8192-node "
             "steps of epochs 1 on (the same batches in every mode), the training step alone (batch in hand to "
             "loss back), medians.\n",
             "| round | mode | graphs/s | releases | guard: whole model kept (compiled / eager median call at its race); pieces per class (nodes/edges raced on) | 8192 steps "
             "(clean) | step ms, not clean | step ms, clean | faults, not clean | user ms, not clean | step_done "
             "ms | s at 8192 | s at other sizes | involuntary switches at 8192 | huge pages MiB (epoch ends) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, fmt=".1f"):
        return "" if v is None else format(v, fmt)

    for r in p["runs"]:
        if "error" in r:
            lines.append(f"| {r['round']} | {r['mode']} | error: {r['error'][:80]} |" + " |" * 12)
            continue
        s = r["summary"]
        other = sum(v[1] for k, v in s["per_size"].items() if k != "8192")
        g = r.get("model_guard") or []
        kept = "" if not g else (f"{g[0]['kept']} ({f(g[0]['compiled_ms'], '.1f')} / {f(g[0]['eager_ms'], '.1f')} ms)"
                                 + (", re-checked" if s["rechecked"] else ""))
        kept += "; pieces: " + ", ".join(f"{n}/{e} {k}" for n, e, k in r.get("piece_guard") or [])
        lines.append(f"| {r['round']} | {r['mode']} | {r['graphs_per_s']:.0f} | {r['releases']} | {kept} | "
                     f"{s['steps_8192']} ({s['clean_8192']}) | {f(s['plain_ms'])} | {f(s['clean_ms'])} | "
                     f"{f(s['plain_faults'], '.0f')} | {f(s['plain_user_ms'])} | {f(s['done_ms'], '.2f')} | "
                     f"{s['seconds_8192']:.2f} | {other:.2f} | {s['preempted']} | "
                     + "/".join(f(v, ".0f") for v in r.get("anon_huge_mib") or []) + " |")
    lines += ["", "Adaptive runs' switches (step, kind, from, to):", ""]
    for r in p["runs"]:
        if r.get("mode") == "adaptive" and "log" in r:
            lines.append(f"- round {r['round']}: " + ", ".join(f"{x[0]} {x[1]} {x[2]}->{x[3]}" for x in r["log"]))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks adapt_steps", description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="adaptive,fixed,history", help=f"comma-separated, of {MODES}")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--out", default="adapt_steps")
    ap.add_argument("--results-dir", type=Path, default=_common.RESULTS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))))
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes must name some of {MODES}, got {args.modes!r}")
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    base = {"graphs": 1200, "min_nodes": 8, "max_nodes": 600, "epochs": args.epochs, "budget_mib": 150,
            "threads": args.threads, "workload": "uniform"}
    load0 = _common.loadavg()
    runs = []
    for k in range(args.rounds):
        order = modes[k % len(modes):] + modes[:k % len(modes)]
        for mode in order:
            cmd = _common.module_command("adapt_steps") + ["--child", json.dumps(dict(base, mode=mode))]
            r = _common.run_child(cmd, _common.timing_env(args.threads), args.timeout)
            r.update(round=k + 1, mode=mode)
            if "error" not in r:
                r["summary"] = summary(r)
            print(f"round {k + 1} {mode}: {r.get('graphs_per_s', r.get('error'))}", file=sys.stderr)
            runs.append(r)
    payload = {"command": _common.command("adapt_steps", argv), "cpu": _common.cpu_model(),
               "machine": _common.machine(), "args": base, "runs": runs,
               "loadavg_before_after": [load0, _common.loadavg()]}
    _common.write_results(args.results_dir, args.out, payload, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
