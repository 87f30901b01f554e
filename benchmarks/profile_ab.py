"""Re-measures written tuning profiles against the defaults, every measurement in a fresh process.

    python -m benchmarks profile_ab PROFILE.json [PROFILE.json ...] [--rounds 6] [--steps 60]
    python -m benchmarks profile_ab benchmarks/results/tuning_profiles/ --target 1.15

For each profile (a file, or every profile of this device in a folder): the workload it was tuned
on (its ``workload`` record, at its batch size), trained once with the profile's settings and
once with the defaults the tuner compared it with (:func:`gnncompile.tuner.workloads.default_settings`:
PyG's DataLoader or the NeighborLoader's defaults, torch's thread count, the kernels' default
knobs, the default inner compiler), each run in a new Python process
(``python -m benchmarks.profile_ab --child SPEC``: nothing cached from the tuning run or from
the other side, the compile and the data built again). The rounds alternate the order (defaults
first, then the profile first, ...), so a drift of the machine's speed falls on both sides. The
result per profile: the geometric mean of the rounds' paired ratios (profile / defaults) and its
95% Student's t interval (:func:`gnncompile.tuner.noise.ratio_interval`), and the other
processes' CPU use over the run (:class:`gnncompile.tuner.noise.LoadProbe`): a run on a loaded
machine is marked, its ratio is not a quiet measurement.

Before each child and after each round a probe reads the machine's state: the cache-line round
trip between the first two CPUs (:func:`benchmarks._common.core_latency_ns`). On a virtual machine
the host may move the vCPUs apart, and a multi-threaded step's speed follows (on the project's 2-vCPU Zen 4
guest the neighbor step ran about 1.25-1.5x slower while the round trip read 330-530 ns instead of
120-200, for tens of seconds at a time, whatever the settings:
benchmarks/results/neighbor_states_zen4_s60.md). The result also gives the ratio over the rounds
whose probes stayed within :data:`STATE_TOLERANCE` of each other (both sides in one state); the
headline ratio counts every round.

A profile whose batch size was tuned (``batch_size_rule.tuned``) trains another optimisation than
its defaults (another batch size); it is refused unless ``--allow-tuned-batch``, and the table
says so. ``--target R`` marks each profile's ratio against R (met when the interval's low end is
at or above it, "point only" when only the ratio is).

Writes benchmarks/results/profile_ab.{json,md,png} (``--name`` for another stem).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

warnings.simplefilter("ignore")

from . import _common  # noqa: E402

from gnncompile.profiles import SETTING_KEYS as _SETTING_KEYS  # noqa: E402  (a profile's settings)


def _child(spec_path: str) -> int:
    """One measurement: the workload and settings of the spec file; prints RESULT {json}."""
    import torch

    from gnncompile.tuner.workloads import measure, prepare, workload_from_dict

    spec = json.loads(Path(spec_path).read_text())
    w = workload_from_dict(spec["workload"])
    t0 = time.perf_counter()
    prepare(w)
    data_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    threads = []  # torch's thread count while the steps ran (measure restores it after)
    rate, peak = measure(w, spec["settings"], report=lambda chunk, r: threads.append(torch.get_num_threads()))
    print("RESULT " + json.dumps({"rate": rate, "peak_bytes": peak, "data_s": data_s,
                                  "measure_s": time.perf_counter() - t0,
                                  "threads": threads[-1] if threads else None}), flush=True)
    return 0


def _profiles_of(paths: List[str]) -> List[Path]:
    """The profile files named: files as given, a folder's profiles for this device."""
    from gnncompile import profiles
    from gnncompile.hardware import device

    key = device.device_key()
    out: List[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = [f for f in profiles.list_profiles(p) if f.name.startswith(key + "__")]
            if not found:
                raise SystemExit(f"profile_ab: no profile for this device ({key}) in {p}")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise SystemExit(f"profile_ab: {p}: no such file or folder")
    return out


def plan(doc: Dict[str, Any], steps: Optional[int], warmup: Optional[int],
         allow_tuned_batch: bool = False) -> Dict[str, Any]:
    """The two sides of one profile's A/B: {"workload", "profile", "defaults"} (settings dicts for
    :func:`gnncompile.tuner.workloads.measure`), or {"refused": why}."""
    import dataclasses

    from gnncompile.hardware import device
    from gnncompile.tuner.workloads import default_settings, workload_from_dict

    wl = dict(doc.get("workload") or {})
    rule = doc.get("batch_size_rule") or {}
    tuned_batch = bool(rule.get("tuned")) or "batch_range" in wl
    if tuned_batch and not allow_tuned_batch:
        return {"refused": "its batch size was tuned (another optimisation than the defaults'); "
                           "--allow-tuned-batch compares it anyway"}
    w = workload_from_dict(wl)
    changes = {}
    if steps is not None:
        changes["steps"] = steps
    if warmup is not None:
        changes["warmup"] = warmup
    w = dataclasses.replace(w, **changes) if changes else w
    s = dict(doc.get("settings") or {})
    ref = wl.get("default_batch_size") or wl.get("batch_size") or s.get("batch_size") or 128
    defaults = default_settings(w, device.detect(), batch_size=int(ref))
    prof = {k: s.get(k) for k in _SETTING_KEYS}
    prof["loader"] = "neighbor" if w.kind == "neighbor" else "pooled"
    if w.kind in ("graphs", "neighbor") and prof.get("batch_size") is None:
        prof["batch_size"] = int(ref)
    if prof.get("threads") is None:
        prof["threads"] = defaults["threads"]
    wd = dataclasses.asdict(w)
    return {"workload": wd, "profile": prof, "defaults": defaults, "unit": w.unit,
            "batch_size_tuned": tuned_batch}


def _measure_child(workload: Dict[str, Any], settings: Dict[str, Any], folder: Path, tag: str,
                   timeout: float) -> Dict[str, Any]:
    spec = folder / f"{tag}.json"
    spec.write_text(json.dumps({"workload": workload, "settings": settings}))
    cmd = _common.module_command("profile_ab") + ["--child", str(spec)]
    return _common.run_child(cmd, _common.timing_env(), timeout=timeout)


#: a round counts as run in one machine state when its probes (before, between and after its two
#: children) are within this factor of each other
STATE_TOLERANCE = 1.5


def state_matched(probes: List[List[Optional[float]]], tolerance: float = STATE_TOLERANCE) -> List[int]:
    """The rounds (indices) whose core-latency probes all read and lie within ``tolerance`` of each
    other: the machine stayed in one state while both sides ran."""
    out = []
    for i, p in enumerate(probes):
        if p and all(x is not None and x > 0 for x in p) and max(p) <= tolerance * min(p):
            out.append(i)
    return out


def ab(doc: Dict[str, Any], rounds: int, steps: Optional[int] = None, warmup: Optional[int] = None,
       allow_tuned_batch: bool = False, timeout: float = 900.0, log=print,
       probe=_common.core_latency_ns) -> Dict[str, Any]:
    """The A/B of one profile document (module docstring). ``probe``: a function of no arguments
    read before each child and after each round (the machine's state; None: no probe)."""
    import tempfile

    from gnncompile.tuner import noise

    p = plan(doc, steps, warmup, allow_tuned_batch)
    if "refused" in p:
        return p
    runs: Dict[str, List[float]] = {"defaults": [], "profile": []}
    extra: Dict[str, List[Dict[str, Any]]] = {"defaults": [], "profile": []}
    errors: List[str] = []
    state: List[List[Optional[float]]] = []  # per round: the probes before, between, after
    with tempfile.TemporaryDirectory(prefix="gnncompile-ab-") as tmp, noise.LoadProbe() as load:
        for r in range(rounds):
            order = ("defaults", "profile") if r % 2 == 0 else ("profile", "defaults")
            got, probes = {}, []
            for side in order:
                probes.append(probe() if probe else None)
                res = _measure_child(p["workload"], p[side], Path(tmp), f"{r}-{side}", timeout)
                if "error" in res:
                    errors.append(f"round {r} {side}: {res['error']}")
                got[side] = res
            probes.append(probe() if probe else None)
            if all("rate" in got[s] for s in got):
                for side in runs:
                    runs[side].append(float(got[side]["rate"]))
                    extra[side].append(got[side])
                state.append(probes)
                log(f"  round {r} ({' then '.join(order)}): defaults {runs['defaults'][-1]:.4g}, "
                    f"profile {runs['profile'][-1]:.4g} {p['unit']} "
                    f"({runs['profile'][-1] / runs['defaults'][-1]:.3f}x)"
                    + (f"; core latency {', '.join('-' if x is None else f'{x:.0f}' for x in probes)} ns"
                       if probe else ""))
            else:
                log(f"  round {r}: failed: {'; '.join(errors[-2:])}")
    iv = noise.ratio_interval(runs["profile"], runs["defaults"])
    matched = state_matched(state) if probe else []
    one_state = None
    if len(matched) >= 2:
        one_state = noise.ratio_interval([runs["profile"][i] for i in matched],
                                         [runs["defaults"][i] for i in matched])
    return {**p, "runs": runs, "children": extra, "errors": errors, "interval": iv,
            "load": load.report, "loaded": noise.loaded(load.report),
            "spread": {k: noise.spread(v) for k, v in runs.items()},
            "state": {"core_latency_ns": state, "tolerance": STATE_TOLERANCE, "matched_rounds": matched,
                      "interval_matched": one_state} if probe else None}


def verdict(res: Dict[str, Any], target: Optional[float]) -> str:
    if "refused" in res:
        return "refused"
    iv = res.get("interval")
    if not iv:
        return "no measurement"
    if target is None:
        return ""
    if iv.get("low") is not None and iv["low"] >= target:
        return f"met (>= {target:g}x with 95% confidence)"
    if iv["ratio"] >= target:
        return f"point only ({iv['ratio']:.3f}x >= {target:g}x, interval low {iv['low']:.3f})" \
            if iv.get("low") is not None else f"point only ({iv['ratio']:.3f}x, one round)"
    return f"not met ({iv['ratio']:.3f}x < {target:g}x)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profiles", nargs="*", help="profile files, or folders (this device's profiles in them)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds (each: one process per side)")
    ap.add_argument("--steps", default=None,
                    help="timed steps per measurement: N, or per workload kind (graphs=600,neighbor=600,"
                         "fullgraph=100); default: the profile's workload's")
    ap.add_argument("--warmup", default=None, help="steps before timing: N or per kind (default: the workload's)")
    ap.add_argument("--target", type=float, default=None, help="the ratio each profile should reach")
    ap.add_argument("--targets", default=None,
                    help="per workload kind, e.g. graphs=1.15,neighbor=1.15,fullgraph=1.1 (overrides --target)")
    ap.add_argument("--allow-tuned-batch", action="store_true",
                    help="compare a profile whose batch size was tuned too (at its own batch size)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per child process")
    ap.add_argument("--name", default="profile_ab", help="stem of the result files")
    ap.add_argument("--out", default=str(_common.RESULTS))
    args = ap.parse_args(argv)
    if args.child:
        return _child(args.child)
    if not args.profiles:
        ap.error("name at least one profile file or folder")
    if args.rounds < 2:
        ap.error("--rounds must be >= 2 (an interval needs two pairs)")
    targets = _per_kind(ap, "--targets", args.targets, float)
    steps = _per_kind(ap, "--steps", args.steps, int)
    warmup = _per_kind(ap, "--warmup", args.warmup, int)

    from gnncompile import profiles
    from gnncompile.hardware import device

    props = device.detect()
    report: Dict[str, Any] = {"command": _common.command("profile_ab", argv),
                              "machine": _common.machine(), "device_key": device.device_key(props),
                              "cpu_model": _common.cpu_model(), "rounds": args.rounds,
                              "loadavg_before_after": [_common.loadavg()], "results": []}
    for path in _profiles_of(args.profiles):
        doc = profiles.read(path)
        kind = (doc.get("workload") or {}).get("kind", "?")
        target = targets.get(kind, args.target)
        print(f"{path.name} ({kind}, target {target}):", flush=True)
        res = ab(doc, args.rounds, steps.get(kind, steps.get("*")), warmup.get(kind, warmup.get("*")),
                 args.allow_tuned_batch, args.timeout)
        res.update(profile_path=str(path), kind=kind, target=target, verdict=verdict(res, target),
                   tuned_ratio=(doc.get("study") or {}).get("ratio"),
                   chosen=(doc.get("study") or {}).get("chosen"))
        report["results"].append(res)
        iv = res.get("interval")
        if iv:
            low = f"{iv['low']:.3f}" if iv.get("low") is not None else "-"
            high = f"{iv['high']:.3f}" if iv.get("high") is not None else "-"
            print(f"  ratio {iv['ratio']:.3f}x [{low}, {high}] {res['verdict']}"
                  + (" (machine loaded)" if res.get("loaded") else ""), flush=True)
        else:
            print(f"  {res.get('refused') or res['verdict']}", flush=True)
    report["loadavg_before_after"].append(_common.loadavg())
    _common.write_results(Path(args.out), args.name, report, _markdown, _plot, json_default=str)
    return 0


