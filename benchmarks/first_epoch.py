"""Where the first epoch's time goes: eager vs ``gnncompile.compile`` on molecule-sized graphs.

    python -m benchmarks first_epoch                          # gin, gine, gcn; 3 rounds
    python -m benchmarks first_epoch --models gin --rounds 1 --attribute
    python -m benchmarks first_epoch --dynamo log_compilation_metrics=false
    python -m benchmarks first_epoch --variants eager,gnncompile,dynamo-eager,gnncompile-warm

The workload of ``python -m benchmarks molecules`` (its ``make_dataset``, ``build_model``,
``_loss``; 4000 graphs, batches of 128, Adam, 2 threads): ``eager`` with PyG's DataLoader,
``gnncompile`` as the molecules benchmark's ``gnncompile-pooled`` (``gnncompile.compile(model,
dynamic=True)``, ``PooledLoader``). Each model x variant runs one first epoch in a fresh process
(rounds in turn), timed whole with wall-clock timers, and the compiled one is taken apart
without a profiler:

* the first step: its forward (Dynamo's compile of the model, then the first call of what it
  compiled), backward and optimizer step;
* inside the compile (``torch._dynamo.utils.compilation_time_metrics``, Dynamo's own timers):
  Dynamo's tracing of the model's bytecode (``bytecode_tracing``; of it, the fake-tensor
  propagation of each op, ``get_fake_value``, and the wrapping of inputs and parameters,
  ``variable_builder_call``), building its guards (``build_guards``), and the backend
  (``OutputGraph.call_user_compiler``): gnncompile's passes, the unrewritten copy kept for the
  speed guard, the portfolio's measurement when a class is not cached yet, the inner compiler;
* after it: the other 31 steps against eager's other 31 steps; the speed guard's races (how
  many calls ran each form, and the forward time of the form that lost above the median of the
  one that won: what the race cost compared with knowing the winner from the start); generated
  kernels built or loaded (``gnncompile.codegen``); graph structures built; recompiles and graph
  breaks; the garbage collector's full collections (``gc.callbacks``: in the epoch, and in the
  first forward) and the time of its younger ones.

``--variants``: besides ``eager`` and ``gnncompile``, ``gnncompile-nolean`` (``gnncompile.compile``
with ``settings={"choices": {"lean_layers": "off"}}``: Dynamo traces PyG's layers as written
instead of gnncompile's lean forwards, :mod:`gnncompile.compiler.lean`), ``gnncompile-nonormmemo``
(lean forwards on, but every GCNConv layer traces its own ``gcn_norm``: ``lean.NORM_MEMO`` off),
``gnncompile-notrim``
(``gnncompile.compile`` with :mod:`gnncompile.compiler.trims` off: Dynamo's first compile with
the work it does for logs, metrics and a lazy import), ``dynamo-eager`` (``torch.compile(model,
backend="eager", dynamic=True)`` with the sizes captured as gnncompile captures them: Dynamo
alone, no passes, no guard) and ``gnncompile-warm`` (another small function compiled before
the epoch, not timed: Dynamo's first use in a process, its lazy imports and caches, paid
outside the epoch).

``--attribute``: one more process per model that times Dynamo's tracing by the user function
it inlines (inclusive and exclusive of the functions it calls; the timers add their own cost,
so these are shares, not totals). ``--dynamo k=v`` (repeatable): a compiled variant with that
``torch._dynamo.config`` (or ``fx.k=v``: ``torch.fx.experimental._config``) value, checked for
the same captured graph (the nodes of the graph Dynamo hands to the backend, :func:`graph_key`), the same first
loss, graph breaks and recompiles as the default. Writes
benchmarks/results/first_epoch.{json,md,png}.
"""
from __future__ import annotations

import argparse
import collections
import copy
import hashlib
import json
import statistics
import time
import warnings
from pathlib import Path

import gnncompile  # (the installed package; imported before anything else)
import torch

from . import _common
from . import molecules as M

VARIANTS = ("eager", "gnncompile", "dynamo-eager", "gnncompile-warm", "gnncompile-nolean", "gnncompile-notrim",
            "gnncompile-nonormmemo")
DYNAMO_KEYS = ("_compile.compile_inner", "bytecode_tracing", "get_fake_value", "variable_builder_call",
               "build_guards", "OutputGraph.call_user_compiler", "insert_deferred_runtime_asserts")


