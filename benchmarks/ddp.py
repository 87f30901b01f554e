"""Data-parallel GraphSAGE training on sampled batches over 2 gloo ranks: eager DDP vs gnncompile.

    python -m benchmarks ddp                 # 100k nodes, 2 ranks x 16 batches of 1024, 3 rounds
    python -m benchmarks ddp --quick         # 20k nodes, batches of 256, a few steps, 1 round
    python -m benchmarks ddp --variants eager,compile-ddp --rounds 5

Issue 32's "DDP, 2 gloo ranks, compiled SAGE on sampled batches with 1 MiB buckets: 0
recompiles after warm-up, faster than eager DDP".

Graph: ``power_law_graph(N, 10 N, seed=0)``, random features (F = 256), 16 random classes.
Training seeds: a fixed random ``2 x --batches x --batch-size`` of the nodes, split into one
equal shard per rank (rank r: the r-th block), so every rank has the same number of batches
of the same size. Loader per rank: ``gnncompile.data.NeighborLoader(data, [10, 5],
input_nodes=shard, batch_size=B, shuffle=True, seed=rank)``. Model:
``torch_geometric.nn.models.GraphSAGE(256, 1024, 2, 16)``, built from seed 0 (2.13 MiB of
parameters: counted backwards through the graph, the second layer and the first layer's root
weight fill DDP's first 1 MiB bucket, so Dynamo's DDP optimizer splits the compiled graph in
two there; with GraphSAGE(256, 512, ...), 1.06 MiB, the bucket fills only at the graph's
first op and nothing is split); ``DistributedDataParallel(..., bucket_cap_mb=1)``; a step is zero_grad,
forward on the batch, cross-entropy on its seeds, backward (gradients all-reduced by DDP), Adam
(lr 1e-3).

Variants, each run by its own pair of fresh rank processes (gloo, MASTER_ADDR=127.0.0.1 and a
free port, one torch thread per rank), interleaved in ``--rounds`` rounds (the order rotates
each round):
  eager              ``DDP(model)``
  ddp-compile        ``DDP(gnncompile.compile(model, dynamic=True))``
  compile-ddp        ``gnncompile.compile(DDP(model), dynamic=True)``
  compile-ddp-noguard  as compile-ddp with ``settings={"choices": {"guard": "off"}}``: the
                     compiled path's own speed (the speed guard, on by default, times the
                     compiled call against the model as written on its first ~25 calls and
                     keeps the faster)
(``--dynamic none``: automatic dynamic shapes, the compile() default, instead of dynamic=True.)

Per run and rank: ``--warmup`` training steps (compilation, the speed guard's races), then
``--epochs`` timed epochs (full passes over the rank's shard): every step timed (zero_grad to
optimizer step, the all-reduce included; the loader's next batch not), and each epoch's wall
time (sampling included). Reported: the step time's median over the steps of both ranks
(median over rounds of those), the epoch's wall time (its median likewise); recompiles after
warm-up, counted three ways, each of which must be 0: gnncompile backend calls (one per graph
piece compiled), Dynamo's ``unique_graphs`` counter, and Dynamo's "recompiles" log records
(``torch._logging`` artifact, with the guard failure); the graph pieces compiled in warm-up
(the DDP split); the first ``--check-steps`` losses of each rank against eager DDP's (same
weights, same batches: relative difference, at most 1e-4 wanted); the parameters of rank 1
after training against rank 0's (broadcast; DDP keeps them equal, 0 wanted); the speed guard's
decisions; a compile that fell back to eager (CompileFallbackWarning) is an error.
Writes benchmarks/results/ddp[_quick].{json,md,png}.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional

import faulthandler
import signal

if "--child" in sys.argv:
    # a rank the driver finds hung is asked for its Python stacks (SIGUSR1): registered before
    # the imports, which may wait (an editable install rebuilds a changed native module on import)
    faulthandler.register(signal.SIGUSR1, all_threads=True)

import gnncompile  # noqa: E402  (the installed package; imported before the rest)
import torch  # noqa: E402

from . import _common  # noqa: E402

F, HIDDEN, LAYERS, C, FANOUT, WORLD = 256, 1024, 2, 16, [10, 5], 2
VARIANTS = ("eager", "ddp-compile", "compile-ddp", "compile-ddp-noguard")
DESCRIBE = {"eager": "DDP(model)", "ddp-compile": "DDP(gnncompile.compile(model))",
            "compile-ddp": "gnncompile.compile(DDP(model))",
            "compile-ddp-noguard": "gnncompile.compile(DDP(model)), guard off"}
LOSS_RTOL, PARAM_ATOL = 1e-4, 0.0


# ----------------------------------------------------------------------------- one rank
def make_data(nodes: int, seeds: int):
    """The graph (the same on every rank) and the training seeds (``seeds`` of the nodes)."""
    from torch_geometric.data import Data

    from gnncompile.data import power_law_graph

    ei = power_law_graph(nodes, 10 * nodes, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(nodes, F, generator=g)
    y = torch.randint(0, C, (nodes,), generator=g)
    train = torch.randperm(nodes, generator=g)[:seeds]
    return Data(x=x, y=y, edge_index=ei, num_nodes=nodes), train


# every DDP module a rank made, kept to the end of its process, which ends with os._exit: freed
# after destroy_process_group, DDP's reducer frees the gloo group, whose destructor can deadlock
# with a worker thread releasing a finished collective (gnncompile/train.py's _leave)
_KEEP: list = []


def wrap(model, variant: str, dynamic: Optional[bool]):
    """The variant's training module around ``model`` (its parameters are the model's)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if variant == "eager":
        run = DDP(model, bucket_cap_mb=1)
    elif variant == "ddp-compile":
        run = DDP(gnncompile.compile(model, dynamic=dynamic), bucket_cap_mb=1)
    else:
        settings = {"choices": {"guard": "off"}} if variant == "compile-ddp-noguard" else None
        run = gnncompile.compile(DDP(model, bucket_cap_mb=1), dynamic=dynamic, settings=settings)
    _KEEP.append(run)
    return run


