"""Per-step fixed costs on small graphs (issue 24): variants interleaved in one process.

    python -m benchmarks small_steps molecules gin eager,gnc:eager,gnc:auto --breakdown
    python -m benchmarks small_steps gine 3000,5000,7000 2,8 eager,eager+never,auto+auto --layers 3

``molecules MODEL VARIANTS``: the model of benchmarks/molecules.py (gin, gine, gcn) on 1024 of
its graphs in prebuilt batches of 128, one step = forward, cross-entropy, backward, Adam;
variants ``eager`` or ``gnc:INNER[+prog|+never][+guard]`` (``gnncompile.compile(dynamic=True,
inner=INNER)``, programs 'always' / 'never' / the default 'auto', the speed guard off unless
``+guard``; ``@KIB`` after a variant: the block cache of gnncompile.hardware.memory set to keep
freed blocks from KIB KiB up before each of its steps, inside the timed step (about 30 us, alike
for every suffixed variant), e.g. ``eager@2048`` for the 2 MiB minimum the cache had before
results/small_steps_cache_s56a.md (the cache is process-wide: a compiled variant turns it on for
eager too);
``+perm``: compiled with settings slot_order False (edge inputs read through perm, no copy in CSR
slot order cached with the structure: gnncompile/ops/slots.py); ``+noself``: compiled with GINConv's self term left unfolded, the graph as before
passes/self_term.py, for an A/B of the fold in one process). Every variant steps through every batch in turn, the variants' order rotated each
round (a variant that always follows another one measured 5-10% apart from an identical one);
medians per variant. ``--breakdown``: one more pass per variant under torch.profiler, self CPU
time per class (ms / step: matmul, gnncompile's fused ops with their autograd records, per-edge
aten ops (index ops, or an input with the batch's edge count as its first dim), other aten ops,
the optimizer's ops (by the profiler's call tree), Dynamo's records, the autograd engine's;
"outside ops" = wall time minus the ops' self time: Python, custom ops' autograd glue, the
compiled module's wrappers), then each variant's 25 largest ops by name and class. ``--no-grad``: forward only, under
torch.no_grad. Each line also gives the variant's minor page faults per step (``getrusage``:
memory the step's allocations touch for the first time since the allocator took it from the
kernel; about 3 us each on this project's VM, a cost eager pays more of where it allocates
``E x F`` tensors).

``gine EDGES DEGREES VARIANTS``: GINEConv(MLP(F, 64, 64), edge_dim=8) (``--layers`` of them in
one module, ReLU between: one graph piece) on a random graph of ``E / degree`` nodes, node
features requiring grad, edge features not; a step = forward + ``out.sum().backward()``;
variants ``eager`` or ``INNER+PROGRAMS`` (``gnncompile.compile(dynamic=True, inner=INNER,
settings={'choices': {'programs': PROGRAMS, 'guard': 'off'}})``), outputs checked against eager
first, steps interleaved.

Prints one line per variant; ``--json FILE`` appends the figures as one JSON line.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time
import warnings

import gnncompile  # (the installed package; imported before anything else)
import torch

from . import molecules as M
from ._common import append_json_line, command


def _compiled(model, inner: str, choices: dict):
    return gnncompile.compile(model, dynamic=True, inner=inner, settings={"choices": choices})


class _self_terms:
    """With ``on`` False, the passes leave GINConv's self term unfolded (passes/self_term.py) in
    the graphs compiled inside the block (``+noself``: the "before" of that fold)."""

    def __init__(self, on: bool) -> None:
        self.on = on

    def __enter__(self):
        import gnncompile.passes as passes

        self.saved = passes.fuse_self_terms
        if not self.on:
            passes.fuse_self_terms = lambda graph, report: 0
        return self

    def __exit__(self, *exc) -> None:
        import gnncompile.passes as passes

        passes.fuse_self_terms = self.saved


def _group(name: str) -> str:
    if name == "TorchDynamo Cache Lookup":
        return "Dynamo cache lookup (guards)"
    if name.startswith("Torch-Compiled Region"):
        return "compiled region (wrappers)"
    if "CompiledFunction" in name:
        return "AOT CompiledFunction (graph code)"
    if name.startswith("autograd::engine"):
        return "autograd engine"
    if name.startswith("aten::empty") or name in ("aten::zeros", "aten::zero_", "aten::new_empty",
                                                  "aten::empty_like", "aten::resize_"):
        return "allocation"
    return M._group(name)


def _cache_min(variant: str):
    """``NAME@KIB`` -> (NAME, KIB): the block cache's minimum block size (KiB) set before each of
    the variant's steps; (NAME, 0) without a suffix (the cache as compile() set it)."""
    name, sep, kib = variant.partition("@")
    if sep and (not kib.isdigit() or int(kib) < 4):
        raise SystemExit(f"small_steps: {variant!r}: the suffix @KIB needs a whole number of KiB >= 4")
    return name, int(kib or 0)


