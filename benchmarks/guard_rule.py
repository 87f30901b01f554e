"""Which rule should the speed guard decide by: long interleaved runs of zoo entries, windows cut from them.

    python -m benchmarks guard_rule
    python -m benchmarks guard_rule --entries GINConv,GraphConv --seconds 20

The measurements behind the whole-model race of ``gnncompile.compiler.guard`` (``ModelGuard``):
for each zoo entry (:mod:`.zoo`'s models and generated graph) one process compiles the model
with the speed guard on, lets the pieces' guards decide (20 compiled calls), then times three
forms, one training step each (:func:`benchmarks.zoo._step`), interleaved in rounds with the
order reversed every other round, for about ``--seconds`` seconds (at most ``--rounds`` rounds):

- ``eager``: the model as written;
- ``compiled``: the compiled call (Dynamo and the rewritten / unrewritten pieces the piece guards
  kept), what the model race times as its compiled form;
- ``kept``: the compiled module once the model race kept the model as written (the call path a
  user pays where the guard kept eager: ``CompiledModule.__call__`` calling the model).

From the long run: eager / compiled and eager / kept by the medians and the paired 95% interval.
Then the long run is cut into windows of 5 and 10 rounds (the race's and the re-check's sizes),
and each decision rule picks a form per window with the guard's 3% margin (compiled only when it
is that much faster): ``min`` (fastest call of each, the rule up to 2026-12-04), ``median`` (the
median call of each), ``paired`` (the median over the window's rounds of eager / compiled of the
same round). A window's pick is scored against the long run's medians: ``wrong`` counts picks
of the form whose long-run median is slower by more than 1%, ``regret`` is the mean extra cost
of the picked form against the faster one (long-run medians). Writes
benchmarks/results/<--out>.{json,md}, naming the CPU model.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from typing import Dict, List

import torch

from . import _common

ENTRIES = ("GINConv,GraphConv,SAGEConv,SAGEConv-max,ClusterGCNConv,FiLMConv,LEConv,MFConv,EdgeConv,GMMConv,"
           "FeaStConv,GatedGraphConv,GIN,CGConv,FastRGCNConv")
MARGIN = 0.03
WINDOWS = (5, 10)


def child(entry: str, nodes: int, degree: int, seconds: float, max_rounds: int) -> dict:
    import gnncompile

    from . import zoo

    build, inputs = zoo._entries()[entry]
    g = zoo.Graph(nodes, degree)
    torch.manual_seed(0)
    model = build(g)
    args = inputs(g)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        args = tuple(a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for a in args)
        params = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    compiled = gnncompile.compile(model, settings={"choices": {"guard": "time"}, **zoo.ENTRY_SETTINGS.get(entry, {})})
    run_compiled = compiled._run_compiled
    for _ in range(20):  # the pieces' races (2 + 2 * SAMPLES calls) and more
        zoo._step(run_compiled, args, params)
    # the state a model race that kept eager leaves: the module calls the model as written
    compiled._as_written[True] = model
    forms = {"eager": model, "compiled": run_compiled, "kept": compiled}
    for _ in range(3):
        for f in forms.values():
            zoo._step(f, args, params)
    t0 = time.perf_counter()
    zoo._step(model, args, params)
    rounds = max(40, min(max_rounds, int(seconds / (3 * (time.perf_counter() - t0)))))
    times: Dict[str, List[float]] = {k: [] for k in forms}
    keys = list(forms)
    for i in range(rounds):
        for k in (keys if i % 2 == 0 else keys[::-1]):
            t0 = time.perf_counter()
            zoo._step(forms[k], args, params)
            times[k].append(time.perf_counter() - t0)
    pieces = sorted({d.kept for d in compiled.guard_decisions() if d.grad})
    return {"entry": entry, "nodes": nodes, "edges": nodes * degree, "rounds": rounds, "pieces_kept": pieces,
            "times": times}


def pick(rule: str, compiled: List[float], eager: List[float], margin: float = MARGIN) -> str:
    """'compiled' or 'eager' for one window of paired calls (the i-th of each ran back to back)."""
    if rule == "min":
        c, e = min(compiled), min(eager)
    elif rule == "median":
        c, e = statistics.median(compiled), statistics.median(eager)
    elif rule == "paired":
        c, e = 1.0, statistics.median(b / a for a, b in zip(compiled, eager))
    else:
        raise ValueError(rule)
    return "compiled" if c * (1 + margin) <= e else "eager"


def score(times: Dict[str, List[float]]) -> dict:
    c, e = times["compiled"], times["eager"]
    cost = {"compiled": statistics.median(c), "eager": statistics.median(e)}
    best = min(cost.values())
    out = {"long_ratio": cost["eager"] / cost["compiled"], "rules": {}}
    for w in WINDOWS:
        for rule in ("min", "median", "paired"):
            picks = [pick(rule, c[i:i + w], e[i:i + w]) for i in range(0, len(c) - w + 1, w)]
            wrong = sum(cost[p] > best * 1.01 for p in picks)
            regret = statistics.fmean(cost[p] / best - 1 for p in picks)
            out["rules"][f"{rule}/{w}"] = {"windows": len(picks), "compiled": picks.count("compiled"),
                                          "wrong": wrong, "regret": regret}
    return out


def _interval(a: List[float], b: List[float]):
    from gnncompile.tuner import noise

    iv = noise.ratio_interval([1 / t for t in a], [1 / t for t in b])
    return [iv["ratio"], iv["low"], iv["high"]]


def markdown(p: dict) -> str:
    rules = [f"{r}/{w}" for w in WINDOWS for r in ("min", "median", "paired")]
    lines = ["Long runs (steps of three forms interleaved; ratios > 1: eager's step is slower): "
             "eager / compiled and eager / kept (the compiled module calling the model as written) "
             "by the medians and the paired steps' geometric mean [95% interval]. Then per decision "
             "rule and window size (rounds): windows that kept the compiled model / windows, wrong picks "
             "(the form whose long-run median is > 1% slower), mean regret (extra cost of the pick).", "",
             "| entry | rounds | eager ms | eager / compiled | paired | eager / kept | paired | "
             + " | ".join(rules) + " |", "|" + "---|" * (7 + len(rules))]
    total = {r: [0, 0, 0.0] for r in rules}
    for r in p["rows"]:
        if "error" in r:
            lines.append(f"| {r['entry']} | not run: {r['error'][:120]} |")
            continue
        t = r["times"]
        med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
        pc, pk = _interval(t["compiled"], t["eager"]), _interval(t["kept"], t["eager"])
        s = r["score"]["rules"]
        cells = []
        for k in rules:
            x = s[k]
            total[k][0] += x["wrong"]
            total[k][1] += x["windows"]
            total[k][2] += x["regret"] * x["windows"]
            cells.append(f"{x['compiled']}/{x['windows']}, {x['wrong']} wrong, {x['regret'] * 100:.1f}%")
        lines.append(f"| {r['entry']} | {r['rounds']} | {med['eager']:.2f} | {med['eager'] / med['compiled']:.3f}x | "
                     f"{pc[0]:.3f}x [{pc[1]:.3f}, {pc[2]:.3f}] | {med['eager'] / med['kept']:.3f}x | "
                     f"{pk[0]:.3f}x [{pk[1]:.3f}, {pk[2]:.3f}] | " + " | ".join(cells) + " |")
    lines.append("| all | | | | | | | " + " | ".join(
        f"{w} wrong of {n}, regret {reg / max(n, 1) * 100:.2f}%" for w, n, reg in total.values()) + " |")
    m = p["machine"]
    lines += ["", f"Graph: {p['nodes']} nodes, {p['nodes'] * p['degree']} edges; about {p['seconds']} s of "
              f"rounds per entry; margin {MARGIN:.0%}; {p['threads']} threads, torch {m['torch']}, CPU {p['cpu']}. "
              f"{_common.load_text(p['loadavg_before_after'])} (a shared machine). Command: `{p['command']}`"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", default=ENTRIES)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=12.0, help="timed rounds per entry, about")
    ap.add_argument("--rounds", type=int, default=600, help="at most")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="guard_rule")
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(opts.threads)
    if opts.child:
        r = child(opts.child, opts.nodes, opts.degree, opts.seconds, opts.rounds)
        print("RESULT " + json.dumps(r), flush=True)
        return {}
    before = _common.loadavg()
    rows = []
    for entry in opts.entries.split(","):
        cmd = _common.module_command("guard_rule") + [
            "--child", entry, "--nodes", str(opts.nodes), "--degree", str(opts.degree),
            "--seconds", str(opts.seconds), "--rounds", str(opts.rounds), "--threads", str(opts.threads)]
        r = _common.run_child(cmd, _common.timing_env(opts.threads), 600, tail_chars=300)
        r.setdefault("entry", entry)
        if "error" not in r:
            r["score"] = score(r["times"])
            print(f"{entry}: {r['rounds']} rounds, long-run {r['score']['long_ratio']:.3f}x, "
                  + ", ".join(f"{k} {v['wrong']} wrong" for k, v in r["score"]["rules"].items()), flush=True)
        else:
            print(f"{entry}: {r['error']}", flush=True)
        rows.append(r)
    payload = {"machine": _common.machine(), "cpu": _common.cpu_model(), "threads": opts.threads,
               "nodes": opts.nodes, "degree": opts.degree, "seconds": opts.seconds, "rows": rows,
               "loadavg_before_after": [before, _common.loadavg()], "command": _common.command("guard_rule", argv)}
    _common.write_results(opts.results_dir, opts.out, payload, markdown)
    return payload


if __name__ == "__main__":
    main()
