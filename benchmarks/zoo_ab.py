"""Zoo entries at an earlier commit against this checkout, in one run, alternating.

    python -m benchmarks zoo_ab --base 39654bf --only TransformerConv-edge --rounds 4

The base is checked out and built as :mod:`.commit_ab` does (``build/commit_ab/<sha>``, reused
by a later run). Each round runs, for each entry, one zoo child (:func:`benchmarks.zoo.child`:
eager and the compiled model interleaved in one process, ``--steps`` steps each after the
speed guard's warm-up) with gnncompile from the base tree and one from this checkout, back to
back, the order alternating from round to round; the zoo code, graph and model are this
checkout's for both sides. Per child: eager / gnncompile (medians) and the paired steps' 95%
interval (as the zoo reports them). Per entry and side: the median over the rounds of each
child's ratio and step times, and the head's compiled step against the base's (the geometric
mean of the rounds' ratios of compiled medians, with its Student's t 95% interval). A child
refuses to run when gnncompile or its native module came from another tree than the one named.
Writes benchmarks/results/<--name>.{json,md}, naming the CPU model.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import _common, commit_ab

BOOT = commit_ab.boot_source("zoo_ab", "child_main")


def child_main(argv: List[str]) -> int:
    """One zoo entry in this process, after checking where gnncompile and its native module came
    from (``--tree``; this checkout when empty)."""
    import json

    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default="")
    ap.add_argument("--entry", required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--degree", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    o = ap.parse_args(argv)
    import gnncompile
    from gnncompile.ops import _native

    from . import zoo

    tree = Path(o.tree or _common.ROOT).resolve()
    where = {"gnncompile": str(Path(gnncompile.__file__).resolve()),
             "native": str(Path(_native._C.__file__).resolve()) if _native.native_loaded() else None}
    if tree not in Path(where["gnncompile"]).parents or where["native"] is None \
            or tree not in Path(where["native"]).parents:
        raise commit_ab.CommitABError(f"gnncompile / its native module not from {tree}: {where}")
    print("RESULT " + json.dumps({**zoo.child(o.entry, o.nodes, o.degree, o.steps), "where": where}), flush=True)
    return 0


def _run(tree: Optional[str], entry: str, opts) -> Dict[str, Any]:
    cmd = [sys.executable, "-c", BOOT, str(_common.ROOT), tree or "", "--tree", tree or "", "--entry", entry,
           "--nodes", str(opts.nodes), "--degree", str(opts.degree), "--steps", str(opts.steps)]
    return _common.run_child(cmd, _common.timing_env(opts.threads), opts.timeout, cwd=Path(tree) if tree else None)


def summary(runs: List[Dict[str, Any]], entries: List[str]) -> List[Dict[str, Any]]:
    from gnncompile.tuner import noise

    rows = []
    for entry in entries:
        row: Dict[str, Any] = {"entry": entry}
        by = {s: [r for r in runs if r["entry"] == entry and r["side"] == s and "speedup" in r] for s in ("base", "head")}
        for side, rs in by.items():
            if rs:
                row[side] = {k: statistics.median(r[k] for r in rs) for k in ("eager_ms", "gnncompile_ms", "speedup")}
                row[side]["intervals"] = [r.get("interval") for r in rs]
        pairs = {}
        for r in runs:
            if r["entry"] == entry and "speedup" in r:
                pairs.setdefault(r["round"], {})[r["side"]] = r["gnncompile_ms"]
        done = [p for p in pairs.values() if len(p) == 2]
        if len(done) >= 2:
            iv = noise.ratio_interval([1 / p["head"] for p in done], [1 / p["base"] for p in done])
            row["head_vs_base"] = iv
        rows.append(row)
    return rows


def markdown(p: Dict[str, Any]) -> str:
    base, head = p["base"]["commit"], p["head"]
    lines = [f"Zoo entries, base {base['short']} ({base['subject']}) against head {head['short']} "
             f"({head['subject']}{', with uncommitted changes' if head.get('dirty') else ''}), "
             f"{p['rounds']} rounds, one zoo child per side and round, alternating.", "",
             "| entry | side | eager ms | gnncompile ms | eager / gnncompile (median of rounds) | "
             "paired intervals per round |", "|---|---|---|---|---|---|"]
    for row in p["rows"]:
        for side in ("base", "head"):
            s = row.get(side)
            if not s:
                lines.append(f"| {row['entry']} | {side} | | | no result | |")
                continue
            ivs = ", ".join(f"[{a:.2f}, {b:.2f}]" for a, b in (i for i in s["intervals"] if i))
            lines.append(f"| {row['entry']} | {side} | {s['eager_ms']:.2f} | {s['gnncompile_ms']:.2f} | "
                         f"{s['speedup']:.2f}x | {ivs} |")
        iv = row.get("head_vs_base")
        if iv and iv.get("low") is not None:
            lines.append(f"| {row['entry']} | head vs base (compiled step) | | | "
                         f"{iv['ratio']:.2f}x [{iv['low']:.2f}, {iv['high']:.2f}] | |")
    errors = [r for r in p["runs"] if "error" in r]
    if errors:
        lines += ["", "Errors:"] + [f"- {r['entry']} {r['side']} round {r['round']}: {r['error']}" for r in errors]
    lines += ["", f"Graph: {p['nodes']} nodes, in-degree {p['degree']} (the zoo's); {p['steps']} steps of each "
              f"per child; {p['threads']} threads; CPU {p['cpu']}. {_common.load_text(p['loadavg_before_after'])}. "
              f"Command: `{p['command']}`"]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--only", required=True, help="comma list of zoo entries")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--cache-dir", type=Path, default=commit_ab.DEFAULT_CACHE)
    ap.add_argument("--name", default="zoo_ab")
    ap.add_argument("--results-dir", type=Path, default=_common.RESULTS)
    opts = ap.parse_args(argv)
    entries = [e for e in opts.only.split(",") if e]
    prep = commit_ab.prepare(opts.base, opts.cache_dir)
    load0 = _common.loadavg()
    runs = []
    for r in range(opts.rounds):
        for i, entry in enumerate(entries):
            order = ("base", "head") if (r + i) % 2 == 0 else ("head", "base")
            for side in order:
                t0 = time.perf_counter()
                res = _run(prep["tree"] if side == "base" else None, entry, opts)
                res.update(entry=entry, side=side, round=r, wall_s=time.perf_counter() - t0)
                runs.append(res)
                print(f"round {r} {entry} {side}: " + (res["error"] if "error" in res else
                      f"eager {res['eager_ms']:.2f} ms, gnncompile {res['gnncompile_ms']:.2f} ms "
                      f"({res['speedup']:.2f}x)"), flush=True)
    payload = {"base": prep, "head": commit_ab.head_info(), "rounds": opts.rounds, "nodes": opts.nodes,
               "degree": opts.degree, "steps": opts.steps, "threads": opts.threads, "cpu": _common.cpu_model(),
               "loadavg_before_after": [load0, _common.loadavg()],
               "command": "python -m benchmarks zoo_ab " + " ".join(argv if argv is not None else sys.argv[1:]),
               "runs": runs, "rows": summary(runs, entries)}
    _common.write_results(opts.results_dir, opts.name, payload, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
