"""The max / min backward without a sort (gnncompile::arg_route): the scatter path it replaced
vs the native route, in one run.

    python -m benchmarks arg_backward            # 100k nodes / 1M edges, F = 64
    python -m benchmarks arg_backward --quick    # 10k nodes / 100k edges, fewer repeats
    python -m benchmarks arg_backward --passes   # the op's two CPU passes over degrees and widths

The backward of a max / min aggregation routes each output gradient to the winner its forward
recorded. Before: tensor operations (gnncompile.ops.autograd.ARG_ROUTE = "scatter":
``scatter_add_`` over the [M, F] winners on the CPU, ``index_put_(accumulate=True)`` on CUDA,
which sorts the M x F indices). After ("native"): ``gnncompile::arg_route``, one deterministic
pass with no sort and no atomics (over the CSC, or on the CPU over the records where that costs
less: native/cpu/arg_route_core.h), and ``arg_edge_dot`` for an edge weight.

Workloads, on a generated power-law graph (gnncompile.data.synthetic.power_law_graph, N nodes,
10 N edges), node features N(0, 1) of width F, 16 classes:
  SAGE-max  2 x SAGEConv(F, F, aggr='max'), ReLU between, Linear(F, 16)     (spmm max)
  PNA       2 x PNAConv(F, F, aggregators mean/min/max/std, scalers identity/amplification/
            attenuation, deg = the in-degree histogram, towers=1), ReLU between, Linear(F, 16)
            (message programs: message_reduce max and min)
Each is compiled twice with gnncompile.compile (default settings, the speed guard off so that both
run the rewritten graph): once while ARG_ROUTE is "scatter", once while it is "native" (the switch
is read where the backward is traced, and, with the eager inner compiler, where it runs: it is set
before every call of each; torch's caches of compiled graphs are off, so that each path traces its
own backward, and the first step of each must make its own route decisions). Same initial
weights. One step = forward, cross-entropy, backward (no optimizer step, so the weights, and the
gradients of the two paths, stay comparable). The first step of each is checked: outputs and
parameter gradients of the two paths (max relative difference, and whether they are equal bit for
bit). Then --repeats rounds, each timing one step of both paths in alternating order; medians of
the step (forward + backward) and of the backward alone (``loss.backward()``), and the median of
the rounds' ratios (the two paths of a round ran back to back: drift on a shared machine hits
both alike).

``--passes``: gnncompile::arg_route alone on power-law graphs of several degrees and widths, each
CPU pass forced (knobs[1]: 1 the CSC pass, 2 the winner pass) against the scatter path's tensor
operations, medians of interleaved calls: the measurements behind the CPU rule (route_pass in
native/cpu/arg_route.cpp).

Writes benchmarks/results/arg_backward[_quick].{json,md} (--passes: arg_backward_passes.*).
"""
from __future__ import annotations

import argparse
import copy
import logging
import re
import statistics
import time
import warnings
from typing import Callable, Dict, List

import torch

import gnncompile
from gnncompile.data.synthetic import power_law_graph
from gnncompile.ops import autograd as ag

from . import _common

PATHS = ("scatter", "native")
WORKLOADS = ("SAGE-max", "PNA")
CLASSES = 16


# ----------------------------------------------------------------------------- models
class SageMax(torch.nn.Module):
    def __init__(self, F: int) -> None:
        super().__init__()
        from torch_geometric.nn import SAGEConv

        self.convs = torch.nn.ModuleList([SAGEConv(F, F, aggr="max"), SAGEConv(F, F, aggr="max")])
        self.head = torch.nn.Linear(F, CLASSES)

    def forward(self, x, edge_index):
        x = self.convs[0](x, edge_index).relu()
        return self.head(self.convs[1](x, edge_index))


class Pna(torch.nn.Module):
    def __init__(self, F: int, deg) -> None:
        super().__init__()
        from torch_geometric.nn import PNAConv

        def conv():
            return PNAConv(F, F, ["mean", "min", "max", "std"], ["identity", "amplification", "attenuation"],
                           deg, towers=1)

        self.convs = torch.nn.ModuleList([conv(), conv()])
        self.head = torch.nn.Linear(F, CLASSES)

    def forward(self, x, edge_index):
        x = self.convs[0](x, edge_index).relu()
        return self.head(self.convs[1](x, edge_index))