def _set_cache_min(kib: int) -> None:
    from gnncompile.hardware import memory

    st = memory.status()
    memory.enable_cache(st["cache_cap"] or memory.default_cache_cap(), min_bytes=kib << 10)


def molecules(kind: str, variants: list, rounds: int, breakdown: bool, no_grad: bool) -> dict:
    from torch_geometric.loader import DataLoader

    ds = M.make_dataset(1024)
    pre = [b.clone() for b in DataLoader(ds, batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(0))]
    runs, losses = {}, {}
    for v in variants:
        model = M.build_model(kind)
        v, cache_min = _cache_min(v)
        if v == "eager":
            run = model
        else:
            parts = (v.split(":")[1] if ":" in v else "auto").split("+")
            choices = {"guard": "off"}
            if "prog" in parts:
                choices["programs"] = "always"
            if "never" in parts:
                choices["programs"] = "never"
            if "guard" in parts:
                choices.pop("guard")
            if "perm" in parts:  # edge inputs read through perm, no cached copy in CSR slot order
                run = gnncompile.compile(model, dynamic=True, inner=parts[0],
                                         settings={"choices": choices, "slot_order": False})
            else:
                run = _compiled(model, parts[0], choices)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(b, run=run, opt=opt, cache_min=cache_min):
            if cache_min:
                _set_cache_min(cache_min)
            if no_grad:
                with torch.no_grad():
                    return M._loss(run, b).detach()
            opt.zero_grad(set_to_none=True)
            loss = M._loss(run, b)
            loss.backward()
            opt.step()
            return loss.detach()

        v = f"{v}@{cache_min}" if cache_min else v
        runs[v] = step
        with _self_terms(v == "eager" or "noself" not in v.split("@")[0].split(":")[-1].split("+")):
            losses[v] = float(step(pre[0]))  # (the graph is captured and rewritten here)
            for b in pre[1:]:
                step(b)
    if any(abs(x - losses[variants[0]]) > 1e-4 * abs(losses[variants[0]]) for x in losses.values()):
        raise AssertionError(f"first losses differ: {losses}")
    ts = {v: [] for v in variants}
    faults = {v: 0 for v in variants}
    for r in range(rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for b in pre:
            for v in order:
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                t = time.perf_counter()
                runs[v](b)
                ts[v].append(time.perf_counter() - t)
                faults[v] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    med = {v: statistics.median(ts[v]) * 1e3 for v in variants}
    per_step = {v: faults[v] / len(ts[v]) for v in variants}
    out = {"model": kind, "no_grad": no_grad, "median_ms": med, "first_losses": losses,
           "minor_faults_per_step": per_step}
    for v in variants:
        print(f"{kind} {v:22s} median {med[v]:7.3f} ms   {med[variants[0]] / med[v]:5.2f}x vs {variants[0]}   "
              f"{per_step[v]:6.0f} minor page faults / step", flush=True)
    if breakdown:
        from torch.profiler import ProfilerActivity, profile

        out["breakdown_ms"], out["ops_ms"] = {}, {}
        edges = {int(b.edge_index.shape[1]) for b in pre}
        for v in variants:
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                t0 = time.perf_counter()
                for b in pre:
                    runs[v](b)
                wall = time.perf_counter() - t0
            parts, ops = {}, {}
            for e in prof.events():
                ms = e.self_cpu_time_total / 1e3
                g = _class(e, edges)
                parts[g] = parts.get(g, 0.0) + ms
                key = f"{e.name} [{g}]"
                n, t = ops.get(key, (0, 0.0))
                ops[key] = (n + 1, t + ms)
            parts["outside ops"] = wall * 1e3 - sum(parts.values())
            parts["wall under profiler"] = wall * 1e3
            out["breakdown_ms"][v] = {k: x / len(pre) for k, x in parts.items()}
            out["ops_ms"][v] = {k: (n / len(pre), t / len(pre)) for k, (n, t) in
                                sorted(ops.items(), key=lambda kv: -kv[1][1])[:40]}
        keys = sorted({k for d in out["breakdown_ms"].values() for k in d})
        print("ms / step".ljust(40) + "".join(f"{v:>20s}" for v in variants))
        for k in keys:
            print(k.ljust(40) + "".join(f"{out['breakdown_ms'][v].get(k, 0.0):20.3f}" for v in variants))
        for v in variants:
            print(f"{v}: the largest ops (self ms / step, calls / step)")
            for k, (n, t) in list(out["ops_ms"][v].items())[:25]:
                print(f"  {t:7.3f} {n:6.1f}x  {k}")
    return out


_PER_EDGE_OPS = {"aten::index_select", "aten::scatter_add_", "aten::gather", "aten::index_add_",
                 "aten::scatter_reduce", "aten::index", "aten::index_put_"}


def _class(event, edges: set) -> str:
    """The breakdown's class of one profiler event (self time): the optimizer's (anything under
    Optimizer.step / zero_grad), per-edge aten ops (an index op, or any input whose first dim is
    the batch's edge count: eager's messages), else :func:`_group`'s class by name."""
    name = event.name
    if "gnncompile" not in name:
        p = event
        while p is not None:
            if p.name.startswith("Optimizer."):
                return "optimizer"
            p = p.cpu_parent
    g = _group(name)
    if g == "other aten ops":
        shapes = getattr(event, "input_shapes", None) or []
        if name in _PER_EDGE_OPS or any(isinstance(s, (list, tuple)) and len(s) >= 1 and s[0] in edges
                                        for s in shapes):
            return "per-edge aten ops"
        return "other aten ops (node-sized, loss, readout)"
    return g


class _Stack(torch.nn.Module):
    def __init__(self, convs) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(convs)

    def forward(self, x, edge_index, edge_attr):
        for conv in self.convs:
            x = conv(x, edge_index, edge_attr).relu()
        return x


def gine(edges_list: list, degrees: list, variants: list, layers: int, width: int, steps: int) -> dict:
    from torch_geometric.nn import GINEConv

    def build():
        torch.manual_seed(0)
        convs = [GINEConv(torch.nn.Sequential(torch.nn.Linear(width if i == 0 else 64, 64), torch.nn.ReLU(),
                                              torch.nn.Linear(64, 64)), edge_dim=8) for i in range(layers)]
        return _Stack(convs) if layers > 1 else convs[0]

    rows = []
    for deg in degrees:
        for e in edges_list:
            torch._dynamo.reset()
            n = max(2, e // deg)
            g = torch.Generator().manual_seed(0)
            x = torch.randn(n, width, generator=g, requires_grad=True)
            ei = torch.randint(0, n, (2, e), generator=g)
            ea = torch.randn(e, 8, generator=g)
            expect = build()(x, ei, ea)
            runs = {}
            for v in variants:
                if v == "eager":
                    runs[v] = build()
                else:
                    inner, programs = v.split("+")
                    runs[v] = _compiled(build(), inner, {"programs": programs, "guard": "off"})
                torch.testing.assert_close(runs[v](x, ei, ea), expect, rtol=1e-4, atol=1e-4)
                for _ in range(3):
                    runs[v](x, ei, ea).sum().backward()
            ts = {v: [] for v in variants}
            for s in range(steps):
                order = variants[s % len(variants):] + variants[:s % len(variants)]
                for v in order:
                    t = time.perf_counter()
                    runs[v](x, ei, ea).sum().backward()
                    ts[v].append(time.perf_counter() - t)
            med = {v: statistics.median(ts[v]) * 1e3 for v in variants}
            rows.append({"edges": e, "degree": deg, "nodes": n, "layers": layers, "ms": med})
            print(f"E={e:6d} deg={deg:2d} layers={layers} " + "  ".join(
                f"{v} {med[v]:.3f} ms ({med[variants[0]] / med[v]:.2f}x)" for v in variants), flush=True)
    return {"gine": rows}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("molecules", "gine"))
    ap.add_argument("args", nargs="+", help="molecules: MODEL VARIANTS; gine: EDGES DEGREES VARIANTS")
    ap.add_argument("--rounds", type=int, default=12, help="molecules: passes over the batches")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--no-grad", action="store_true")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--width", type=int, default=64, help="gine: input feature width")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(opts.threads)
    if opts.what == "molecules":
        kind, variants = opts.args
        out = molecules(kind, variants.split(","), opts.rounds, opts.breakdown, opts.no_grad)
    else:
        edges, degrees, variants = opts.args
        out = gine([int(e) for e in edges.split(",")], [int(d) for d in degrees.split(",")], variants.split(","),
                   opts.layers, opts.width, opts.steps)
    out["command"] = command("small_steps", argv)
    if opts.json:
        append_json_line(opts.json, out)
    return out


if __name__ == "__main__":
    main()
