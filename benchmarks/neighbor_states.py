"""Why fresh processes of the neighbor workload run in a fast or a slow state.

    python -m benchmarks neighbor_states --procs 6 --timeline 80 --out neighbor_states_zen4_s60

Starts ``--procs`` fresh processes per variant (the variants interleaved: process 1 of every
variant, then process 2, ..., the order reversed every other time), each training the tuner's
``neighbor`` workload (GraphSAGE, NeighborLoader batches of ``--batch-size`` seeds, the tuner's
default settings, measured as ``profile_ab`` measures: :func:`gnncompile.tuner.workloads.measure`,
``--warmup`` then ``--steps`` steps). Each process reports its seeds/s and what could set a
process's speed for its whole life: its CPU time and minor faults per step after the first chunk,
every thread's CPU time and context switches (and the CPU it ran on last), the huge pages backing
it (``AnonHugePages``), and the largest live CPU tensors (the graph, the features, the sampler's
CSC) with their address modulo 4 KiB and 2 MiB and the share of their pages backed by a
transparent huge page (/proc/self/pagemap and /proc/kpageflags: root only). Before and after
each process the parent reads the core-latency probe (:func:`benchmarks._common.core_latency_ns`:
the cache-line round trip between the first two CPUs), which says where a virtual machine's host
has placed its vCPUs.

``--timeline N``: then one process, N chunks of ``--chunk-steps`` steps (every fourth chunk at 1
thread), each step cut into its phases (the loader's ``next()``, forward, loss, backward, Adam:
:mod:`benchmarks.neighbor_step`), the probe after each chunk; the chunks are classed near / far
by the probe and the phases given per class.

``--variants JSON``: a list of objects ``{"name": ..., "env": {...}, "settings": {...}}``
(environment variables of the child, changes to the default settings); the default is the
defaults alone.

Writes benchmarks/results/neighbor_states.{json,md} (``--out`` for another stem).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import time
from typing import Any, Dict, List, Optional, Sequence

from . import _common

PHASES = ("load", "forward", "loss", "backward", "optimizer", "step")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _task_stats(pid: str = "self") -> Dict[str, Dict[str, Any]]:
    out = {}
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{base}/{tid}/stat") as f:
                s = f.read()
            with open(f"{base}/{tid}/status") as f:
                st = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        rest = s[s.rindex(")") + 2:].split()
        vol = int(next(l.split()[1] for l in st.splitlines() if l.startswith("voluntary_ctxt")))
        nonvol = int(next(l.split()[1] for l in st.splitlines() if l.startswith("nonvoluntary_ctxt")))
        out[tid] = {"comm": comm, "utime": int(rest[11]) / TICK, "stime": int(rest[12]) / TICK,
                    "cpu": int(rest[36]), "vol": vol, "nonvol": nonvol}
    return out


def _smaps_rollup() -> Dict[str, int]:
    out = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                p = line.split()
                if p[0] in ("Rss:", "AnonHugePages:", "Anonymous:"):
                    out[p[0][:-1]] = int(p[1])
    except OSError:
        pass
    return out


def _thp_share(ptr: int, nbytes: int) -> Dict[str, Any]:
    """Of the 4 KiB pages of [ptr, ptr + nbytes): the share resident, and the share backed by
    a transparent huge page (/proc/self/pagemap and /proc/kpageflags: root only; {} otherwise)."""
    import struct

    page = 4096
    first, last = ptr // page, (ptr + nbytes - 1) // page
    try:
        with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
            pm.seek(first * 8)
            raw = pm.read((last - first + 1) * 8)
            present = thp = 0
            for (e,) in struct.iter_unpack("<Q", raw):
                if e >> 63 & 1:
                    present += 1
                    pfn = e & ((1 << 55) - 1)
                    if pfn == 0:
                        continue
                    kf.seek(pfn * 8)
                    (flags,) = struct.unpack("<Q", kf.read(8))
                    thp += flags >> 22 & 1
    except OSError:
        return {}
    n = last - first + 1
    return {"pages": n, "present": present / n, "thp": thp / n}


def _big_tensors(min_bytes: int = 512 << 10) -> List[Dict[str, Any]]:
    """Every live CPU tensor storage of at least ``min_bytes`` (the graph, the features, the
    sampler's CSC): its size, address modulo 4 KiB and 2 MiB and its huge-page share."""
    import gc

    import torch

    seen, out = set(), []
    for o in gc.get_objects():
        try:
            if not isinstance(o, torch.Tensor) or o.device.type != "cpu" or o.is_sparse:
                continue
            st = o.untyped_storage()
            ptr, nb = st.data_ptr(), st.nbytes()
        except Exception:
            continue
        if nb < min_bytes or ptr in seen:
            continue
        seen.add(ptr)
        out.append({"shape": list(o.shape), "dtype": str(o.dtype).replace("torch.", ""), "bytes": nb,
                    "mod4k": ptr % 4096, "mod2m": ptr % (2 << 20), **_thp_share(ptr, nb)})
    out.sort(key=lambda t: -t["bytes"])
    return out


def child(args) -> Dict[str, Any]:
    import torch

    from gnncompile.tuner import workloads as W

    spec = json.loads(open(args.spec).read())
    w = W.workload_from_dict(spec["workload"])
    settings = spec["settings"]
    W.prepare(w)
    snaps = []

    def report(chunk, rate):
        snaps.append({"t": time.perf_counter(), "cpu": time.process_time(), "tasks": _task_stats(),
                      "rate": rate, "ru": resource.getrusage(resource.RUSAGE_SELF)})

    t0 = time.perf_counter()
    rate, peak = W.measure(w, settings, report=report)
    total = time.perf_counter() - t0
    bufs = _big_tensors()
    smaps = _smaps_rollup()
    a, b = snaps[0], snaps[-1]
    steps_after_first = w.steps - math.ceil(w.steps / max(w.chunks, 1))
    threads = []
    for tid, x in b["tasks"].items():
        y = a["tasks"].get(tid, {"utime": 0, "stime": 0, "vol": 0, "nonvol": 0})
        threads.append({"comm": x["comm"], "cpu_s": x["utime"] + x["stime"] - y["utime"] - y["stime"],
                        "last_cpu": x["cpu"], "vol": x["vol"] - y["vol"], "nonvol": x["nonvol"] - y["nonvol"],
                        "main": tid == str(os.getpid())})
    threads.sort(key=lambda t: -t["cpu_s"])
    # chunk rates (each chunk's own, from the cumulative ones)
    per_chunk = math.ceil(w.steps / max(w.chunks, 1))
    return {
        "seeds_per_s": rate, "measure_s": total,
        "chunk_rates": [s["rate"] for s in snaps],
        "late_seeds_per_s": None if b is a else (len(snaps) - 1) * per_chunk * settings["batch_size"] / (b["t"] - a["t"]),
        "cpu_ms_per_step": (b["cpu"] - a["cpu"]) * 1e3 / max(steps_after_first, 1),
        "wall_ms_per_step": (b["t"] - a["t"]) * 1e3 / max(steps_after_first, 1),
        "minflt_per_step": (b["ru"].ru_minflt - a["ru"].ru_minflt) / max(steps_after_first, 1),
        "threads": threads, "smaps": smaps, "tensors": bufs, "steps_timed": steps_after_first,
    }


def _spec(args, variant: Dict[str, Any], folder: str) -> str:
    """The child's spec file: the tuner's neighbor workload and its default settings at
    ``--batch-size``, with the variant's ``settings`` changes."""
    from dataclasses import asdict

    from gnncompile.hardware import device
    from gnncompile.tuner import workloads as W

    w = W.Workload(kind="neighbor", model="sage", hidden=args.hidden, layers=len(args.fanout),
                   num_features=args.num_features, num_nodes=args.num_nodes, num_edges=args.num_edges,
                   fanout=list(args.fanout), seed=0, steps=args.steps, warmup=args.warmup,
                   allow_bf16=True)
    s = W.default_settings(w, device.detect(), batch_size=args.batch_size)
    s.update(variant.get("settings") or {})
    path = os.path.join(folder, variant["name"] + ".json")
    with open(path, "w") as f:
        json.dump({"workload": asdict(w), "settings": s}, f)
    return path


def _spawn(args, variant: Dict[str, Any], spec: str) -> Dict[str, Any]:
    cmd = _common.module_command("neighbor_states") + ["--child", "--spec", spec]
    env = _common.timing_env()
    env.update({k: str(v) for k, v in (variant.get("env") or {}).items()})
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.child_timeout,
                       cwd=str(_common.ROOT))
    if p.returncode != 0:
        raise RuntimeError(f"child failed ({p.returncode}): {p.stderr[-2000:]}")
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1]
    r = json.loads(line)
    r["process_s"] = time.perf_counter() - t0
    return r


