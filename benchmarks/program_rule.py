"""When message programs pay: one GINEConv layer with and without them, by edge count and degree.

    python -m benchmarks program_rule                 # degrees 2, 4, 10 x 6.6k, 20k, 60k, 200k edges
    python -m benchmarks program_rule --quick         # degrees 2, 10 x 6.6k edges

The measurements behind ``gnncompile.passes.match.PROGRAM_MIN_EDGES`` (the rule
``Settings.choices['programs'] == 'auto'`` applies). Layer: ``GINEConv(MLP(64, 64, 64),
edge_dim=8)`` on a random graph of ``E / degree`` nodes, node features of width 64 (requiring
grad), edge features of width 8; one step = forward, ``out.sum().backward()``. Variants, all in
this process (Dynamo reset between them): ``eager``; ``gnncompile.compile(settings={'choices':
{'programs': 'always', 'guard': 'off'}})`` (the message as a program); the same with ``'never'``
(the message as written, everything else compiled). The speed guard is off in both (it would
race each form against its unrewritten piece and keep the faster: the rule is measured here). Median over ``max(5, 2e6 / E)`` steps after 3 warm-up steps;
outputs checked against eager first. Writes benchmarks/results/program_rule[_quick].{json,md}.
A shared machine is noisy: read the ratios, and repeat a run before trusting one row.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import gnncompile  # (the installed package; imported before anything else)
import torch

from . import _common

VARIANTS = ("eager", "always", "never")


def _layer():
    from torch_geometric.nn import GINEConv

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    return GINEConv(mlp, edge_dim=8)


def measure(edges: int, degree: int) -> dict:
    n = max(2, edges // degree)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 64, generator=g, requires_grad=True)
    ei = torch.randint(0, n, (2, edges), generator=g)
    ea = torch.randn(edges, 8, generator=g)
    layer = _layer()
    expect = layer(x, ei, ea)
    out = {"edges": edges, "degree": degree, "nodes": n}
    for v in VARIANTS:
        torch._dynamo.reset()
        run = layer if v == "eager" else gnncompile.compile(layer, dynamic=False,
                                                            settings={"choices": {"programs": v, "guard": "off"}})
        torch.testing.assert_close(run(x, ei, ea), expect, rtol=1e-4, atol=1e-4)
        for _ in range(3):
            run(x, ei, ea).sum().backward()
        times = []
        for _ in range(max(5, int(2e6 // edges))):
            t0 = time.perf_counter()
            run(x, ei, ea).sum().backward()
            times.append(time.perf_counter() - t0)
        out[f"{v}_ms"] = statistics.median(times) * 1e3
    return out


def markdown(p: dict) -> str:
    lines = ["| degree | edges | eager ms | programs ms | without programs ms | programs / without | rule says |",
             "|---|---|---|---|---|---|---|"]
    from gnncompile.passes.match import programs_pay

    for r in p["rows"]:
        pays = programs_pay(r["edges"], r["nodes"])[0]
        lines.append(f"| {r['degree']} | {r['edges']} | {r['eager_ms']:.2f} | {r['always_ms']:.2f} | "
                     f"{r['never_ms']:.2f} | {r['always_ms'] / r['never_ms']:.2f} | "
                     f"{'programs' if pays else 'as written'} |")
    m = p["machine"]
    lines += ["", f"GINEConv(MLP(64, 64, 64), edge_dim=8), forward + backward, median step; {p['threads']} "
              f"threads, torch {m['torch']}, CPU {p['cpu']}. {_common.load_text(p['loadavg_before_after'])} "
              f"(a shared machine). Command: `{p['command']}`"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="degrees 2, 10 at 6.6k edges")
    ap.add_argument("--degrees", default=None, help="comma list (default 2,4,10)")
    ap.add_argument("--edges", default=None, help="comma list (default 6600,20000,60000,200000)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(opts.threads)
    degrees = [int(d) for d in (opts.degrees or ("2,10" if opts.quick else "2,4,10")).split(",")]
    sizes = [int(e) for e in (opts.edges or ("6600" if opts.quick else "6600,20000,60000,200000")).split(",")]
    load_before = _common.loadavg()
    rows = []
    for d in degrees:
        for e in sizes:
            rows.append(measure(e, d))
            r = rows[-1]
            print(f"degree {d} edges {e}: eager {r['eager_ms']:.2f} ms, programs {r['always_ms']:.2f} ms, "
                  f"without {r['never_ms']:.2f} ms", flush=True)
    payload = {"machine": _common.machine(), "cpu": _common.cpu_model(), "threads": opts.threads, "rows": rows,
               "loadavg_before_after": [load_before, _common.loadavg()],
               "command": _common.command("program_rule", argv)}
    name = opts.out or ("program_rule_quick" if opts.quick else "program_rule")
    _common.write_results(Path(opts.results_dir), name, payload, markdown)
    return payload


if __name__ == "__main__":
    main()