# ----------------------------------------------------------------------------- probes
class Probes:
    """Wall-clock timers around gnncompile's backend and the speed guard's forms (installed
    before the model is compiled; each adds one perf_counter pair to the call it wraps)."""

    def __init__(self) -> None:
        from gnncompile import passes
        from gnncompile.compiler import backend as B, portfolio as P
        from gnncompile.ops import structure as S

        self.t = collections.defaultdict(float)
        self.n = collections.Counter()
        self.graphs: list = []  # graph_key of each graph Dynamo hands to the backend
        self.forms: dict = collections.defaultdict(list)  # 'model:eager' -> [(call index, fwd s)]
        self.calls = 0

        def timed(name, fn):
            def wrapper(*a, **k):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    self.t[name] += time.perf_counter() - t0
                    self.n[name] += 1
            return wrapper

        passes.run = timed("passes", passes.run)
        B.unrewritten_copy = timed("unrewritten copy", B.unrewritten_copy)
        P.measure = timed("portfolio measurement", P.measure)
        S.build = timed("structure builds", S.build)
        inner = B._inner
        B._inner = lambda name: timed("inner compiler", inner(name))
        call = B.Backend.__call__

        def backend_call(be, gm, example_inputs):
            self.graphs.append(graph_key(gm))
            return timed("backend", call)(be, gm, example_inputs)
        B.Backend.__call__ = backend_call

    def watch(self, racer, tag: str) -> None:
        """Times each call of ``racer``'s two forms (a SpeedGuard or the ModelGuard)."""
        if getattr(racer, "_probed", False):
            return
        racer._probed = True

        def timed(fn, name):
            def wrapper(*a, **k):
                t0 = time.perf_counter()
                out = fn(*a, **k)
                self.forms[f"{tag}:{name}"].append((self.calls, time.perf_counter() - t0))
                return out
            return wrapper
        f0, f1 = racer._forms
        racer._forms = (timed(f0, racer._names[0]), timed(f1, racer._names[1]))

    def race_costs(self, decisions) -> dict:
        """Per race: calls of each form, and the loser's forward seconds above the winner's
        median forward (0 where the loser was faster per call: the race then gained)."""
        out = {}
        for tag in ("piece", "model"):
            names = sorted({k.split(":")[1] for k in self.forms if k.startswith(tag + ":")})
            if len(names) < 2:
                continue
            kept = [d.kept for d in decisions if (d.piece.startswith("the whole model") == (tag == "model")) and d.grad]
            if not kept:
                continue
            win = kept[-1]
            lose = next(n for n in names if n != win)
            # (call 0 of the compiled form is the compile)
            w = [s for i, s in self.forms[f"{tag}:{win}"] if i > 0]
            lo = [s for i, s in self.forms[f"{tag}:{lose}"] if i > 0]
            med = statistics.median(w)
            out[tag] = {"kept": win, "calls": {win: len(w), lose: len(lo)}, "winner_median_ms": med * 1e3,
                        "loser_median_ms": statistics.median(lo) * 1e3 if lo else None,
                        "cost_ms": max(0.0, sum(lo) - med * len(lo)) * 1e3}
        return out


def graph_key(gm) -> str:
    """A short sha1 of the graph Dynamo hands to the backend: each node's op, name, target,
    args and kwargs in order. Not of ``gm.code``: Dynamo's graph module compiles lazily, and
    reading its code generates and compiles Python the compile itself never runs (the passes
    rewrite the graph first), 3-10 ms inside the first forward."""
    from torch.fx.node import map_arg

    def target(t):
        return t if isinstance(t, str) else f"{getattr(t, '__module__', '')}.{getattr(t, '__qualname__', repr(t))}"

    rows = [f"{n.op} {n.name} {target(n.target)} {map_arg(n.args, lambda a: a.name)!r} "
            f"{map_arg(dict(n.kwargs), lambda a: a.name)!r}" for n in gm.graph.nodes]
    return hashlib.sha1("\n".join(rows).encode()).hexdigest()[:12]