def _thp_text(r: Dict[str, Any], top: int = 3) -> str:
    return ", ".join(f"{'x'.join(map(str, t['shape']))} {t['dtype']} {t['bytes'] >> 10} KiB "
                     f"thp {t.get('thp', float('nan')):.2f}" for t in r["tensors"][:top])


def _timeline(args) -> Dict[str, Any]:
    """One process, ``--timeline`` chunks of ``--chunk-steps`` steps (every fourth at 1 thread),
    each step cut into its phases (:class:`benchmarks.neighbor_step._Trainer`), the core-latency
    probe after each chunk (at 1 thread, after a pause, so the idle OpenMP thread has stopped
    spinning)."""
    import torch

    from .neighbor_step import _Trainer, _workload

    w = _workload(args)
    threads = torch.get_num_threads()
    tr = _Trainer(w, args.batch_size)
    chunks = []
    t0 = time.perf_counter()
    try:
        for _ in range(max(args.warmup, 2)):
            tr.step()
        for c in range(args.timeline):
            th = 1 if c % 4 == 3 else threads
            torch.set_num_threads(th)
            rows = [tr.step() for _ in range(args.chunk_steps)]
            torch.set_num_threads(1)
            time.sleep(0.02)
            probe = _common.core_latency_ns()
            torch.set_num_threads(threads)
            seconds = sum(r["step"] for r in rows)
            chunks.append({"chunk": c, "at_s": round(time.perf_counter() - t0, 2), "threads": th,
                           "seeds_per_s": sum(r["seeds"] for r in rows) / seconds, "core_latency_ns": probe,
                           **{p: statistics.median(r[p] for r in rows) * 1e3 for p in PHASES}})
            print(f"chunk {c} ({th} threads): {chunks[-1]['seeds_per_s']:.4g} seeds/s, core latency {probe} ns",
                  flush=True)
    finally:
        tr.close()
        torch.set_num_threads(threads)
    probes = sorted(c["core_latency_ns"] for c in chunks if c["core_latency_ns"])
    split = None
    if len(probes) >= 4:
        lo, hi = probes[len(probes) // 10], probes[-1 - len(probes) // 10]
        split = (lo * hi) ** 0.5
    classes = {}
    for c in chunks:
        if split is None or c["core_latency_ns"] is None:
            continue
        key = f"{'far' if c['core_latency_ns'] > split else 'near'}, {c['threads']} thread(s)"
        classes.setdefault(key, []).append(c)
    summary = {k: {"chunks": len(v), "seeds_per_s": statistics.median(c["seeds_per_s"] for c in v),
                   "core_latency_ns": statistics.median(c["core_latency_ns"] for c in v),
                   **{p: statistics.median(c[p] for c in v) for p in PHASES}} for k, v in sorted(classes.items())}
    return {"chunks": chunks, "split_ns": split, "summary": summary, "threads": threads,
            "chunk_steps": args.chunk_steps}


def run(args) -> Dict[str, Any]:
    import tempfile

    variants = json.loads(args.variants) if args.variants else [{"name": "defaults"}]
    if not isinstance(variants, list) or not all(isinstance(v, dict) and "name" in v for v in variants):
        raise ValueError("--variants must be a JSON list of objects with a name")
    runs: Dict[str, List[Dict[str, Any]]] = {v["name"]: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="gnncompile-states-") as tmp:
        specs = {v["name"]: _spec(args, v, tmp) for v in variants}
        for i in range(args.procs):
            order = variants if i % 2 == 0 else variants[::-1]
            for v in order:
                before = _common.core_latency_ns()
                r = _spawn(args, v, specs[v["name"]])
                r["index"] = i
                r["core_latency_ns"] = [before, _common.core_latency_ns()]
                runs[v["name"]].append(r)
                print(f"{v['name']:>12} #{i}: {r['seeds_per_s']:.4g} seeds/s (later chunks {r['late_seeds_per_s']:.4g}), "
                      f"cpu {r['cpu_ms_per_step']:.2f} ms, wall {r['wall_ms_per_step']:.2f} ms, "
                      f"huge pages {r['smaps'].get('AnonHugePages')} KiB; core latency {r['core_latency_ns']} ns; "
                      f"{_thp_text(r)}", flush=True)
    timeline = _timeline(args) if args.timeline else None
    return {"variants": variants, "runs": runs, "procs": args.procs, "steps": args.steps, "timeline": timeline,
            "batch_size": args.batch_size, "workload": {
                "num_nodes": args.num_nodes, "num_edges": args.num_edges, "fanout": args.fanout,
                "hidden": args.hidden, "num_features": args.num_features}}


def markdown(r: Dict[str, Any]) -> str:
    lines = ["# The neighbor workload's fresh processes: fast and slow states", "",
             f"Machine: {r['cpu']}, torch {r['machine']['torch']}. {_common.load_text(r['loadavg_before_after'])}.",
             "", f"Command: `{r['command']}`", "",
             f"Each row one fresh process ({r['steps']} steps, batch {r['batch_size']} seeds, measured as "
             "`profile_ab` measures). seeds/s: the whole run; CPU and wall ms: per step after the first "
             "chunk; threads: CPU ms per step of the busiest threads (last CPU); huge pages: the "
             "process's AnonHugePages; tensors: the largest live CPU tensors and the share of their "
             "4 KiB pages backed by a transparent huge page.", "",
             "| variant | # | seeds/s | wall ms | CPU ms | minor faults | threads | huge pages (KiB) | tensors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, rows in r["runs"].items():
        for x in rows:
            th = ", ".join(f"{'main' if t['main'] else t['comm']}@{t['last_cpu']} "
                           f"{t['cpu_s'] * 1e3 / max(x['steps_timed'], 1):.1f}" for t in x["threads"][:3])
            lines.append(f"| {name} | {x['index']} | {x['seeds_per_s']:.4g} | {x['wall_ms_per_step']:.2f} | "
                         f"{x['cpu_ms_per_step']:.2f} | {x['minflt_per_step']:.1f} | {th} | "
                         f"{x['smaps'].get('AnonHugePages')} | {_thp_text(x, 4)} |")
    lines += ["", "| variant | processes | median seeds/s | lowest | highest |", "|---|---|---|---|---|"]
    for name, rows in r["runs"].items():
        s = [x["seeds_per_s"] for x in rows]
        lines.append(f"| {name} | {len(s)} | {statistics.median(s):.4g} | {min(s):.4g} | {max(s):.4g} |")
    lines += ["", "Core latency (the cache-line round trip between the first two CPUs, "
              "`benchmarks/native/core_latency.cpp`, ns) before and after each process:", ""]
    for name, rows in r["runs"].items():
        lines.append(f"- {name}: " + "; ".join(
            f"#{x['index']} {x['seeds_per_s']:.3g} seeds/s at {'/'.join('-' if v is None else f'{v:.0f}' for v in x['core_latency_ns'])}"
            for x in rows))
    t = r.get("timeline")
    if t:
        lines += ["", f"## One process over time ({len(t['chunks'])} chunks of {t['chunk_steps']} steps, "
                  f"every fourth at 1 thread, the others at {t['threads']})", "",
                  "The core-latency probe after each chunk; a chunk is 'far' when its probe reads over "
                  f"{t['split_ns'] and round(t['split_ns'])} ns (the geometric mean of the probes' 10th and "
                  "90th percentiles). Medians over the chunks of each class; phases in ms (medians of the steps):", "",
                  "| class | chunks | core latency (ns) | seeds/s | load | forward | loss | backward | Adam | step |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for k, v in t["summary"].items():
            lines.append(f"| {k} | {v['chunks']} | {v['core_latency_ns']:.0f} | {v['seeds_per_s']:.4g} | "
                         + " | ".join(f"{v[p]:.3f}" for p in PHASES) + " |")
        lines += ["", "| chunk | at (s) | threads | seeds/s | core latency (ns) | load | forward | backward | step |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in t["chunks"]:
            lat = "-" if c["core_latency_ns"] is None else f"{c['core_latency_ns']:.0f}"
            lines.append(f"| {c['chunk']} | {c['at_s']} | {c['threads']} | {c['seeds_per_s']:.4g} | {lat} | "
                         f"{c['load']:.3f} | {c['forward']:.3f} | {c['backward']:.3f} | {c['step']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks neighbor_states", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_neighbor_workload(ap)
    ap.add_argument("--procs", type=int, default=8, help="fresh processes per variant")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--variants", default=None, help="JSON list of {name, env, settings}")
    ap.add_argument("--timeline", type=int, default=0,
                    help="also: one process, this many chunks, phases and the core-latency probe per chunk")
    ap.add_argument("--chunk-steps", type=int, default=100, help="steps per --timeline chunk")
    ap.add_argument("--child-timeout", type=float, default=300.0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="neighbor_states", help="stem of the result files")
    ap.add_argument("--folder", default=str(_common.RESULTS))
    args = ap.parse_args(argv)
    if args.procs < 0 or args.steps < 1 or args.timeline < 0 or args.chunk_steps < 1:
        ap.error("--procs and --timeline must be >= 0, --steps and --chunk-steps >= 1")
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    before = _common.loadavg()
    r = run(args)
    _common.record_and_write(args.folder, "neighbor_states", args.out, argv, r, markdown, before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
