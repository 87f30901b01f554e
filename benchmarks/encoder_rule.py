"""Where an edge encoder pays: inside the message program or outside, per model, one training step.

    python -m benchmarks encoder_rule                      # the zoo's encoder entries + synthetic layers
    python -m benchmarks encoder_rule --only SchNet,GINEConv --steps 20

The measurements behind ``gnncompile.passes.messages.encoder_inside`` (the rule
``Settings.choices['edge_encoder'] == 'auto'`` applies). Each entry runs in a process of its own:
the model built from seed 0 (the zoo's entries on the zoo's graph: ``benchmarks.zoo``, 2000 nodes,
in-degree 8; SchNet's radius graph about 113k edges), then four forms: ``eager``, and
``gnncompile.compile`` with ``choices {'edge_encoder': 'inside' | 'outside' | 'auto', 'programs': 'always', 'guard': 'off'}``
(message programs at every size, the speed guard off: the forms themselves are measured); outputs and every parameter's
gradient checked against eager first (1e-4 relative). Then ``--steps`` rounds of one step of each
form (forward, the mean square of every output, backward), the order rotated each round;
medians, and the 95% interval of each ratio over the rounds' pairs (``tuner.noise``). Also
recorded: where ``'auto'`` put each encoder (explain's details of the fused programs, with the
reasons).

Synthetic entries (``enc-D<d>[-W<w>]-<grad|nograd>``): ``GINEConv(Linear(w, w), edge_dim=d)`` (w
32 where not given) on the zoo's graph whose edge features either are an input (no gradient) or
come from ``relu(Linear(8, d)(edge_attr))`` (their gradient is needed); any such name is accepted. Writes benchmarks/results/encoder_rule.{json,md}. A shared machine is noisy: run it
under an exclusive lock and read the intervals.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Optional, Tuple

import gnncompile  # (the installed package; imported before anything else)
import torch

from . import _common

ZOO = ("GINEConv", "PNAConv", "CGConv", "PointNetConv", "PPFConv", "AttentiveFP", "TransformerConv-edge",
       "SchNet")
SYNTHETIC = ("enc-D8-nograd", "enc-D8-grad", "enc-D16-nograd", "enc-D16-grad", "enc-D32-nograd", "enc-D32-grad",
             "enc-D8-W128-grad", "enc-D16-W128-nograd", "enc-D16-W128-grad", "enc-D32-W128-nograd")
FORMS = ("eager", "inside", "outside", "auto")
CHOICES = {"programs": "always", "guard": "off"}


class _Synthetic(torch.nn.Module):
    """GINEConv of width ``W`` over edge features of width ``D``, given (``grad`` False) or
    computed by a learnable map of the 8 zoo edge features (``grad`` True: the encoder's input
    needs a gradient)."""

    def __init__(self, D: int, W: int, grad: bool) -> None:
        super().__init__()
        from torch_geometric.nn import GINEConv

        self.pre = torch.nn.Linear(8, D) if grad else None
        self.conv = GINEConv(torch.nn.Linear(W, W), edge_dim=D)

    def forward(self, x, edge_index, edge_attr):
        e = torch.relu(self.pre(edge_attr)) if self.pre is not None else edge_attr
        return self.conv(x, edge_index, e)


def synthetic(name: str) -> Optional[Tuple[int, int, bool]]:
    """(D, W, grad) of a synthetic entry's name ``enc-D<d>[-W<w>]-<grad|nograd>`` (W 32 where not
    given), None for another name."""
    parts = name.split("-")
    if len(parts) not in (3, 4) or parts[0] != "enc" or parts[-1] not in ("grad", "nograd") \
            or not parts[1].startswith("D") or not parts[1][1:].isdigit():
        return None
    W = 32
    if len(parts) == 4:
        if not parts[2].startswith("W") or not parts[2][1:].isdigit():
            return None
        W = int(parts[2][1:])
    return int(parts[1][1:]), W, parts[-1] == "grad"


def _build(name: str, g):
    from . import zoo

    syn = synthetic(name)
    if syn is not None:
        D, W, grad = syn
        gen = torch.Generator().manual_seed(1)
        x = g.x if W == g.x.shape[1] else torch.randn(g.x.shape[0], W, generator=gen)
        edge_attr = g.edge_attr if grad else torch.randn(g.edge_attr.shape[0], D, generator=gen)
        return _Synthetic(D, W, grad), (x, g.edge_index, edge_attr)
    build, inputs = zoo._entries()[name]
    return build(g), inputs(g)


def child(name: str, nodes: int, degree: int, steps: int) -> dict:
    from gnncompile.tuner import noise

    from . import zoo

    g = zoo.Graph(nodes, degree)
    torch.manual_seed(0)
    model, args = _build(name, g)
    params = [p for p in model.parameters() if p.requires_grad]
    out = {"name": name, "nodes": nodes}
    runs = {"eager": model}
    for form in ("inside", "outside", "auto"):
        runs[form] = gnncompile.compile(model, settings={"choices": {"edge_encoder": form, **CHOICES}})
        out[f"{form}_details"] = _details(gnncompile.explain(runs[form], *args))

    def grads(run):
        for p in params:
            p.grad = None
        res = zoo._floats(run(*args))
        sum(t.float().square().mean() for t in res).backward()
        return [t.detach() for t in res] + [p.grad.clone() for p in params if p.grad is not None]

    expect = grads(model)
    err = 0.0
    for form in ("inside", "outside", "auto"):
        got = grads(runs[form])
        assert len(got) == len(expect), f"{name} {form}: {len(got)} outputs and gradients, eager {len(expect)}"
        err = max([err] + [((a - b).abs().max() / (1 + b.abs().max())).item() for a, b in zip(got, expect)])
    out["auto"] = out.pop("auto_details")
    out["max_rel_err"] = err
    out["agree"] = err <= 1e-4
    for _ in range(3):
        for form in FORMS:
            zoo._step(runs[form], args, params)
    times = {f: [] for f in FORMS}
    for i in range(steps):
        order = FORMS[i % len(FORMS):] + FORMS[:i % len(FORMS)]
        for form in order:
            t0 = time.perf_counter()
            zoo._step(runs[form], args, params)
            times[form].append(time.perf_counter() - t0)
    for form in FORMS:
        out[f"{form}_ms"] = statistics.median(times[form]) * 1e3
    for a, b in (("inside", "eager"), ("outside", "eager"), ("auto", "eager"), ("inside", "outside"),
                 ("auto", "inside"), ("auto", "outside")):
        iv = noise.ratio_interval([1 / t for t in times[a]], [1 / t for t in times[b]])
        out[f"{a}_vs_{b}"] = [iv["ratio"], iv["low"], iv["high"]] if iv and iv["low"] is not None else None
    out["edges"] = _edges(model, args)
    return out


def _details(rep) -> list:
    """explain's details of the fused programs (messages, edge programs, segment reductions)."""
    return [f"{f.kind}: {f.detail}" for f in rep.fused if "(" in f.detail]