class TraceAttribution:
    """Dynamo's tracing time by the user function it inlines (``InliningInstructionTranslator.
    inline_call``): inclusive and exclusive seconds, calls."""

    def __init__(self) -> None:
        from torch._dynamo import symbolic_convert as SC

        self.incl = collections.defaultdict(float)
        self.excl = collections.defaultdict(float)
        self.count = collections.Counter()
        stack: list = []
        orig = SC.InliningInstructionTranslator.inline_call.__func__

        def inline_call(cls, parent, func, args, kwargs, **kw):
            try:
                code = func.get_code()
                name = code.co_filename.split("site-packages/")[-1]
                if name.startswith("/tmp/") and "propagate" in name:  # PyG's generated propagate
                    name = "(PyG's generated " + name.split(".")[-2].rsplit("_", 1)[0] + ")"
                key = f"{name}:{code.co_firstlineno} {code.co_name}"
            except Exception:  # pragma: no cover - an unusual callable
                key = type(func).__name__
            t0 = time.perf_counter()
            stack.append(0.0)
            try:
                return orig(cls, parent, func, args, kwargs, **kw)
            finally:
                dt = time.perf_counter() - t0
                child = stack.pop()
                self.incl[key] += dt
                self.excl[key] += dt - child
                self.count[key] += 1
                if stack:
                    stack[-1] += dt
        SC.InliningInstructionTranslator.inline_call = classmethod(inline_call)

    def top(self, n: int) -> list:
        rows = sorted(self.excl.items(), key=lambda kv: -kv[1])[:n]
        return [{"function": k, "exclusive_ms": v * 1e3, "inclusive_ms": self.incl[k] * 1e3, "calls": self.count[k]}
                for k, v in rows]


class GcTimer:
    """Wall-clock seconds of the garbage collector's passes while it is installed (``gc.callbacks``):
    full collections (generation 2: the whole heap, the dataset's graphs included) and the
    younger ones."""

    def __init__(self) -> None:
        import gc

        self.full_s = self.young_s = 0.0
        self.full_n = 0
        self._t0 = 0.0

        def callback(phase, info):
            if phase == "start":
                self._t0 = time.perf_counter()
                return
            dt = time.perf_counter() - self._t0
            if info.get("generation") == 2:
                self.full_s += dt
                self.full_n += 1
            else:
                self.young_s += dt
        self._cb = callback
        gc.callbacks.append(callback)

    def stop(self) -> None:
        import gc

        if self._cb in gc.callbacks:
            gc.callbacks.remove(self._cb)


# ----------------------------------------------------------------------------- one run
def _set_config(items) -> None:
    for item in items or []:
        key, value = item.split("=", 1)
        mod = torch.fx.experimental._config if key.startswith("fx.") else torch._dynamo.config
        name = key.split(".")[-1]
        if not hasattr(mod, name):
            raise SystemExit(f"unknown config {key}")
        setattr(mod, name, json.loads(value))


