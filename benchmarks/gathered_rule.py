"""Cheap messages of gathered node rows with message programs forced against none, per graph size.

    python -m benchmarks gathered_rule
    python -m benchmarks gathered_rule --sizes 2000x8,4000x4 --entries LEConv --steps 50

The measurements behind ``gnncompile.passes.match.GATHERED_MIN_EDGES``: for each zoo entry
(:mod:`.zoo`'s models and generated graph, ``NODESxDEGREE`` per size) one process runs eager and
two compiled forms, speed guard off, message programs 'never' (the messages as written) and
'always', one training step each (:func:`benchmarks.zoo._step`) interleaved, ``--steps`` rounds
with the order reversed every other round, after 20 warm-up steps of each compiled form; medians.
The rule fuses where 'always' beats 'never'. Writes benchmarks/results/<--out>.{json,md}, naming
the CPU model.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch

from . import _common


def child(entry: str, nodes: int, degree: int, steps: int) -> dict:
    import gnncompile

    from . import zoo

    build, inputs = zoo._entries()[entry]
    g = zoo.Graph(nodes, degree)
    torch.manual_seed(0)
    model = build(g)
    args = inputs(g)
    params = [p for p in model.parameters() if p.requires_grad]
    forms = {"eager": model}
    fused = {}
    for mode in ("never", "always"):
        forms[mode] = gnncompile.compile(model, settings={"choices": {"guard": "off", "programs": mode}})
        for _ in range(20):
            zoo._step(forms[mode], args, params)
        fused[mode] = sum(f.kind == "message" for f in gnncompile.explain(forms[mode], *args).fused)
    for _ in range(5):
        zoo._step(model, args, params)
    times = {k: [] for k in forms}
    keys = list(forms)
    for i in range(steps):
        for k in (keys if i % 2 == 0 else keys[::-1]):
            t0 = time.perf_counter()
            zoo._step(forms[k], args, params)
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"entry": entry, "nodes": nodes, "degree": degree, "edges": nodes * degree,
            "eager_ms": med["eager"], "never_ms": med["never"], "always_ms": med["always"],
            "message_programs": fused}


def markdown(p: dict) -> str:
    lines = [f"Message programs forced ('always') against none ('never'), speed guard off, training step "
             f"medians over {p['steps']} interleaved rounds; {p['threads']} threads, CPU {p['cpu']}.", "",
             "| entry | edges | degree | eager ms | never ms | always ms | never / always | programs (always) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
        if "error" in r:
            lines.append(f"| {r.get('entry')} | | | {r['error'][:80]} | | | | |")
            continue
        lines.append(f"| {r['entry']} | {r['edges']} | {r['degree']} | {r['eager_ms']:.2f} | {r['never_ms']:.2f} | "
                     f"{r['always_ms']:.2f} | {r['never_ms'] / r['always_ms']:.2f}x | "
                     f"{r['message_programs']['always']} |")
    lines += ["", f"Load average (1 min) before / after: {p['loadavg_before_after'][0][0]:.1f} / "
              f"{p['loadavg_before_after'][1][0]:.1f}. Command: `{p['command']}`", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", default="LEConv,FiLMConv")
    ap.add_argument("--sizes", default="2000x8,4000x4,8000x2,1500x8,1250x8,2500x4,5000x2,3000x8,6000x4",
                    help="comma list of NODESxDEGREE")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="gathered_rule")
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(opts.threads)
    if opts.child:
        entry, nodes, degree = opts.child.split(":")
        print("RESULT " + json.dumps(child(entry, int(nodes), int(degree), opts.steps)), flush=True)
        return {}
    before = _common.loadavg()
    rows = []
    for size in opts.sizes.split(","):
        nodes, degree = (int(v) for v in size.split("x"))
        for entry in opts.entries.split(","):
            cmd = _common.module_command("gathered_rule") + ["--child", f"{entry}:{nodes}:{degree}",
                                                             "--steps", str(opts.steps),
                                                             "--threads", str(opts.threads)]
            r = _common.run_child(cmd, _common.timing_env(opts.threads), 600, tail_chars=300)
            r.setdefault("entry", entry)
            rows.append(r)
            print(r if "error" in r else
                  f"{entry} {nodes}x{degree}: eager {r['eager_ms']:.2f}, never {r['never_ms']:.2f}, "
                  f"always {r['always_ms']:.2f} ms", flush=True)
    payload = {"machine": _common.machine(), "cpu": _common.cpu_model(), "threads": opts.threads,
               "steps": opts.steps, "rows": rows, "loadavg_before_after": [before, _common.loadavg()],
               "command": _common.command("gathered_rule", argv)}
    _common.write_results(opts.results_dir, opts.out, payload, markdown)
    return payload


if __name__ == "__main__":
    main()
