"""Differential fuzzing of the compiler against eager, as long a run as a budget allows.

    python -m benchmarks fuzz_messages                      # 10 minutes, seeds from 1000
    python -m benchmarks fuzz_messages --minutes 60 --start 1000
    python -m benchmarks fuzz_messages --cases 50           # a fixed number of cases

Random user MessagePassing layers (gnncompile/testing/fuzz.py: elementwise messages over x_i,
x_j, edge features, edge weights and parameters; modelled and unmodelled operations with every
argument form, in-place writes, rounding and integer operations, NaN / infinities / signed zeros
in the inputs, ties), 10 per case, each case compiled (inner aot_eager) and compared with eager
in float64: outputs and the gradients of the features, edge features, edge weights and every
parameter. The test suite runs seeds 0-29 (tests/passes/test_fuzz_messages.py); this script starts
elsewhere so that it tries layers the suite does not. A mismatch is narrowed down to the
layers that cause it, and their sources are written to the results.

Writes benchmarks/results/fuzz_messages.{json,md} (no plot: the counts are the result).
"""
from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

from gnncompile.testing import fuzz

from . import _common


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="time budget (ignored with --cases)")
    ap.add_argument("--cases", type=int, default=None, help="run exactly this many cases")
    ap.add_argument("--start", type=int, default=1000, help="first seed")
    ap.add_argument("--layers", type=int, default=10, help="layers per case")
    ap.add_argument("--out", default=str(_common.RESULTS))
    ap.add_argument("--name", default="fuzz_messages")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    deadline = time.monotonic() + args.minutes * 60
    t0 = time.monotonic()
    seed, cases, layers, forward_only, skipped = args.start, 0, 0, 0, 0
    mismatches = []
    while (args.cases is None and time.monotonic() < deadline) or (args.cases is not None and cases < args.cases):
        case = fuzz.random_case(seed, layers=args.layers)
        res, bad = fuzz.check(case)
        cases += 1
        layers += len(case.layers)
        forward_only += res.forward_only
        skipped += res.skipped
        if not res.ok:
            mismatches.append({"seed": seed, "detail": res.detail,
                               "layers": [{"index": i, "aggr": case.layers[i][1], "source": case.layers[i][0]}
                                          for i in bad]})
            print(f"seed {seed}: MISMATCH {res.detail}", flush=True)
        if cases % 10 == 0:
            print(f"{cases} cases, {layers} layers, {len(mismatches)} mismatching, "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
        seed += 1
    payload = {"machine": _common.machine(), "first_seed": args.start, "last_seed": seed - 1, "cases": cases,
               "layers": layers, "layers_per_case": args.layers, "mismatching_cases": len(mismatches),
               "mismatching_layers": sum(len(m["layers"]) for m in mismatches),
               "forward_only_layers": forward_only, "skipped_cases": skipped,
               "seconds": round(time.monotonic() - t0, 1), "dtype": "float64", "inner": "aot_eager",
               "command": _common.command("fuzz_messages", argv), "mismatches": mismatches}
    _common.write_results(Path(args.out), args.name, payload, markdown)
    return 1 if mismatches else 0


def markdown(p: dict) -> str:
    lines = [
        "# Differential fuzzing: random message layers, compiled vs eager",
        "",
        f"Machine: {p['machine']['device']}, torch {p['machine']['torch']}, {p['machine']['threads']} threads. "
        f"Seeds {p['first_seed']}-{p['last_seed']}, {p['layers_per_case']} layers per case, {p['dtype']}, "
        f"inner compiler {p['inner']}, {p['seconds']} s. Command: `{p['command']}`.",
        "",
        "| cases | layers | mismatching cases | mismatching layers | layers compared forward only | cases eager rejects |",
        "|---|---|---|---|---|---|",
        f"| {p['cases']} | {p['layers']} | {p['mismatching_cases']} | {p['mismatching_layers']} | "
        f"{p['forward_only_layers']} | {p['skipped_cases']} |",
        "",
        "Forward only: eager's own backward refuses the layer (an in-place write to a tensor it saved).",
    ]
    for m in p["mismatches"]:
        lines += ["", f"## seed {m['seed']}", "", m["detail"]]
        for lay in m["layers"]:
            lines += ["", f"layer {lay['index']} (aggr {lay['aggr']}):", "", "```python", lay["source"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