def measure(kind: str, variant: str, opts) -> dict:
    from torch._dynamo.utils import compilation_time_metrics as ctm, counters

    torch.set_num_threads(opts.threads)
    compiled = variant != "eager"
    _set_config(opts.dynamo if variant == "gnncompile+config" else None)
    if variant == "gnncompile-notrim":  # Dynamo's first compile as is (gnncompile.compiler.trims off)
        from gnncompile.compiler import trims

        trims.ENABLED[0] = False
    if variant == "gnncompile-nonormmemo":  # each GCNConv layer traces its own gcn_norm
        from gnncompile.compiler import lean

        lean.NORM_MEMO[0] = False
    probes = Probes() if compiled and not opts.attribute_child else None
    attribution = TraceAttribution() if opts.attribute_child else None
    dataset = M.make_dataset(opts.graphs)
    warm_up_s = warm_up() if variant == "gnncompile-warm" else 0.0
    counters.clear()
    ctm.clear()
    model0 = M.build_model(kind)
    ref, model = copy.deepcopy(model0), copy.deepcopy(model0)
    if variant == "dynamo-eager":  # Dynamo alone: the same capture, no passes, no guard
        from gnncompile.compiler.backend import dynamic_output_shapes

        plain = torch.compile(model, backend="eager", dynamic=True)

        def run(*args):
            with dynamic_output_shapes(True):
                return plain(*args)
    elif variant == "gnncompile-nolean":  # PyG's code traced as written (gnncompile.compiler.lean off)
        run = gnncompile.compile(model, dynamic=True, settings={"choices": {"lean_layers": "off"}})
    else:
        run = M.wrap(model, "gnncompile-pooled" if compiled else "eager")
    if probes is not None and getattr(run, "_guard", None) is not None:
        probes.watch(run._guard, "model")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = M.make_loader(dataset, opts.batch_size, "gnncompile-pooled" if compiled else "eager")
    steps, losses, first, ref_s, expect = [], [], {}, 0.0, None
    collections_ = GcTimer()
    t_epoch = time.perf_counter()
    for i, b in enumerate(loader):
        if i == 0:  # the first loss against eager's (not timed)
            t = time.perf_counter()
            with torch.no_grad():
                expect = float(M._loss(ref, b))
            ref_s = time.perf_counter() - t
        if probes is not None:
            probes.calls = i
            if i == 1 and hasattr(run, "_backend"):
                for g in (r() for r in run._backend.guards):
                    if g is not None:
                        probes.watch(g, "piece")
        c0, t0 = time.process_time(), time.perf_counter()
        opt.zero_grad(set_to_none=True)
        gc_before = collections_.full_s
        out = run(b.x, b.edge_index, b.edge_attr, b.batch)
        t1, c1 = time.perf_counter(), time.process_time()
        if i == 0:
            gc_forward = collections_.full_s - gc_before
        loss = torch.nn.functional.cross_entropy(out, b.y)
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        losses.append(float(loss))
        t3 = time.perf_counter()
        steps.append(t3 - t0)
        if i == 0:
            # (CPU seconds of the process: less sensitive to other jobs than the wall clock)
            first = {"forward_s": t1 - t0, "forward_cpu_s": c1 - c0, "backward_s": t2 - t1, "optimizer_s": t3 - t2}
    epoch = time.perf_counter() - t_epoch - ref_s
    collections_.stop()
    out = {"model": kind, "variant": variant, "first_epoch_s": epoch, "first_step_s": steps[0], "first_step": first,
           "rest_s": sum(steps[1:]), "rest_loader_s": epoch - sum(steps), "steps": len(steps),
           "step_median_ms": statistics.median(steps[1:]) * 1e3, "first_loss": losses[0], "first_loss_eager": expect,
           "steps_ms": [round(s * 1e3, 3) for s in steps], "threads": torch.get_num_threads(), "config": opts.dynamo if variant == "gnncompile+config" else [],
           "warm_up_s": warm_up_s, "gc_full_s": collections_.full_s, "gc_full_n": collections_.full_n,
           "gc_full_first_forward_s": gc_forward, "gc_young_s": collections_.young_s}
    if not compiled:
        return out
    out["dynamo_s"] = {k: sum(ctm.get(k, [0.0])) for k in DYNAMO_KEYS}
    out["graphs_compiled"] = counters["stats"]["unique_graphs"]
    out["graph_breaks"] = sum(counters["graph_break"].values())
    out["guard"] = [str(d) for d in run.guard_decisions()] if hasattr(run, "guard_decisions") else []
    if attribution is not None:
        out["attribution"] = attribution.top(opts.top)
        return out
    from gnncompile.codegen import build

    out["gnncompile_s"] = dict(probes.t)
    out["gnncompile_calls"] = dict(probes.n)
    out["graph_code"] = probes.graphs
    out["codegen"] = dict(getattr(build, "stats", {}))
    out["races"] = probes.race_costs(run.guard_decisions()) if hasattr(run, "guard_decisions") else {}
    out["form_calls"] = {k: len(v) for k, v in probes.forms.items()}
    return out


def warm_up() -> float:
    """Compiles and runs a two-line function with dynamic shapes and a captured scalar (not the
    model): Dynamo's first-use work in a process (lazy imports, caches), paid before the epoch.
    Returns its seconds."""
    from gnncompile.compiler.backend import dynamic_output_shapes

    f = torch.compile(lambda x, i: (x[i] * 2).sum(0) + int(i.max()), backend="eager", dynamic=True)
    t0 = time.perf_counter()
    with dynamic_output_shapes(True):
        f(torch.randn(10, 3), torch.arange(5))
    return time.perf_counter() - t0


def child(kind: str, variant: str, opts, attribute: bool = False) -> dict:
    cmd = _common.module_command("first_epoch") + [
        "--child", f"{kind}:{variant}", "--graphs", str(opts.graphs), "--batch-size", str(opts.batch_size),
        "--threads", str(opts.threads), "--top", str(opts.top)]
    for item in opts.dynamo or []:
        cmd += ["--dynamo", item]
    if attribute:
        cmd.append("--attribute-child")
    return _common.run_child(cmd, _common.timing_env(opts.threads), opts.timeout, tail_chars=2000)