def _edges(model, args) -> int:
    """Edges of the entry's graph (SchNet's: its radius graph)."""
    ig = getattr(model, "interaction_graph", None)
    if ig is not None:
        return int(ig(args[1], args[2])[0].shape[1])
    return int(next(a for a in args if isinstance(a, torch.Tensor) and a.dtype == torch.long and a.dim() == 2)
               .shape[1])


def _auto_says(r: dict) -> str:
    """Where 'auto' put the entry's encoders: inside, outside, or 'k of n inside'."""
    n = sum(d.count("lin(edge)") for d in r.get("inside_details", []))
    k = sum(d.count("lin(edge)") for d in r.get("auto", []))
    if n == 0:
        return "-"
    return "inside" if k == n else "outside" if k == 0 else f"{k} of {n} inside"


def _iv(r: dict, key: str) -> str:
    iv = r.get(key)
    return f"{iv[0]:.2f}x [{iv[1]:.2f}, {iv[2]:.2f}]" if iv else "-"


def markdown(p: dict) -> str:
    lines = ["| entry | edges | eager ms | inside ms | outside ms | auto ms | inside / outside (speed, 95% "
             "interval) | faster form | auto puts it | auto / eager |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
        if "error" in r:
            lines.append(f"| {r['name']} | | | | | | not run: {r['error'][:160]} | | | |")
            continue
        if not r.get("agree"):
            lines.append(f"| {r['name']} | | | | | | outputs differ (max rel err {r['max_rel_err']:.2e}) | | | |")
            continue
        iv = r.get("inside_vs_outside")
        faster = "-" if not iv else "inside" if iv[1] > 1 else "outside" if iv[2] < 1 else "no difference measured"
        if not any("lin(edge)" in d for d in r.get("inside_details", [])):
            faster = "(no encoder)"
        lines.append(f"| {r['name']} | {r['edges']} | {r['eager_ms']:.2f} | {r['inside_ms']:.2f} | "
                     f"{r['outside_ms']:.2f} | {r['auto_ms']:.2f} | {_iv(r, 'inside_vs_outside')} | {faster} | "
                     f"{_auto_says(r)} | {_iv(r, 'auto_vs_eager')} |")
    lines += ["", "Why 'auto' keeps an encoder outside (explain's message details):", ""]
    said = [f"- {r['name']}: {d}" for r in p["rows"] for d in r.get("auto", []) if "computed outside" in d]
    lines += said or ["- (none)"]
    m = p["machine"]
    lines += ["", f"Zoo graph: {p['nodes']} nodes, in-degree {p['degree']} (SchNet: its radius graph); one "
              f"training step each, {p['steps']} rounds (order rotated), medians; inside / outside > 1: "
              f"inside is faster. Message programs at every size, speed guard off. {p['threads']} threads, torch {m['torch']}, "
              f"CPU {p['cpu']}. {_common.load_text(p['loadavg_before_after'])} (a shared machine). "
              f"Command: `{p['command']}`"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="comma list of entries")
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--degree", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per entry")
    ap.add_argument("--out", default=None)
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(opts.threads)
    if opts.child:
        print("RESULT " + json.dumps(child(opts.child, opts.nodes, opts.degree, opts.steps)), flush=True)
        return {}
    names = opts.only.split(",") if opts.only else list(ZOO + SYNTHETIC)
    unknown = {n for n in names if n not in ZOO and synthetic(n) is None}
    if unknown:
        raise SystemExit(f"encoder_rule: unknown entries {sorted(unknown)}; known: {', '.join(ZOO + SYNTHETIC)}")
    load_before = _common.loadavg()
    rows = []
    for name in names:
        cmd = _common.module_command("encoder_rule") + [
            "--child", name, "--nodes", str(opts.nodes), "--degree", str(opts.degree), "--steps", str(opts.steps),
            "--threads", str(opts.threads)]
        row = _common.run_child(cmd, _common.timing_env(opts.threads), opts.timeout, tail_chars=2000)
        row.setdefault("name", name)
        rows.append(row)
        if "error" in row:
            print(f"{name}: not run: {row['error'][-300:]}", flush=True)
        else:
            print(f"{name}: eager {row['eager_ms']:.2f} ms, inside {row['inside_ms']:.2f}, outside "
                  f"{row['outside_ms']:.2f}, auto {row['auto_ms']:.2f} ({_auto_says(row)}); inside/outside "
                  f"{_iv(row, 'inside_vs_outside')}", flush=True)
    payload = {"machine": _common.machine(), "cpu": _common.cpu_model(), "threads": opts.threads,
               "nodes": opts.nodes, "degree": opts.degree, "steps": opts.steps, "rows": rows,
               "loadavg_before_after": [load_before, _common.loadavg()],
               "command": _common.command("encoder_rule", argv)}
    _common.write_results(Path(opts.results_dir), opts.out or "encoder_rule", payload, markdown)
    return payload


if __name__ == "__main__":
    main()
