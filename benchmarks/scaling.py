"""Data-parallel training of a compiled GraphSAGE: 1 vs 2 ranks measured here, and a model of 1 to 64 ranks.

    python -m benchmarks scaling             # 1 and 2 ranks (1 thread each), eager and compiled, 3 rounds
    python -m benchmarks scaling --quick     # a small graph, 1 round (the test's form)

Measured: each variant is one ``torchrun --standalone --nproc-per-node R -m gnncompile.train``
job (R = 1 or 2, ``--threads 1``, gloo), eager (``--eager``) and compiled
(``DDP(gnncompile.compile(model))``), the variants of a round in rotating order. A job trains
``--epochs`` epochs over the same training seeds (R = 2: each rank half of them, one shuffle per
epoch shared by the ranks); the first epoch (compilation, the speed guard's races) is warm-up
and the job's figure is the median over the later epochs of: seeds per second of the whole job
(the slowest rank's epoch time), rank 0's median step time (zero_grad .. optimizer step, DDP's
all-reduce in it) and its median wait for the next batch (sampling). Also measured: the gloo
all-reduce of float32 buffers of 4 KiB to 4x the model's gradients, 2 ranks on this host, fitted
as ``t = a + bytes / b``.

The model: a step of N ranks costs ``wait + compute + allreduce(N)`` (no overlap) or
``wait + max(compute, allreduce(N))`` (DDP's bucketed all-reduce fully hidden behind the
backward pass); ``wait`` and ``compute`` are the 1-rank job's, ``allreduce(N)`` is a ring
all-reduce of the gradients, ``2 (N - 1) a + 2 (N - 1) / N * bytes / b``, with this host's fitted
a and b within one host (up to ``--ranks-per-host`` ranks) and beyond it the worse of those and
an assumed network (``--net-gbits``, ``--net-latency-us``: not measured here), since a ring
spanning hosts waits on its slowest link. Throughput = N x batch / step.
Everything else is assumed to scale: each rank has its own cores and memory bandwidth, the
sampler runs per rank on its shard. On this 2-core machine the 2-rank job shares the cores and
the memory bus, which the model does not; the table shows the measured 2-rank figure beside the
predicted one.

Writes benchmarks/results/scaling[_quick].{json,md,png}.
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
from pathlib import Path
from typing import Dict, List

from . import _common

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("eager", "compiled")
RANKS = (1, 2)
MODEL_RANKS = (1, 2, 4, 8, 16, 32, 64)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, module_args: List[str], timeout: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port())] + module_args
    env = _common.timing_env(threads=1)
    env.setdefault("PYTHONPATH", str(_common.ROOT))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=_common.ROOT,
                             start_new_session=True)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _common.kill_tree(p.pid)  # the launcher and its ranks (each in a session of its own)
            p.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, p.returncode, out.read(), err.read())


def _train_job(args, variant: str, ranks: int, folder: Path) -> Dict:
    out = folder / f"{variant}_{ranks}_{time.monotonic_ns()}.json"
    train = ["-m", "gnncompile.train", "--threads", "1", "--quiet", "--epochs", str(args.epochs),
             "--nodes", str(args.nodes), "--degree", str(args.degree), "--features", str(args.features),
             "--hidden", str(args.hidden), "--batch-size", str(args.batch_size), "--fanout", args.fanout,
             "--json", str(out), "--timeout", str(args.timeout)]
    if variant == "eager":
        train.append("--eager")
    try:
        p = _torchrun(ranks, train, args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    if p.returncode != 0 or not out.exists():
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"error": f"rc {p.returncode}: {' | '.join(tail)[:600]}"}
    r = json.loads(out.read_text())
    timed = r["epochs"][1:] or r["epochs"]  # the first epoch compiles
    return {"seeds_per_s": statistics.median(e["seeds_per_s"] for e in timed),
            "step_ms": statistics.median(e["step_ms_median"] for e in timed),
            "wait_ms": statistics.median(e["batch_wait_ms_median"] for e in timed),
            "epoch_s": statistics.median(e["seconds"] for e in timed),
            "final_loss": r["epochs"][-1]["loss"], "val_acc": r.get("val_acc"),
            "steps_per_epoch": r["epochs"][0]["steps"], "params_checksum": r["param_checksum"]}


# ----------------------------------------------------------------------------- all-reduce child
def _allreduce_child(sizes: List[int], repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    res = {}
    for nbytes in sizes:
        t = torch.ones(max(nbytes // 4, 1))
        for _ in range(3):
            dist.all_reduce(t)
        times = []
        for _ in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        res[nbytes] = statistics.median(times)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def _fit(points: Dict[int, float]):
    """Least squares of t = a + bytes / b over the measured sizes: (a seconds, b bytes/s)."""
    xs, ys = [float(k) for k in points], list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = max(my - slope * mx, 0.0)
    return a, (1.0 / slope if slope > 0 else float("inf"))


def _param_bytes(args) -> int:
    from torch_geometric.nn.models import GraphSAGE

    m = GraphSAGE(args.features, args.hidden, 2, 8)
    return 4 * sum(p.numel() for p in m.parameters())


def _allreduce_time(n: int, nbytes: int, a: float, b: float) -> float:
    """Ring all-reduce of nbytes over n ranks: 2 (n - 1) steps of latency a, 2 (n - 1) / n of
    the buffer through each link of bandwidth b."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / b


