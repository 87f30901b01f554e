"""Training step of the compiled model at an earlier commit against this checkout, interleaved A/B.

    python -m benchmarks commit_ab                          # base: the commit before issue 26's work
    python -m benchmarks commit_ab --base HEAD~3 --rounds 4 --models GCN
    python -m benchmarks commit_ab --prepare-only           # check out and build the base, no timing

The base revision is checked out detached (``git worktree add --detach``) into a cache folder
(default ``build/commit_ab/<sha>``; ``--cache-dir``) and its native module is built there with
CMake against this environment's torch, then installed into that checkout's ``gnncompile/``: the
current checkout, its build folder and its environment are not touched, and a later run reuses
the build. The head is this checkout as it is (uncommitted changes included; the JSON records
``git status``), imported the way the environment installs it.

Each measurement is a fresh Python process that runs this module's ``--child`` mode with
gnncompile imported from one side's tree and the model code of *this* checkout (the benchmark
package is loaded from here by path, so both sides run the same model, graph generator call,
seed and training step): :func:`benchmarks.models.child` with the variant ``gnncompile`` (the
compiled model, default settings; it checks the first step's output against eager PyG, steps
past the speed guard and times ``--repeats`` steps after ``--warmup``). The child refuses to
run when gnncompile or its native module came from another tree, or when the native kernels did
not load (a reference-fallback run would time the wrong thing). The graph is the models
benchmark's (``power_law_graph(N, 10 N, seed=0)``, features and labels from seed 1), F features,
hidden 128, 2 layers, 16 classes, Adam.

Rounds: each model's base and head children run back to back, the order alternating from round
to round and from model to model, so a drift of the machine's speed falls on both sides. Per
model: the medians over the rounds of each side's step time (each child's own median), the
speed-up base / head as the geometric mean of the rounds' paired ratios with its 95% Student's
t interval (:func:`gnncompile.tuner.noise.ratio_interval`), and a verdict against ``--target``
(met when the interval's low end is at or above it). The first step's loss (same parameters,
before any optimizer step) must agree between base and head to ``--loss-rtol``, and every
child must report the same graph digest; a disagreement is reported and the exit status is 1.

Peers (``--peers``, default ``eager,csr``, for ``--peer-model``, default GCN): PyG eager and
PyG's sparse CSR path (benchmarks/models.py's variants), one child each per round under this
checkout; the head's compiled step against each, paired per round, with the ``--peer-targets``.

Writes benchmarks/results/commit_ab.{json,md,png} (``--name``, ``--results-dir``), naming the
CPU model.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import _common

#: issue 26's first commit ("CPU kernels prefetch past the row's end"): the base is its parent
ISSUE26_FIRST = "0686146"
DEFAULT_BASE = ISSUE26_FIRST + "^"
MODELS = ("GCN", "GraphSAGE", "GIN")
#: the models benchmark's models run when named (TransformerConv with edge features: issue 25 / 32)
EXTRA_MODELS = ("GAT", "GATv2", "TransformerE")
DEFAULT_CACHE = _common.ROOT / "build" / "commit_ab"
BUILD_STAMP = "commit_ab_build.json"  # in the base tree's build folder, written after an install

#: How a child starts (python -c BOOT HEAD_ROOT TREE ARGS..., in TREE's folder when TREE is
#: given): gnncompile found first in the working directory, TREE, with the editable install's
#: finder removed; with TREE empty, as installed (from HEAD_ROOT). The benchmarks package is
#: always HEAD_ROOT's, loaded by its path.
def boot_source(module: str, function: str) -> str:
    """The child's boot script (above) that ends calling ``benchmarks.<module>.<function>``."""
    return r"""
import importlib.util, os, sys
head, tree = sys.argv[1], sys.argv[2]
del sys.argv[1:3]
if tree:
    sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable_")]
spec = importlib.util.spec_from_file_location(
    "benchmarks", os.path.join(head, "benchmarks", "__init__.py"),
    submodule_search_locations=[os.path.join(head, "benchmarks")])
pkg = importlib.util.module_from_spec(spec)
sys.modules["benchmarks"] = pkg
spec.loader.exec_module(pkg)
""" + f"from benchmarks import {module}\nsys.exit({module}.{function}(sys.argv[1:]))\n"


