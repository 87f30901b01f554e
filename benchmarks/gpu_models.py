"""GPU training step of 2-layer PyG models: gnncompile vs PyG eager vs PyG CSR vs inductor.

    python -m benchmarks gpu_models --out OUTDIR [--nodes 1000000 --models GCN,GraphSAGE,GAT]

The CUDA counterpart of benchmarks/models.py, made to fit a short GPU lease: every variant runs
in this one process, one after the other, on gnncompile.data.synthetic.power_law_graph(N, 10 N)
with F = 128 float32 features. One step = forward, cross-entropy, backward, Adam step. Variants
are those of models.py (eager, csr, inductor, gnncompile); each one's first-step output is
checked against eager (relative error <= 1e-3) before it is timed. Step time is the median over
--repeats steps timed with CUDA events after --warmup steps; first_step_s is the wall time of the
first step (compilation included); peak_bytes is the allocator's high-water mark during one
step above what was allocated before it. gpu_models.json is rewritten after every variant, so a
run cut short keeps what it measured; --budget seconds stops starting new variants in time.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import warnings

import torch

import gnncompile

from . import _common
from .models import _csr_adj, _model, train_step

VARIANTS = ("eager", "csr", "gnncompile", "inductor")
# also accepted by --variants: gnncompile with its speed guard off (the compiled model runs from
# the first call; to tell a slow rewrite from a guard that kept the model as written)
EXTRA_VARIANTS = ("gnncompile_noguard",)


def run_variant(name: str, variant: str, x, ei, y, C: int, args) -> dict:
    N = x.size(0)
    torch.manual_seed(0)
    model = _model(name, x.size(1), C).cuda()
    ref_model = copy.deepcopy(model)
    if variant == "csr":
        adj = _csr_adj(name, ei, N)
        if adj is None:
            return {"skipped": "layer has no sparse-adjacency path"}
        for conv in model.convs:
            if name == "GCN":
                conv.normalize = False
            elif name == "GraphSAGE":
                conv.aggr = "sum"
        graph_arg, run = adj, model
    elif variant == "eager":
        graph_arg, run = ei, model
    elif variant == "inductor":
        graph_arg, run = ei, torch.compile(model)
    elif variant == "gnncompile":
        graph_arg, run = ei, gnncompile.compile(model)
    elif variant == "gnncompile_noguard":
        graph_arg, run = ei, gnncompile.compile(model, settings={"choices": {"guard": "off"}})
    else:
        raise ValueError(variant)
    step = train_step(run, model, x, graph_arg, y)

    with torch.no_grad():
        expect = ref_model(x, ei)
    del ref_model
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out, _ = step()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    err = ((out.detach() - expect).abs().max() / expect.abs().max().clamp(min=1e-12)).item()
    del out, expect
    if err > 1e-3:
        raise AssertionError(f"{variant} disagrees with eager: relative error {err:.2e}")
    _, times = _common.cuda_time(step, args.repeats, args.warmup)
    times = [t / 1e3 for t in times]  # seconds
    peak = _common.cuda_peak_bytes(step)
    res = {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
           "first_step_s": first, "peak_bytes": int(peak), "rel_err": err}
    decisions = getattr(run, "guard_decisions", None)
    if callable(decisions):  # what the speed guard kept, and why
        res["guard"] = [str(d) for d in decisions()]
    if args.explain and variant.startswith("gnncompile"):
        res["explain"] = str(gnncompile.explain(run, x, ei))
    return res


def table(report: dict) -> str:
    lines = [f"GPU training step, {report['device']}, N={report['N']} E={report['E']} F={report['F']}",
             f"{'model':<10} {'variant':<18} {'median ms':>10} {'x eager':>8} {'x csr':>7} "
             f"{'x induct':>8} {'first s':>8} {'peak MiB':>9}"]
    for name, res in report["results"].items():
        def med(v):
            r = res.get(v, {})
            return r.get("median_s")
        for v, r in res.items():
            if "median_s" not in r:
                lines.append(f"{name:<10} {v:<18} {r.get('skipped') or r.get('error')}")
                continue
            m = r["median_s"]
            ratio = [f"{med(p) / m:.2f}" if med(p) else "-" for p in ("eager", "csr", "inductor")]
            kept = "  (guard kept eager)" if any("the whole model" in d and "kept eager" in d
                                                 for d in r.get("guard", ())) else ""
            lines.append(f"{name:<10} {v:<18} {m * 1e3:>10.2f} {ratio[0]:>8} {ratio[1]:>7} "
                         f"{ratio[2]:>8} {r['first_step_s']:>8.1f} {r['peak_bytes'] / 2**20:>9.0f}{kept}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--models", default="GCN,GraphSAGE,GAT")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--explain", action="store_true",
                    help="record gnncompile.explain() of the gnncompile variants in the JSON")
    ap.add_argument("--budget", type=float, default=1e9,
                    help="seconds: no new variant starts after this much time has passed")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_models.py needs a CUDA device", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")
    from gnncompile.data.synthetic import power_law_graph

    t_start = time.perf_counter()
    N = args.nodes
    ei = power_law_graph(N, 10 * N, seed=0).cuda()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, args.features, generator=g).cuda()
    y = torch.randint(0, 16, (N,), generator=g).cuda()
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "gnncompile": gnncompile.__version__, "N": N, "E": int(ei.size(1)),
              "F": args.features, "repeats": args.repeats, "results": {}}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu_models.json")
    for name in args.models.split(","):
        res = report["results"].setdefault(name, {})
        for variant in args.variants.split(","):
            if time.perf_counter() - t_start > args.budget:
                res[variant] = {"skipped": "out of time"}
                continue
            try:
                res[variant] = run_variant(name, variant, x, ei, y, 16, args)
            except Exception as e:  # recorded, and the next variant still runs
                res[variant] = {"error": f"{type(e).__name__}: {e}"[:500]}
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            print(name, variant, json.dumps(res[variant]), flush=True)
            _common.write_json(path, report)
    text = table(report)
    print(text)
    with open(os.path.join(args.out, "gpu_models.txt"), "w") as f:
        f.write(text + "\n")
    return 0 if not any("error" in r for res in report["results"].values() for r in res.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
