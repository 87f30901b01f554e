"""End to end: PyG's Cora examples (GCN, GAT) as scripts, plain vs one added gnncompile line.

    python -m benchmarks cora_examples                          # gcn + gat, 200 epochs, 3 repeats
    python -m benchmarks cora_examples --examples gcn --epochs 50 --repeats 1

The scripts are benchmarks/examples/{gcn,gat}_cora.py: our own versions of the recipes of PyG's
examples/gcn.py and examples/gat.py (Planetoid Cora, NormalizeFeatures, 200 epochs of one
full-graph training step + a full evaluation). ``--compile`` adds the single line
``model = gnncompile.compile(model)`` after the model is built; nothing else changes.

Every run is a fresh ``python`` process. Variants, per example:
  eager           the script as PyG users run it
  compiled        ``--compile`` with a cold persistent compile cache: TORCHINDUCTOR_CACHE_DIR set
                  to a new empty temporary folder (inductor's FX graph / AOTAutograd caches and
                  compiled kernels start empty)
  compiled-warm   ``--compile`` again, reusing the folder the cold run just filled (what a second
                  run of the same script on the same machine sees)
Each variant runs ``--repeats`` times, interleaved (eager first in even repeats, the compiled
pair first in odd ones); the medians over repeats are reported. Measured per run: the process's
wall time (time.perf_counter around subprocess.run: interpreter start, imports, dataset
processing, compilation, training, exit), the script's own wall_s (first line to end), the first
epoch (includes compilation) and median epoch time, the final loss and test accuracy. Ratios:
eager process wall / compiled process wall, eager median epoch / compiled median epoch. The
children run with OMP_NUM_THREADS and torch.set_num_threads = ``--threads`` (on a 2-core machine
shared with other work, 2 threads can be many times slower than 1: compare runs made with the
same setting). The inner compiler is gnncompile's default, 'auto': the inner of a device profile
in the cache folder when one applies and names one, else $GNNCOMPILE_INNER when set, else the size
rule of gnncompile.compiler.backend.choose_inner, which gives Cora (2.7k nodes + 13k edges with
self loops) the "eager" inner. (The record names $GNNCOMPILE_INNER or the rule, not a
profile's.) With inductor, dropout inside the compiled graph draws other random numbers than eager, so final accuracies differ by the usual run-to-run spread; with aot_eager
they are identical. ``--examples gcn-uncached`` (not in the default list) runs the GCN script
with ``--no-cached``: GCNConv(cached=False), the normalisation on every call, which gnncompile's
compiled graph caches per edge_index instead. Writes
benchmarks/results/cora_examples.{json,md,png}. Skips (exit 0) when the raw Cora files are
absent.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import _common

HERE = Path(__file__).resolve().parent
# name: (script, extra arguments). gcn-uncached: GCNConv(cached=False), the normalisation on every
# call (as in models written for mini-batches); not run unless asked for.
EXAMPLES = {"gcn": (HERE / "examples" / "gcn_cora.py", []), "gat": (HERE / "examples" / "gat_cora.py", []),
            "gcn-uncached": (HERE / "examples" / "gcn_cora.py", ["--no-cached"])}
VARIANTS = ("eager", "compiled", "compiled-warm")
DEFAULT_ROOT = HERE.parents[1] / "shared" / "data" / "planetoid"
METRICS = ("process_wall_s", "wall_s", "first_epoch_s", "median_epoch_s", "final_test_acc", "final_loss")


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def run_script(example: str, compile_: bool, cache_dir, opts) -> dict:
    """One run of an example script in a fresh process; the script's JSON plus process_wall_s."""
    env = _common.timing_env(opts.threads)
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    fd, out = tempfile.mkstemp(suffix=".json", prefix=f"{example}_")
    os.close(fd)
    script, extra = EXAMPLES[example]
    cmd = [sys.executable, str(script), *extra, "--epochs", str(opts.epochs), "--threads",
           str(opts.threads), "--root", str(opts.root), "--json", out] + (["--compile"] if compile_ else [])
    try:
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=opts.timeout)
        wall = time.perf_counter() - t0
        text = Path(out).read_text() if p.returncode == 0 else ""
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {opts.timeout} s", "command": " ".join(cmd)}
    finally:
        os.unlink(out)
    if p.returncode != 0 or not text:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["failed"]
        return {"error": f"rc {p.returncode}: {tail[0]}", "command": " ".join(cmd)}
    res = json.loads(text)
    res["process_wall_s"] = wall
    return res


