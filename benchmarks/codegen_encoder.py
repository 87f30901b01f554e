"""An edge encoder inside a generated message kernel (side enc, gnncompile/ops/program.py) against the tuned spmm.

    python -m benchmarks codegen_encoder            # 100k nodes / 1M edges, F = 128, D = 16, 2 threads
    python -m benchmarks codegen_encoder --quick    # 10k nodes / 100k edges, fewer rounds

A power-law graph (gnncompile.data.synthetic.power_law_graph, N nodes, 10 N edges, seed 0), its
CSR by destination (gnncompile::build_csr), node features x [N, F], edge features a [E, D] and a
linear map (Wt [D, F], b [1, F]), float32, N(0, 1). Variants, each the forward sum over every row:

  spmm                 gnncompile's tuned spmm of x_j (no weight): the floor a message kernel is
                       measured against (issue 25: the fused encoder within 1.5x of it)
  generated            relu(x_j + lin(a_e)), lin computed per edge inside the generated kernel
                       (b + a[e] @ Wt, the E x F encoded edges never in memory)
  interpreter          the same program run by the interpreter (native/cpu/message_core.h)
  encoder_alone        the generated kernel of the sum of lin(a_e) alone (no x_j): what computing
                       the encoder costs, its feature rows read through the edge permutation
  materialized         the unfused alternative: e = torch.addmm(b, a, Wt) ([E, F] written), then
                       the generated kernel of relu(x_j + e) reading e per edge

Agreement before any timing: generated and interpreted results bit for bit; the materialized
variant close to them (addmm sums in its own order). Then --rounds rounds, each calling every
variant once in turn; medians, and the median of the rounds' ratios to spmm.

Writes benchmarks/results/codegen_encoder[_quick].{json,md}.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Dict, List

import torch

from gnncompile import codegen
from gnncompile.codegen import build
from gnncompile.data.synthetic import power_law_graph
from gnncompile.ops import program as P
from gnncompile.ops.schemas import ops

from . import _common


def _rounds(fns: Dict[str, tuple], rounds: int) -> Dict[str, List[float]]:
    """``fns``: name -> (setup, call); only the call is timed."""
    for setup, fn in fns.values():  # warm-up
        setup()
        fn()
    times: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, (setup, fn) in fns.items():
            setup()
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return times


def _summary(times: Dict[str, List[float]], base: str) -> Dict[str, dict]:
    out = {}
    for k, ts in times.items():
        ratios = [t / b for t, b in zip(ts, times[base])]
        out[k] = {"median_ms": 1e3 * statistics.median(ts), "min_ms": 1e3 * min(ts), "max_ms": 1e3 * max(ts),
                  "ratio_to_" + base: statistics.median(ratios), "n": len(ts)}
    return out


def run(N: int, F: int, D: int, rounds: int) -> dict:
    torch.manual_seed(0)
    ei = power_law_graph(N, 10 * N, seed=0)
    E = int(ei.size(1))
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g)
    a = torch.randn(E, D, generator=g)
    wt = torch.randn(D, F, generator=g) / D ** 0.5
    b = torch.randn(1, F, generator=g)
    knobs: List[int] = []
    relu = P.encode(P.node("relu", P.node("add", P.inp(0), P.inp(1))))
    enc_ins, enc_sides = [x, a, wt, b], [P.COL, P.ENC, P.CONST, P.CONST]
    code, consts = relu

    def run_enc():
        return ops.message_reduce(rowptr, col, perm, enc_ins, enc_sides, code, consts, F, "sum", knobs, [], None)[0]

    def run_materialized():
        e = torch.addmm(b, a, wt)
        return ops.message_reduce(rowptr, col, perm, [x, e], [P.COL, P.EDGE], code, consts, F, "sum", knobs, [],
                                  None)[0]

    alone = P.encode(P.inp(0))

    def run_alone():
        return ops.message_reduce(rowptr, col, perm, [a, wt, b], [P.ENC, P.CONST, P.CONST], *alone, F, "sum", knobs,
                                  [], None)[0]

    def run_spmm():
        return ops.spmm(rowptr, col, perm, None, x, "sum", knobs)[0]

    e_like = torch.empty(E, F)
    codegen.reset()
    ref = run_enc()  # the interpreter
    t0 = time.perf_counter()
    ok = [codegen.prepare(enc_ins, enc_sides, code, consts, F, "sum", rowptr.dtype, force=True),
          codegen.prepare([x, e_like], [P.COL, P.EDGE], code, consts, F, "sum", rowptr.dtype, force=True),
          codegen.prepare([a, wt, b], [P.ENC, P.CONST, P.CONST], *alone, F, "sum", rowptr.dtype, force=True)]
    prepare_s = time.perf_counter() - t0
    del e_like
    if not all(ok):
        raise RuntimeError("codegen_encoder benchmark: no generated kernel (no C++ compiler?)")
    calls = codegen.calls()
    gen, mat = run_enc(), run_materialized()
    if codegen.calls() != calls + 2:
        raise RuntimeError("codegen_encoder benchmark: the generated kernels did not run")
    agreement = {"generated_vs_interpreter_bitwise": torch.equal(gen.view(torch.int32), ref.view(torch.int32)),
                 "materialized_vs_generated_close": bool(torch.allclose(mat, gen, rtol=1e-4, atol=1e-3)),
                 "materialized_vs_generated_max_abs_diff": float((mat - gen).abs().max())}
    if not (agreement["generated_vs_interpreter_bitwise"] and agreement["materialized_vs_generated_close"]):
        raise RuntimeError(f"codegen_encoder benchmark: results differ {agreement}")

    def interp():
        codegen.suspend()

    codegen.suspend()
    ref_alone = run_alone()
    codegen.resume()
    calls = codegen.calls()
    gen_alone = run_alone()
    if codegen.calls() != calls + 1:
        raise RuntimeError("codegen_encoder benchmark: the generated kernel of the encoder alone did not run")
    agreement["encoder_alone_generated_vs_interpreter_bitwise"] = torch.equal(gen_alone.view(torch.int32),
                                                                              ref_alone.view(torch.int32))
    if not agreement["encoder_alone_generated_vs_interpreter_bitwise"]:
        raise RuntimeError(f"codegen_encoder benchmark: results differ {agreement}")
    times = _rounds({"spmm": (codegen.resume, run_spmm), "generated": (codegen.resume, run_enc),
                     "materialized": (codegen.resume, run_materialized), "interpreter": (interp, run_enc),
                     "encoder_alone": (codegen.resume, run_alone)}, rounds)
    codegen.reset()
    return {"N": N, "E": E, "F": F, "D": D, "dtype": "float32", "prepare_in_process_s": prepare_s,
            "agreement": agreement, "forward_sum": _summary(times, "spmm")}


def markdown(p: dict) -> str:
    r = p["result"]
    lines = [f"# An edge encoder inside a generated message kernel (`{p['command']}`)", "",
             f"CPU: {p['cpu']}, {p['threads']} threads; {r['N']:,} nodes / {r['E']:,} edges power-law, "
             f"F = {r['F']}, D = {r['D']}, {r['dtype']}; compiler: {p['compiler']}; flags: {' '.join(p['flags'])}. "
             f"{_common.load_text(p['loadavg_before_after'])}.", "",
             "Program: the forward sum over every row of relu(x_j + lin(a_e)), lin(a_e) = b + a_e @ Wt.", "",
             "Agreement (checked before timing): " + ", ".join(f"{k} = {v}" for k, v in r["agreement"].items()) + ".",
             "", "| variant | median ms | min ms | ratio to spmm (median of rounds) |", "|---|---|---|---|"]
    for k, v in r["forward_sum"].items():
        lines.append(f"| {k} | {v['median_ms']:.1f} | {v['min_ms']:.1f} | {v['ratio_to_spmm']:.2f}x |")
    gen = r["forward_sum"]["generated"]["ratio_to_spmm"]
    lines += ["", f"Generated (encoder inside) / spmm of x_j = {gen:.2f} (issue 25's target: within 1.5x).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k nodes / 100k edges, fewer rounds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dim", type=int, default=16, help="D, the edge features")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    N = 10_000 if args.quick else 100_000
    rounds = 5 if args.quick else args.rounds
    load0 = _common.loadavg()
    res = run(N, 128, args.dim, rounds)
    payload = {"command": _common.command("codegen_encoder", argv), "cpu": _common.cpu_model(),
               "threads": args.threads, "machine": _common.machine(),
               "compiler": build._compiler_identity(build.compiler()),
               "flags": build.module_flags() + list(build.BASE_FLAGS), "result": res,
               "loadavg_before_after": [load0, _common.loadavg()]}
    _common.write_results(_common.RESULTS, "codegen_encoder_quick" if args.quick else "codegen_encoder", payload,
                          markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