def _compiled_of(run):
    """The gnncompile CompiledModule of a variant's module (None for eager DDP)."""
    from gnncompile.compiler import CompiledModule

    for m in (run, getattr(run, "module", None)):
        if isinstance(m, CompiledModule):
            return m
    return None


class _RecompileLog:
    """Counts Dynamo's "recompiles" log records (torch._logging's artifact) and keeps their text."""

    def __init__(self) -> None:
        import logging

        torch._logging.set_logs(recompiles=True)
        self.records: List[str] = []
        outer = self

        class _H(logging.Handler):
            def emit(self, record) -> None:
                outer.records.append(record.getMessage())

        self.logger = logging.getLogger("torch._dynamo.guards.__recompiles")
        self.logger.addHandler(_H())
        self.logger.propagate = False  # kept here, not printed


def _progress(opts, text: str) -> None:
    if opts.rank == 0:
        print(f"progress: {text}", file=sys.stderr, flush=True)


def _warm_up(loader, step, opts) -> None:
    """``opts.warmup`` training steps: as many passes over the shard as it takes."""
    t0, done = time.perf_counter(), 0
    while done < opts.warmup:
        for batch in loader:
            step(batch)
            done += 1
            if done % 5 == 0 or done == opts.warmup:
                _progress(opts, f"{opts.child} warm-up step {done}/{opts.warmup} ({time.perf_counter() - t0:.1f} s)")
            if done >= opts.warmup:
                return


