"""Where one neighbor-sampling training step's time goes (the tuner's neighbor workload).

    python -m benchmarks neighbor_step --chunks 24 --steps 50 --out neighbor_step_zen4_s55

The tuner's ``neighbor`` workload (:mod:`gnncompile.tuner.workloads`: GraphSAGE on a generated
power-law graph, :class:`gnncompile.data.NeighborLoader` batches of ``--batch-size`` seeds, the
compiled model with the defaults the tuner compares profiles with), trained in one process in
chunks of ``--steps`` steps; the chunks alternate torch's thread count over ``--threads`` (the
first count first, then the next, ...), so each count sees the same machine. Each step is cut
by wall-clock timers into: the loader's ``next()`` (sampling, the feature and label gather,
PyG's batch assembly), the compiled forward (the batch's structures included), the loss, the
backward and Adam's step. Per chunk: its seeds/s and the phases' medians; per thread count: the
median over its chunks and the spread (lowest and highest chunk), which shows a machine whose
speed changes during the run. Then one ``torch.profiler`` pass of ``--profile-steps`` steps at
the first thread count: the ops' own CPU time per step, largest first.

``--arms JSON``: a list of setting changes (e.g. ``'[{"inner": "inductor"}, {"num_workers": 1,
"pool_size": 2, "threads": 1}]'``) measured against the defaults in this process with
:func:`gnncompile.tuner.workloads.interleaved` (``--arm-rounds`` rounds of ``--arm-steps`` steps,
the order reversed every other round): each arm's median seeds/s and its ratio to the defaults
with the 95% interval of the paired rounds (:func:`gnncompile.tuner.noise.ratio_interval`).

Writes benchmarks/results/neighbor_step.{json,md} (``--out`` for another stem).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Dict, List, Optional, Sequence

import torch

from . import _common

PHASES = ("load", "forward", "loss", "backward", "optimizer", "step")


def _workload(args):
    from gnncompile.tuner import workloads as W

    return W.Workload(kind="neighbor", model="sage", hidden=args.hidden, layers=len(args.fanout),
                      num_features=args.num_features, num_nodes=args.num_nodes,
                      num_edges=args.num_edges, fanout=list(args.fanout), seed=0)


class _Trainer:
    """The workload's model (compiled with the tuner's default settings), Adam and an endless
    stream of loader batches; :meth:`step` trains one batch and returns its phases' seconds."""

    def __init__(self, w, batch_size: int) -> None:
        from gnncompile.tuner import workloads as W

        self.settings = W.default_settings(w, batch_size=batch_size)
        dev = torch.device("cpu")
        torch.manual_seed(w.seed)
        self.model = W.build_model(w)
        self.fwd = W._compile_with(self.model, self.settings, dev)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.loader = W._neighbor_loader(w, self.settings, dev)
        self.it = self._batches()

    def _batches(self):
        while True:
            yield from self.loader

    def step(self) -> Dict[str, float]:
        t0 = time.perf_counter()
        b = next(self.it)
        t1 = time.perf_counter()
        k = int(b.batch_size)
        self.opt.zero_grad(set_to_none=True)
        out = self.fwd(b.x, b.edge_index)
        t2 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(out[:k], b.y[:k])
        t3 = time.perf_counter()
        loss.backward()
        t4 = time.perf_counter()
        self.opt.step()
        t5 = time.perf_counter()
        return {"load": t1 - t0, "forward": t2 - t1, "loss": t3 - t2, "backward": t4 - t3,
                "optimizer": t5 - t4, "step": t5 - t0, "seeds": k}

    def close(self) -> None:
        from gnncompile.tuner import workloads as W

        W._close(self.it, self.loader)


def _chunk(tr: _Trainer, steps: int) -> Dict[str, Any]:
    rows = [tr.step() for _ in range(steps)]
    seconds = sum(r["step"] for r in rows)
    out = {p: statistics.median(r[p] for r in rows) * 1e3 for p in PHASES}  # ms
    out["seeds_per_s"] = sum(r["seeds"] for r in rows) / seconds
    out["total_ms"] = {p: sum(r[p] for r in rows) * 1e3 for p in PHASES}  # the phases partition the step
    return out


def _profile(tr: _Trainer, steps: int, top: int) -> List[Dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(steps):
            tr.step()
    ev = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)
    return [{"op": e.key, "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
             "calls_per_step": e.count / steps} for e in ev[:top]]


def run(args) -> Dict[str, Any]:
    from gnncompile.tuner.noise import LoadProbe

    w = _workload(args)
    old = torch.get_num_threads()
    tr = _Trainer(w, args.batch_size)
    try:
        torch.set_num_threads(args.threads[0])
        for _ in range(max(args.warmup, 2)):  # the compile of the first two batch sizes
            tr.step()
        chunks: List[Dict[str, Any]] = []
        probe = LoadProbe().start()
        t0 = time.perf_counter()
        for c in range(args.chunks):
            th = args.threads[c % len(args.threads)]
            torch.set_num_threads(th)
            row = _chunk(tr, args.steps)
            row.update(chunk=c, threads=th, at_s=round(time.perf_counter() - t0, 2))
            chunks.append(row)
        noise = probe.stop()
        torch.set_num_threads(args.threads[0])
        ops = _profile(tr, args.profile_steps, args.top) if args.profile_steps > 0 else []
        batch = next(tr.it)
        sizes = {"nodes": int(batch.num_nodes), "edges": int(batch.edge_index.size(1))}
    finally:
        tr.close()
        torch.set_num_threads(old)
    arms = _arms(w, args) if args.arms else []
    per_threads = {}
    for th in args.threads:
        mine = [c for c in chunks if c["threads"] == th]
        rates = [c["seeds_per_s"] for c in mine]
        per_threads[str(th)] = {
            "seeds_per_s": statistics.median(rates), "lowest": min(rates), "highest": max(rates),
            "chunks": len(mine), **{p: statistics.median(c[p] for c in mine) for p in PHASES}}
    return {"workload": w.signature_dict(), "batch_size": args.batch_size, "threads": list(args.threads),
            "steps_per_chunk": args.steps, "chunks": chunks, "per_threads": per_threads,
            "profile": ops, "profile_threads": args.threads[0], "profile_steps": args.profile_steps,
            "batch_sizes_example": sizes, "noise": noise, "arms": arms}


