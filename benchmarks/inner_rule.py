"""The measurement behind the first-call rule: which inner compiler pays off at which graph size.

    python -m benchmarks inner_rule                       # GCN and GraphSAGE, 4 sizes
    python -m benchmarks inner_rule --models GCN --sizes 2708,10000

For each model and graph size (N nodes, 10 N edges, F = 128, 2 layers, hidden 128) and each
inner compiler (eager: the rewritten graph runs op by op; inductor: code generated), one fresh
process with an empty compile cache measures the first training step (compilation included)
and the median of the next --repeats steps. The rule (gnncompile.compiler.backend.choose_inner)
picks inductor when its per-step saving over --steps steps (200: a full-batch training run
such as PyG's examples) repays its extra compile time:

    (step_eager - step_inductor) * steps > first_inductor - first_eager

Writes benchmarks/results/inner_rule.{json,md} with the break-even size it implies.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from . import _common


def child(model: str, n: int, inner: str, repeats: int, threads: int) -> dict:
    import torch

    import gnncompile
    from gnncompile.data.synthetic import power_law_graph
    from torch_geometric.nn import models

    torch.set_num_threads(threads)
    ei = power_law_graph(n, 10 * n, seed=0)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 128, generator=g), torch.randint(0, 16, (n,), generator=g)
    torch.manual_seed(0)
    m = getattr(models, model)(128, 128, 2, 16)
    c = gnncompile.compile(m, inner=inner)
    opt = torch.optim.Adam(m.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(c(x, ei), y)
        loss.backward()
        opt.step()

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    return {"model": model, "nodes": n, "edges": int(ei.shape[1]), "inner": inner, "first_s": first,
            "step_s": _common.timeit(step, repeats, warmup=0)["median"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="GCN,GraphSAGE")
    ap.add_argument("--sizes", default="2708,10000,30000,100000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="inner_rule")
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.child[2], a.repeats, a.threads)))
        return {}
    rows = []
    for model in a.models.split(","):
        for n in (int(s) for s in a.sizes.split(",")):
            r = {}
            for inner in ("eager", "inductor"):
                with tempfile.TemporaryDirectory() as cache:
                    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS=str(a.threads))
                    env.pop("GNNCOMPILE_INNER", None)
                    out = subprocess.run(_common.module_command("inner_rule") + [
                        "--child", model, str(n), inner, "--repeats", str(a.repeats), "--threads", str(a.threads)],
                        env=env, capture_output=True, text=True, check=True, cwd=_common.ROOT)
                r[inner] = json.loads(out.stdout.strip().splitlines()[-1])
            e, i = r["eager"], r["inductor"]
            row = {"model": model, "nodes": n, "edges": e["edges"], "size": n + e["edges"],
                   "first_eager_s": e["first_s"], "first_inductor_s": i["first_s"],
                   "step_eager_ms": e["step_s"] * 1e3, "step_inductor_ms": i["step_s"] * 1e3}
            row["saving_over_steps_s"] = (e["step_s"] - i["step_s"]) * a.steps
            row["extra_compile_s"] = i["first_s"] - e["first_s"]
            row["inductor_pays"] = row["saving_over_steps_s"] > row["extra_compile_s"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    p = {"machine": _common.machine(), "steps": a.steps, "threads": a.threads, "repeats": a.repeats, "rows": rows,
         "command": _common.command("inner_rule", argv)}
    _common.write_results(Path(a.results_dir), a.out, p, markdown)
    return p


def markdown(p: dict) -> str:
    lines = ["| model | nodes | edges | first step s eager / inductor | step ms eager / inductor | "
             f"saving over {p['steps']} steps s | extra compile s | inductor pays |", "|---|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
        lines.append(f"| {r['model']} | {r['nodes']} | {r['edges']} | {r['first_eager_s']:.2f} / "
                     f"{r['first_inductor_s']:.2f} | {r['step_eager_ms']:.1f} / {r['step_inductor_ms']:.1f} | "
                     f"{r['saving_over_steps_s']:.2f} | {r['extra_compile_s']:.2f} | {r['inductor_pays']} |")
    lines += ["", f"Fresh process and empty inductor cache per cell, {p['threads']} threads, F = 128, "
              f"median of {p['repeats']} steps. Command: `{p['command']}`"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