def run_example(example: str, opts) -> dict:
    runs = {v: [] for v in VARIANTS}
    for r in range(opts.repeats):
        order = ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")
        for what in order:
            if what == "eager":
                runs["eager"].append(run_script(example, False, None, opts))
                _say(example, "eager", r, runs["eager"][-1])
                continue
            cache = Path(tempfile.mkdtemp(prefix="inductor_cache_"))
            try:
                cold = run_script(example, True, cache, opts)
                cold["cache_bytes"] = _dir_bytes(cache)
                runs["compiled"].append(cold)
                _say(example, "compiled", r, cold)
                runs["compiled-warm"].append(run_script(example, True, cache, opts))
                _say(example, "compiled-warm", r, runs["compiled-warm"][-1])
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    out = {}
    for v, rs in runs.items():
        ok = [x for x in rs if "error" not in x]
        summary = {"runs": len(rs), "ok": len(ok)}
        if len(ok) < len(rs):
            summary["errors"] = [x["error"] for x in rs if "error" in x]
            summary["error_command"] = next(x.get("command") for x in rs if "error" in x)
        if ok:
            for m in METRICS:
                summary[m] = statistics.median(x[m] for x in ok)
                summary[m + "_all"] = [x[m] for x in ok]
            if "cache_bytes" in ok[0]:
                summary["cache_bytes"] = statistics.median(x["cache_bytes"] for x in ok)
            summary["epoch_times_s"] = ok[0]["epoch_times_s"]  # the first run's, for the record
        out[v] = summary
    e = out["eager"]
    for v in VARIANTS[1:]:
        c = out[v]
        if "process_wall_s" in e and "process_wall_s" in c:
            c["wall_ratio"] = e["process_wall_s"] / c["process_wall_s"]
            c["epoch_ratio"] = e["median_epoch_s"] / c["median_epoch_s"]
            # extra epochs after which the compiled run would have caught up (its fixed cost
            # paid back by faster epochs); None when its epochs are not faster
            gain = e["median_epoch_s"] - c["median_epoch_s"]
            c["break_even_epochs"] = ((c["process_wall_s"] - e["process_wall_s"]) / gain
                                      if gain > 0 else None)
    return out


def _say(example: str, variant: str, r: int, res: dict) -> None:
    if "error" in res:
        print(f"{example}/{variant} #{r}: {res['error']}", flush=True)
        return
    print(f"{example}/{variant} #{r}: process {res['process_wall_s']:.1f} s, script {res['wall_s']:.1f} s, "
          f"first epoch {res['first_epoch_s']:.2f} s, median epoch {res['median_epoch_s'] * 1e3:.1f} ms, "
          f"test acc {res['final_test_acc']:.3f}", flush=True)