# ----------------------------------------------------------------------------- report
def combine(rounds: list, eager: list) -> dict:
    ok = [r for r in rounds if "first_epoch_s" in r]
    if not ok:
        return rounds[0] if rounds else {"error": "no run"}
    med = statistics.median
    out = dict(ok[0])
    for k in ("first_epoch_s", "first_step_s", "rest_s", "rest_loader_s", "step_median_ms", "warm_up_s", "gc_full_s",
              "gc_full_n", "gc_full_first_forward_s", "gc_young_s"):
        out[k] = med(r.get(k, 0.0) for r in ok)
    out["first_step"] = {k: med(r["first_step"][k] for r in ok) for k in ok[0]["first_step"]}
    for group in ("dynamo_s", "gnncompile_s"):
        if group in ok[0]:
            keys = {k for r in ok for k in r[group]}
            out[group] = {k: med(r[group].get(k, 0.0) for r in ok) for k in sorted(keys)}
    if "races" in ok[0]:
        out["race_cost_ms"] = {t: med(r["races"][t]["cost_ms"] for r in ok if t in r.get("races", {}))
                               for t in ok[0]["races"]}
    pairs = [(r, e) for r, e in zip(rounds, eager or []) if "first_epoch_s" in r and "first_epoch_s" in e]
    if pairs:
        out["over_eager_first_epoch"] = med(r["first_epoch_s"] / e["first_epoch_s"] for r, e in pairs)
    out["rounds"] = rounds
    return out


def _ms(s) -> str:
    return f"{s * 1e3:.0f}"


