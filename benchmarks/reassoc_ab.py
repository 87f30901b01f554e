"""Training step compiled with the default settings against reassociate=True, interleaved A/B.

    python -m benchmarks reassoc_ab                         # GCN, 100k nodes / 1M edges, F 128, 3 rounds
    python -m benchmarks reassoc_ab --rounds 2 --append     # more rounds added to the last result
    python -m benchmarks reassoc_ab --models GCN,GraphSAGE --peers eager

Each measurement is a fresh process running benchmarks/models.py's child: the variant
``gnncompile`` (``gnncompile.compile(model)``) or ``gnncompile-reassoc``
(``gnncompile.compile(model, reassociate=True)``: the opt-in inexact algebra; for GCN, the first
layer aggregated before its linear map, gnncompile/passes/order.py), same graph, seed, model and
step as the models benchmark (first output checked against eager, stepped past the speed guard,
the median of ``--repeats`` steps after ``--warmup``). Per round and model the two sides run back
to back, the order alternating from round to round and model to model, then each peer
(``--peers``: PyG eager, PyG's sparse CSR path) once for ``--peer-model``. The statistics are
commit_ab's (:func:`benchmarks.commit_ab.summarise`): medians over the rounds of each child's
median, speed-ups as the geometric mean of the rounds' paired ratios with a 95% Student's t
interval. The sides compute in a different order, so their first losses agree only to rounding
(``--loss-rtol``, default 1e-5).

Writes benchmarks/results/reassoc_ab.{json,md} (``--name``), naming the CPU model.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import _common
from . import commit_ab

SIDES = {"base": "gnncompile", "head": "gnncompile-reassoc"}


def _measure(opts):
    def measure(side: str, model: str, r: int) -> Dict[str, Any]:
        variant = SIDES.get(side, side)
        cmd = _common.module_command("models") + [
            "--child", "--model", model, "--graph", str(opts.nodes), "--variant", variant,
            "--repeats", str(opts.repeats), "--warmup", str(opts.warmup), "--threads", str(opts.threads),
            "--features", str(opts.features), "--measure", "time"]
        return _common.run_child(cmd, _common.timing_env(), opts.timeout)

    return measure


def _iv(iv) -> str:
    return commit_ab._iv_text(iv)


def markdown(p: Dict[str, Any]) -> str:
    s, o = p["summary"], p["options"]
    lines = [f"# Training step: default settings against reassociate=True ({p['head']['short']})", "",
             f"CPU: {p['cpu']}; {o['threads']} threads; torch {p['machine']['torch']}. Graph: power-law, "
             f"{o['nodes']} nodes, {10 * o['nodes']} edges, F = {o['features']}, hidden 128, 2 layers, 16 classes; "
             f"one step = forward, cross-entropy, backward, Adam. {len(p['rounds'])} rounds, each child the median "
             f"of {o['repeats']} steps after {o['warmup']} warm-up steps and the speed guard's decision.", "",
             "| model | default ms | reassociate ms | speed-up default / reassociate [95% interval] | pairs | "
             "first loss default / reassociate | loss spread |", "|---|---|---|---|---|---|---|"]
    for model, m in s["models"].items():
        loss, spread = commit_ab._loss_cells(m)
        lines.append(f"| {model} | {commit_ab._ms(m['base_median_ms'])} | {commit_ab._ms(m['head_median_ms'])} | "
                     f"{_iv(m['speedup'])} | {m['pairs']} | {loss} | {spread} |")
    if s["peers"]:
        model = next(iter(s["peers"].values()))["model"]
        hm = s["models"].get(model, {}).get("head_median_ms")
        lines += ["", f"## {model}: reassociate=True against PyG's own paths (same rounds)", "",
                  "| peer | peer ms | reassociate ms | peer / reassociate [95% interval] | pairs |",
                  "|---|---|---|---|---|"]
        for peer, q in s["peers"].items():
            lines.append(f"| {peer} | {commit_ab._ms(q['median_ms'])} | {commit_ab._ms(hm)} | "
                         f"{_iv(q['head_over_peer'])} | {q['pairs']} |")
    lines += ["", "Medians over the rounds of each child's median step time; speed-ups: geometric mean of the "
              "rounds' paired ratios, 95% Student's t interval. First losses: same parameters, before any "
              f"optimizer step; within {o['loss_rtol']:g} of each other: "
              f"{'yes' if s['agree'] else '**no**'}. Graph digests: "
              f"{'all equal' if len(s['graphs']) == 1 else s['graphs']}."]
    for model, m in s["models"].items():
        pairs = [f"{b * 1e3:.0f} / {h * 1e3:.0f}" for b, h in zip(*commit_ab._paired(p["runs"], model, "base", "head"))]
        lines.append(f"- {model}, per round, default / reassociate ms: {', '.join(pairs)}.")
        kept = [r.get("guard", []) for r in p["runs"] if r["model"] == model and r["side"] == "head" and "median_s" in r]
        rewritten = sum(1 for g in kept if g and all("kept rewritten" in d or "kept compiled" in d for d in g))
        lines.append(f"- {model}, speed guard on the reassociate side: the rewritten, compiled form kept in "
                     f"{rewritten} of {len(kept)} children (their decisions are in the JSON).")
    if s["errors"]:
        lines += ["", "Errors:"] + [f"- {e}" for e in s["errors"]]
    for i, x in enumerate(p["sessions"]):
        lines.append(f"- Run {i + 1} (rounds {', '.join(map(str, x['rounds']))}): `{x['command']}`, "
                     f"{x['wall_s'] / 60:.1f} min; {_common.load_text(x['loadavg_before_after']).lower()}.")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None, measure=None) -> int:
    """``measure(side, model, round)``: one child's result (default: a fresh process running
    benchmarks/models.py's child; tests pass a stand-in)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="GCN")
    ap.add_argument("--nodes", type=int, default=100000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--peers", default="eager,csr", help="comma list of models.py variants ('' for none)")
    ap.add_argument("--peer-model", default="GCN")
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--append", action="store_true", help="add the rounds to the last result of the same options")
    ap.add_argument("--name", default="reassoc_ab")
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    opts = ap.parse_args(argv)
    models = [m for m in opts.models.split(",") if m]
    peers = [p for p in opts.peers.split(",") if p]
    same = {"models": models, "peers": peers, "peer_model": opts.peer_model, "nodes": opts.nodes,
            "features": opts.features, "threads": opts.threads, "repeats": opts.repeats, "warmup": opts.warmup}
    folder = Path(opts.results_dir)
    path = folder / f"{opts.name}.json"
    runs: List[Dict[str, Any]] = []
    sessions: List[Dict[str, Any]] = []
    if opts.append:
        if not path.exists():
            ap.error(f"--append: no earlier result at {path}")
        old = json.loads(path.read_text())
        diff = [k for k, v in same.items() if old["options"].get(k) != v]
        head = commit_ab.head_info()
        if (old["head"]["sha"], old["head"]["diff_digest"]) != (head["sha"], head["diff_digest"]):
            diff.append("the checkout (commit or working tree)")
        if diff:
            ap.error(f"--append: {path} was measured with other options ({', '.join(diff)})")
        runs, sessions = old["runs"], old["sessions"]
    start = 1 + max((r["round"] for r in runs), default=-1)
    load0, t0 = _common.loadavg(), time.perf_counter()
    runs += commit_ab.run_rounds(models, opts.rounds, measure or _measure(opts), peers, opts.peer_model, start=start)
    sessions.append({"command": _common.command("reassoc_ab", argv), "rounds": list(range(start, start + opts.rounds)),
                     "wall_s": time.perf_counter() - t0, "loadavg_before_after": [load0, _common.loadavg()]})
    summary = commit_ab.summarise(runs, models, 0.0, opts.loss_rtol, peers, opts.peer_model)
    head = commit_ab.head_info()
    payload = {"machine": _common.machine(), "cpu": _common.cpu_model(), "head": head,
               "options": {**same, "loss_rtol": opts.loss_rtol}, "rounds": sorted({r["round"] for r in runs}),
               "runs": runs, "sessions": sessions, "summary": summary}
    _common.write_results(folder, opts.name, payload, markdown, None)
    return 0 if summary["agree"] and not summary["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