def build(workload: str, F: int, ei, N: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if workload == "SAGE-max":
        return SageMax(F)
    deg = torch.bincount(torch.bincount(ei[1], minlength=N))
    return Pna(F, deg)


# ----------------------------------------------------------------------------- one workload
class _Pieces(logging.Handler):
    """The inner compiler of every graph piece the backend compiles (its INFO record)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.inner: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = re.search(r"graph piece \d+ \(.*inner (\w+)", record.getMessage())
        if m:
            self.inner.append(m.group(1))


def _count_routes() -> Callable[[], int]:
    """Counts the backward's route decisions from now on (each traced or eager max / min
    backward makes one): a path whose first step made none did not run the code it is named for."""
    calls = {"n": 0}
    original = ag._arg_route

    def spy():
        calls["n"] += 1
        return original()

    ag._arg_route = spy
    return lambda: calls["n"]


def run_workload(workload: str, N: int, F: int, repeats: int) -> dict:
    ei = power_law_graph(N, 10 * N, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g)
    y = torch.randint(0, CLASSES, (N,), generator=g)
    base = build(workload, F, ei, N)
    models = {p: copy.deepcopy(base) for p in PATHS}
    settings = {"choices": {"guard": "off"}}
    compiled = {p: gnncompile.compile(models[p], settings=settings) for p in PATHS}
    original = ag._arg_route
    routes = _count_routes()
    res: dict = {"workload": workload, "N": N, "E": int(ei.size(1)), "F": F}
    pieces, log = _Pieces(), logging.getLogger("gnncompile")
    level = log.level
    log.addHandler(pieces)
    log.setLevel(logging.INFO)

    def step(p: str):
        ag.ARG_ROUTE = p
        m = models[p]
        for q in m.parameters():
            q.grad = None
        t0 = time.perf_counter()
        out = compiled[p](x, ei)
        loss = torch.nn.functional.cross_entropy(out, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        return out.detach(), [q.grad for q in m.parameters()], t2 - t0, t2 - t1

    try:
        first = {}
        for p in PATHS:
            before = routes()
            t0 = time.perf_counter()
            out, grads, _, _ = step(p)
            first[p] = (out, grads)
            res[f"first_step_s_{p}"] = time.perf_counter() - t0
            res[f"route_decisions_first_step_{p}"] = routes() - before
            if routes() == before:
                raise RuntimeError(f"{workload}: the {p} path made no max / min route decision")
        res["inner_compilers"] = sorted(set(pieces.inner))
        (o_s, g_s), (o_n, g_n) = first["scatter"], first["native"]
        res["outputs_equal"] = bool(torch.equal(o_s, o_n))
        res["grads_equal"] = all(torch.equal(a, b) for a, b in zip(g_s, g_n))
        res["max_rel_diff"] = max(float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))
                                  for a, b in zip([o_s] + g_s, [o_n] + g_n))
        if not res["max_rel_diff"] <= 1e-5:
            raise AssertionError(f"{workload}: the paths disagree (max relative difference {res['max_rel_diff']:.2e})")
        times: Dict[str, Dict[str, List[float]]] = {p: {"step": [], "backward": []} for p in PATHS}
        for p in PATHS:  # one more warm-up step each
            step(p)
        for i in range(repeats):
            for p in (PATHS if i % 2 == 0 else PATHS[::-1]):
                _, _, t_step, t_bwd = step(p)
                times[p]["step"].append(t_step)
                times[p]["backward"].append(t_bwd)
    finally:
        ag._arg_route = original
        ag.ARG_ROUTE = "native"
        log.removeHandler(pieces)
        log.setLevel(level)
    for p in PATHS:
        res[f"step_s_{p}"] = statistics.median(times[p]["step"])
        res[f"backward_s_{p}"] = statistics.median(times[p]["backward"])
        res[f"times_{p}"] = times[p]
    for k in ("step", "backward"):  # paired: the two paths of one round ran back to back
        res[f"{k}_ratio_paired"] = statistics.median(a / b for a, b in zip(times["scatter"][k], times["native"][k]))
        res[f"{k}_native_faster_rounds"] = sum(a > b for a, b in zip(times["scatter"][k], times["native"][k]))
    res["repeats"] = repeats
    return res


# ----------------------------------------------------------------------------- --passes
def _interleaved(fns: Dict[str, Callable[[], object]], repeats: int) -> Dict[str, float]:
    for f in fns.values():
        f()
    ts: Dict[str, List[float]] = {k: [] for k in fns}
    for i in range(repeats):
        for k in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            t0 = time.perf_counter()
            fns[k]()
            ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in ts.items()}


def run_passes(repeats: int, quick: bool) -> List[dict]:
    from gnncompile.ops import transpose_structure

    ops = torch.ops.gnncompile
    shapes = [(100_000, d, F) for d in (3, 5, 10) for F in (16, 64, 128)] + \
             [(20_000, 30, 64), (10_000, 100, 64), (1_000, 1_000, 64)]
    if quick:
        shapes = [(10_000, d, F) for d in (3, 10) for F in (16, 64)]
    out = []
    for N, deg, F in shapes:
        E = N * deg
        ei = power_law_graph(N, E, seed=0)
        rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
        csc = transpose_structure(rowptr, col, perm, N)
        g = torch.Generator().manual_seed(2)
        x = torch.randn(N, F, generator=g)
        _, arg = ops.spmm(rowptr, col, perm, None, x, "max", [])
        grad = torch.where(arg >= 0, torch.randn(N, F, generator=g), torch.zeros(()))
        fns = {
            "scatter": lambda: ag._arg_backward_scatter(x.shape, col, perm, None, x, arg, grad, True, False),
            "csc": lambda: ops.arg_route(rowptr, col, perm, None, arg, grad, N, [0, 1], *csc),
            "winners": lambda: ops.arg_route(rowptr, col, perm, None, arg, grad, N, [0, 2], *csc),
            "rule": lambda: ops.arg_route(rowptr, col, perm, None, arg, grad, N, [], *csc),
        }
        want = fns["scatter"]()[0]
        equal = all(torch.equal(fns[k](), want) for k in ("csc", "winners", "rule"))
        t = _interleaved(fns, repeats)
        out.append({"N": N, "E": E, "F": F, "equal": equal, **{f"{k}_s": v for k, v in t.items()}})
        print(out[-1], flush=True)
    return out


# ----------------------------------------------------------------------------- report
def report(res: dict) -> str:
    ms = 1e3
    lines = [f"Machine: {res['machine']}, {_common.cpu_model()}", ""]
    if "workloads" in res:
        lines += ["| workload | nodes / edges, F | path | step (fwd + bwd) ms | backward ms | first step s |",
                  "|---|---|---|---|---|---|"]
        for w in res["workloads"]:
            if "error" in w:
                lines.append(f"| {w['workload']} | | error: {w['error']} | | | |")
                continue
            for p in PATHS:
                lines.append(f"| {w['workload']} | {w['N']:,} / {w['E']:,}, {w['F']} | {p} | "
                             f"{w[f'step_s_{p}'] * ms:.1f} | {w[f'backward_s_{p}'] * ms:.1f} | "
                             f"{w[f'first_step_s_{p}']:.1f} |")
            lines.append(f"| {w['workload']} | | scatter / native (medians) | "
                         f"{w['step_s_scatter'] / w['step_s_native']:.2f}x | "
                         f"{w['backward_s_scatter'] / w['backward_s_native']:.2f}x | |")
            lines.append(f"| {w['workload']} | | scatter / native (median of the rounds' ratios; rounds "
                         f"native was faster) | {w['step_ratio_paired']:.2f}x ({w['step_native_faster_rounds']}/"
                         f"{w['repeats']}) | {w['backward_ratio_paired']:.2f}x ({w['backward_native_faster_rounds']}/"
                         f"{w['repeats']}) | |")
        lines += [""]
        for w in res["workloads"]:
            if "error" not in w:
                lines.append(f"{w['workload']}: outputs equal bit for bit: {w['outputs_equal']}, gradients: "
                             f"{w['grads_equal']}, max relative difference {w['max_rel_diff']:.1e}; "
                             f"inner compiler {', '.join(w.get('inner_compilers', [])) or '?'}")
        lines += ["", f"Medians of {res['repeats']} rounds, each one step of both paths in alternating order. "
                  "Step = forward, cross-entropy, backward (no optimizer step). gnncompile.compile with "
                  "default settings (inner compiler 'auto'), speed guard off."]
    if "passes" in res:
        lines += ["| nodes | edges | F | scatter ms | CSC pass ms | winner pass ms | rule ms | same bits |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in res["passes"]:
            lines.append(f"| {r['N']:,} | {r['E']:,} | {r['F']} | {r['scatter_s'] * ms:.2f} | {r['csc_s'] * ms:.2f} | "
                         f"{r['winners_s'] * ms:.2f} | {r['rule_s'] * ms:.2f} | {r['equal']} |")
        lines += ["", f"gnncompile::arg_route alone (no weight), medians of {res['repeats']} interleaved calls; "
                  "scatter: the tensor operations it replaced (clamp, gather of the sources, scatter_add_)."]
    lines += [_common.load_text(res["loadavg_before_after"]), "", f"Command: `{res['command']}`"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10k nodes / 100k edges, 3 rounds")
    ap.add_argument("--nodes", type=int, default=None, help="nodes (edges: 10x); default 100000, --quick 10000")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=None, help="rounds (default 9, --quick 3)")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--passes", action="store_true", help="the op's CPU passes instead of the workloads")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    # each path's graphs traced anew: the cache of compiled autograd graphs is keyed by the
    # forward graph, not by the switch the backward formula reads, and would hand the second path
    # the first one's backward (run_workload checks that each path made its own route decisions)
    import torch._functorch.config
    import torch._inductor.config

    torch._functorch.config.enable_autograd_cache = False
    torch._inductor.config.fx_graph_cache = False
    repeats = args.repeats or (3 if args.quick else 9)
    res: dict = {"machine": _common.machine(), "repeats": repeats}
    before = _common.loadavg()
    if args.passes:
        res["passes"] = run_passes(repeats, args.quick)
        name = "arg_backward_passes" + ("_quick" if args.quick else "")
    else:
        N = args.nodes or (10_000 if args.quick else 100_000)
        res["workloads"] = []
        for w in args.workloads:
            try:
                res["workloads"].append(run_workload(w, N, args.features, repeats))
            except Exception as e:  # recorded, the other workload still runs
                res["workloads"].append({"workload": w, "error": _error(e)})
            torch._dynamo.reset()
        name = "arg_backward" + ("_quick" if args.quick else "")
    res["loadavg_before_after"] = [before, _common.loadavg()]
    res["command"] = _common.command("arg_backward", argv)
    _common.write_results(_common.RESULTS, name, res, report, json_default=str)


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"[:300]


if __name__ == "__main__":
    main()