def markdown(p: dict) -> str:
    lines = ["First epoch (32 steps, compile included), wall-clock ms, medians over the rounds:", "",
             "| | " + " | ".join(f"{k} eager | {k} gnncompile" for k in p["models"]) + " |",
             "|---|" + "---|---|" * len(p["models"])]
    R = p["results"]

    def row(label, fn_eager, fn_comp):
        cells = []
        for k in p["models"]:
            e, c = R[k].get("eager", {}), R[k].get("gnncompile", {})
            cells += [fn_eager(e) if fn_eager and "first_epoch_s" in e else "",
                      fn_comp(c) if fn_comp and "first_epoch_s" in c else ""]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("**first epoch**", lambda e: f"**{_ms(e['first_epoch_s'])}**",
        lambda c: f"**{_ms(c['first_epoch_s'])}** ({c.get('over_eager_first_epoch', 0):.2f}x eager)")
    row("first step", lambda e: _ms(e["first_step_s"]), lambda c: _ms(c["first_step_s"]))
    row("- its forward", lambda e: _ms(e["first_step"]["forward_s"]), lambda c: _ms(c["first_step"]["forward_s"]))
    row("- its forward, CPU time of the process", lambda e: _ms(e["first_step"]["forward_cpu_s"]),
        lambda c: _ms(c["first_step"]["forward_cpu_s"]))
    row("-- Dynamo's compile (compile_inner)", None, lambda c: _ms(c["dynamo_s"]["_compile.compile_inner"]))
    row("--- bytecode tracing", None, lambda c: _ms(c["dynamo_s"]["bytecode_tracing"]))
    row("---- of it: fake-tensor propagation", None, lambda c: _ms(c["dynamo_s"]["get_fake_value"]))
    row("---- of it: wrapping inputs, parameters", None, lambda c: _ms(c["dynamo_s"]["variable_builder_call"]))
    row("--- building guards", None, lambda c: _ms(c["dynamo_s"]["build_guards"]))
    row("--- runtime asserts", None, lambda c: _ms(c["dynamo_s"]["insert_deferred_runtime_asserts"]))
    row("--- the backend (gnncompile)", None, lambda c: _ms(c["gnncompile_s"].get("backend", 0)))
    row("---- passes", None, lambda c: _ms(c["gnncompile_s"].get("passes", 0)))
    row("---- unrewritten copy (guard)", None, lambda c: _ms(c["gnncompile_s"].get("unrewritten copy", 0)))
    row("---- inner compiler", None, lambda c: _ms(c["gnncompile_s"].get("inner compiler", 0)))
    row("---- portfolio measurement", None, lambda c: _ms(c["gnncompile_s"].get("portfolio measurement", 0)))
    row("--- rest of Dynamo's compile", None, lambda c: _ms(
        c["dynamo_s"]["_compile.compile_inner"] - c["dynamo_s"]["bytecode_tracing"] - c["dynamo_s"]["build_guards"]
        - c["dynamo_s"]["insert_deferred_runtime_asserts"] - c["gnncompile_s"].get("backend", 0)))
    row("-- outside the compile (first call of the graph, Dynamo's entry)", None,
        lambda c: _ms(c["first_step"]["forward_s"] - c["dynamo_s"]["_compile.compile_inner"]))
    row("- its backward + optimizer", lambda e: _ms(e["first_step"]["backward_s"] + e["first_step"]["optimizer_s"]),
        lambda c: _ms(c["first_step"]["backward_s"] + c["first_step"]["optimizer_s"]))
    row("steps 2-32", lambda e: _ms(e["rest_s"]), lambda c: _ms(c["rest_s"]))
    row("- of it: speed guard races, piece (loser's extra forward)", None,
        lambda c: f"{c.get('race_cost_ms', {}).get('piece', 0):.1f}")
    row("- of it: speed guard races, whole model", None, lambda c: f"{c.get('race_cost_ms', {}).get('model', 0):.1f}")
    row("structure builds (all 32 steps)", None, lambda c: _ms(c["gnncompile_s"].get("structure builds", 0)))
    row("loader (all 32 batches)", lambda e: _ms(e["rest_loader_s"]), lambda c: _ms(c["rest_loader_s"]))
    row("full garbage collections in the epoch (count, ms)", lambda e: f"{e.get('gc_full_n', 0):.0f}, {_ms(e.get('gc_full_s', 0))}",
        lambda c: f"{c.get('gc_full_n', 0):.0f}, {_ms(c.get('gc_full_s', 0))}")
    row("- of it in the first forward", lambda e: _ms(e.get("gc_full_first_forward_s", 0)),
        lambda c: _ms(c.get("gc_full_first_forward_s", 0)))
    row("younger collections in the epoch (ms)", lambda e: _ms(e.get("gc_young_s", 0)), lambda c: _ms(c.get("gc_young_s", 0)))
    row("median step 2-32", lambda e: f"{e['step_median_ms']:.1f}", lambda c: f"{c['step_median_ms']:.1f}")
    row("graphs compiled / breaks", None, lambda c: f"{c['graphs_compiled']} / {c['graph_breaks']}")
    row("generated kernels built / loaded", None,
        lambda c: f"{c['codegen'].get('builds', 0)} / {c['codegen'].get('disk_hits', 0)}")
    extra = ("dynamo-eager", "gnncompile-warm", "gnncompile-nolean", "gnncompile-notrim", "gnncompile-nonormmemo")
    others = [(k, v, R[k][v]) for k in p["models"] for v in R[k] if v in extra
              or (v == "gnncompile" and any(o in R[k] for o in extra))]
    if others:
        lines += ["", "Dynamo alone (dynamo-eager: `torch.compile(model, backend='eager', dynamic=True)` with the "
                  "same capture of sizes, no passes, no guard), Dynamo's first use in the process "
                  "(gnncompile-warm: another function compiled before the epoch, its time not counted) and "
                  "PyG's code traced as written (gnncompile-nolean: `settings={'choices': {'lean_layers': "
                  "'off'}}`, gnncompile.compiler.lean off), every GCNConv layer tracing its own normalization "
                  "(gnncompile-nonormmemo: gnncompile.compiler.lean.NORM_MEMO off) and Dynamo's first compile as is (gnncompile-notrim: "
                  "gnncompile.compiler.trims off):", "",
                  "| model | variant | first epoch ms | vs eager | first forward ms | compile_inner ms | "
                  "bytecode tracing ms | wrapping inputs, parameters ms | building guards ms | full GCs: count, ms (in the first forward) | "
                  "median step 2-32 ms | first loss | warm-up compile ms (before the epoch) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for k, v, r in others:
            if "first_epoch_s" not in r:
                lines.append(f"| {k} | {v} | error: {r.get('error', '')[:200]} | | | | | | | | | | |")
                continue
            lines.append(f"| {k} | {v} | {_ms(r['first_epoch_s'])} | {r.get('over_eager_first_epoch', 0):.2f}x | "
                         f"{_ms(r['first_step']['forward_s'])} | {_ms(r['dynamo_s']['_compile.compile_inner'])} | "
                         f"{_ms(r['dynamo_s']['bytecode_tracing'])} | {_ms(r['dynamo_s']['variable_builder_call'])} | "
                         f"{_ms(r['dynamo_s']['build_guards'])} | "
                         f"{r.get('gc_full_n', 0):.0f}, {_ms(r.get('gc_full_s', 0))} ({_ms(r.get('gc_full_first_forward_s', 0))}) | "
                         f"{r['step_median_ms']:.1f} | {r['first_loss']:.6f} | {_ms(r.get('warm_up_s', 0.0))} |")
    lines += ["", "What the speed guard kept (first round):", ""]
    for k in p["models"]:
        c = R[k].get("gnncompile", {})
        lines += [f"- {k}: {g}" for g in c.get("guard", [])]
    if p.get("attribution"):
        lines += ["", "Dynamo's tracing by the function it inlines (one more process per model, timers around "
                  "every inlined call: shares, not totals; exclusive = not counting the functions it calls; "
                  "the fake-tensor propagation of an op counts to the function that calls it):", ""]
        for k, a in p["attribution"].items():
            if "attribution" not in a:
                lines.append(f"- {k}: {a.get('error', 'no result')}")
                continue
            total = a["dynamo_s"]["bytecode_tracing"] * 1e3
            lines += [f"{k} (bytecode tracing {total:.0f} ms in this process):", "",
                      "| function | exclusive ms | inclusive ms | calls |", "|---|---|---|---|"]
            lines += [f"| `{r['function']}` | {r['exclusive_ms']:.1f} | {r['inclusive_ms']:.1f} | {r['calls']} |"
                      for r in a["attribution"]]
            lines.append("")
    if p.get("configs"):
        lines += ["", "Dynamo configuration tried (compiled variant with the setting vs the default, same "
                  "round; exact = same graph (its nodes) handed to the backend, same first loss, same breaks and "
                  "recompiles):", "",
                  "| model | setting | first epoch ms (default) | compile_inner ms (default) | first forward CPU ms "
                  "(default) | same graph | same first loss | breaks | graphs |", "|---|---|---|---|---|---|---|---|---|"]
        for k, rows in p["configs"].items():
            for r in rows:
                if "first_epoch_s" not in r["with"]:
                    lines.append(f"| {k} | {' '.join(r['setting'])} | error: {r['with'].get('error', '')[:200]} | | | | | | |")
                    continue
                w, d = r["with"], r["default"]
                lines.append(f"| {k} | `{' '.join(r['setting'])}` | {_ms(w['first_epoch_s'])} ({_ms(d['first_epoch_s'])}) | "
                             f"{_ms(w['dynamo_s']['_compile.compile_inner'])} ({_ms(d['dynamo_s']['_compile.compile_inner'])}) | "
                             f"{_ms(w['first_step']['forward_cpu_s'])} ({_ms(d['first_step']['forward_cpu_s'])}) | "
                             f"{'yes' if w['graph_code'] == d['graph_code'] else 'no'} | "
                             f"{'yes' if w['first_loss'] == d['first_loss'] else 'no'} | {w['graph_breaks']} | "
                             f"{w['graphs_compiled']} |")
    lines += ["", f"{p['graphs']} generated molecule-sized graphs (benchmarks/molecules.py), batches of "
              f"{p['batch_size']}, {p['threads']} threads; eager with PyG's DataLoader, gnncompile with "
              f"PooledLoader and `gnncompile.compile(model, dynamic=True)`; each model x variant in a process of "
              f"its own, {p['rounds']} round(s) in turn; ratio = median of each round's gnncompile / eager. "
              f"CPU: {p['cpu']}; torch {p['machine']['torch']}. {_common.load_text(p['loadavg_before_after'])} "
              f"(a shared machine). Command: `{p['command']}`"]
    return "\n".join(lines) + "\n"


def plot(p: dict, path: Path) -> None:
    """Stacked bars per model and variant: the first epoch's parts (medians over the rounds), the
    2x-eager line of issue 24 per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = (("Dynamo tracing", lambda r: r["dynamo_s"]["bytecode_tracing"]),
             ("building guards", lambda r: r["dynamo_s"]["build_guards"]),
             ("rest of the compile (backend incl.)", lambda r: r["dynamo_s"]["_compile.compile_inner"]
              - r["dynamo_s"]["bytecode_tracing"] - r["dynamo_s"]["build_guards"]),
             ("first step's rest", lambda r: r["first_step_s"] - r.get("dynamo_s", {}).get("_compile.compile_inner", 0.0)),
             ("steps 2-32", lambda r: r["rest_s"]),
             ("loader", lambda r: r["rest_loader_s"]))
    bars, labels = [], []
    for k in p["models"]:
        for v, r in p["results"][k].items():
            if "first_epoch_s" in r:
                bars.append((k, v, r))
                labels.append(f"{k}\n{v.replace('gnncompile', 'gnc')}")
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(bars)), 4.5))
    bottom = [0.0] * len(bars)
    for name, fn in parts:
        vals = [max(0.0, fn(r) if "dynamo_s" in r or name in ("first step's rest", "steps 2-32", "loader") else 0.0) * 1e3
                for _, _, r in bars]
        ax.bar(range(len(bars)), vals, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, (k, v, r) in enumerate(bars):
        e = p["results"][k].get("eager", {})
        if v == "eager" and "first_epoch_s" in e:
            n = sum(1 for kk, _, _ in bars if kk == k)
            ax.hlines(2e3 * e["first_epoch_s"], i - 0.4, i + n - 0.6, colors="k", linestyles="dashed", lw=0.8)
    ax.set_xticks(range(len(bars)), labels, fontsize=7)
    ax.set_ylabel("first epoch, ms (median of the rounds)")
    ax.set_title(f"first epoch, compile included (dashed: 2x eager's); {p['cpu']}", fontsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=4000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default=",".join(M.MODELS))
    ap.add_argument("--variants", default="eager,gnncompile",
                    help="comma list of eager, gnncompile, gnncompile-nolean (lean forwards off), gnncompile-nonormmemo "
                         "(each GCNConv layer traces its own gcn_norm), gnncompile-notrim "
                         "(gnncompile.compiler.trims off), dynamo-eager (torch.compile(backend='eager') with the "
                         "same capture: Dynamo alone), gnncompile-warm (after a warm-up compile of another "
                         "function: Dynamo's first use in the process paid before the epoch)")
    ap.add_argument("--attribute", action="store_true", help="also time Dynamo's tracing per inlined function")
    ap.add_argument("--top", type=int, default=12, help="functions listed by --attribute")
    ap.add_argument("--dynamo", action="append", default=None, metavar="KEY=JSON",
                    help="a compiled variant with this torch._dynamo.config (fx.KEY: fx.experimental._config)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", default="first_epoch")
    ap.add_argument("--results-dir", default=str(_common.RESULTS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--attribute-child", action="store_true", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if opts.child:
        kind, variant = opts.child.split(":")
        out = measure(kind, variant, opts)
        print("RESULT " + json.dumps(out), flush=True)
        return out
    models = [m.strip() for m in opts.models.split(",") if m.strip()]
    bad = [m for m in models if m not in M.MODELS]
    if bad:
        ap.error(f"unknown models {bad}; known: {', '.join(M.MODELS)}")
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad or "eager" not in variants:
        ap.error(f"unknown variants {bad} (known: {', '.join(VARIANTS)}); eager is needed (the ratios)")
    variants += ["gnncompile+config"] if opts.dynamo else []
    load_before = _common.loadavg()
    runs = {k: {v: [] for v in variants} for k in models}
    for rnd in range(opts.rounds):
        for k in models:
            for v in variants:
                r = child(k, v, opts)
                runs[k][v].append(r)
                print(f"round {rnd + 1} {k:<5} {v:<18} " + (
                    f"first epoch {r['first_epoch_s']:.3f} s, first step {r['first_step_s']:.3f} s, rest "
                    f"{r['rest_s']:.3f} s" if "first_epoch_s" in r else str(r)), flush=True)
    results = {k: {v: combine(runs[k][v], runs[k]["eager"]) for v in variants if v != "gnncompile+config"}
               for k in models}
    payload = {"machine": _common.machine(), "cpu": _common.cpu_model(), "graphs": opts.graphs,
               "batch_size": opts.batch_size, "threads": opts.threads, "rounds": opts.rounds, "models": models,
               "results": results, "command": _common.command("first_epoch", argv)}
    if opts.dynamo:
        payload["configs"] = {k: [{"setting": opts.dynamo, "with": combine(runs[k]["gnncompile+config"], None),
                                   "default": results[k]["gnncompile"]}] for k in models}
    if opts.attribute:
        payload["attribution"] = {k: child(k, "gnncompile", opts, attribute=True) for k in models}
    payload["loadavg_before_after"] = [load_before, _common.loadavg()]
    _common.write_results(Path(opts.results_dir), opts.out, payload, markdown, plot)
    return payload


if __name__ == "__main__":
    main()
