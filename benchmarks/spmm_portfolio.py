"""The spmm portfolio: which implementation a compiled model runs at each point, and both candidates' times there.

    python -m benchmarks spmm_portfolio                       # nodes {20k, 100k} x F {32, 128}, sum and weighted sum
    python -m benchmarks spmm_portfolio --nodes 20000 100000 500000 --features 16 32 64 128 256

At each point (a power-law graph of ``--degree`` x nodes edges, F features, unweighted or one
weight per edge), a one-layer aggregation model (a MessagePassing sum, ``w * x_j`` when weighted)
is compiled with ``choices['spmm_impl'] = 'auto'`` and a cache folder new to the run, so the
portfolio measures each class (gnncompile.compiler.portfolio: at most 2 s, on its own synthetic
graph) at its first compile. Then, on the point's own graph:

* ``native`` / ``torch_sparse``: one forward + backward (gradient of x) of each candidate op,
  called directly on the cached structure (medians over ``--repeats`` calls);
* ``compiled``: one forward + backward of the compiled model, and the implementation it ran,
  counted from torch's profiler (``gnncompile::spmm`` / ``gnncompile::spmm_sparse`` events);
* ``decision``: what explain says of the model's spmm (the measured class times, or why the
  other candidate is not admitted);
* ``bitwise``: whether both candidates give the same bits here (forward and gradient).

Writes benchmarks/results/spmm_portfolio.{json,md}.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch
from torch_geometric.nn import MessagePassing

import gnncompile
from gnncompile.compiler import portfolio
from gnncompile.data.synthetic import power_law_graph
from gnncompile.ops import structure as S

from . import _common


class Aggregate(MessagePassing):
    def __init__(self):
        super().__init__(aggr="add")

    def forward(self, x, edge_index, w=None):
        return self.propagate(edge_index, x=x, w=w)

    def message(self, x_j, w):
        return x_j if w is None else w.view(-1, 1) * x_j


def _ran(fn) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    names = [e.name for e in prof.events()]
    n, v = names.count("gnncompile::spmm"), names.count("gnncompile::spmm_sparse")
    return "native" if n and not v else "torch_sparse" if v and not n else f"native x{n}, torch_sparse x{v}"


def point(N: int, degree: int, F: int, weighted: bool, repeats: int) -> dict:
    E = N * degree
    ei = power_law_graph(N, E, seed=0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g)
    w = torch.rand(E, generator=g) if weighted else None
    go = torch.randn(N, F, generator=g)
    s = S.structure(ei, N)
    csr, csc = (s.rowptr, s.col, s.perm), s.transposed(N)
    xr = x.clone().requires_grad_()

    def op_step(impl):
        def run():
            xr.grad = None
            portfolio.run_candidate(impl, csr, csc, w, xr).backward(go)
            return xr.grad
        return run

    a, b = op_step("native")(), op_step("torch_sparse")()
    with torch.no_grad():
        fa, fb = portfolio.run_candidate("native", csr, csc, w, x), portfolio.run_candidate("torch_sparse", csr, csc, w, x)
    bitwise = bool(torch.equal(fa, fb) and torch.equal(a, b))
    torch.testing.assert_close(fb, fa, rtol=1e-4, atol=1e-4)  # the candidates agree before they are timed
    res = {"N": N, "E": E, "F": F, "weighted": weighted, "bitwise": bitwise}
    for impl in ("native", "torch_sparse"):
        res[impl] = _common.timeit(op_step(impl), repeats)["median"]

    torch._dynamo.reset()
    model = gnncompile.compile(Aggregate(), profile=None,
                               settings={"choices": {"spmm_impl": "auto", "guard": "off"}})
    args = (xr, ei) if w is None else (xr, ei, w)

    def compiled_step():
        xr.grad = None
        model(*args).backward(go)
        return xr.grad

    torch.testing.assert_close(compiled_step(), a, rtol=1e-4, atol=1e-4)
    res["compiled"] = _common.timeit(compiled_step, repeats)["median"]
    res["ran"] = _ran(compiled_step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = gnncompile.explain(model, *args)
    res["decision"] = "; ".join(f.impl for f in rep.fused if f.kind == "spmm") or "(no fused spmm)"
    return res


def table(p: dict) -> str:
    lines = [f"CPU: {p['cpu']}, {p['machine']['threads']} threads, torch {p['machine']['torch']}. "
             f"{_common.load_text(p['loadavg_before_after'])}.",
             f"Command: `{p['command']}`. Times: one forward + backward (gradient of x), ms, medians of "
             f"{p['repeats']}.", "",
             "| nodes | edges | F | weights | native | torch_sparse | bitwise equal | compiled model | ran | "
             "why (explain) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in p["results"]:
        lines.append(f"| {r['N']:,} | {r['E']:,} | {r['F']} | {'per edge' if r['weighted'] else 'none'} "
                     f"| {r['native'] * 1e3:.1f} | {r['torch_sparse'] * 1e3:.1f} | {'yes' if r['bitwise'] else 'no'} "
                     f"| {r['compiled'] * 1e3:.1f} | {r['ran']} | {r['decision']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, nargs="+", default=[20_000, 100_000])
    p.add_argument("--features", type=int, nargs="+", default=[32, 128])
    p.add_argument("--degree", type=int, default=10, help="edges per node (default 10)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path, default=_common.RESULTS)
    args = p.parse_args(argv)
    if not gnncompile.info()["native"]:
        print("the native kernels are not loaded: nothing to compare", file=sys.stderr)
        return 2
    before = _common.loadavg()
    results = []
    with tempfile.TemporaryDirectory() as cache:
        os.environ["GNNCOMPILE_CACHE_DIR"] = cache  # every class measured in this run
        for N in args.nodes:
            for F in args.features:
                for weighted in (False, True):
                    r = point(N, args.degree, F, weighted, args.repeats)
                    print(f"N={N:,} F={F} {'weighted' if weighted else 'plain'}: native {r['native'] * 1e3:.1f} ms, "
                          f"torch_sparse {r['torch_sparse'] * 1e3:.1f} ms, compiled {r['compiled'] * 1e3:.1f} ms "
                          f"ran {r['ran']}", flush=True)
                    results.append(r)
    payload = {"machine": _common.machine(), "cpu": _common.cpu_model(), "command": _common.command("spmm_portfolio", argv),
               "repeats": args.repeats, "loadavg_before_after": [before, _common.loadavg()], "results": results}
    _common.write_results(args.out, "spmm_portfolio", payload, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
