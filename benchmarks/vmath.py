"""The float32 math of message programs (native/cpu/vmath.h): its accuracy, and what each
transcendental operator costs in a generated kernel.

    python -m benchmarks vmath                         # ulp table + per-op timing, 100k / 1M, F 128
    python -m benchmarks vmath --timing-only --json PATH   # per-op timing only (runs on older trees)
    python -m benchmarks vmath --ulp-only

Accuracy: every function of vmath.h over gnncompile.testing.vmath.sweep (2^20 float32 values over
its range: evenly by bit pattern on each side of 0, plus a linear grid) and the special values,
against torch's float64 value, in float32 ulp at the reference (the largest error, and where).

Per-op cost: a power-law graph (power_law_graph(N, 10 N, seed 0)), its CSR by destination, x
[N, F] float32 N(0, 1); for each program op(x_j) summed over each row, the generated kernel
(gnncompile/codegen) and the interpreter (native/cpu/message_core.h), checked bit for bit equal
before timing; then --rounds rounds, each calling every variant once in turn; medians and the
median of the rounds' ratios to relu(x_j)'s generated kernel. Only APIs older trees have are
used, so the timing part also runs with gnncompile imported from an earlier checkout for a
before / after table (``--before out.json`` adds it to the report): build the checkout with
``python -m benchmarks commit_ab --prepare-only --base REV`` (build/commit_ab/<sha>), then in that
folder run this file as a script with ``--timing-only --json out.json`` from a Python whose
meta path has the editable install's finder removed and whose import path starts with the folder
(as commit_ab's child boots; PYTHONPATH alone still imports this checkout's gnncompile).

Writes benchmarks/results/vmath.{json,md} (``--name``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

try:  # run as `python -m benchmarks vmath` or as a plain script against another tree
    from . import _common
except ImportError:  # pragma: no cover - the script form
    _common = None

PROGRAMS = ("relu", "exp", "tanh", "sigmoid", "gelu", "sigmoid*softplus", "elu", "log|x|")


def _expr(name: str):
    from gnncompile.ops import program as P
    x = P.inp(0)
    if name == "sigmoid*softplus":
        return P.node("mul", P.node("sigmoid", x), P.node("softplus", x, params=(1.0, 20.0)))
    if name == "elu":
        return P.node("elu", x, params=(1.0,))
    if name == "log|x|":
        return P.node("log", P.node("abs", x))
    return P.node(name, x)


def timing(N: int, F: int, rounds: int, threads: int) -> dict:
    from gnncompile import codegen, config
    from gnncompile.data.synthetic import power_law_graph
    from gnncompile.ops import program as P
    from gnncompile.ops.schemas import ops

    torch.set_num_threads(threads)
    ei = power_law_graph(N, 10 * N, seed=0)
    E = int(ei.size(1))
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
    x = torch.randn(N, F, generator=torch.Generator().manual_seed(1))
    runs = {}
    agree = {}
    with config.override(codegen="auto"):
        for name in PROGRAMS:
            code, consts = P.encode(_expr(name))

            def call(code=code, consts=consts):
                return ops.message_reduce(rowptr, col, perm, [x], [P.COL], code, consts, F, "sum", [], [], None)[0]

            codegen.reset()
            interp = call()
            if not codegen.prepare([x], [P.COL], code, consts, F, "sum", rowptr.dtype):
                raise RuntimeError(f"vmath benchmark: the generated kernel of {name} was not built")
            before = codegen.calls()
            gen = call()
            if codegen.calls() != before + 1:
                raise RuntimeError(f"vmath benchmark: {name}'s generated kernel did not run")
            nan = interp.isnan()
            agree[name] = bool(torch.equal(nan, gen.isnan()) and torch.equal(interp[~nan], gen[~nan]))
            runs[name] = (code, consts, call)
        if not all(agree.values()):
            raise RuntimeError(f"vmath benchmark: generated != interpreter: {agree}")
        times: Dict[str, Dict[str, List[float]]] = {n: {"generated": [], "interpreter": []} for n in PROGRAMS}
        for name, (code, consts, call) in runs.items():  # warm-up
            codegen.prepare([x], [P.COL], code, consts, F, "sum", rowptr.dtype)
            call()
        for _ in range(rounds):
            for name, (code, consts, call) in runs.items():
                for variant in ("generated", "interpreter"):
                    if variant == "generated":
                        codegen.resume()
                    else:
                        codegen.suspend()
                    t0 = time.perf_counter()
                    call()
                    times[name][variant].append(time.perf_counter() - t0)
        codegen.resume()
    out = {"N": N, "E": E, "F": F, "threads": threads, "rounds": rounds, "agreement_bitwise": agree, "ops": {}}
    base = times["relu"]["generated"]
    for name in PROGRAMS:
        row = {}
        for variant, ts in times[name].items():
            row[variant] = {"median_ms": statistics.median(ts) * 1e3, "min_ms": min(ts) * 1e3,
                            "ratio_to_relu_generated": statistics.median(t / b for t, b in zip(ts, base))}
        out["ops"][name] = row
    return out


def accuracy() -> dict:
    from gnncompile.testing import vmath
    return {name: vmath.measure(name) for name in vmath.FUNCTIONS}


def markdown(p: dict) -> str:
    lines = [f"# Vectorized float32 math of message programs (`{p['command']}`)", "",
             f"CPU: {p['cpu']}; compiler flags of the kernels: {' '.join(p.get('flags', []))}. "
             f"{p.get('load', '')}", ""]
    if "accuracy" in p:
        lines += ["## Accuracy (native/cpu/vmath.h against float64, float32 ulp)", "",
                  "| function | sweep points | max ulp (sweep) | at x | max ulp (special values) |",
                  "|---|---|---|---|---|"]
        for name, m in p["accuracy"].items():
            lines.append(f"| {name} | {m['sweep_points']:,} | {m['sweep_max_ulp']:.3f} | {m['sweep_at']:.6g} | "
                         f"{m['specials_max_ulp']:.3f} |")
        lines.append("")
    for side in ("before", "after"):
        t = p.get(side)
        if not t:
            continue
        lines += [f"## Per-op cost, {side} ({t.get('tree', '')}): op(x_j) summed per row, "
                  f"{t['N']:,} nodes / {t['E']:,} edges, F = {t['F']}, float32, {t['threads']} threads, "
                  f"{t['rounds']} rounds", "",
                  "| program | generated ms (median) | x relu generated | interpreter ms (median) | "
                  "x relu generated |", "|---|---|---|---|---|"]
        for name, row in t["ops"].items():
            g, i = row["generated"], row["interpreter"]
            lines.append(f"| {name} | {g['median_ms']:.1f} | {g['ratio_to_relu_generated']:.2f}x | "
                         f"{i['median_ms']:.1f} | {i['ratio_to_relu_generated']:.2f}x |")
        lines += ["", "Generated and interpreted results bit for bit equal before timing: "
                  + ", ".join(f"{k} {v}" for k, v in t["agreement_bitwise"].items()) + ".", ""]
    if p.get("before") and p.get("after"):
        lines += ["## After / before (generated kernel, median ms)", "", "| program | before | after | speed-up |",
                  "|---|---|---|---|"]
        for name, row in p["after"]["ops"].items():
            b = p["before"]["ops"].get(name)
            if b:
                bm, am = b["generated"]["median_ms"], row["generated"]["median_ms"]
                lines.append(f"| {name} | {bm:.1f} | {am:.1f} | {bm / am:.2f}x |")
        lines.append("")
    for k, v in p.get("notes", {}).items():
        lines += [f"{k}: {v}", ""]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timing-only", action="store_true")
    ap.add_argument("--ulp-only", action="store_true")
    ap.add_argument("--json", type=Path, help="--timing-only: write the timing here (no report)")
    ap.add_argument("--before", type=Path, help="a --timing-only JSON of an earlier tree, shown beside this one")
    ap.add_argument("--tree", default="", help="a label for the tree timed (the report's heading)")
    ap.add_argument("--name", default="vmath")
    opts = ap.parse_args(argv)
    if opts.timing_only:
        t = timing(opts.nodes, opts.features, opts.rounds, opts.threads)
        t["tree"] = opts.tree
        text = json.dumps(t, indent=1)
        if opts.json:
            opts.json.write_text(text)
        print(text)
        return 0
    from gnncompile.codegen import build
    p = {"command": _common.command("vmath", argv), "cpu": _common.cpu_model(), "flags": build.module_flags()
         + list(build.BASE_FLAGS)}
    load0 = _common.loadavg()
    p["accuracy"] = accuracy()
    if not opts.ulp_only:
        p["after"] = timing(opts.nodes, opts.features, opts.rounds, opts.threads)
        p["after"]["tree"] = opts.tree or "this checkout"
        if opts.before:
            p["before"] = json.loads(opts.before.read_text())
    p["load"] = _common.load_text((load0, _common.loadavg()))
    _common.write_results(_common.ROOT / "benchmarks" / "results", opts.name, p, markdown)
    return 0


if __name__ == "__main__":  # the script form (an older tree's gnncompile on PYTHONPATH)
    sys.exit(main())