def _arms(w, args) -> List[Dict[str, Any]]:
    import json

    from gnncompile.tuner import noise, workloads as W

    changes = json.loads(args.arms)
    if not isinstance(changes, list) or not all(isinstance(c, dict) for c in changes):
        raise ValueError("--arms must be a JSON list of objects (setting changes)")
    base = W.default_settings(w, batch_size=args.batch_size)
    w2 = W.Workload(**{**w.__dict__, "warmup": max(args.warmup, 2)})
    runs = W.interleaved(w2, [dict(base)] + [dict(base, **c) for c in changes], args.arm_rounds, args.arm_steps)
    out = [{"changes": {}, "median": statistics.median(runs[0]), "runs": runs[0]}]
    for c, r in zip(changes, runs[1:]):
        out.append({"changes": c, "median": statistics.median(r), "runs": r,
                    "ratio": noise.ratio_interval(r, runs[0])})
    return out


def markdown(r: Dict[str, Any]) -> str:
    w = r["workload"]
    lines = [
        "# One neighbor training step taken apart",
        "",
        f"Machine: {r['cpu']}, torch {r['machine']['torch']}. {_common.load_text(r['loadavg_before_after'])}; "
        f"other processes' CPU use over the chunks {r['noise'].get('others_cores')} cores.",
        "",
        f"Command: `{r['command']}`",
        "",
        f"Workload: SAGE, {w['num_nodes']} nodes / {w['num_edges']} edges, fanout {w['fanout']}, "
        f"batch {r['batch_size']} seeds (a batch: about {r['batch_sizes_example']['nodes']} nodes, "
        f"{r['batch_sizes_example']['edges']} edges), the tuner's default settings (no loader worker, "
        f"the compiled model). {len(r['chunks'])} chunks of {r['steps_per_chunk']} steps in one process, "
        f"the thread count alternating {r['threads']}. Phases: medians of the steps (ms).",
        "",
        "| threads | seeds/s (median chunk) | lowest chunk | highest chunk | load | forward | loss | backward | Adam | step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for th, p in r["per_threads"].items():
        lines.append(f"| {th} | {p['seeds_per_s']:.4g} | {p['lowest']:.4g} | {p['highest']:.4g} | "
                     + " | ".join(f"{p[k]:.3f}" for k in PHASES) + " |")
    lines += ["", "Chunks in order:", "", "| chunk | at (s) | threads | seeds/s | load | forward | backward | step |",
              "|---|---|---|---|---|---|---|---|"]
    for c in r["chunks"]:
        lines.append(f"| {c['chunk']} | {c['at_s']} | {c['threads']} | {c['seeds_per_s']:.4g} | {c['load']:.3f} | "
                     f"{c['forward']:.3f} | {c['backward']:.3f} | {c['step']:.3f} |")
    if r["profile"]:
        lines += ["", f"torch.profiler, {r['profile_steps']} steps at {r['profile_threads']} thread(s): "
                  "each op's own CPU time per step (the profiler's overhead included)", "",
                  "| op | ms / step | calls / step |", "|---|---|---|"]
        for o in r["profile"]:
            lines.append(f"| {o['op'][:70]} | {o['self_ms_per_step']:.3f} | {o['calls_per_step']:.1f} |")
    if r.get("arms"):
        lines += ["", "Settings against the defaults, interleaved in one process (`--arms`): each arm's median "
                  "seeds/s over the rounds, the ratio to the defaults and its 95% interval over the paired rounds", "",
                  "| settings changed | seeds/s | ratio | 95% interval |", "|---|---|---|---|"]
        for a in r["arms"]:
            if not a["changes"]:
                lines.append(f"| (defaults) | {a['median']:.4g} | 1 | |")
            else:
                q = a["ratio"]
                lines.append(f"| {a['changes']} | {a['median']:.4g} | {q['ratio']:.3f}x | [{q['low']:.3f}, {q['high']:.3f}] |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks neighbor_step", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_neighbor_workload(ap)
    ap.add_argument("--threads", type=int, nargs="+", default=None,
                    help="thread counts the chunks alternate (default: torch's count, then 1)")
    ap.add_argument("--chunks", type=int, default=24)
    ap.add_argument("--steps", type=int, default=50, help="steps per chunk")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=30, help="0: no profiler pass")
    ap.add_argument("--top", type=int, default=25, help="ops listed from the profiler pass")
    ap.add_argument("--arms", default=None, help="JSON list of setting changes measured against the defaults")
    ap.add_argument("--arm-rounds", type=int, default=8)
    ap.add_argument("--arm-steps", type=int, default=60)
    ap.add_argument("--out", default="neighbor_step", help="stem of the result files")
    ap.add_argument("--folder", default=str(_common.RESULTS))
    args = ap.parse_args(argv)
    if args.threads is None:
        n = torch.get_num_threads()
        args.threads = [n, 1] if n > 1 else [1]
    if args.chunks < 1 or args.steps < 1 or any(t < 1 for t in args.threads):
        ap.error("--chunks, --steps and --threads must be >= 1")
    before = _common.loadavg()
    r = run(args)
    _common.record_and_write(args.folder, "neighbor_step", args.out, argv, r, markdown, before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
