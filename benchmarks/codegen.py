"""Generated message kernels (gnncompile/codegen) against the interpreter and the tuned spmm, and
what building and loading one costs.

    python -m benchmarks codegen             # 100k nodes / 1M edges, F = 128, 2 threads
    python -m benchmarks codegen --quick     # 10k nodes / 100k edges, fewer rounds

A power-law graph (gnncompile.data.synthetic.power_law_graph, N nodes, 10 N edges, seed 0), its
CSR by destination (gnncompile::build_csr), node features x [N, F] and an edge term e [E, F] (a
precomputed edge projection, read per edge through perm), float32, N(0, 1). Programs:

  x_j sum           sum over the row of x[col[j]]: the generated kernel, the interpreter
                    (native/cpu/message_core.h) and gnncompile's tuned spmm (gnncompile::spmm,
                    no weight: the same sum, in the same order)
  relu(x_j + e)     sum over the row of relu(x[col[j]] + e[perm[j]]): generated vs interpreter;
                    also forward + backward (x and e need gradients): the generated variant runs
                    generated kernels for the backward's derivative programs too (message_sum_multi
                    over the CSC for x, message_edges for e), prepared at their first use
  gelu(x_j + e)     the same with gelu (std::erf per feature: scalar libm calls in both) in place
                    of relu, generated vs interpreter, and the generated relu kernel beside it:
                    what the transcendental operators, not vectorized, cost
  GINE step         a compiled GINEConv (nn = Linear(F, F), edge_dim = 16) training step: forward,
                    backward, Adam; one compiled model, its message ops switched between the
                    generated kernels and the interpreter (codegen.suspend / resume) per call

Agreement is checked before any timing: generated and interpreted results (and spmm's, for the
x_j sum), and the training steps' gradients, compared bit for bit. Then --rounds rounds, each calling every variant once in turn
(drift on a shared machine hits all alike); medians, and the median of the rounds' ratios.

Build cost, each in a fresh process with an empty cache folder: the first use of a new program
(emit, compile with the system C++ compiler, load, register: codegen.prepare), then the same
program in a second fresh process, loaded from the disk cache. Both exclude importing gnncompile.

Writes benchmarks/results/codegen[_quick].{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Callable, Dict, List

import torch

from gnncompile import codegen, config
from gnncompile.codegen import build
from gnncompile.data.synthetic import power_law_graph
from gnncompile.ops import program as P
from gnncompile.ops.schemas import ops

from . import _common

_CHILD = textwrap.dedent("""
    import json, time
    import torch
    from gnncompile import codegen, config
    from gnncompile.codegen import build
    from gnncompile.ops import program as P
    code, consts = P.encode(P.node("relu", P.node("add", P.inp(0), P.inp(1))))
    x = torch.zeros(4, 128)
    t0 = time.perf_counter()
    ok = codegen.prepare([x, x], [P.COL, P.EDGE], code, consts, 128, "sum")
    print(json.dumps({"ok": ok, "seconds": time.perf_counter() - t0, "stats": build.stats}))