def rank_main(opts) -> dict:
    """One rank of one variant (this process): warm-up, timed epochs, the checks' raw data."""
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    from gnncompile.compiler import STATS, collect
    from gnncompile.data import NeighborLoader

    torch.set_num_threads(1)
    seen_warnings: List[str] = []
    warnings.simplefilter("ignore")
    from gnncompile.compiler.api import CompileFallbackWarning
    from gnncompile.compiler.backend import RecompileLimitWarning

    for cat in (CompileFallbackWarning, RecompileLimitWarning):
        warnings.simplefilter("always", cat)
    show = warnings.showwarning
    warnings.showwarning = lambda m, cat, *a, **k: (seen_warnings.append(f"{cat.__name__}: {m}"), show(m, cat, *a, **k))
    recompiles = _RecompileLog()
    dist.init_process_group("gloo", rank=opts.rank, world_size=WORLD)
    try:
        t_setup = time.perf_counter()
        per_rank = opts.batches * opts.batch_size
        data, train = make_data(opts.nodes, WORLD * per_rank)
        shard = train[opts.rank * per_rank:(opts.rank + 1) * per_rank]
        loader = NeighborLoader(data, FANOUT, input_nodes=shard, batch_size=opts.batch_size, shuffle=True,
                                seed=opts.rank)
        torch.manual_seed(0)
        from torch_geometric.nn.models import GraphSAGE

        model = GraphSAGE(F, HIDDEN, LAYERS, C)
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        run = wrap(model, opts.child, None if opts.dynamic == "none" else True)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        losses: List[float] = []
        sizes: List[List[int]] = []

        def step(batch) -> float:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            out = run(batch.x, batch.edge_index)[: batch.batch_size]
            loss = torch.nn.functional.cross_entropy(out, batch.y[: batch.batch_size])
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t0
            losses.append(float(loss))
            sizes.append([int(batch.num_nodes), int(batch.edge_index.size(1))])
            return dt

        setup_s = time.perf_counter() - t_setup
        t0 = time.perf_counter()
        with collect() as reports:  # what the passes did to each graph piece compiled in warm-up
            _warm_up(loader, step, opts)
        warmup_s = time.perf_counter() - t0
        base = {"backend_calls": STATS["graphs"], "unique_graphs": counters["stats"]["unique_graphs"],
                "recompile_records": len(recompiles.records)}
        step_s: List[float] = []
        epoch_s: List[float] = []
        for e in range(opts.epochs):
            t0 = time.perf_counter()
            n = 0
            for batch in loader:
                step_s.append(step(batch))
                n += 1
            epoch_s.append(time.perf_counter() - t0)
            _progress(opts, f"{opts.child} timed epoch {e + 1}/{opts.epochs}: {epoch_s[-1]:.2f} s, {n} steps, "
                            f"median step {statistics.median(step_s[-n:]) * 1e3:.0f} ms")
        # every parameter of this rank against rank 0's
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        ref = flat.clone()
        dist.broadcast(ref, src=0)
        dist.barrier()
        compiled = _compiled_of(run)
        return {
            "rank": opts.rank, "variant": opts.child, "setup_s": setup_s, "warmup_s": warmup_s,
            "warmup_steps": opts.warmup, "step_s": step_s, "epoch_s": epoch_s, "losses": losses,
            "batches_per_epoch": len(loader), "batch_sizes": sizes, "param_bytes": param_bytes,
            "param_max_diff_vs_rank0": float((flat - ref).abs().max()),
            "backend_calls_in_warmup": base["backend_calls"],
            "backend_calls_after_warmup": STATS["graphs"] - base["backend_calls"],
            "unique_graphs_in_warmup": base["unique_graphs"],
            "unique_graphs_after_warmup": counters["stats"]["unique_graphs"] - base["unique_graphs"],
            "recompiles_in_warmup": base["recompile_records"],
            "recompiles_after_warmup": len(recompiles.records) - base["recompile_records"],
            "recompile_reasons": [r[:600] for r in recompiles.records[:4]],
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "fused_chains": sum(r.num_fused for r in reports), "inner": sorted({r.inner for r in reports}),
            "guard": [str(d) for d in compiled.guard_decisions()] if compiled is not None else [],
            "compile_failed": getattr(compiled, "_failed", None) if compiled is not None else None,
            "warnings": seen_warnings[:5], "threads": torch.get_num_threads(),
        }
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- driver
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_args(opts) -> list:
    return ["--nodes", str(opts.nodes), "--batches", str(opts.batches), "--batch-size", str(opts.batch_size),
            "--warmup", str(opts.warmup), "--epochs", str(opts.epochs), "--dynamic", opts.dynamic]


