"""Dense attention with a key padding mask: gnncompile::dense_attention against torch's fused attention.

    python -m benchmarks dense_attention                       # B 8, H 4, L 260, D 4..64, 2 threads
    python -m benchmarks dense_attention --dims 8 --repeats 41
    python -m benchmarks dense_attention --zoo-json /tmp/yours/gps.json   # adds a zoo run's GPSConv line

Then GPSConv's training step as the zoo builds it: eager, compiled with the default capture and
compiled with capture_dynamic=False (``--gps-steps``, 0 for none).
The shape of GPSConv's attention in the zoo (benchmarks/zoo.py: 2000 nodes in 8 graphs, width
32, 4 heads): [B, H, L, D] with B = 8 graphs padded to L = 260 nodes, D = 32 / heads, a boolean
key padding mask with ragged lengths (graph b keeps L - 5 b keys, as to_dense_batch's padding).
Per head dim: torch's scaled_dot_product_attention with the boolean mask (the flash backend, the
one MultiheadAttention's call runs on the CPU; and the math backend) and gnncompile's op
(native/cpu/dense_attention_core.h), checked to agree (outputs and the gradients of q, k, v,
1e-5 relative to the largest entry) before any timing; then forward alone (no_grad) and forward
+ backward (the gradient of out.sum()), the implementations interleaved round by round, medians
over ``--repeats`` rounds.

Writes benchmarks/results/dense_attention.{json,md} (``--name``), naming the CPU model.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import gnncompile  # noqa: F401  (loads the ops)
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import _common

IMPLS = ("torch_flash", "torch_math", "gnncompile")


def _inputs(B: int, H: int, L: int, D: int, step: int):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_() for _ in range(3))
    kpm = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        kpm[b, L - step * b:] = True
    return q, k, v, kpm


def _impl(name: str, q, k, v, kpm):
    scale = q.shape[-1] ** -0.5
    if name == "gnncompile":
        return lambda: torch.ops.gnncompile.dense_attention(q, k, v, kpm, scale, [])[0]
    backend = SDPBackend.FLASH_ATTENTION if name == "torch_flash" else SDPBackend.MATH
    mask = ~kpm[:, None, None, :]

    def run():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    return run


def _agree(fns, q, k, v) -> float:
    """The largest difference from torch_flash over out and the three gradients, relative to the
    largest entry of each; raises when over 1e-5."""
    results = {}
    for name, fn in fns.items():
        out = fn()
        results[name] = (out.detach(), *torch.autograd.grad(out.sum(), (q, k, v)))
    worst = 0.0
    for name, r in results.items():
        for a, b in zip(r, results["torch_flash"]):
            worst = max(worst, ((a - b).abs().max() / b.abs().max()).item())
    if worst > 1e-5:
        raise SystemExit(f"dense_attention: implementations disagree ({worst:.2e} relative)")
    return worst


def measure(B: int, H: int, L: int, D: int, step: int, repeats: int, warmup: int) -> Dict[str, Any]:
    q, k, v, kpm = _inputs(B, H, L, D, step)
    fns = {name: _impl(name, q, k, v, kpm) for name in IMPLS}
    err = _agree(fns, q, k, v)

    def fwd(fn):
        with torch.no_grad():
            fn()

    def fwd_bwd(fn):
        out = fn()
        torch.autograd.grad(out.sum(), (q, k, v))

    times: Dict[str, Dict[str, List[float]]] = {n: {"forward": [], "forward_backward": []} for n in fns}
    for r in range(warmup + repeats):
        order = list(fns) if r % 2 == 0 else list(reversed(list(fns)))
        for name in order:
            for kind, run in (("forward", fwd), ("forward_backward", fwd_bwd)):
                t0 = time.perf_counter()
                run(fns[name])
                if r >= warmup:
                    times[name][kind].append(time.perf_counter() - t0)
    med = {n: {k: statistics.median(v) * 1e3 for k, v in t.items()} for n, t in times.items()}
    flops = 2 * B * H * L * (L - step * (B - 1) / 2) * D * 2  # q k^T and p v over the kept keys
    return {"B": B, "H": H, "L": L, "D": D, "max_rel_diff": err, "median_ms": med,
            "forward_gflops_per_s": {n: flops / (m["forward"] * 1e-3) / 1e9 for n, m in med.items()}}


def measure_gps(nodes: int, degree: int, steps: int, warmup: int) -> Dict[str, Any]:
    """GPSConv as the zoo builds it (benchmarks/zoo.py, same graph and seed), one training step
    (forward, mean square, backward) of: the model as written, gnncompile.compile with the default
    capture (the attention graph-breaks and runs as written) and with capture_dynamic=False (the
    attention rewritten). The speed guard off on both compiled sides (it would keep the faster form
    anyway): what the rewrite itself costs or saves. Outputs checked (1e-4) before timing; steps
    interleaved, medians."""
    from . import zoo

    build, inputs = zoo._entries()["GPSConv"]
    g = zoo.Graph(nodes, degree)
    torch.manual_seed(0)
    model = build(g)
    args = inputs(g)
    params = [p for p in model.parameters() if p.requires_grad]
    sides = {"eager": model,
             "compiled_default": gnncompile.compile(model, settings={"choices": {"guard": "off"}}),
             "compiled_static_capture": gnncompile.compile(model, settings={"capture_dynamic": False,
                                                                            "choices": {"guard": "off"}})}
    fused = {}
    for name, run in sides.items():
        if name != "eager":
            rep = gnncompile.explain(run, *args)
            fused[name] = [f.kind for f in rep.fused]
            err = (run(*args) - model(*args)).abs().max().item()
            if err > 1e-4 * (1 + model(*args).abs().max().item()):
                raise SystemExit(f"dense_attention: {name} disagrees with eager ({err:.2e})")
    times: Dict[str, List[float]] = {n: [] for n in sides}
    for r in range(warmup + steps):
        order = list(sides) if r % 2 == 0 else list(reversed(list(sides)))
        for name in order:
            t0 = time.perf_counter()
            zoo._step(sides[name], args, params)
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    med = {n: statistics.median(t) * 1e3 for n, t in times.items()}
    return {"nodes": nodes, "edges": nodes * degree, "steps": steps, "median_ms": med, "fused": fused,
            "speedup_over_eager": {n: med["eager"] / m for n, m in med.items()}}


def markdown(p: Dict[str, Any]) -> str:
    o = p["options"]
    lines = [f"# Dense attention with a key padding mask: gnncompile::dense_attention against torch", "",
             f"CPU: {p['cpu']}; {o['threads']} threads; torch {p['machine']['torch']}. Shape [B, H, L, D] = "
             f"[{o['B']}, {o['H']}, {o['L']}, D], boolean key padding mask, graph b keeps L - {o['step']} b keys "
             f"(GPSConv's attention in the zoo at D = 8). Medians over {o['repeats']} interleaved rounds after "
             f"{o['warmup']} warm-up rounds; all implementations agree within 1e-5 (relative to the largest entry) "
             "on the output and the gradients of q, k, v before timing.", "",
             "| D | torch flash fwd ms | torch math fwd ms | gnncompile fwd ms | torch flash fwd+bwd ms | "
             "torch math fwd+bwd ms | gnncompile fwd+bwd ms | flash / gnncompile fwd+bwd | max rel diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
        m = r["median_ms"]
        lines.append(f"| {r['D']} | {m['torch_flash']['forward']:.2f} | {m['torch_math']['forward']:.2f} | "
                     f"{m['gnncompile']['forward']:.2f} | {m['torch_flash']['forward_backward']:.2f} | "
                     f"{m['torch_math']['forward_backward']:.2f} | {m['gnncompile']['forward_backward']:.2f} | "
                     f"{m['torch_flash']['forward_backward'] / m['gnncompile']['forward_backward']:.2f}x | "
                     f"{r['max_rel_diff']:.1e} |")
    gps = p.get("gps")
    if gps:
        m, x = gps["median_ms"], gps["speedup_over_eager"]
        lines += ["", f"## GPSConv training step ({gps['nodes']} nodes, {gps['edges']} edges, 8 graphs: the zoo's "
                  f"entry), medians of {gps['steps']} interleaved steps, speed guard off", "",
                  "| side | ms | eager / side | fused |", "|---|---|---|---|"]
        for n in m:
            lines.append(f"| {n} | {m[n]:.2f} | {x[n]:.2f}x | {', '.join(gps['fused'].get(n, [])) or '-'} |")
    z = p.get("zoo")
    if z:
        lines += ["", "## GPSConv in the zoo (one training step, eager against gnncompile.compile)", "",
                  "| entry | eager ms | compiled ms | eager / compiled [95% interval] | fused | max rel err | "
                  "speed guard kept |", "|---|---|---|---|---|---|---|"]
        for r in z["rows"]:
            iv = r.get("interval") or [float("nan"), float("nan")]
            lines.append(f"| {r['name']} | {r['eager_ms']:.2f} | {r['compiled_ms']:.2f} | {r['speedup']:.2f}x "
                         f"[{iv[0]:.2f}, {iv[1]:.2f}] | {r['fused']} | {r['max_rel_err']:.1e} | {r['kept']} |")
        lines.append(f"- Command: `{z['command']}`.")
    lines += ["", f"- Command: `{p['command']}`; {_common.load_text(p['loadavg_before_after']).lower()}."]
    return "\n".join(lines) + "\n"


def _zoo(path: str, command: str) -> Dict[str, Any]:
    """The GPSConv rows of a zoo result file (benchmarks/zoo.py's JSON)."""
    data = json.loads(Path(path).read_text())
    rows = []
    for r in data["rows"]:
        if str(r.get("name", "")).startswith("GPSConv"):
            kept = "; ".join(f"{g['piece']}: {g['kept']}" for g in r.get("guard", []))
            rows.append({"name": r["name"], "eager_ms": r.get("eager_ms"), "compiled_ms": r.get("gnncompile_ms"),
                         "speedup": r.get("speedup"), "interval": r.get("interval"), "kept": kept,
                         "fused": r.get("fused"), "max_rel_err": r.get("max_rel_err")})
    return {"rows": rows, "command": command or data.get("command", ""), "cpu": data.get("cpu"), "source": str(path)}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="4,8,16,32,64")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--length", type=int, default=260)
    ap.add_argument("--step", type=int, default=5, help="graph b keeps length - step * b keys")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--gps-steps", type=int, default=40, help="GPSConv training steps per side (0: none)")
    ap.add_argument("--zoo-json", default=None, help="a zoo result holding GPSConv, added to the table")
    ap.add_argument("--zoo-command", default="", help="the command that produced --zoo-json")
    ap.add_argument("--name", default="dense_attention")
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    opts = ap.parse_args(argv)
    torch.set_num_threads(opts.threads)
    load0 = _common.loadavg()
    rows = [measure(opts.batch, opts.heads, opts.length, int(d), opts.step, opts.repeats, opts.warmup)
            for d in opts.dims.split(",") if d]
    payload = {"machine": _common.machine(), "cpu": _common.cpu_model(), "command": _common.command("dense_attention", argv),
               "options": {"B": opts.batch, "H": opts.heads, "L": opts.length, "step": opts.step,
                           "threads": opts.threads, "repeats": opts.repeats, "warmup": opts.warmup},
               "rows": rows, "loadavg_before_after": [load0, _common.loadavg()]}
    if opts.gps_steps:
        payload["gps"] = measure_gps(2000, 8, opts.gps_steps, 5)
        payload["loadavg_before_after"][1] = _common.loadavg()
    if opts.zoo_json:
        payload["zoo"] = _zoo(opts.zoo_json, opts.zoo_command)
    _common.write_results(Path(opts.results_dir), opts.name, payload, markdown, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