def _per_kind(ap, flag: str, text: Optional[str], cast) -> Dict[str, Any]:
    """``N`` (every kind: key "*") or ``kind=N,kind=N`` as a dict; a usage error otherwise."""
    if not text:
        return {}
    out: Dict[str, Any] = {}
    try:
        for part in text.split(","):
            k, sep, v = part.partition("=")
            out[k.strip() if sep else "*"] = cast(v if sep else k)
    except ValueError:
        ap.error(f"{flag}: expected N or KIND=N,KIND=N, got {text!r}")
    bad = set(out) - {"*", "graphs", "neighbor", "fullgraph"}
    if bad:
        ap.error(f"{flag}: unknown workload kind(s) {sorted(bad)}")
    return out


def _diff(res: Dict[str, Any]) -> str:
    """The settings where the profile differs from the defaults."""
    a, b = res["defaults"], res["profile"]
    keys = [k for k in _SETTING_KEYS + ("loader",) if a.get(k) != b.get(k)]
    return ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys) or "none"


def _markdown(r: Dict[str, Any]) -> str:
    m = r["machine"]
    lines = ["# Tuning profiles re-measured against the defaults, fresh processes, interleaved", "",
             f"Machine: {r['cpu_model']} ({r['device_key']}), {m.get('threads', '?')} threads, torch "
             f"{m.get('torch', '?')}. {r['rounds']} rounds per profile; each round runs the defaults and the "
             "profile once each, each in a new process, in alternating order. Ratio: geometric mean "
             "of the rounds' profile / defaults throughputs, 95% interval (Student's t over the "
             "rounds' log ratios). Other processes' CPU use measured over each profile's rounds.",
             "", f"Command: `{r['command']}`", "",
             _common.load_text(r["loadavg_before_after"]), "",
             "| profile | workload | batch size | settings that differ | defaults | profile | ratio | 95% interval | others' cores | target | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for res in r["results"]:
        name = Path(res["profile_path"]).name
        if "refused" in res:
            lines.append(f"| {name} | {res['kind']} | tuned | - | - | - | - | - | - | {res.get('target')} | refused: {res['refused']} |")
            continue
        iv = res.get("interval") or {}
        import statistics

        d = statistics.median(res["runs"]["defaults"]) if res["runs"]["defaults"] else float("nan")
        pr = statistics.median(res["runs"]["profile"]) if res["runs"]["profile"] else float("nan")
        span = (f"[{iv['low']:.3f}, {iv['high']:.3f}]" if iv.get("low") is not None else "-")
        lines.append(f"| {name} | {res['kind']} | {res['profile'].get('batch_size')}"
                     f"{' (tuned)' if res.get('batch_size_tuned') else ''} | {_diff(res)} | "
                     f"{d:.4g} {res['unit']} | {pr:.4g} | {iv.get('ratio', float('nan')):.3f}x | {span} | "
                     f"{(res.get('load') or {}).get('others_cores')}{' (loaded)' if res.get('loaded') else ''} | "
                     f"{res.get('target') or '-'} | {res.get('verdict') or '-'} |")
    lines += ["", "Throughputs are medians over the rounds. The tuning run's own re-measurement of each "
              "profile (same process, `study.ratio`) for comparison:", ""]
    for res in r["results"]:
        tr = res.get("tuned_ratio") or {}
        lines.append(f"- {Path(res['profile_path']).name}: chosen {res.get('chosen')!r}; tuning run ratio "
                     f"{tr.get('ratio', float('nan')):.3f}" if tr else
                     f"- {Path(res['profile_path']).name}: chosen {res.get('chosen')!r}; no ratio recorded")
    states = [res for res in r["results"] if res.get("state")]
    if states:
        lines += ["", "The machine's state: the cache-line round trip between the first two CPUs "
                  "(`benchmarks/native/core_latency.cpp`), read before each child and after each round; "
                  f"a round whose probes lie within {STATE_TOLERANCE}x of each other ran both sides in one "
                  "state. The ratio over those rounds only (not the headline ratio above, which counts every "
                  "round):", ""]
        for res in states:
            st = res["state"]
            m, iv = st["matched_rounds"], st.get("interval_matched")
            probes = "; ".join("/".join("-" if x is None else f"{x:.0f}" for x in p) for p in st["core_latency_ns"])
            text = (f"{iv['ratio']:.3f}x [{iv['low']:.3f}, {iv['high']:.3f}]" if iv and iv.get("low") is not None
                    else "fewer than two such rounds")
            lines.append(f"- {Path(res['profile_path']).name}: {len(m)} of {len(st['core_latency_ns'])} rounds "
                         f"in one state ({m}): {text}; probes (ns) per round: {probes}")
    errs = [e for res in r["results"] for e in res.get("errors", [])]
    if errs:
        lines += ["", "Failed children:", ""] + [f"- {e}" for e in errs]
    return "\n".join(lines) + "\n"


def _plot(r: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [res for res in r["results"] if res.get("interval")]
    if not rows:
        raise RuntimeError("no profile was measured")
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(rows) + 2), 3.6))
    for i, res in enumerate(rows):
        iv = res["interval"]
        ratios = [a / b for a, b in zip(res["runs"]["profile"], res["runs"]["defaults"])]
        ax.bar(i, iv["ratio"], color="tab:green" if iv.get("low") and iv["low"] > 1 else "tab:gray", alpha=.7)
        if iv.get("low") is not None:
            ax.errorbar(i, iv["ratio"], yerr=[[iv["ratio"] - iv["low"]], [iv["high"] - iv["ratio"]]],
                        color="k", capsize=5)
        ax.scatter([i] * len(ratios), ratios, color="k", s=10, zorder=3)
        if res.get("target"):
            ax.hlines(res["target"], i - .4, i + .4, colors="tab:red", linestyles="--")
    ax.axhline(1.0, color="k", lw=.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{res['kind']}\n{Path(res['profile_path']).stem.split('__')[-1]}" for res in rows])
    ax.set_ylabel("profile / defaults (throughput)")
    ax.set_title("Profiles re-measured in fresh processes (bars: geo. mean, 95% CI; dots: rounds; red: target)",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