def run_pair(variant: str, opts) -> List[dict]:
    """Both ranks of ``variant``, each a fresh process; their results (or {"error": ...}). Prints
    rank 0's progress lines as they come. A pair still running after ``--timeout`` seconds is
    a hang: each rank is asked for its Python stacks (SIGUSR1, faulthandler), then killed."""
    env = _common.timing_env(threads=1)
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(WORLD),
                "PYTHONWARNINGS": "ignore"})
    with tempfile.TemporaryDirectory() as tmp:
        procs, logs = [], []
        for rank in range(WORLD):
            out, err = Path(tmp) / f"out{rank}", Path(tmp) / f"err{rank}"
            logs.append((out, err))
            cmd = _common.module_command("ddp") + ["--child", variant, "--rank", str(rank)] + child_args(opts)
            with open(out, "w") as fo, open(err, "w") as fe:
                procs.append(subprocess.Popen(cmd, stdout=fo, stderr=fe, env=dict(env, RANK=str(rank)),
                                              cwd=_common.ROOT))
        deadline, shown, hung = time.monotonic() + opts.timeout, 0, False
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                hung = True
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGUSR1)
                time.sleep(3)
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                    p.wait()
                break
            time.sleep(0.5)
            lines = logs[0][1].read_text().splitlines()
            for ln in lines[shown:]:
                if ln.startswith("progress: "):
                    print("    " + ln[len("progress: "):], flush=True)
            shown = len(lines)
        results = []
        for rank, (p, (out, err)) in enumerate(zip(procs, logs)):
            got = [ln for ln in out.read_text().splitlines() if ln.startswith("RESULT ")]
            stderr = [ln for ln in err.read_text().splitlines() if not ln.startswith("progress: ")]
            if hung:
                frames = [ln.strip() for ln in stderr if ln.strip().startswith("File ")]
                results.append({"rank": rank, "error": f"rank {rank} still running after {opts.timeout} s (a hang): "
                                                       f"{' < '.join(frames[:3]) or 'no stack'}",
                                "stderr_tail": stderr[-60:]})
            elif p.returncode == 0 and got:
                results.append(json.loads(got[-1][len("RESULT "):]))
            else:
                tail = " / ".join(t.strip() for t in stderr[-3:])[-600:] or "no output"
                results.append({"rank": rank, "error": f"rank {rank} rc {p.returncode}: {tail}",
                                "stderr_tail": stderr[-60:]})
    return results


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def combine(runs: Dict[str, List[List[dict]]], opts) -> dict:
    """Per variant: the rounds' medians and the checks (losses against eager's in the same
    round and rank, ranks' parameters, recompiles)."""
    out = {}
    for v, rounds in runs.items():
        ok = [r for r in rounds if all("error" not in x for x in r)]
        errors = [x["error"] for r in rounds for x in r if "error" in x]
        if not ok:
            out[v] = {"error": errors[0] if errors else "no run",
                      "error_stderr": [x.get("stderr_tail") for r in rounds for x in r if "error" in x]}
            continue
        step_rounds = [statistics.median([s for x in r for s in x["step_s"]]) for r in ok]
        epoch_rounds = [statistics.median([e for x in r for e in x["epoch_s"]]) for r in ok]
        loss_diff = []
        for i, r in enumerate(rounds):
            ref = runs["eager"][i] if "eager" in runs and i < len(runs["eager"]) else None
            if r not in ok or ref is None or any("error" in x for x in ref):
                continue
            for x, e in zip(r, ref):
                k = min(opts.check_steps, len(x["losses"]), len(e["losses"]))
                loss_diff.append(max(_rel(a, b) for a, b in zip(x["losses"][:k], e["losses"][:k])))
        kept = [d for r in ok for x in r for d in x["guard"]]
        model_kept = [d.split(": kept ")[1].split(":")[0] for d in kept if "the whole model" in d and "(training)" in d]
        piece_kept = [d.split(": kept ")[1].split(":")[0] for d in kept if "the whole model" not in d and "(training)" in d]
        out[v] = {
            "step_ms": statistics.median(step_rounds) * 1e3, "step_ms_rounds": [s * 1e3 for s in step_rounds],
            "epoch_s": statistics.median(epoch_rounds), "epoch_s_rounds": epoch_rounds,
            "steps_timed_per_rank": len(ok[0][0]["step_s"]), "batches_per_epoch": ok[0][0]["batches_per_epoch"],
            "warmup_s": statistics.median([x["warmup_s"] for r in ok for x in r]),
            "pieces_compiled": max(x["backend_calls_in_warmup"] for r in ok for x in r),
            "backend_calls_after_warmup": max(x["backend_calls_after_warmup"] for r in ok for x in r),
            "unique_graphs_after_warmup": max(x["unique_graphs_after_warmup"] for r in ok for x in r),
            "recompiles_after_warmup": max(x["recompiles_after_warmup"] for r in ok for x in r),
            "recompiles_in_warmup": max(x["recompiles_in_warmup"] for r in ok for x in r),
            "recompile_reasons": next((x["recompile_reasons"] for r in ok for x in r if x["recompile_reasons"]), []),
            "graph_breaks": max(x["graph_breaks"] for r in ok for x in r),
            "fused_chains": max(x["fused_chains"] for r in ok for x in r),
            "inner": sorted({i for r in ok for x in r for i in x["inner"]}),
            "loss_max_rel_diff": max(loss_diff) if loss_diff else None,
            "rank_param_max_diff": max(x["param_max_diff_vs_rank0"] for r in ok for x in r),
            "guard_model": {k: model_kept.count(k) for k in sorted(set(model_kept))},
            "guard_pieces": {k: piece_kept.count(k) for k in sorted(set(piece_kept))},
            "guard_decisions_first_run": [d for x in ok[0] for d in x["guard"]],
            "compile_failed": next((x["compile_failed"] for r in ok for x in r if x["compile_failed"]), None),
            "warnings": sorted({w for r in ok for x in r for w in x["warnings"]}),
            "first_losses_rank0": ok[0][0]["losses"][:opts.check_steps],
            "mean_batch_nodes_edges": [statistics.mean(s[i] for x in ok[0] for s in x["batch_sizes"]) for i in (0, 1)],
            "param_bytes": ok[0][0]["param_bytes"], "rounds_ok": len(ok), "errors": errors,
            "error_stderr": [x.get("stderr_tail") for r in rounds for x in r if "error" in x],
        }
    return out


