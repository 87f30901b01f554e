"""A tuning study killed mid-run and resumed loses no completed trial; its profile then drives
``gnncompile.compile``. Shows, with the real CLI, on a small graph-classification workload:

1. ``gnncompile tune ... --trials N --storage sqlite:///<dir>/study.db --out <dir>`` is started
   and killed with SIGKILL once ``--kill-after`` trials have completed;
2. the completed trials in the study are listed (number, value, parameters);
3. the same command is run again: it resumes the study and finishes the missing trials; every
   trial completed before the kill is checked to be still there, unchanged;
4. the profile it wrote is given to ``gnncompile.compile(model, profile=<dir>/<file>.json)``,
   and a few training steps of the compiled model are checked against the eager model.

Writes benchmarks/results/tuning_resume.md (and .json).

    python -m benchmarks tuning_resume                 # about 2-3 minutes here
    python -m benchmarks tuning_resume --trials 6 --kill-after 2
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

warnings.simplefilter("ignore")

from . import _common  # noqa: E402


def _cmd(args, storage, out):
    return [sys.executable, "-m", "gnncompile.cli", "tune", "--workload", "graphs", "--model", "gin",
            "--num-graphs", str(args.num_graphs), "--batch-size", "128", "--warmup", "5", "--steps", "30",
            "--trials", str(args.trials), "--storage", storage, "--study-name", "resume-demo",
            "--out", str(out), "--seed", "0", "--no-progress"]


def _completed(optuna, storage):
    try:
        s = optuna.load_study(study_name="resume-demo", storage=storage)
    except Exception:
        return []
    return [t for t in s.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]


def _running(optuna, storage):
    try:
        s = optuna.load_study(study_name="resume-demo", storage=storage)
    except Exception:
        return False
    return any(t.state == optuna.trial.TrialState.RUNNING for t in s.get_trials())


def _row(t):
    return {"number": t.number, "value": t.value, "params": t.params,
            "worker": t.user_attrs.get("worker")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--kill-after", type=int, default=3, help="completed trials before the SIGKILL")
    ap.add_argument("--kill-delay", type=float, default=0.5,
                    help="seconds into the next trial (once it is running) before the kill")
    ap.add_argument("--num-graphs", type=int, default=2000)
    ap.add_argument("--out", default=str(_common.RESULTS))
    args = ap.parse_args(argv)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="gnncompile-resume-"))
    storage = f"sqlite:///{work / 'study.db'}"
    env = {**os.environ, "GNNCOMPILE_CACHE_DIR": str(work / "cache")}
    report = {"command": " ".join(_cmd(args, storage, work)[1:]), "folder": str(work)}

    print(f"[1/4] tuning, to be killed after {args.kill_after} completed trials", flush=True)
    p = subprocess.Popen(_cmd(args, storage, work), cwd=str(work), env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while len(_completed(optuna, storage)) < args.kill_after:
        if p.poll() is not None:
            print(p.stderr.read(), file=sys.stderr)
            raise SystemExit(f"the tuning run ended before {args.kill_after} trials completed")
        if time.time() - t0 > 600:
            p.kill()
            raise SystemExit("timeout waiting for completed trials")
        time.sleep(0.5)
    # into the next trial, so that one is running when the kill comes
    t1 = time.time()
    while not _running(optuna, storage) and p.poll() is None and time.time() - t1 < 60:
        time.sleep(0.1)
    time.sleep(args.kill_delay)
    p.send_signal(signal.SIGKILL)
    p.wait()
    study = optuna.load_study(study_name="resume-demo", storage=storage)
    states = [(t.number, t.state.name) for t in study.get_trials()]
    before = {t.number: _row(t) for t in _completed(optuna, storage)}
    report["killed_after_s"] = round(time.time() - t0, 1)
    report["states_after_kill"] = states
    report["completed_before"] = list(before.values())
    print(f"[2/4] killed (SIGKILL) after {report['killed_after_s']} s; trials: {states}", flush=True)

    print("[3/4] the same command again: resume", flush=True)
    r = subprocess.run(_cmd(args, storage, work), cwd=str(work), env=env, capture_output=True, text=True,
                       timeout=1200)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        raise SystemExit(f"the resumed run failed ({r.returncode})")
    summary = json.loads(r.stdout)
    study = optuna.load_study(study_name="resume-demo", storage=storage)
    after = {t.number: _row(t) for t in _completed(optuna, storage)}
    lost = [n for n, row in before.items() if after.get(n) != row]
    report["states_after_resume"] = [(t.number, t.state.name) for t in study.get_trials()]
    report["completed_after"] = list(after.values())
    report["lost_or_changed"] = lost
    report["profile"] = summary["profile"]
    print(f"  completed before the kill: {sorted(before)}; after the resume: {sorted(after)}; "
          f"lost or changed: {lost}", flush=True)

    print("[4/4] gnncompile.compile(model, profile=<the profile>)", flush=True)
    import torch

    import gnncompile
    from gnncompile.tuner.workloads import Workload, build_model, dataset_for
    from torch_geometric.loader import DataLoader

    w = Workload(kind="graphs", model="gin", num_graphs=args.num_graphs)
    torch.manual_seed(0)
    eager = build_model(w)
    model = build_model(w)
    model.load_state_dict(eager.state_dict())
    compiled = gnncompile.compile(model, profile=summary["profile"])
    prof = compiled.gnncompile_profile
    diffs = []
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (eager, model)]
    for i, b in enumerate(DataLoader(dataset_for(w), batch_size=128, shuffle=False)):
        if i == 5:
            break
        losses = []
        for f, opt in ((eager, opts[0]), (compiled, opts[1])):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(f(b.x, b.edge_index, b.batch), b.y)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        diffs.append(abs(losses[0] - losses[1]))
    report["compile"] = {"profile_source": prof.source, "profile_path": prof.path, "settings": prof.settings,
                         "throughput": prof.throughput, "max_loss_difference_5_steps": max(diffs),
                         "loader_kwargs": prof.loader_kwargs()}
    print(f"  profile used: {prof.path} (source {prof.source}); settings {prof.settings}; max loss "
          f"difference over 5 steps vs eager {max(diffs):.2e}", flush=True)
    ok = not lost and prof.source == "file" and max(diffs) < 1e-4 and len(after) >= args.trials - 1
    report["ok"] = ok

    _common.write_results(Path(args.out), "tuning_resume", report, _markdown, json_default=str)
    return 0 if ok else 1


def _markdown(r) -> str:
    lines = ["# A killed tuning study, resumed", "",
             f"Command (run twice; the first run killed with SIGKILL): `gnncompile {r['command'].split('gnncompile.cli ', 1)[-1]}`",
             "", f"Killed after {r['killed_after_s']} s. Trial states right after the kill: {r['states_after_kill']}.", "",
             "| trial | value before the kill (graphs/s) | value after the resume | parameters |", "|---|---|---|---|"]
    after = {row["number"]: row for row in r["completed_after"]}
    for row in r["completed_before"]:
        a = after.get(row["number"])
        lines.append(f"| {row['number']} | {row['value']:.1f} | {a['value']:.1f} | {row['params']} |" if a else
                     f"| {row['number']} | {row['value']:.1f} | **lost** | {row['params']} |")
    new = [n for n in after if n not in {row["number"] for row in r["completed_before"]}]
    lines += ["", f"Trials completed by the resumed run: {sorted(new)}. States after the resume: "
              f"{r['states_after_resume']}.", f"Completed trials lost or changed: {r['lost_or_changed'] or 'none'}.", "",
              f"`gnncompile.compile(model, profile=\"{r['profile']}\")` used the profile (source "
              f"`{r['compile']['profile_source']}`), settings {r['compile']['settings']}; five training steps "
              f"matched the eager model (largest loss difference {r['compile']['max_loss_difference_5_steps']:.1e}).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
