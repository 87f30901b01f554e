"""Tuning under synthetic load: a process keeps one core busy while ``gnncompile tune`` runs; then the profile it wrote is re-measured on the quiet machine against the defaults.

    python -m benchmarks tuning_load                              # neighbor SAGE, 8 trials, 300 s
    python -m benchmarks tuning_load --workload graphs --trials 6 --timeout 200

1. A busy process (a Python loop, one core) starts, then ``gnncompile tune`` in its own process
   (a sibling of the busy one, so the tuner's load probe counts it as another process's work),
   with a fixed batch size, writing its profile to ``--profile-out``.
2. The busy process is stopped; the written profile is re-measured against the defaults in fresh
   processes, interleaved (:func:`benchmarks.profile_ab.ab`), on the quiet machine.
3. What must hold: the tuning run reported the load (its summary's ``noise.loaded``, the stderr
   line), and the quiet ratio of its profile is not below 1.0 (the interval's high end at or
   above 1.0; a point ratio below 1.0 with an interval that includes 1.0 is reported as such).

Writes benchmarks/results/tuning_load.{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

from . import _common
from . import profile_ab

#: the workloads' tune arguments (the neighbor graph of benchmarks/tuning_neighbor.py, smaller)
WORKLOADS = {
    "neighbor": ["--workload", "neighbor", "--num-nodes", "100000", "--num-edges", "1000000",
                 "--fanout", "10", "5", "--batch-size", "1024", "--steps", "12", "--warmup", "2",
                 "--max-workers", "2"],
    "graphs": ["--workload", "graphs", "--num-graphs", "4000", "--batch-size", "128", "--steps", "40",
               "--warmup", "5", "--max-workers", "2"],
}


def _busy() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="neighbor")
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for the tuning run")
    ap.add_argument("--rounds", type=int, default=5, help="quiet A/B rounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile-out", default=str(_common.RESULTS / "tuning_load_profiles"))
    ap.add_argument("--out", default=str(_common.RESULTS))
    args = ap.parse_args(argv)
    out = Path(args.out)
    prof_dir = Path(args.profile_out)
    prof_dir.mkdir(parents=True, exist_ok=True)
    report: Dict[str, Any] = {"command": _common.command("tuning_load", argv), "machine": _common.machine(),
                              "cpu_model": _common.cpu_model(), "workload": args.workload,
                              "loadavg_before_after": [_common.loadavg()]}
    storage = f"sqlite:///{Path(tempfile.mkdtemp(prefix='gnncompile-load-')) / 'studies.db'}"
    cmd = [sys.executable, "-m", "gnncompile.cli", "tune", *WORKLOADS[args.workload], "--trials",
           str(args.trials), "--timeout", str(args.timeout), "--out", str(prof_dir), "--storage", storage,
           "--seed", str(args.seed), "--no-progress"]
    report["tune_command"] = " ".join(["gnncompile"] + cmd[3:])
    print(f"[1/2] tuning with one core kept busy: {report['tune_command']}", flush=True)
    busy = _busy()
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 600,
                           cwd=str(_common.ROOT), env=_common.timing_env())
    finally:
        busy.kill()
        busy.wait()
    report["tune_seconds"] = time.perf_counter() - t0
    report["tune_rc"] = p.returncode
    report["tune_stderr_tail"] = p.stderr.strip().splitlines()[-6:]
    if p.returncode != 0 or "{" not in p.stdout:
        report["error"] = f"tune exited {p.returncode}: {' | '.join(report['tune_stderr_tail'])}"
        print(report["error"], file=sys.stderr)
        _common.write_results(out, "tuning_load", report, _markdown, None, json_default=str)
        return 1
    summary = json.loads(p.stdout[p.stdout.index("{"):])
    report["summary"] = summary
    report["reported_load"] = bool((summary.get("noise") or {}).get("loaded"))
    report["stderr_says_load"] = "other processes kept the machine busy" in p.stderr
    time.sleep(5)  # the busy process is gone; let the machine settle
    print(f"[2/2] the profile re-measured quietly, {args.rounds} rounds", flush=True)
    doc = json.loads(Path(summary["profile"]).read_text())
    res = profile_ab.ab(doc, args.rounds)
    res["profile_path"] = summary["profile"]
    report["ab"] = res
    iv = res.get("interval") or {}
    report["never_below_1"] = bool(iv and (iv.get("high") if iv.get("high") is not None else iv["ratio"]) >= 1.0)
    report["loadavg_before_after"].append(_common.loadavg())
    _common.write_results(out, "tuning_load", report, _markdown, _plot, json_default=str)
    return 0


def _markdown(r: Dict[str, Any]) -> str:
    lines = ["# Tuning under synthetic load, its profile re-measured quietly", "",
             f"Machine: {r['cpu_model']}, {r['machine'].get('threads')} threads, torch {r['machine'].get('torch')}. "
             "A Python loop kept one core busy for the whole tuning run (a sibling process of the tuner); "
             "then the profile was re-measured against the defaults in fresh processes, interleaved, "
             "with nothing else running.", "", f"Command: `{r['command']}`", "",
             f"Tuning command: `{r.get('tune_command')}`", "", _common.load_text(r["loadavg_before_after"])
             if len(r["loadavg_before_after"]) == 2 else "", ""]
    if r.get("error"):
        return "\n".join(lines + [f"**Failed**: {r['error']}"]) + "\n"
    s = r["summary"]
    noise = s.get("noise") or {}
    lines += ["| what | value |", "|---|---|",
              f"| tuning run: load reported (summary `noise.loaded`) | {r['reported_load']} |",
              f"| tuning run: stderr names the load | {r['stderr_says_load']} |",
              f"| others' cores during the trials / re-measurement | {(noise.get('trials') or {}).get('others_cores')} / "
              f"{(noise.get('confirm') or {}).get('others_cores')} |",
              f"| candidates excluded under load (thread count changed) | {noise.get('excluded')} |",
              f"| profile chosen | {s.get('chosen')} |",
              f"| profile settings | `{json.dumps(r['ab'].get('profile'))}` |",
              f"| tuning run's ratio (under load) | {(s.get('ratio') or {}).get('ratio')} |"]
    iv = r["ab"].get("interval") or {}
    if iv:
        span = f"[{iv['low']:.3f}, {iv['high']:.3f}]" if iv.get("low") is not None else "-"
        lines.append(f"| quiet re-measurement: profile / defaults | {iv['ratio']:.3f}x {span} "
                     f"(others' cores {(r['ab'].get('load') or {}).get('others_cores')}) |")
    lines.append(f"| never below 1.0x (interval reaches 1.0 or above) | {r['never_below_1']} |")
    lines += ["", "Rounds (defaults, profile):", ""]
    for a, b in zip(r["ab"]["runs"]["defaults"], r["ab"]["runs"]["profile"]):
        lines.append(f"- {a:.4g} / {b:.4g} ({b / a:.3f}x)")
    return "\n".join(lines) + "\n"


def _plot(r: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = r["ab"]["runs"]
    ratios: List[float] = [b / a for a, b in zip(runs["defaults"], runs["profile"])]
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    ax.plot(range(1, len(ratios) + 1), ratios, "o-", label="profile / defaults, per round")
    ax.axhline(1.0, color="k", lw=.8)
    ax.set_xlabel("quiet round")
    ax.set_ylabel("throughput ratio")
    ax.set_title(f"profile tuned under load ({r['workload']}), re-measured quietly", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