""")


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


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


def cpu_detail() -> str:
    """The CPU as the tables name it (:func:`benchmarks._common.cpu_model`)."""
    return _common.cpu_model()


def build_costs() -> dict:
    """First use in a fresh process with an empty cache, then a second fresh process (disk cache)."""
    with tempfile.TemporaryDirectory(prefix="gnncompile-codegen-bench-") as cache:
        env = dict(os.environ, GNNCOMPILE_CACHE_DIR=cache, GNNCOMPILE_CODEGEN="auto")
        res = []
        for _ in range(2):
            r = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env,
                               cwd=_common.ROOT, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"codegen benchmark child failed: {r.stderr[-2000:]}")
            res.append(json.loads(r.stdout.strip().splitlines()[-1]))
    first, second = res
    if not (first["ok"] and second["ok"] and first["stats"]["builds"] == 1 and second["stats"]["builds"] == 0):
        raise RuntimeError(f"codegen benchmark: unexpected build record {res}")
    return {"first_use_s": first["seconds"], "cached_load_s": second["seconds"], "first": first, "cached": second}


def run(N: int, F: int, rounds: int, rounds_bwd: int, gine_rounds: int = 0) -> dict:
    torch.manual_seed(0)
    ei = power_law_graph(N, 10 * N, seed=0)
    E = int(ei.size(1))
    rowptr, col, perm = ops.build_csr(ei[1], ei[0], N, N)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g)
    e = torch.randn(E, F, generator=g)
    knobs: List[int] = []
    xj = P.encode(P.inp(0))
    relu = P.encode(P.node("relu", P.node("add", P.inp(0), P.inp(1))))
    gelu = P.encode(P.node("gelu", P.node("add", P.inp(0), P.inp(1))))

    def reduce_of(code_consts, ins, sides):
        code, consts = code_consts
        return lambda: ops.message_reduce(rowptr, col, perm, ins, sides, code, consts, F, "sum", knobs, [], None)[0]

    run_xj = reduce_of(xj, [x], [P.COL])
    run_relu = reduce_of(relu, [x, e], [P.COL, P.EDGE])
    run_gelu = reduce_of(gelu, [x, e], [P.COL, P.EDGE])
    run_spmm = lambda: ops.spmm(rowptr, col, perm, None, x, "sum", knobs)[0]  # noqa: E731

    # the interpreter's results, then the generated kernels' (prepared now: not timed here)
    codegen.reset()
    ref_xj, ref_relu, ref_gelu = run_xj(), run_relu(), run_gelu()
    t0 = time.perf_counter()
    ok = [codegen.prepare(i, s, *cc, F, "sum", rowptr.dtype, force=True)
          for i, s, cc in (([x], [P.COL], xj), ([x, e], [P.COL, P.EDGE], relu), ([x, e], [P.COL, P.EDGE], gelu))]
    prepare_s = time.perf_counter() - t0
    if not all(ok):
        raise RuntimeError("codegen benchmark: no generated kernel (no C++ compiler?)")
    calls = codegen.calls()
    gen_xj, gen_relu, gen_gelu = run_xj(), run_relu(), run_gelu()
    assert codegen.calls() == calls + 3, "the generated kernels did not run"
    spmm_xj = run_spmm()
    agreement = {"xj_generated_vs_interpreter_bitwise": _bits_equal(gen_xj, ref_xj),
                 "xj_generated_vs_spmm_bitwise": _bits_equal(gen_xj, spmm_xj),
                 "relu_generated_vs_interpreter_bitwise": _bits_equal(gen_relu, ref_relu),
                 "gelu_generated_vs_interpreter_bitwise": _bits_equal(gen_gelu, ref_gelu)}
    if not all(v for k, v in agreement.items() if "interpreter" in k):
        raise RuntimeError(f"codegen benchmark: results differ {agreement}")

    def interp(fn):
        return codegen.reset, fn

    def generated(fn, i, s, cc):  # registers the loaded kernel again before the timed call
        return (lambda: codegen.prepare(i, s, *cc, F, "sum", rowptr.dtype, force=True)), fn

    # every variant sets its path before its timed call (reset / prepare: a registry update)
    t_xj = _rounds({"spmm": (codegen.reset, run_spmm), "interpreter": interp(run_xj),
                    "generated": generated(run_xj, [x], [P.COL], xj)}, rounds)
    # the same message with gelu (erf, a scalar libm call per feature, in both) in place of relu:
    # what the transcendental operators cost the generated kernels
    t_gelu = _rounds({"interpreter": interp(run_gelu), "generated": generated(run_gelu, [x, e], [P.COL, P.EDGE], gelu),
                      "generated_relu": generated(run_relu, [x, e], [P.COL, P.EDGE], relu)}, max(3, rounds // 3))
    t_relu = _rounds({"interpreter": interp(run_relu),
                      "generated": generated(run_relu, [x, e], [P.COL, P.EDGE], relu)}, rounds)

    xr, er = x.clone().requires_grad_(), e.clone().requires_grad_()
    code_r, consts_r = relu

    def step():
        xr.grad = er.grad = None
        out = ops.message_reduce(rowptr, col, perm, [xr, er], [P.COL, P.EDGE], code_r, consts_r, F, "sum", knobs,
                                 [], None)[0]
        out.backward(torch.ones_like(out))
        return out

    # forward + backward: the interpreter everywhere (mode off, nothing registered), then the
    # generated kernels everywhere (mode auto: the backward prepares its own at first use)
    def interp_step():
        codegen.suspend()
        with config.override(codegen="off"):
            return step()

    def generated_step():
        codegen.resume()
        with config.override(codegen="auto"):
            return step()

    grads = {}
    calls = codegen.calls()
    for name, fn in (("interpreter", interp_step), ("generated", generated_step)):
        fn()
        grads[name] = (xr.grad.clone(), er.grad.clone())
    bwd_calls = codegen.calls() - calls
    agreement["relu_fwd_bwd_grads_bitwise"] = all(_bits_equal(a, b) for a, b in zip(grads["interpreter"],
                                                                                     grads["generated"]))
    if not agreement["relu_fwd_bwd_grads_bitwise"] or bwd_calls < 3:
        raise RuntimeError(f"codegen benchmark: training step differs or ran no generated backward "
                           f"({agreement}, {bwd_calls} generated calls)")
    t_bwd = _rounds({"interpreter": ((lambda: None), interp_step), "generated": ((lambda: None), generated_step)},
                    rounds_bwd)
    result = {"N": N, "E": E, "F": F, "dtype": "float32", "prepare_in_process_s": prepare_s,
              "agreement": agreement, "generated_calls_per_fwd_bwd_step": bwd_calls,
              "xj_sum": _summary(t_xj, "spmm"), "relu_xj_e": _summary(t_relu, "interpreter"),
              "gelu_xj_e": _summary(t_gelu, "interpreter"), "relu_xj_e_fwd_bwd": _summary(t_bwd, "interpreter")}
    del xr, er, grads
    if gine_rounds:
        result["gine_step"], agreement["gine_step_bitwise"] = gine_step(ei, x, F, gine_rounds)
    codegen.reset()
    return result


def gine_step(ei: torch.Tensor, x: torch.Tensor, F: int, rounds: int):
    """A compiled GINEConv training step (forward, backward, Adam), generated vs interpreter: one
    compiled model (prepared with the mode on), its message ops switched per call."""
    import copy

    import gnncompile
    from torch_geometric.nn import GINEConv

    E = ei.size(1)
    g = torch.Generator().manual_seed(2)
    ea = torch.randn(E, 16, generator=g)
    torch.manual_seed(0)
    base = GINEConv(torch.nn.Linear(F, F), edge_dim=16)
    models, opts = {}, {}
    with config.override(codegen="auto"):
        for name in ("interpreter", "generated"):
            models[name] = gnncompile.compile(copy.deepcopy(base))
            opts[name] = torch.optim.Adam(models[name].parameters(), lr=1e-3)

    def step(name):
        def run():
            if name == "generated":
                codegen.resume()
            else:
                codegen.suspend()
            with config.override(codegen="auto" if name == "generated" else "off"):
                opts[name].zero_grad(set_to_none=True)
                out = models[name](x, ei, ea)
                out.pow(2).mean().backward()
                opts[name].step()
            return out
        return run

    runs = {k: step(k) for k in models}
    # the first step of each (compiles; the generated one prepares its kernels): equal parameters after it
    calls = codegen.calls()
    runs["generated"]()
    gen_calls = codegen.calls() - calls
    runs["interpreter"]()
    same = all(torch.equal(a, b) for a, b in zip(models["interpreter"].parameters(), models["generated"].parameters()))
    if not same or gen_calls < 2:
        raise RuntimeError(f"codegen benchmark: GINE steps differ ({same}) or ran no generated kernel ({gen_calls})")
    times = _rounds({k: ((lambda: None), fn) for k, fn in runs.items()}, rounds)
    out = _summary(times, "interpreter")
    out["generated_calls_per_step"] = gen_calls
    return out, same


def markdown(p: dict) -> str:
    r = p["result"]
    b = p["build"]
    lines = [f"# Generated message kernels (`{p['command']}`)", "",
             f"CPU: {p['cpu']}, {p['threads']} threads; {r['N']:,} nodes / {r['E']:,} edges power-law, "
             f"F = {r['F']}, {r['dtype']}; compiler: {p['compiler']}; flags: {' '.join(p['flags'])}. "
             f"{_common.load_text(p['loadavg_before_after'])}.", "",
             "Agreement (checked before timing): " + ", ".join(f"{k} = {v}" for k, v in r["agreement"].items()) + ".",
             "", "| program | variant | median ms | min ms | ratio (median of rounds) |", "|---|---|---|---|---|"]
    for prog, base in (("xj_sum", "spmm"), ("relu_xj_e", "interpreter"), ("gelu_xj_e", "interpreter"),
                       ("relu_xj_e_fwd_bwd", "interpreter"),
                       ("gine_step", "interpreter")):
        for k, v in r.get(prog, {}).items():
            if not isinstance(v, dict):
                continue
            lines.append(f"| {prog} | {k} | {v['median_ms']:.1f} | {v['min_ms']:.1f} | "
                         f"{v['ratio_to_' + base]:.2f}x {base} |")
    xj = r["xj_sum"]
    lines += ["", f"x_j sum: generated / spmm = {xj['generated']['ratio_to_spmm']:.2f}, interpreter / spmm = "
              f"{xj['interpreter']['ratio_to_spmm']:.2f} (target: generated within 1.1x spmm).", "",
              f"Build (fresh processes, empty cache folder): first use of a new program "
              f"{b['first_use_s'] * 1e3:.0f} ms (emit + compile + load + register; target <= 2 s), the same "
              f"program in a new process from the disk cache {b['cached_load_s'] * 1e3:.1f} ms (target <= 50 ms).",
              ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k nodes / 100k edges, fewer rounds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--gine-rounds", type=int, default=5, help="rounds of the GINE training step (0: none)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    N = 10_000 if args.quick else 100_000
    rounds = 5 if args.quick else args.rounds
    load0 = _common.loadavg()
    costs = build_costs()
    res = run(N, 128, rounds, max(3, rounds // 3), 3 if args.quick and args.gine_rounds else args.gine_rounds)
    payload = {"command": _common.command("codegen", argv), "cpu": cpu_detail(), "threads": args.threads,
               "machine": _common.machine(), "compiler": build._compiler_identity(build.compiler()),
               "flags": build.module_flags() + list(build.BASE_FLAGS), "build": costs, "result": res,
               "loadavg_before_after": [load0, _common.loadavg()]}
    _common.write_results(_common.RESULTS, "codegen_quick" if args.quick else "codegen", payload, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