def checks(results: dict) -> List[str]:
    """What went wrong (empty: every variant ran, 0 recompiles after warm-up, losses and ranks agree)."""
    bad = []
    for v, r in results.items():
        if "error" in r:
            bad.append(f"{v}: {r['error']}")
            continue
        for key in ("backend_calls_after_warmup", "unique_graphs_after_warmup", "recompiles_after_warmup"):
            if r[key]:
                bad.append(f"{v}: {key} = {r[key]} ({r['recompile_reasons'][:1]})")
        if r["loss_max_rel_diff"] is not None and r["loss_max_rel_diff"] > LOSS_RTOL:
            bad.append(f"{v}: first losses differ from eager DDP's by {r['loss_max_rel_diff']:.2e} (relative)")
        if r["rank_param_max_diff"] > PARAM_ATOL:
            bad.append(f"{v}: rank 1's parameters differ from rank 0's by {r['rank_param_max_diff']:.2e}")
        if r["compile_failed"]:
            bad.append(f"{v}: compiling failed, ran eagerly: {r['compile_failed']}")
        if r["errors"]:
            bad.append(f"{v}: {len(r['errors'])} failed run(s): {r['errors'][0]}")
    return bad


def _guard_text(r: dict) -> str:
    if not r["guard_model"] and not r["guard_pieces"]:
        return "n/a"
    model = ", ".join(f"{k} x{n}" for k, n in r["guard_model"].items()) or "undecided"
    pieces = ", ".join(f"{k} x{n}" for k, n in r["guard_pieces"].items()) or "none decided"
    return f"model: {model}; pieces: {pieces}"


