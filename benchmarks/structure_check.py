"""Cost of the structure cache's content check (gnncompile.ops.set_structure_check, issue 14).

    python -m benchmarks structure_check            # tiny graph + 1M edges + compiled GraphSAGE step
    python -m benchmarks structure_check --quick    # fewer repeats, no compiled step

Every identity hit of the structure cache on a CPU edge_index recomputes the edge_index's
content fingerprint (gnncompile::fingerprint) when the check is on ("cpu", the default); "off"
trusts the version counter alone. Measured, check on vs off, interleaved call by call (block by
block on the tiny graph) so that drift on a shared machine hits both alike, medians:

  * ops.spmm per call on a tiny graph (100 nodes, 500 edges, F = 16): the per-call overhead;
  * on 100k nodes / 1M edges (power-law): the fingerprint alone, one ops.spmm forward at
    F = 128, and one training step of a compiled 2-layer GraphSAGE (hidden 128, Adam,
    cross-entropy, default inner compiler), with the number of checked lookups per step.

Writes benchmarks/results/structure_check[_quick].{json,md}.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Callable, Dict, List

import torch

import gnncompile
from gnncompile.data.synthetic import power_law_graph
from gnncompile.ops import spmm, structure

from . import _common

MODES = ("cpu", "off")


def ab(fn: Callable[[], object], repeats: int, block: int = 1) -> Dict[str, float]:
    """Median seconds per call of fn with the check on ("cpu") and off, interleaved per block."""
    times: Dict[str, List[float]] = {m: [] for m in MODES}
    for m in MODES:  # warm-up in each mode
        structure.set_structure_check(m)
        fn()
    for _ in range(repeats):
        for m in MODES:
            structure.set_structure_check(m)
            t0 = time.perf_counter()
            for _ in range(block):
                fn()
            times[m].append((time.perf_counter() - t0) / block)
    structure.set_structure_check("cpu")
    return {m: statistics.median(ts) for m, ts in times.items()}


def tiny(repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 100, (2, 500), generator=g)
    x = torch.randn(100, 16, generator=g)
    ops = torch.ops.gnncompile
    fp = _common.timeit(lambda: ops.fingerprint(ei), repeats * 50)["median"]
    return {"spmm": ab(lambda: spmm(ei, x), repeats, block=50), "fingerprint": fp}


def big(repeats: int) -> dict:
    ei = power_law_graph(100_000, 1_000_000)
    x = torch.randn(100_000, 128)
    ops = torch.ops.gnncompile
    fp = _common.timeit(lambda: ops.fingerprint(ei), repeats * 3)["median"]
    return {"fingerprint": fp, "spmm": ab(lambda: spmm(ei, x), repeats)}


def sage_step(repeats: int) -> dict:
    from torch_geometric.nn import models

    ei = power_law_graph(100_000, 1_000_000)
    x = torch.randn(100_000, 128)
    y = torch.randint(0, 16, (100_000,))
    torch.manual_seed(0)
    model = gnncompile.compile(models.GraphSAGE(128, 128, 2, 16))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x, ei), y).backward()
        opt.step()

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    before = structure.cache_info()["identity_hits"]
    step()
    lookups = structure.cache_info()["identity_hits"] - before
    return {"step": ab(step, repeats), "first_step": first, "identity_lookups_per_step": lookups}


def report(res: dict) -> str:
    t, b = res["tiny"], res["big"]
    us, ms = 1e6, 1e3

    def row(name, d, scale, unit):
        on, off = d["cpu"] * scale, d["off"] * scale
        return f"| {name} | {on:.1f} {unit} | {off:.1f} {unit} | {on - off:+.1f} {unit} ({(on / off - 1) * 100:+.1f}%) |"

    lines = [f"Machine: {res['machine']}", "",
             "| what | check on (cpu) | check off | difference |", "|---|---|---|---|",
             row("ops.spmm, 100 nodes / 500 edges, F=16, per call", t["spmm"], us, "us"),
             row("ops.spmm forward, 100k nodes / 1M edges, F=128", b["spmm"], ms, "ms")]
    if "sage" in res:
        lines.append(row("compiled GraphSAGE training step, 1M edges", res["sage"]["step"], ms, "ms"))
    lines += ["", f"fingerprint alone: {t['fingerprint'] * us:.1f} us on 500 edges, "
              f"{b['fingerprint'] * ms:.2f} ms on 1M edges"]
    if "sage" in res:
        lines.append(f"checked lookups per GraphSAGE step: {res['sage']['identity_lookups_per_step']} "
                     f"(first step {res['sage']['first_step']:.1f} s)")
    if "command" in res:
        lines += ["", f"Command: `{res['command']}`"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    n = args.repeats or (5 if args.quick else 21)
    res = {"machine": _common.machine(), "repeats": n, "tiny": tiny(n * 2), "big": big(n)}
    if not args.quick:
        res["sage"] = sage_step(max(5, n // 2))
    res["command"] = _common.command("structure_check", argv)
    suffix = "_quick" if args.quick else ""
    _common.write_results(_common.RESULTS, f"structure_check{suffix}", res, report)


if __name__ == "__main__":
    main()