def markdown(p: dict) -> str:
    head = ["example", "variant", "process wall s", "script wall_s", "first epoch s", "median epoch ms",
            "wall: eager / this", "epoch: eager / this", "break-even epochs", "final test acc (runs)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for ex, res in p["results"].items():
        for v, r in res.items():
            if "process_wall_s" not in r:
                lines.append(f"| {ex} | {v} | error: {'; '.join(r.get('errors', ['no runs']))} |"
                             + " |" * (len(head) - 3))
                continue
            be = r.get("break_even_epochs")
            cells = [ex, v, f"{r['process_wall_s']:.1f}", f"{r['wall_s']:.1f}", f"{r['first_epoch_s']:.2f}",
                     f"{r['median_epoch_s'] * 1e3:.1f}",
                     f"{r['wall_ratio']:.2f}x" if "wall_ratio" in r else "",
                     f"{r['epoch_ratio']:.2f}x" if "epoch_ratio" in r else "",
                     "" if v == "eager" else ("never" if be is None else f"{be:.0f}"),
                     f"{r['final_test_acc']:.3f} ({', '.join(f'{a:.3f}' for a in r['final_test_acc_all'])})"]
            lines.append("| " + " | ".join(cells) + " |")
    m = p["machine"]
    lines += ["", f"{p['epochs']} epochs (one full-graph training step + full evaluation each) of "
              f"benchmarks/examples/<example>_cora.py, each run a fresh process with {p['threads']} threads; "
              f"medians over {p['repeats']} runs per variant, interleaved. compiled = `--compile` "
              f"(model = gnncompile.compile(model)) with an empty TORCHINDUCTOR_CACHE_DIR; compiled-warm = "
              f"the same again reusing that cache folder. Process wall: perf_counter around "
              f"subprocess.run (interpreter start to exit); script wall_s: the script's first line to its "
              f"end; first epoch includes compilation. Break-even: extra epochs after which the "
              f"compiled run's fixed cost is paid back by its faster epochs ((wall_c - wall_e) / "
              f"(epoch_e - epoch_c)). Inner compiler: {p['inner']}. torch {m['torch']}, gnncompile "
              f"{m['gnncompile']}. {_common.load_text(p['loadavg_before_after'])} (a shared machine). "
              f"Command: `{p['command']}`"]
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [(ex, v) for ex, res in p["results"].items() for v, r in res.items() if "process_wall_s" in r]
    labels = [f"{ex}\n{v}" for ex, v in keys]
    colors = {"eager": "tab:gray", "compiled": "tab:blue", "compiled-warm": "tab:green"}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(2 + 1.6 * len(keys), 3.8))
    for ax, metric, scale, unit in ((a1, "process_wall_s", 1, "process wall time (s)"),
                                    (a2, "median_epoch_s", 1e3, "median epoch (ms)")):
        vals = [p["results"][ex][v][metric] * scale for ex, v in keys]
        ax.bar(range(len(keys)), vals, color=[colors[v] for _, v in keys])
        for i, val in enumerate(vals):
            ax.text(i, val, f"{val:.1f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(keys)), labels, fontsize=7)
        ax.set_ylabel(unit)
    fig.suptitle(f"Cora examples, {p['epochs']} epochs, {p['threads']} threads, median of {p['repeats']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", default="gcn,gat", help="comma list of " + ", ".join(EXAMPLES))
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--root", default=str(DEFAULT_ROOT), help="folder holding Cora/raw (read only)")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    ap.add_argument("--out", default="cora_examples")
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    opts = ap.parse_args(argv)
    examples = [e.strip() for e in opts.examples.split(",") if e.strip()]
    unknown = [e for e in examples if e not in EXAMPLES]
    if unknown:
        ap.error(f"unknown examples {unknown}; known: {', '.join(EXAMPLES)}")
    raw = Path(opts.root) / "Cora" / "raw"
    if not raw.is_dir() or not any(raw.iterdir()):
        msg = f"skipped: the raw Cora files are not in {raw}"
        print(msg)
        return {"skipped": msg}
    from gnncompile import config as _cfg
    from gnncompile.compiler import backend as _be

    load_before = _common.loadavg()
    results = {ex: run_example(ex, opts) for ex in examples}
    payload = {"machine": _common.machine(), "loadavg_before_after": [load_before, _common.loadavg()],
               "examples": examples, "epochs": opts.epochs, "repeats": opts.repeats, "threads": opts.threads,
               "inner": (_cfg.current().inner or
                         f"auto (eager below {_be.AUTO_INDUCTOR_MIN_SIZE} nodes + edges, else inductor)"),
               "results": results,
               "command": _common.command("cora_examples", argv)}
    _common.write_results(Path(opts.results_dir), opts.out, payload, markdown, plot)
    return payload


if __name__ == "__main__":
    main()
