"""What a compiled call costs between the caller and the graph (issue 24, point 3), layer by layer.

    python -m benchmarks entry_cost gin --graphs 128 --rounds 40
    python -m benchmarks entry_cost gin --graphs 1 --rounds 40

The model of benchmarks/molecules.py (gin, gine, gcn) on prebuilt batches of ``--graphs``
molecule graphs, compiled twice with ``gnncompile.compile(model, dynamic=True)`` (defaults, speed
guard on). Both models' guards are then set to the compiled, rewritten form (the probe times that
path; on one-graph batches the model guard keeps eager), and one of them is put back on the call
path before this change ("before": ``CompiledModule.__call__`` through ``Module.__call__`` and
``forward``, the speed guard's rewritten form Dynamo's ``_lazy_forward``, which reaches the
generated code through the graph module's ``Module.__call__``).

1. Per call (forward in grad mode, no backward; the fastest and the median of ``--calls`` calls of
   each, interleaved, on the first batch): the graph's generated forward called directly with the
   arguments Dynamo passes it, ``_lazy_forward``, the speed guard, Dynamo's OptimizedModule (its
   entry, guard check and the compiled frame), ``_run_compiled`` (+ the two context managers),
   the compiled module before / after, the model as written, the context managers alone, and
   Dynamo's guard check alone.
2. Training steps (forward, cross-entropy, backward, Adam; each variant steps through every batch
   in turn, the order rotated each round; medians): eager, before, after, the speed guard
   called directly and the graph called directly (with the arguments Dynamo passed it for that
   batch); each step's median, and those of its two parts: forward (zero_grad, forward, loss) and
   the rest (backward, Adam).

Outputs of the direct calls are checked equal to the compiled module's first. ``--json FILE``
appends the figures as one JSON line.
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings

import gnncompile  # (the installed package; imported before anything else)
import torch
import torch.nn.modules.module as _mm

from . import molecules as M
from ._common import append_json_line, command


def _before_class():
    from gnncompile.compiler.api import CompiledModule

    class Before(CompiledModule):
        """CompiledModule.__call__ before this change: Module.__call__ -> forward unless the
        model guard kept the model as written."""

        def __call__(self, *args, **kwargs):
            run = self._as_written.get(torch.is_grad_enabled())
            if (run is None or self._forward_pre_hooks or self._forward_hooks or self._backward_pre_hooks
                    or self._backward_hooks or _mm._global_forward_pre_hooks or _mm._global_forward_hooks
                    or _mm._global_backward_pre_hooks or _mm._global_backward_hooks
                    or self._compiled_call_impl is not None or torch._C._get_tracing_state()
                    or torch.compiler.is_exporting()):
                return torch.nn.Module.__call__(self, *args, **kwargs)
            return run(*args, **kwargs)
    return Before


class _Step:
    """One training step of ``loss_of(b)``; ``split(b)`` runs it and returns the seconds of its
    forward (zero_grad, forward, loss) and of the rest (backward, Adam)."""

    def __init__(self, loss_of, params) -> None:
        self.loss_of, self.opt = loss_of, torch.optim.Adam(params, lr=1e-3)

    def split(self, b):
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_of(b)
        t1 = time.perf_counter()
        loss.backward()
        self.opt.step()
        return t1 - t0, time.perf_counter() - t1

    def __call__(self, b):
        self.split(b)


def _step(run, params):
    return _Step(lambda b: M._loss(run, b), params)


def _force_compiled(cm, sg) -> None:
    """Both guards of ``cm`` (the model guard and the piece's speed guard ``sg``) keep the
    compiled, rewritten form."""
    g = cm._guard
    g.as_written.clear()
    for r in g._races.values():
        r.winner, r.recheck_in = g._forms[0], None
    for r in sg._races.values():
        r.winner = sg._forms[0]


def _recorded_args(cm, sg, batches) -> dict:
    """index of a batch -> the arguments Dynamo passes the graph for it (through ``sg``)."""
    out = {}
    for i, b in enumerate(batches):
        saved = {k: r.winner for k, r in sg._races.items()}
        for r in sg._races.values():
            r.winner = (lambda *a, w=r.winner, i=i: (out.__setitem__(i, a), w(*a))[1])
        cm(b.x, b.edge_index, b.edge_attr, b.batch)
        for k, r in sg._races.items():
            r.winner = saved[k]
    return out


def run(kind: str, graphs: int, rounds: int, calls: int) -> dict:
    from torch_geometric.loader import DataLoader

    from gnncompile.compiler import backend as B, lean as L
    from gnncompile.compiler.guard import SpeedGuard

    ds = M.make_dataset(1024)
    pre = [b.clone() for b in DataLoader(ds, batch_size=graphs, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))][:8]
    got = []
    backend_call = B.Backend.__call__

    def spy(self, gm, ex):
        fn = backend_call(self, gm, ex)
        got.append((gm, fn))
        return fn
    B.Backend.__call__ = spy
    try:
        eager = M.build_model(kind)
        mb, ma = M.build_model(kind), M.build_model(kind)
        cb, ca = gnncompile.compile(mb, dynamic=True), gnncompile.compile(ma, dynamic=True)
        steps = {"eager": _step(eager, eager.parameters()), "before": _step(cb, mb.parameters()),
                 "after": _step(ca, ma.parameters())}
        for _ in range(4):  # compiles, and the guards' races
            for b in pre:
                for s in steps.values():
                    s(b)
    finally:
        B.Backend.__call__ = backend_call
    if len(got) != 2 or not all(isinstance(fn, SpeedGuard) for _, fn in got):
        raise SystemExit(f"entry_cost: expected one guarded graph piece per model, got {got}")
    (gm_b, sg_b), (gm_a, sg_a) = got
    _force_compiled(cb, sg_b)
    _force_compiled(ca, sg_a)
    # the "before" model: its old __call__, and the speed guard's rewritten form through _lazy_forward
    cb.__class__ = _before_class()
    lazy = type(gm_b)._lazy_forward.__get__(gm_b)
    sg_b._forms = (lazy, sg_b._forms[1])
    for r in sg_b._races.values():
        r.winner = lazy
    args_of = _recorded_args(ca, sg_a, pre)
    b0 = pre[0]
    a0 = (b0.x, b0.edge_index, b0.edge_attr, b0.batch)
    ref = ca(*a0)
    if not (torch.equal(gm_a.forward(*args_of[0])[0], ref) and torch.equal(sg_a(*args_of[0])[0], ref)):
        raise AssertionError("entry_cost: the graph called directly differs from the compiled module")

    # 1. per call
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    entries = _debug_get_cache_entry_list(type(ma).forward.__code__)
    f_locals = {"self": ma, "x": a0[0], "edge_index": a0[1], "edge_attr": a0[2], "batch": a0[3]}
    guard_check = next((e.guard_manager for e in entries if e.guard_manager.check(f_locals)), None)
    lazy_a = type(gm_a)._lazy_forward.__get__(gm_a)
    opt_mod = ca._compiled

    def contexts():
        with B.dynamic_output_shapes(ca._capture), L.scope(ca._lean, ca.lean_record):
            pass
    forms = {
        "graph: generated forward, called directly": lambda: gm_a.forward(*args_of[0]),
        "graph: _lazy_forward (before)": lambda: lazy_a(*args_of[0]),
        "speed guard -> generated forward (after)": lambda: sg_a(*args_of[0]),
        "Dynamo OptimizedModule (entry, guard check, frame)": lambda: opt_mod(*a0),
        "_run_compiled (+ the two context managers)": lambda: ca._run_compiled(*a0),
        "compiled module, after": lambda: ca(*a0),
        "compiled module, before": lambda: cb(*a0),
        "the model as written (eager)": lambda: eager(*a0),
        "the two context managers alone": contexts,
    }
    if guard_check is not None:
        forms["Dynamo's guard check alone"] = lambda: guard_check.check(f_locals)
    ts = {k: [] for k in forms}
    for _ in range(calls):
        for k, f in forms.items():
            t = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t)
    per_call = {k: {"fastest_us": min(v) * 1e6, "median_us": statistics.median(v) * 1e6} for k, v in ts.items()}
    sizes = (statistics.mean(int(b.num_nodes) for b in pre), statistics.mean(int(b.edge_index.shape[1]) for b in pre))
    print(f"{kind}, batches of {graphs} graph(s) (~{sizes[0]:.0f} nodes, ~{sizes[1]:.0f} edges), 2 threads")
    print(f"per call (forward, grad mode, {calls} calls each, interleaved):")
    for k, d in per_call.items():
        print(f"  {k:52s} fastest {d['fastest_us']:8.1f} us   median {d['median_us']:8.1f} us")

    # 2. training steps
    idx = {id(b): i for i, b in enumerate(pre)}

    def direct(fn):
        return _Step(lambda b: torch.nn.functional.cross_entropy(fn(*args_of[idx[id(b)]])[0], b.y), ma.parameters())
    steps["speed guard direct"] = direct(sg_a)
    steps["graph direct"] = direct(gm_a.forward)
    names = list(steps)
    st = {v: [] for v in names}
    fw = {v: [] for v in names}
    bw = {v: [] for v in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for b in pre:
            for v in order:
                t = time.perf_counter()
                f, rest = steps[v].split(b)
                st[v].append(time.perf_counter() - t)
                fw[v].append(f)
                bw[v].append(rest)
    med = {v: statistics.median(st[v]) * 1e3 for v in names}
    fmed = {v: statistics.median(fw[v]) * 1e3 for v in names}
    bmed = {v: statistics.median(bw[v]) * 1e3 for v in names}
    print(f"training steps ({len(st['eager'])} each, interleaved; medians; forward = zero_grad + forward + loss, "
          f"rest = backward + Adam):")
    for v in names:
        print(f"  {v:20s} {med[v]:8.3f} ms  {med['eager'] / med[v]:.3f}x eager  "
              f"{1e3 * (med[v] - med['graph direct']):+8.1f} us vs the graph direct   (forward {fmed[v]:.3f}, "
              f"rest {bmed[v]:.3f} ms)", flush=True)
    return {"model": kind, "graphs_per_batch": graphs, "nodes_edges": sizes, "calls": calls,
            "per_call": per_call, "steps_per_variant": len(st["eager"]), "step_median_ms": med,
            "forward_median_ms": fmed, "rest_median_ms": bmed}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=("gin", "gine", "gcn"))
    ap.add_argument("--graphs", type=int, default=128, help="graphs per batch")
    ap.add_argument("--rounds", type=int, default=40, help="passes over the 8 batches")
    ap.add_argument("--calls", type=int, default=300, help="per-call part: calls of each form")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(opts.threads)
    out = run(opts.model, opts.graphs, opts.rounds, opts.calls)
    out["command"] = command("entry_cost", argv)
    if opts.json:
        append_json_line(opts.json, out)
    return out


if __name__ == "__main__":
    main()