BOOT = boot_source("commit_ab", "main")


class CommitABError(RuntimeError):
    """A revision that is not a commit, a checkout in the way, a failed build."""


# ----------------------------------------------------------------------------- git and build
def _git(*args: str, cwd: Path = _common.ROOT, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise CommitABError(f"git {' '.join(args)} (in {cwd}) failed: {(p.stderr or p.stdout).strip()}")
    return p


def resolve(rev: str, root: Path = _common.ROOT) -> str:
    """The full hash of commit ``rev`` in the repository at ``root``; CommitABError when it names
    no commit there."""
    if not rev or rev.startswith("-"):
        raise CommitABError(f"--base {rev!r}: not a revision")
    p = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", cwd=root, check=False)
    if p.returncode != 0 or not p.stdout.strip():
        raise CommitABError(f"--base {rev!r} names no commit in {root} "
                            f"(git rev-parse: {(p.stderr or 'unknown revision').strip() or 'unknown revision'})")
    return p.stdout.strip()


def describe(sha: str, root: Path = _common.ROOT) -> Dict[str, str]:
    p = _git("log", "-1", "--format=%h%x00%s%x00%cI", sha, cwd=root)
    short, subject, date = p.stdout.strip().split("\x00")
    return {"sha": sha, "short": short, "subject": subject, "date": date}


def head_info(root: Path = _common.ROOT) -> Dict[str, Any]:
    """This checkout: its commit, the tracked files that differ from it and a digest of the
    difference (``git diff HEAD``)."""
    import hashlib

    sha = _git("rev-parse", "HEAD", cwd=root).stdout.strip()
    dirty = _git("status", "--porcelain", "--untracked-files=no", cwd=root).stdout.split("\n")
    diff = _git("diff", "HEAD", cwd=root).stdout
    return {**describe(sha, root), "dirty": [ln for ln in dirty if ln.strip()],
            "diff_digest": hashlib.blake2b(diff.encode(), digest_size=8).hexdigest() if diff else ""}


def checkout(sha: str, cache: Path, root: Path = _common.ROOT, log: Callable[[str], None] = print) -> Path:
    """A detached checkout of ``sha`` at cache/<sha[:12]> (a git worktree of ``root``), made once
    and reused; CommitABError when something else is in its place or its tracked files were
    edited."""
    tree = Path(cache) / sha[:12]
    if tree.exists():
        p = _git("rev-parse", "HEAD", cwd=tree, check=False)
        if p.returncode != 0 or p.stdout.strip() != sha:
            raise CommitABError(f"{tree} exists but is not a checkout of {sha[:12]}: remove it")
        edited = _git("status", "--porcelain", "--untracked-files=no", cwd=tree).stdout.strip()
        if edited:
            raise CommitABError(f"{tree} has edited tracked files (git status: {edited.splitlines()[0]} ...): "
                                f"remove it to check out {sha[:12]} again")
        return tree
    tree.parent.mkdir(parents=True, exist_ok=True)
    _git("worktree", "prune", cwd=root)
    log(f"checking out {sha[:12]} into {tree}")
    _git("worktree", "add", "--detach", str(tree), sha, cwd=root)
    return tree


def _tool(name: str) -> Optional[str]:
    """A build tool from this environment's bin folder (where pip puts cmake and ninja), else PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def _torch_version() -> str:
    import torch

    return torch.__version__


def build(tree: Path, jobs: Optional[int] = None, force: bool = False,
          log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Builds the native module of the checkout ``tree`` with CMake (Release, the tree's own
    CMakeLists, this interpreter and its torch; CUDA off: the A/B is on the CPU) and installs it
    into tree/gnncompile/. Skipped when a stamp says it was built for this interpreter and
    torch. Returns the stamp (command lines, seconds)."""
    bdir = tree / "build" / "commit_ab"
    stamp = bdir / BUILD_STAMP
    want = {"python": sys.executable, "torch": _torch_version()}
    if stamp.exists() and not force:
        done = json.loads(stamp.read_text())
        if all(done.get(k) == v for k, v in want.items()) and list((tree / "gnncompile").glob("_C*.so")):
            return done
    cmake = _tool("cmake")
    if cmake is None:
        raise CommitABError("cmake not found (install it into the environment: pip install cmake)")
    configure = [cmake, "-S", str(tree), "-B", str(bdir), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DPython_EXECUTABLE={sys.executable}", "-DGNNCOMPILE_CUDA=OFF"]
    ninja = _tool("ninja")
    if ninja:
        configure += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    cmds = [configure, [cmake, "--build", str(bdir), "--parallel", str(jobs or os.cpu_count() or 1)],
            [cmake, "--install", str(bdir), "--prefix", str(tree)]]
    t0 = time.perf_counter()
    for cmd in cmds:
        log("  " + " ".join(cmd))
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
            raise CommitABError(f"building the native module of {tree} failed ({' '.join(cmd[:2])} ...):\n{tail}")
    # gnncompile.tuner lives at the top of the repository and is installed under the package: the
    # checkout gets the same layout through a link (an untracked file of the cache checkout only)
    link = tree / "gnncompile" / "tuner"
    if (tree / "tuner").is_dir() and not link.exists():
        link.symlink_to(Path("..") / "tuner", target_is_directory=True)
    done = {**want, "commands": [" ".join(c) for c in cmds], "seconds": round(time.perf_counter() - t0, 1)}
    _common.write_json(stamp, done)
    return done


def prepare(rev: str, cache: Path = DEFAULT_CACHE, jobs: Optional[int] = None, rebuild: bool = False,
            log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Resolves ``rev``, checks it out and builds it: {"commit": describe(), "tree", "build"}."""
    sha = resolve(rev)
    tree = checkout(sha, Path(cache), log=log)
    return {"commit": describe(sha), "tree": str(tree), "build": build(tree, jobs, rebuild, log)}


# ----------------------------------------------------------------------------- one run (child)
def child(opts) -> Dict[str, Any]:
    """One measurement in this process (started by :func:`child_command`): models.child with
    gnncompile from ``opts.tree`` (this checkout when empty), after checking where it came from."""
    import gnncompile
    from gnncompile.ops import _native

    from . import models

    tree = Path(opts.tree or _common.ROOT).resolve()
    where = {"gnncompile": str(Path(gnncompile.__file__).resolve()),
             "native": str(Path(_native._C.__file__).resolve()) if _native.native_loaded() else None}
    if tree not in Path(where["gnncompile"]).parents:
        raise CommitABError(f"gnncompile was imported from {where['gnncompile']}, not from {tree}")
    if where["native"] is None:
        raise CommitABError(f"the native module of {tree} did not load ({_native.LOAD_ERROR}): "
                            "a run of the pure-torch references would be timed")
    if tree not in Path(where["native"]).parents:
        raise CommitABError(f"the native module was loaded from {where['native']}, not from {tree}")
    args = argparse.Namespace(model=opts.model, graph=str(opts.nodes), features=opts.features,
                              variant=opts.variant, threads=opts.threads, warmup=opts.warmup,
                              repeats=opts.repeats, measure="time")
    return {**models.child(args), "where": where}


def child_command(tree: Optional[Path], model: str, variant: str, opts) -> List[str]:
    """The command line of one child: gnncompile from ``tree`` (None: this checkout as
    installed), the benchmark package from this checkout."""
    return [sys.executable, "-c", BOOT, str(_common.ROOT), str(tree) if tree else "",
            "--child", "--tree", str(tree) if tree else "", "--model", model, "--variant", variant,
            "--nodes", str(opts.nodes), "--features", str(opts.features), "--threads", str(opts.threads),
            "--warmup", str(opts.warmup), "--repeats", str(opts.repeats)]


def _run_child(tree: Optional[Path], model: str, variant: str, opts) -> Dict[str, Any]:
    return _common.run_child(child_command(tree, model, variant, opts), _common.timing_env(), opts.timeout,
                             cwd=tree)


# ----------------------------------------------------------------------------- rounds and summary
def run_rounds(models: Sequence[str], rounds: int, measure: Callable[[str, str, int], Dict[str, Any]],
               peers: Sequence[str] = (), peer_model: Optional[str] = None,
               log: Callable[[str], None] = print, start: int = 0) -> List[Dict[str, Any]]:
    """The interleaved runs: per round, per model, base and head back to back (the order
    alternating with the round and the model), then each peer of ``peer_model`` once.
    ``measure(side, model, round)`` runs one child (side: 'base', 'head' or a peer variant).
    Rounds are numbered from ``start`` (a run appended to earlier ones continues their order).
    Returns every run as {"round", "model", "side", "order", **result}."""
    runs = []
    for r in range(start, start + rounds):
        for i, model in enumerate(models):
            order = ("base", "head") if (r + i) % 2 == 0 else ("head", "base")
            for side in order:
                res = measure(side, model, r)
                runs.append({"round": r, "model": model, "side": side, "order": " then ".join(order), **res})
                log(f"round {r} {model:<10} {side:<6} " + (f"{res['median_s'] * 1e3:8.1f} ms  first loss "
                    f"{res['first_loss']:.6f}" if "median_s" in res else f"error: {res.get('error')}"))
        for peer in peers:
            res = measure(peer, peer_model, r)
            runs.append({"round": r, "model": peer_model, "side": peer, "order": "", **res})
            log(f"round {r} {peer_model:<10} {peer:<6} " + (f"{res['median_s'] * 1e3:8.1f} ms" if "median_s" in res
                                                            else f"error: {res.get('error')}"))
    return runs


def verdict(iv: Optional[Dict[str, Any]], target: Optional[float]) -> str:
    """'met' when the interval's low end reaches the target, 'point only' when only the ratio
    does, else 'not met' (or 'no measurement')."""
    if not iv:
        return "no measurement"
    if target is None:
        return ""
    if iv.get("low") is not None and iv["low"] >= target:
        return f"met (low {iv['low']:.2f} >= {target:g})"
    if iv["ratio"] >= target:
        low = "one pair" if iv.get("low") is None else f"low {iv['low']:.2f}"
        return f"point only ({iv['ratio']:.2f} >= {target:g}, {low})"
    return f"not met ({iv['ratio']:.2f} < {target:g})"


def _paired(runs: List[Dict[str, Any]], model: str, slow: str, fast: str):
    """Per round, the step times (s) of sides ``slow`` and ``fast`` of ``model`` where both ran."""
    by = {}
    for r in runs:
        if r["model"] == model and "median_s" in r:
            by.setdefault(r["round"], {})[r["side"]] = r["median_s"]
    rounds = sorted(k for k, v in by.items() if slow in v and fast in v)
    return [by[k][slow] for k in rounds], [by[k][fast] for k in rounds]


def speedup(slow_s: Sequence[float], fast_s: Sequence[float]) -> Optional[Dict[str, Any]]:
    """slow / fast from paired times: geometric mean and 95% interval (ratio_interval of the
    throughputs 1/fast against 1/slow)."""
    from gnncompile.tuner import noise

    return noise.ratio_interval([1 / t for t in fast_s], [1 / t for t in slow_s])


def summarise(runs: List[Dict[str, Any]], models: Sequence[str], target: float, loss_rtol: float,
              peers: Sequence[str] = (), peer_model: Optional[str] = None,
              peer_targets: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    """Per model: medians, the base / head speed-up and its verdict, the first losses' agreement;
    per peer: its step against the head's; the graph digests' agreement; the errors."""
    out: Dict[str, Any] = {"models": {}, "peers": {}, "errors": [], "agree": True}
    for r in runs:
        if "error" in r:
            out["errors"].append(f"round {r['round']} {r['model']} {r['side']}: {r['error']}")
    graphs = sorted({r["graph"] for r in runs if "graph" in r})
    out["graphs"] = graphs
    if len(graphs) > 1:
        out["agree"] = False
    for model in models:
        ok = [r for r in runs if r["model"] == model and r["side"] in ("base", "head") and "median_s" in r]
        side = {s: [r for r in ok if r["side"] == s] for s in ("base", "head")}
        b, h = _paired(runs, model, "base", "head")
        iv = speedup(b, h)
        losses = {s: [r["first_loss"] for r in side[s]] for s in side}
        allv = losses["base"] + losses["head"]
        spread = (max(allv) - min(allv)) / max(abs(statistics.median(allv)), 1e-12) if allv else None
        agree = spread is not None and bool(losses["base"]) and bool(losses["head"]) and spread <= loss_rtol
        if not agree:
            out["agree"] = False
        out["models"][model] = {
            "base_ms": [r["median_s"] * 1e3 for r in side["base"]],
            "head_ms": [r["median_s"] * 1e3 for r in side["head"]],
            "base_median_ms": statistics.median(r["median_s"] * 1e3 for r in side["base"]) if side["base"] else None,
            "head_median_ms": statistics.median(r["median_s"] * 1e3 for r in side["head"]) if side["head"] else None,
            "speedup": iv, "pairs": len(b), "target": target, "verdict": verdict(iv, target),
            "first_loss": losses, "loss_rel_spread": spread, "losses_agree": agree,
            "rel_err_vs_eager": max((r["rel_err"] for r in ok), default=None),
            "guard": sorted({d for r in side["head"] for d in r.get("guard", [])}),
        }
    for peer in peers:
        p, h = _paired(runs, peer_model, peer, "head")
        iv = speedup(p, h)
        target = (peer_targets or {}).get(peer)
        ms = [r["median_s"] * 1e3 for r in runs if r["model"] == peer_model and r["side"] == peer and "median_s" in r]
        out["peers"][peer] = {"model": peer_model, "ms": ms, "median_ms": statistics.median(ms) if ms else None,
                              "head_over_peer": iv, "pairs": len(p), "target": target, "verdict": verdict(iv, target)}
    return out


#: the options that must match for a run's rounds to be added to an earlier result's (--append)
SAME_OPTIONS = ("nodes", "features", "threads", "repeats", "warmup", "models", "peers", "peer_model")


def earlier(path: Path, base_sha: str, head: Dict[str, Any], opts) -> Dict[str, Any]:
    """The result at ``path`` that --append adds to; CommitABError unless it measured the same
    base, the same head (commit and working-tree difference) with the same options."""
    if not path.exists():
        raise CommitABError(f"--append: no earlier result at {path}")
    p = json.loads(path.read_text())
    o = p.get("options", {})
    diff = [f"{k} {o.get(k)!r} there, {getattr(opts, k)!r} now" for k in SAME_OPTIONS if o.get(k) != getattr(opts, k)]
    if p.get("base", {}).get("sha") != base_sha:
        diff.append(f"base {p.get('base', {}).get('short')} there")
    if (p.get("head", {}).get("sha"), p.get("head", {}).get("diff_digest")) != (head["sha"], head["diff_digest"]):
        diff.append(f"head {p.get('head', {}).get('short')} (working-tree digest "
                    f"{p.get('head', {}).get('diff_digest')!r}) there, {head['short']} ({head['diff_digest']!r}) now")
    if diff:
        raise CommitABError(f"--append: {path} measured something else: {'; '.join(diff)}")
    return p


# ----------------------------------------------------------------------------- report
def _iv_text(iv: Optional[Dict[str, Any]]) -> str:
    if not iv:
        return "n/a"
    span = f" [{iv['low']:.2f}, {iv['high']:.2f}]" if iv.get("low") is not None else " (one pair)"
    return f"{iv['ratio']:.2f}x{span}"


def _ms(v: Optional[float]) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def _loss_cells(m: dict) -> tuple:
    """(first losses 'base / head', their relative spread) of one model's summary, as table cells."""
    fl = m["first_loss"]
    loss = (f"{statistics.median(fl['base']):.6f} / {statistics.median(fl['head']):.6f}"
            if fl["base"] and fl["head"] else "n/a")
    spread = "n/a" if m["loss_rel_spread"] is None else f"{m['loss_rel_spread']:.1e}"
    return loss, spread


def _subject(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[:width].rsplit(" ", 1)[0] + " ..."


def markdown(p: Dict[str, Any]) -> str:
    s, base, head = p["summary"], p["base"], p["head"]
    o = p["options"]
    lines = [f"# Training step: {head['short']} (this checkout) against {base['short']}", "",
             f"CPU: {p['cpu']}; {o['threads']} threads; torch {p['machine']['torch']}. Graph: power-law, "
             f"{o['nodes']} nodes, {10 * o['nodes']} edges, F = {o['features']}, hidden 128, 2 layers, 16 classes; "
             f"one step = forward, cross-entropy, backward, Adam. {o['rounds']} rounds, each child the median of "
             f"{o['repeats']} steps after {o['warmup']} warm-up steps and the speed guard's decision.", "",
             f"- base: `{base['short']}` {_subject(base['subject'])} ({base['date'][:10]})",
             f"- head: `{head['short']}` {_subject(head['subject'])} ({head['date'][:10]})"
             + (f", **working tree edited** ({len(head['dirty'])} files)" if head["dirty"] else ""), "",
             "| model | base ms | head ms | speed-up base / head [95% interval] | pairs | target | verdict | "
             "first loss base / head | loss spread |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model, m in s["models"].items():
        loss, spread = _loss_cells(m)
        if m["loss_rel_spread"] is not None and not m["losses_agree"]:
            spread += " **disagree**"
        lines.append(f"| {model} | {_ms(m['base_median_ms'])} | {_ms(m['head_median_ms'])} | {_iv_text(m['speedup'])} | "
                     f"{m['pairs']} | {m['target']:g}x | {m['verdict']} | {loss} | {spread} |")
    if s["peers"]:
        model = next(iter(s["peers"].values()))["model"]
        hm = s["models"].get(model, {}).get("head_median_ms")
        lines += ["", f"## {model}: the head's compiled step against PyG's own paths (same rounds)", "",
                  "| peer | peer ms | head ms | peer / head [95% interval] | pairs | target | verdict |",
                  "|---|---|---|---|---|---|---|"]
        for peer, q in s["peers"].items():
            tgt = "" if q["target"] is None else f"{q['target']:g}x"
            lines.append(f"| {peer} | {_ms(q['median_ms'])} | {_ms(hm)} | {_iv_text(q['head_over_peer'])} | "
                         f"{q['pairs']} | {tgt} | {q['verdict']} |")
    lines += ["", f"Medians over the rounds of each child's median step time. Speed-ups: geometric mean of the "
              f"rounds' paired ratios, 95% Student's t interval; a verdict is met when the interval's low end "
              f"reaches the target. First losses: every child's first-step loss (same parameters, before any "
              f"optimizer step); they agree when their spread is within {o['loss_rtol']:g} of their median. "
              f"Graph digests: {'all equal' if len(s['graphs']) == 1 else s['graphs']}."]
    if not s["agree"]:
        lines += ["", "**The sides disagree (first losses or graphs): the timings do not compare the same "
                  "computation.**"]
    if s["errors"]:
        lines += ["", "Errors:"] + [f"- {e}" for e in s["errors"]]
    build = p.get("base_build") or {}
    lines.append("")
    if build.get("commands"):
        lines.append(f"- Base tree {p['base_tree']}, its native module built in {build.get('seconds', 0):.0f} s: "
                     + "; ".join(f"`{c}`" for c in build["commands"]) + ".")
    for i, x in enumerate(p.get("sessions") or [p]):
        others = (x.get("load") or {}).get("others_cores")
        lines.append(f"- Run {i + 1} (rounds {', '.join(map(str, x['rounds']))}): `{x['command']}`, "
                     f"{x['wall_s'] / 60:.1f} min; {_common.load_text(x['loadavg_before_after']).lower()}"
                     + ("" if others is None else f"; other processes' CPU use {others:.2f} cores") + ".")
    return "\n".join(lines) + "\n"


def plot(p: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = p["summary"]
    bars = [(m, v["speedup"], v["target"]) for m, v in s["models"].items()]
    bars += [(f"{q['model']} vs {peer}", q["head_over_peer"], q["target"]) for peer, q in s["peers"].items()]
    bars = [b for b in bars if b[1]]
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(bars)), 4))
    xs = range(len(bars))
    ys = [b[1]["ratio"] for b in bars]
    err = [[y - (b[1]["low"] if b[1].get("low") is not None else y) for y, b in zip(ys, bars)],
           [(b[1]["high"] if b[1].get("high") is not None else y) - y for y, b in zip(ys, bars)]]
    ax.bar(xs, ys, yerr=err, capsize=4, color=["tab:blue"] * len(s["models"]) + ["tab:green"] * len(s["peers"]))
    for x, b in zip(xs, bars):
        if b[2]:
            ax.plot([x - 0.4, x + 0.4], [b[2], b[2]], "r--", lw=1)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([b[0] for b in bars], fontsize=8)
    ax.set_ylabel("speed-up of the head (95% interval); red: target")
    ax.axhline(1, color="k", lw=0.5)
    ax.set_title(f"{p['head']['short']} vs {p['base']['short']}, {p['options']['nodes']} nodes, "
                 f"F {p['options']['features']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ----------------------------------------------------------------------------- main
def _targets(text: str) -> Dict[str, float]:
    out = {}
    for item in filter(None, text.split(",")):
        k, sep, v = item.partition("=")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            sep = ""
        if not sep:
            raise argparse.ArgumentTypeError(f"{item!r}: expected PEER=RATIO, e.g. eager=6")
    return out


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return v


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks commit_ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=DEFAULT_BASE,
                    help=f"the revision to compare with (default {DEFAULT_BASE}: the commit before issue 26's work)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of GCN, GraphSAGE, GIN (default all); also GAT, GATv2, TransformerE")
    ap.add_argument("--nodes", type=_positive, default=100_000, help="graph nodes (edges: 10x)")
    ap.add_argument("--features", type=_positive, default=128)
    ap.add_argument("--rounds", type=_positive, default=3)
    ap.add_argument("--repeats", type=_positive, default=7, help="timed steps per child")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=_positive, default=2)
    ap.add_argument("--target", type=float, default=1.3, help="the base / head speed-up to reach (default 1.3)")
    ap.add_argument("--peers", default="eager,csr", help="comma list of models-benchmark variants timed "
                    "against the head for --peer-model ('' for none)")
    ap.add_argument("--peer-model", default="GCN")
    ap.add_argument("--peer-targets", type=_targets, default=_targets("eager=6,csr=2.5"))
    ap.add_argument("--loss-rtol", type=float, default=1e-4)
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--jobs", type=_positive, default=None, help="parallel compile jobs of the base build")
    ap.add_argument("--rebuild", action="store_true", help="build the base's native module again")
    ap.add_argument("--prepare-only", action="store_true", help="check out and build the base, then stop")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--append", action="store_true",
                    help="add this run's rounds to the earlier result of the same name (same base, head and "
                         "options; refused otherwise): several shorter runs make one result")
    ap.add_argument("--name", default="commit_ab")
    ap.add_argument("--results-dir", type=Path, default=_common.RESULTS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", default="", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--variant", default="gnncompile", help=argparse.SUPPRESS)
    return ap


def main(argv: Optional[List[str]] = None,
         measure: Optional[Callable[[str, str, int], Dict[str, Any]]] = None) -> int:
    """The command line. ``measure`` replaces the child runs (tests)."""
    ap = parser()
    opts = ap.parse_args(argv)
    if opts.child:
        print("RESULT " + json.dumps(child(opts)), flush=True)
        return 0
    models = [m for m in opts.models.split(",") if m]
    bad = [m for m in models if m not in MODELS + EXTRA_MODELS]
    if bad or not models:
        ap.error(f"--models: {', '.join(bad) or 'none given'}; choose from {', '.join(MODELS + EXTRA_MODELS)}")
    peers = [v for v in opts.peers.split(",") if v]
    if [v for v in peers if v not in ("eager", "csr", "inductor")]:
        ap.error(f"--peers: {opts.peers!r}; choose from eager, csr, inductor")
    if peers and opts.peer_model not in models:
        ap.error(f"--peer-model {opts.peer_model} is not among --models")
    t0 = time.perf_counter()
    try:
        head = head_info()
        if measure is None:
            prep = prepare(opts.base, opts.cache_dir, opts.jobs, opts.rebuild)
        else:  # a stand-in for the children: no checkout, no build
            prep = {"commit": describe(resolve(opts.base)), "tree": None, "build": {}}
        before = earlier(opts.results_dir / f"{opts.name}.json", prep["commit"]["sha"], head, opts) \
            if opts.append else {}
    except CommitABError as e:
        print(f"python -m benchmarks commit_ab: {e}", file=sys.stderr)
        return 2
    print(f"base {prep['commit']['short']} ({prep['tree']}), head {head['short']}"
          + (" + edits" if head["dirty"] else ""), flush=True)
    if opts.prepare_only:
        return 0
    if measure is None:
        tree = Path(prep["tree"])

        def measure(side, model, r):
            if side == "base":
                return _run_child(tree, model, "gnncompile", opts)
            return _run_child(None, model, "gnncompile" if side == "head" else side, opts)

    from gnncompile.tuner import noise

    runs = list(before.get("runs", []))
    start = max((r["round"] for r in runs), default=-1) + 1
    load0 = _common.loadavg()
    with noise.LoadProbe() as probe:
        runs += run_rounds(models, opts.rounds, measure, peers, opts.peer_model, start=start)
    summary = summarise(runs, models, opts.target, opts.loss_rtol, peers, opts.peer_model, opts.peer_targets)
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()
               if k not in ("child", "tree", "model", "variant")}
    session = {"command": _common.command("commit_ab", argv), "rounds": list(range(start, start + opts.rounds)),
               "load": probe.report, "loadavg_before_after": [load0, _common.loadavg()],
               "wall_s": time.perf_counter() - t0}
    sessions = before.get("sessions", []) + [session]
    cpu = _common.cpu_model()
    if before and before.get("cpu") != cpu:
        print(f"python -m benchmarks commit_ab: --append: the earlier rounds ran on {before.get('cpu')}, "
              f"these on {cpu}", file=sys.stderr)
        return 2
    payload = {**session, "cpu": cpu, "machine": _common.machine(), "base": prep["commit"], "head": head,
               "base_tree": prep["tree"], "base_build": before.get("base_build") or prep["build"],
               "options": dict(options, rounds=len({r["round"] for r in runs})), "runs": runs, "summary": summary,
               "sessions": sessions}
    _common.write_results(opts.results_dir, opts.name, payload, markdown, plot)
    return 0 if summary["agree"] and not summary["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