def scaling_model(compute_s: float, wait_s: float, batch: int, nbytes: int, host_ab, net_ab,
                  ranks_per_host: int) -> List[Dict]:
    rows = []
    for n in MODEL_RANKS:
        # a ring over several hosts waits on its slowest link: the worse latency and bandwidth
        a, b = host_ab if n <= ranks_per_host else (max(host_ab[0], net_ab[0]), min(host_ab[1], net_ab[1]))
        ar = _allreduce_time(n, nbytes, a, b)
        worst, best = wait_s + compute_s + ar, wait_s + max(compute_s, ar)
        rows.append({"ranks": n, "hosts": -(-n // ranks_per_host), "allreduce_ms": 1e3 * ar,
                     "step_ms_no_overlap": 1e3 * worst, "step_ms_overlap": 1e3 * best,
                     "seeds_per_s_no_overlap": n * batch / worst, "seeds_per_s_overlap": n * batch / best,
                     "efficiency_no_overlap": (wait_s + compute_s) / worst})
    return rows


def main(argv=None) -> Dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a 4000-node graph, 2 epochs, 1 round")
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--degree", type=int, default=10)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanout", default="10,5")
    p.add_argument("--epochs", type=int, default=4, help="per job, the first one warm-up")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks-per-host", type=int, default=8, help="the model's ranks per host")
    p.add_argument("--net-gbits", type=float, default=25.0, help="the model's network between hosts (Gbit/s)")
    p.add_argument("--net-latency-us", type=float, default=30.0, help="the model's latency per ring step between hosts")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    p.add_argument("--results-dir", default=str(RESULTS))
    p.add_argument("--out", default=None)
    p.add_argument("--allreduce-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.allreduce_child:
        cfg = json.loads(args.allreduce_child)
        _allreduce_child(cfg["sizes"], cfg["repeats"], cfg["out"])
        return {}
    if args.quick:
        args.nodes, args.epochs, args.rounds, args.batch_size, args.hidden = 4000, 2, 1, 256, 64
    name = args.out or ("scaling_quick" if args.quick else "scaling")
    load_before = _common.loadavg()
    runs: Dict[str, List[Dict]] = {f"{v}_{r}": [] for v in VARIANTS for r in RANKS}
    keys = list(runs)
    with tempfile.TemporaryDirectory(prefix="gnncompile_scaling_") as tmp:
        for rnd in range(args.rounds):
            for i in range(len(keys)):
                key = keys[(i + rnd) % len(keys)]
                v, r = key.rsplit("_", 1)
                res = _train_job(args, v, int(r), Path(tmp))
                print(f"round {rnd}: {key}: {res}", flush=True)
                runs[key].append(res)
        nbytes = _param_bytes(args)
        sizes = [4096, 65536, 1 << 20, max(nbytes, 1 << 21), 4 * nbytes]
        out = Path(tmp) / "allreduce.json"
        child = json.dumps({"sizes": sizes, "repeats": 7 if args.quick else 21, "out": str(out)})
        pr = _torchrun(2, ["-m", "benchmarks.scaling", "--allreduce-child", child], args.timeout)
        allreduce = {int(k): v for k, v in json.loads(out.read_text()).items()} if out.exists() else {}
        if not allreduce:
            print(f"all-reduce measurement failed: {pr.stderr[-600:]}", file=sys.stderr)
    summary = {}
    for key, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        summary[key] = ({k: statistics.median(r[k] for r in ok) for k in ("seeds_per_s", "step_ms", "wait_ms", "epoch_s")}
                        if ok else {"error": rs[0]["error"] if rs else "not run"})
        if ok:
            summary[key].update(final_loss=ok[-1]["final_loss"], val_acc=ok[-1]["val_acc"],
                                steps_per_epoch=ok[-1]["steps_per_epoch"])
    payload = {"args": vars(args), "runs": runs, "summary": summary, "allreduce_s": allreduce,
               "param_bytes": nbytes, "machine": _common.machine(), "cpu": _common.cpu_model(),
               "loadavg_before_after": [load_before, _common.loadavg()],
               "command": _common.command("scaling", argv)}
    c1 = summary.get("compiled_1", {})
    if allreduce and "error" not in c1:
        a, b = _fit(allreduce)
        net = (args.net_latency_us * 1e-6, args.net_gbits * 1e9 / 8)
        payload["fit"] = {"latency_s": a, "bytes_per_s": b}
        payload["model"] = scaling_model(c1["step_ms"] / 1e3, c1["wait_ms"] / 1e3, args.batch_size, nbytes,
                                         (a, b), net, args.ranks_per_host)
        pred2 = next(r for r in payload["model"] if r["ranks"] == 2)
        payload["model_check"] = {"predicted_2_no_overlap": pred2["seeds_per_s_no_overlap"],
                                  "predicted_2_overlap": pred2["seeds_per_s_overlap"],
                                  "measured_2": summary.get("compiled_2", {}).get("seeds_per_s")}
    _common.write_results(Path(args.results_dir), name, payload, markdown, plot)
    return payload


def markdown(p: Dict) -> str:
    a = p["args"]
    s = p["summary"]
    lines = ["# Data-parallel scaling: compiled GraphSAGE on sampled batches, gloo", "",
             "| job | ranks | seeds/s (whole job) | vs 1 rank | vs eager, same ranks | step ms (rank 0) | "
             "batch wait ms | epoch s | final loss | val. accuracy |", "|---|---|---|---|---|---|---|---|---|---|"]
    for v in VARIANTS:
        for r in RANKS:
            x = s.get(f"{v}_{r}", {})
            if "error" in x:
                lines.append(f"| {v} | {r} | error: {x['error']} | | | | | | | |")
                continue
            one, eager = s.get(f"{v}_1", {}), s.get(f"eager_{r}", {})
            vs1 = x["seeds_per_s"] / one["seeds_per_s"] if "seeds_per_s" in one else float("nan")
            vse = x["seeds_per_s"] / eager["seeds_per_s"] if "seeds_per_s" in eager else float("nan")
            acc = "-" if x.get("val_acc") is None else f"{x['val_acc']:.3f}"
            lines.append(f"| {v} | {r} | {x['seeds_per_s']:.0f} | {vs1:.2f}x | {vse:.2f}x | {x['step_ms']:.1f} | "
                         f"{x['wait_ms']:.1f} | {x['epoch_s']:.2f} | {x['final_loss']:.4f} | {acc} |")
    lines += ["", f"Graph: power_law_graph({a['nodes']:,}, {a['nodes'] * a['degree']:,}), F = {a['features']}; "
              f"GraphSAGE({a['features']}, {a['hidden']}, 2, 8) ({p['param_bytes'] / 2**20:.2f} MiB of gradients); "
              f"NeighborLoader fanout [{a['fanout']}], batch {a['batch_size']} per rank, half the nodes as training "
              f"seeds; Adam. One torchrun job per row and round, 1 torch thread per rank, {a['rounds']} round(s), "
              f"{a['epochs']} epochs per job (the first not timed); medians over epochs, then rounds. "
              f"Machine: {p['cpu']}, {os.cpu_count()} cores, torch {p['machine']['torch']}. "
              + _common.load_text(p["loadavg_before_after"]) + f". Command: `{p['command']}`", ""]
    if p.get("allreduce_s"):
        lines += ["All-reduce, gloo, 2 ranks on this host (median): " + ", ".join(
            f"{k / 1024:.0f} KiB {1e3 * v:.2f} ms" for k, v in sorted(p["allreduce_s"].items()))]
        if p.get("fit"):
            f = p["fit"]
            lines += [f"fitted: {1e6 * f['latency_s']:.0f} us + bytes / {f['bytes_per_s'] / 1e9:.2f} GB/s.", ""]
    if p.get("model"):
        lines += ["## The model, 1 to 64 ranks",
                  "",
                  f"From the 1-rank compiled job (step {s['compiled_1']['step_ms']:.1f} ms, batch wait "
                  f"{s['compiled_1']['wait_ms']:.1f} ms); ring all-reduce of {p['param_bytes'] / 2**20:.2f} MiB; "
                  f"{a['ranks_per_host']} ranks per host on this host's fitted all-reduce, beyond one host an assumed "
                  f"{a['net_gbits']:.0f} Gbit/s network with {a['net_latency_us']:.0f} us per ring step (not measured).",
                  "", "| ranks | hosts | all-reduce ms | step ms (no overlap / overlap) | seeds/s (no overlap / overlap) | "
                  "efficiency (no overlap) |", "|---|---|---|---|---|---|"]
        for r in p["model"]:
            lines.append(f"| {r['ranks']} | {r['hosts']} | {r['allreduce_ms']:.2f} | {r['step_ms_no_overlap']:.1f} / "
                         f"{r['step_ms_overlap']:.1f} | {r['seeds_per_s_no_overlap']:.0f} / {r['seeds_per_s_overlap']:.0f} | "
                         f"{100 * r['efficiency_no_overlap']:.0f}% |")
        c = p["model_check"]
        if c.get("measured_2"):
            lines += ["", f"Check at 2 ranks: predicted {c['predicted_2_no_overlap']:.0f}-{c['predicted_2_overlap']:.0f} "
                      f"seeds/s, measured {c['measured_2']:.0f} ({c['measured_2'] / c['predicted_2_no_overlap']:.2f}x the "
                      "no-overlap prediction): the two ranks here share 2 cores and one memory bus, which the model "
                      "gives each rank to itself."]
    return "\n".join(lines) + "\n"


def plot(p: Dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not p.get("model"):
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    n = [r["ranks"] for r in p["model"]]
    one = p["model"][0]["seeds_per_s_no_overlap"]
    ax.plot(n, [one * k for k in n], "k:", label="ideal (N x 1 rank)")
    ax.fill_between(n, [r["seeds_per_s_no_overlap"] for r in p["model"]], [r["seeds_per_s_overlap"] for r in p["model"]],
                    alpha=0.3, label="model (no overlap .. full overlap)")
    for v, m in (("compiled", "o"), ("eager", "s")):
        pts = [(r, p["summary"][f"{v}_{r}"]["seeds_per_s"]) for r in RANKS if "seeds_per_s" in p["summary"].get(f"{v}_{r}", {})]
        if pts:
            ax.plot(*zip(*pts), m, label=f"measured here, {v}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks")
    ax.set_ylabel("training seeds / s")
    ax.set_title("Data-parallel GraphSAGE: measured (1-2 ranks) and modelled")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