def markdown(p: dict) -> str:
    head = ["variant", "module", "step ms (median)", "vs eager DDP", "epoch s", "recompiles after warm-up "
            "(backend calls / Dynamo graphs / recompile log)", "graph pieces (fused chains, inner)",
            "first-loss max rel. diff vs eager", "rank 1 vs rank 0 params (max abs diff)", "guard kept (training)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    eager = p["results"].get("eager", {})
    for v, r in p["results"].items():
        if "error" in r:
            why = r["error"].replace("|", "/")
            lines.append(f"| {v} | `{DESCRIBE[v]}` | error: {why} |" + " |" * (len(head) - 3))
            continue
        ratio = f"{eager['step_ms'] / r['step_ms']:.2f}x" if "step_ms" in eager else "n/a"
        loss = "reference" if v == "eager" else (f"{r['loss_max_rel_diff']:.1e}" if r["loss_max_rel_diff"] is not None
                                                 else "n/a")
        cells = [v, f"`{DESCRIBE[v]}`", f"{r['step_ms']:.1f}", ratio, f"{r['epoch_s']:.2f}",
                 f"{r['backend_calls_after_warmup']} / {r['unique_graphs_after_warmup']} / {r['recompiles_after_warmup']}",
                 f"{r['pieces_compiled']} ({r['fused_chains']}, {'/'.join(r['inner']) or '-'})", loss, f"{r['rank_param_max_diff']:.1e}", _guard_text(r)]
        lines.append("| " + " | ".join(cells) + " |")
    m = p["machine"]
    any_ok = next((r for r in p["results"].values() if "step_ms" in r), None)
    size = (f" ({any_ok['param_bytes'] / 2**20:.2f} MiB of parameters)" if any_ok else "")
    per_batch = (f", on average {any_ok['mean_batch_nodes_edges'][0]:,.0f} nodes / "
                 f"{any_ok['mean_batch_nodes_edges'][1]:,.0f} edges per batch" if any_ok else "")
    lines += ["", f"2 gloo ranks (one process each, 1 torch thread each), MASTER_ADDR=127.0.0.1; every variant run by "
              f"a fresh pair of processes, {p['rounds']} round(s) interleaved (the order rotates). Graph: "
              f"power_law_graph({p['nodes']:,}, {10 * p['nodes']:,}, seed=0), F = {F}; GraphSAGE({F}, {HIDDEN}, "
              f"{LAYERS}, {C}){size} in DDP(bucket_cap_mb=1), Adam; NeighborLoader fanout {FANOUT}, batch "
              f"{p['batch_size']}, each rank its own shard of {p['batches'] * p['batch_size']:,} seeds "
              f"({p['batches']} batches per epoch{per_batch}). "
              f"compile(dynamic={p['dynamic']}). {p['warmup']} warm-up steps, then {p['epochs']} timed epoch(s); "
              f"step = zero_grad .. optimizer step (all-reduce included, sampling not), median over the steps of "
              f"both ranks, then over rounds; 'vs eager DDP' = eager step ms / variant step ms; epoch s = a timed "
              f"epoch's wall time with sampling. Recompiles after warm-up: gnncompile backend calls, Dynamo's "
              f"unique_graphs, Dynamo's 'recompiles' log records (max over ranks and rounds; 0 wanted). Graph "
              f"pieces: backend calls in warm-up (the DDP optimizer's split), with the chains the passes fused in "
              f"them and the inner compiler. Loss check: first {p['check_steps']} "
              f"losses of each rank vs eager DDP's in the same round. Guard kept: the speed guard's training-mode "
              f"decisions over ranks x rounds (model = the whole compiled call vs the model as written; pieces = "
              f"rewritten vs unrewritten graph piece).",
              "", f"Machine: a shared 2-core VM, {p['cpu']}; torch {m['torch']}, gnncompile {m['gnncompile']}. "
              f"{_common.load_text(p['loadavg_before_after'])}. Command: `{p['command']}`"]
    if p["problems"]:
        lines += ["", "Problems:", ""] + [f"- {b}" for b in p["problems"]]
    dec = [(v, d) for v, r in p["results"].items() if "guard_decisions_first_run" in r
           for d in r["guard_decisions_first_run"] if "(training)" in d]
    if dec:
        lines += ["", "Speed guard decisions (first round, both ranks, training calls):", ""]
        lines += [f"- {v}: {d}" for v, d in dec]
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [v for v, r in p["results"].items() if "step_ms" in r]
    vals = [p["results"][v]["step_ms"] for v in keys]
    fig, ax = plt.subplots(figsize=(1.5 + 1.5 * len(keys), 3.5))
    ax.bar(keys, vals, color=["#888888" if v == "eager" else "#3b75af" for v in keys])
    eager = p["results"].get("eager", {}).get("step_ms")
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:.0f}" + (f"\n({eager / v:.2f}x)" if eager else ""), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("ms per training step (median)")
    ax.set_ylim(0, max(vals) * 1.25)
    ax.set_title(f"DDP, 2 gloo ranks: GraphSAGE, fanout {FANOUT}, batch {p['batch_size']}, N={p['nodes']:,}",
                 fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20k nodes, batches of 256, 4 warm-up steps, 1 round")
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--batches", type=int, default=None, help="batches per rank and epoch (default 16, quick 3)")
    ap.add_argument("--batch-size", type=int, default=None, help="default 1024, quick 256")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 30: past the speed guard's "
                                                              "~25 races; quick 4)")
    ap.add_argument("--epochs", type=int, default=1, help="timed epochs per run")
    ap.add_argument("--rounds", type=int, default=None, help="default 3, quick 1")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--dynamic", choices=("true", "none"), default="true")
    ap.add_argument("--check-steps", type=int, default=5, help="first losses compared with eager DDP's")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per pair of rank processes")
    ap.add_argument("--out", default=None)
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    q = opts.quick
    opts.nodes = opts.nodes or (20_000 if q else 100_000)
    opts.batches = opts.batches or (3 if q else 16)
    opts.batch_size = opts.batch_size or (256 if q else 1024)
    opts.warmup = opts.warmup if opts.warmup is not None else (4 if q else 30)
    opts.rounds = opts.rounds or (1 if q else 3)
    if opts.child:
        print("RESULT " + json.dumps(rank_main(opts)), flush=True)
        sys.stderr.flush()
        os._exit(0)  # without the interpreter's teardown (see _KEEP)
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variant(s) {sorted(unknown)}; choose from {VARIANTS}")
    load_before = _common.loadavg()
    runs: Dict[str, List[List[dict]]] = {v: [] for v in variants}
    for rnd in range(opts.rounds):
        order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
        for v in order:
            print(f"round {rnd + 1}/{opts.rounds} {v} ({DESCRIBE[v]}): 2 ranks ...", flush=True)
            pair = run_pair(v, opts)
            runs[v].append(pair)
            for x in pair:
                print(f"  rank {x.get('rank', '?')}: " + (
                    f"step {statistics.median(x['step_s']) * 1e3:.1f} ms median, epoch {statistics.median(x['epoch_s']):.2f} s, "
                    f"warm-up {x['warmup_s']:.1f} s ({x['backend_calls_in_warmup']} graph pieces), recompiles after "
                    f"warm-up {x['backend_calls_after_warmup']}/{x['unique_graphs_after_warmup']}/"
                    f"{x['recompiles_after_warmup']}" if "error" not in x else x["error"]), flush=True)
    results = combine(runs, opts)
    problems = checks(results)
    payload = {"machine": _common.machine(), "cpu": _common.cpu_model(),
               "loadavg_before_after": [load_before, _common.loadavg()], "nodes": opts.nodes,
               "batches": opts.batches, "batch_size": opts.batch_size, "fanout": FANOUT, "warmup": opts.warmup,
               "epochs": opts.epochs, "rounds": opts.rounds, "dynamic": opts.dynamic, "check_steps": opts.check_steps,
               "world_size": WORLD, "model": f"GraphSAGE({F}, {HIDDEN}, {LAYERS}, {C})", "results": results,
               "problems": problems, "command": _common.command("ddp", argv)}
    name = opts.out or ("ddp_quick" if q else "ddp")
    _common.write_results(Path(opts.results_dir), name, payload, markdown, plot)
    for b in problems:
        print(f"PROBLEM: {b}", flush=True)
    return payload


if __name__ == "__main__":
    main()
