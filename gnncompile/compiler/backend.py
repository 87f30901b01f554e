"""The torch.compile backend ``"gnncompile"``.

Dynamo hands every captured graph piece (a torch-level FX graph; a model with graph breaks
gives several) to :func:`gnncompile_backend`, which

1. runs the rewrite passes (:mod:`gnncompile.passes`) on it, replacing message-passing chains
   with the fused custom ops (whose registered autograd formulas give the fused backward),
2. hands the rewritten graph to an inner compiler: ``"eager"`` (run the FX graph as is; autograd
   at run time), ``"aot_eager"`` (AOTAutograd traces forward + backward, no code generation) or
   ``"inductor"``: the backend's ``settings.inner``, which is 'auto' unless compile(inner=...),
   the profile or ``$GNNCOMPILE_INNER`` name one; 'auto' is chosen per graph piece from its
   size by :func:`choose_inner` (a measured rule: inductor for large graphs; "eager" for small
   ones, where inductor's compile costs more than it saves; :data:`AUTO_SMALL_FUSED_TRAINING`
   says why not aot_eager there), and
3. returns the result wrapped in a speed guard (:mod:`.guard`, unless ``settings.guard`` is
   'off'), which times it against the piece as captured on the first calls of each size class
   and keeps the faster: the compiled model is never slower than eager by more than the noise
   of that measurement.

``torch.compile(model, backend="gnncompile")`` uses the defaults and works without importing
gnncompile first: the package declares the name in the ``torch_dynamo_backends`` entry-point group,
where Dynamo looks up backend names it does not know. :func:`make_backend` builds a configured
one, a picklable :class:`Backend` (what :func:`gnncompile.compile` does).
"""
from __future__ import annotations

import logging
import threading
import warnings
from typing import Callable, List, Optional

import torch
from torch.fx import GraphModule

from .. import config as _config
from .. import passes
from ..passes.canonical import size_hint
from ..passes.report import one_line
from ..settings import Settings
from ..ops import hoisted, loops
from . import lean as _lean
from . import trims as _trims
from .._log import get_logger, log_fusions
from . import portfolio as _portfolio
from .guard import SpeedGuard, unrewritten_copy

_log = get_logger(__name__)

INNERS = _config.INNERS
# compile(inner=...), else the profile's inner, else $GNNCOMPILE_INNER (gnncompile.config) picks
# one for every graph piece (Settings.inner); the test suite sets aot_eager, for speed. Earlier
# measurements of aot_eager vs inductor: benchmarks/results/HISTORY.md, "Inner compiler".

# 'auto' (no compile(inner=...), no profile inner, no $GNNCOMPILE_INNER): each graph piece gets inductor when its
# graph is large enough that inductor's faster steps repay its longer compile within a typical
# training run, else "eager" (the rewritten graph run op by op: fused kernels and hoisted
# graph-only work, nothing generated, a first call of about two seconds). Size = nodes + edges
# of the piece's largest inputs. Measured with benchmarks/inner_rule.py (results/inner_rule.md,
# inner_rule_sage_gin.md; 2-layer models, F = 128, 2 threads, fresh process and empty compile
# cache): inductor's extra compile is 10-20 s; over 200 steps it repays that for GraphSAGE, GIN
# and GAT at 1.1M (100k nodes + 1M edges: 1014 -> 667, 1094 -> 886, 1351 -> 1105 ms per step)
# and for none of them at 110k or 330k (GCN not even at 1.1M: 596 vs 601 ms). The threshold
# sits between the two measured sizes.
AUTO_INDUCTOR_MIN_SIZE = 600_000
# Below that size, a piece with fused ops that records a backward could go to aot_eager instead of
# "eager" (measured, not taken: see below). AOTAutograd traces the forward and the fused ops' backward formulas once (one
# CompiledFunction node a call), where "eager" runs every fused op's torch.library autograd glue
# in Python at each call (fill_defaults, autograd_impl: tens of us an op) and autograd records
# every op as written. A piece with nothing fused saves nothing that way and pays AOTAutograd's
# runtime wrapper (a GINEConv layer left as written, 2k-7k edges: 0.3-0.5 ms a step slower).
# Measured (issue 24, benchmarks/results/small_steps.md): molecule batches (3.3k nodes, 7k
# edges, 3 layers, Adam), the zoo (2000 nodes, 16k edges), GINEConv alone at 2k-16k edges:
# model alone GCN 1.57x -> 1.77x eager, GINE 0.96x -> 1.05x, GIN a tie.
# But AOTAutograd's trace costs about 1.1 s more at the first call: in one run of
# `python -m benchmarks molecules --rounds 3` (benchmarks/results/molecules.md, variants
# gnncompile-pooled with aot_eager there against gnncompile-pooled-before with "eager"), the
# first epoch (32 steps, compile included) took 2.35-2.40 s against 1.15-1.44 s, 4.6-5.6x
# eager's first epoch against 2.3-3.1x, while a step gains 0.3-1.1 ms: repaid after 1000-3700
# steps (30-120 epochs of that workload). So 'auto' keeps "eager" for small pieces; the choice
# after the passes stays (this constant names it), and compile(inner='aot_eager') takes the
# faster steps for long runs.
AUTO_SMALL_FUSED_TRAINING = "eager"


def graph_size(example_inputs) -> int:
    """Nodes + edges of a graph piece's inputs: the longest dim 0 of a float tensor that is not
    a parameter, plus the longest dim 1 of an integer ``[2, E]`` tensor. Sizes are read from
    their hints, never specialised (a dynamic piece stays dynamic); a size with no hint counts
    as a large graph."""
    nodes = edges = 0
    for t in example_inputs:
        if not isinstance(t, torch.Tensor) or isinstance(t, torch.nn.Parameter) or t.dim() == 0:
            continue
        first = size_hint(t.shape[0])
        if t.is_floating_point():
            if first is None:
                return AUTO_INDUCTOR_MIN_SIZE
            nodes = max(nodes, first)
        elif t.dim() == 2 and first == 2:
            second = size_hint(t.shape[1])
            if second is None:
                return AUTO_INDUCTOR_MIN_SIZE
            edges = max(edges, second)
    return nodes + edges


def needs_grad(example_inputs) -> bool:
    """Whether a call of the piece records a backward (grad mode on, an input or parameter that
    requires a gradient)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def unbacked_sized(gm: GraphModule) -> List[str]:
    """The nodes of ``gm`` whose value has a data-dependent (unbacked) size, as 'name (shape)'.
    Inductor (torch 2.13) fails to compile the backward of such a piece when one of them is
    saved for it (``InductorError: For u0 + 1000, expected [u0] to have been codegen-ed``:
    GATConv(edge_dim=...) at its first backward, where the self-loops' edge features, of size
    ``E' + N`` with ``E'`` the count of ``edge_index[:, mask]``, feed lin_edge). The hoisting
    pass moves most such work out of the graph; what it leaves is what this finds."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    out = []
    for n in gm.graph.nodes:
        v = n.meta.get("val", n.meta.get("example_value"))
        if isinstance(v, torch.Tensor) and free_unbacked_symbols(v.shape):
            out.append(f"{n.name} {tuple(v.shape)}")
    return out


def inductor_fallback_note(sized: List[str], explicit: bool) -> str:
    return (f"inner compiler: aot_eager instead of inductor{' (asked for)' if explicit else ' (auto)'} for a piece "
            f"with {len(sized)} value(s) of data-dependent size ({', '.join(sized[:3])}"
            f"{', ...' if len(sized) > 3 else ''}): inductor fails to compile the backward of such a "
            f"piece; the fused kernels run either way")


_warned: set = set()


def _warn_once(message: str) -> None:
    key = message.split(" for a piece")[0]
    if key not in _warned:
        _warned.add(key)
        warnings.warn("gnncompile: " + message, RuntimeWarning, stacklevel=3)


def choose_inner(example_inputs, fused: int = 0) -> str:
    """The inner compiler 'auto' uses for a graph piece whose rewrite fused ``fused`` chains:
    inductor from AUTO_INDUCTOR_MIN_SIZE; below it :data:`AUTO_SMALL_FUSED_TRAINING` ("eager":
    see there why not aot_eager) for a piece that has fused ops and records a backward
    (:func:`needs_grad` at compile time: Dynamo compiles grad-mode and no-grad calls apart),
    "eager" otherwise."""
    if graph_size(example_inputs) >= AUTO_INDUCTOR_MIN_SIZE:
        return "inductor"
    return AUTO_SMALL_FUSED_TRAINING if fused and needs_grad(example_inputs) else "eager"

# Data-dependent sizes are traced into the graph instead of breaking it, while a
# gnncompile-compiled callable runs (see :func:`dynamic_output_shapes`):
# * ops with data-dependent output sizes (``edge_index[:, mask]`` in add_remaining_self_loops
#   and remove_self_loops, in every default GCNConv / GATConv): Dynamo's
#   capture_dynamic_output_shape_ops. The hoisting pass then moves them, with the rest of the
#   graph-only work, into a cached region;
# * scalars read from tensors (``int(index.max()) + 1`` where PyG infers a size that was not
#   given: ``global_*_pool(x, batch)``, ``aggr.*`` readouts, ``to_dense_batch``, ``softmax``):
#   Dynamo's capture_scalar_outputs. The size becomes an unbacked symbolic size of the graph,
#   read when the graph runs (as eager reads it), so graph-level readout compiles in the same
#   piece as the layers and its reductions fuse as segment reductions.
# Settings.capture_dynamic = False (GNNCOMPILE_CAPTURE_DYNAMIC=0) turns both off: the graph
# breaks there again, as with plain torch.compile. CAPTURE_OUTPUTS ("outputs") keeps the first
# and reads scalars eagerly: what a compiled module switches to where a captured scalar ended a
# piece at a data-dependent guard (CompiledModule._capture_switch).
_CAPTURE_FLAGS = ("capture_dynamic_output_shape_ops", "capture_scalar_outputs")
CAPTURE_OUTPUTS = "outputs"
#: the words of Dynamo's graph-break reason when a guard needed the value of a captured size
DATA_DEPENDENT = "guard on data-dependent expression"
#: calls whose break on a data-dependent guard makes a compiled module compile again with scalar
#: reads left to eager: torch's attention, which a rewrite fuses once a graph reaches it. Other
#: such breaks (a Python branch on a captured size, as in RGCNConv) stay: there the breaks at
#: every scalar read cost more than they give (RGCNConv 1.47x -> 1.27x eager in the zoo)
SWITCH_CALLS = ("multi_head_attention_forward", "scaled_dot_product_attention")


class dynamic_output_shapes:
    """Context manager: Dynamo captures ops with data-dependent output sizes and scalar reads
    while it is active (each flag restored afterwards; a no-op for a flag already on, and
    entirely when ``on`` is False: a model's ``settings.capture_dynamic``). ``on`` =
    :data:`CAPTURE_OUTPUTS` captures the ops only (scalar reads break the graph)."""

    __slots__ = ("_set", "_on")

    def __init__(self, on: bool = True) -> None:
        self._on = on

    def __enter__(self):
        cfg = torch._dynamo.config
        flags = _CAPTURE_FLAGS[:1] if self._on == CAPTURE_OUTPUTS else _CAPTURE_FLAGS
        self._set = [f for f in flags if self._on and not getattr(cfg, f)]
        for f in self._set:
            setattr(cfg, f, True)
        return self

    def __exit__(self, *exc):
        for f in self._set:
            setattr(torch._dynamo.config, f, False)
        return False


# What the backend has done in this process (for tests and explain()).
STATS = {"graphs": 0, "fused": 0}
_local = threading.local()


def _collectors() -> List[list]:
    if not hasattr(_local, "collectors"):
        _local.collectors = []
    return _local.collectors


def frame_parameters(gm: GraphModule, example_inputs) -> dict:
    """id(parameter) -> its path below the root of the frame Dynamo compiled ('lin_l.weight').
    A frame's root is not always the user's model: after a graph break in a loop Dynamo
    compiles each layer as a frame of its own."""
    from ..passes.canonical import module_path

    out = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n, v in zip(placeholders, example_inputs):
        source = getattr(n.meta.get("grapharg"), "source", None)
        if isinstance(v, torch.nn.Parameter) and source is not None:
            name = source.name() if callable(source.name) else source.name
            out[id(v)] = module_path(name)
    return out


class collect:
    """Context manager: records the PassReport of every graph compiled inside it."""

    def __init__(self) -> None:
        self.reports: list = []

    def __enter__(self):
        _collectors().append(self.reports)
        return self.reports

    def __exit__(self, *exc):
        _collectors().remove(self.reports)
        return False


def graph_forward(gm: GraphModule, example_inputs=None) -> Callable:
    """The "eager" inner compiler: ``gm``'s generated ``forward``, called as it is. Dynamo's
    graph modules recompile lazily: until then ``gm.forward`` is ``_lazy_forward``, which at every
    call checks for a pending recompile and then calls the module (``Module.__call__``, its
    ``_call_impl`` and GraphModule's wrapped call) to reach the generated code. Dynamo compiles
    such a module when a backend returns its ``forward`` and calls the generated code directly;
    the speed guard holds the forms itself, so it is done here for them too (about 3 us a call
    of a piece, and its rewritten and unrewritten forms alike)."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    if isinstance(gm, _LazyGraphModule):
        _LazyGraphModule.force_recompile(gm)
    return gm.forward


def _inner(name: str) -> Callable:
    if name == "eager":
        return graph_forward
    if name == "aot_eager":
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend("aot_eager")
    if name == "inductor":
        from torch._inductor.compile_fx import compile_fx

        return compile_fx
    raise ValueError(f"gnncompile: unknown inner compiler {name!r}; expected 'auto' or one of {INNERS}")


def break_reason(gm: GraphModule):
    """(reason, 'file:line (function)') of the graph break that ended the piece ``gm``, or
    ('', '') when it ended otherwise (the frame returned). The reason is Dynamo's, without its
    hints and debug context."""
    why = getattr(gm, "compile_subgraph_reason", None)
    if why is None or not getattr(why, "graph_break", False):
        return "", ""
    stack = getattr(why, "user_stack", None) or []
    at = f"{stack[-1].filename}:{stack[-1].lineno} ({stack[-1].name})" if stack else ""
    return plain_reason(why.reason), at


DDP_SPLIT = "DDPOptimizer intentional graph-break"  # the reason torch gives every piece of a DDP split


def _compile_id() -> str:
    """Dynamo's id of the frame compile under way ('' outside one): the pieces a DDP split
    hands over one by one share it."""
    try:
        cid = torch._guards.CompileContext.current_compile_id()
    except Exception:  # pragma: no cover - torch internals moved
        return ""
    return "" if cid is None else str(cid)


def plain_reason(reason) -> str:
    """Dynamo's graph-break reason on one line, without its hints and debug context."""
    return " ".join(ln.strip() for ln in str(reason).splitlines()
                    if ln.strip() and not ln.strip().startswith(("Hint:", "Developer debug context",
                                                                 "For more details")))


def _changed(report) -> bool:
    """Whether the passes changed anything a call runs (fused ops, hoisted regions, dropouts)."""
    return bool(report.fused or report.hoisted or report.dropouts or report.gathers
                or report.structures or report.linear_moved or report.aggregated_first)


def _summary(report) -> str:
    fused = [f"{f.kind if f.kind != 'spmm' else 'spmm[' + f.reduce + ']'} in {f.layer}" for f in report.fused]
    head = f"{report.num_fused} fused chain(s)"
    if not fused:
        return head
    more = f", +{len(fused) - 3} more" if len(fused) > 3 else ""
    return f"{head}: {', '.join(fused[:3])}{more}"


class Backend:
    """A configured gnncompile backend: the rewrite passes with ``settings``
    (:class:`gnncompile.settings.Settings`: the knobs baked into the fused calls, reassociate,
    slot order; ``rewrite=False`` skips the passes, for comparisons), then the inner compiler
    ``settings.inner``. A module-level class that holds only values, so whatever references it (a
    ``torch.compile`` result, a :class:`~gnncompile.compiler.CompiledModule`) can be pickled;
    the inner compiler's function is looked up again when it is unpickled."""

    def __init__(self, settings: Optional[Settings] = None, rewrite: bool = True) -> None:
        if isinstance(settings, str):
            raise TypeError("gnncompile.Backend(settings): give a Settings (make_backend(inner) takes a name)")
        self.settings = Settings.from_config() if settings is None else settings
        self.rewrite = bool(rewrite)
        self.guards: List = []  # weak references to the speed guards of the pieces compiled here
        # reasons of the graph breaks on a data-dependent guard in one of SWITCH_CALLS that ended
        # a piece compiled here
        self.data_dependent_breaks: List[str] = []
        inner = self.settings.inner
        self._inner_fn = None if inner == "auto" else _inner(inner)  # ValueError for an unknown name

    @property
    def inner(self) -> str:
        return self.settings.inner  # 'auto': chosen per graph piece by choose_inner()

    @property
    def reassociate(self) -> bool:
        return self.settings.reassociate

    def __call__(self, gm: GraphModule, example_inputs):
        inner = choose_inner(example_inputs) if self.inner == "auto" else self.inner
        plain = unrewritten_copy(gm) if self.rewrite and self.settings.guard != "off" else None
        report = (passes.run(gm, self.settings, copy_structures=(inner == "inductor"), hoist=True,
                             fast_dropout=(inner != "inductor"), portfolio=_portfolio.decide) if self.rewrite
                  else passes.PassReport())
        if self.inner == "auto" and inner != "inductor":  # eager or aot_eager: by what fused
            inner = choose_inner(example_inputs, report.num_fused)
        report.inner = inner
        report.settings = self.settings
        report.graph_break, report.break_at = break_reason(gm)
        if DATA_DEPENDENT in report.graph_break and any(c in report.graph_break for c in SWITCH_CALLS):
            self.data_dependent_breaks.append(report.graph_break)
        report.compile_id = _compile_id()
        STATS["graphs"] += 1
        STATS["fused"] += report.num_fused
        log_fusions(_log, f"graph piece {STATS['graphs']} ({len(gm.graph.nodes)} nodes, "
                          f"inner {inner}{' (auto)' if self.inner == 'auto' else ''})", report)
        if _collectors():
            report.frame_params = frame_parameters(gm, example_inputs)
        for c in _collectors():
            c.append(report)
        fn = self._inner_fn if self._inner_fn is not None else _inner(inner)
        if inner == "inductor" and needs_grad(example_inputs):
            sized = unbacked_sized(gm)
            if sized:
                inner, fn = "aot_eager", _inner("aot_eager")
                report.inner = inner
                report.notes.append(inductor_fallback_note(sized, explicit=self.inner == "inductor"))
                if self.inner == "inductor":
                    _warn_once(report.notes[-1])
                else:
                    _log.info(report.notes[-1])
        # what the inner compiler returns holds the hoisted regions its graph calls (held weakly
        # by their registry): they go when Dynamo drops it
        compiled = hoisted.pass_on(gm, fn(gm, example_inputs))
        if plain is None or (inner == "eager" and not _changed(report)):
            return compiled  # nothing to race: the piece runs as captured either way
        label = f"piece {STATS['graphs']} ({_summary(report)})"
        return SpeedGuard(compiled, graph_forward(plain), label, self.guards)

    def verdict(self, grad: bool) -> Optional[str]:
        """What the speed guards of the pieces compiled here say for calls in grad mode
        ``grad``: 'unrewritten' when every one has decided for the unrewritten form (the model
        may as well run as written), 'rewritten' when one kept the rewritten form, None while
        one is still measuring or none exists."""
        says = [g.verdict(grad) for g in (ref() for ref in self.guards) if g is not None]
        if "rewritten" in says:
            return "rewritten"
        if says and all(v == "unrewritten" for v in says):
            return "unrewritten"
        return None

    def guard_decisions(self) -> list:
        """What the speed guards of the pieces compiled here kept, per size class
        (:class:`gnncompile.compiler.guard.Decision`), oldest first."""
        return [d for ref in self.guards if ref() is not None for d in ref().decisions]

    def __getstate__(self) -> dict:  # guards are not carried: a rebuilt model measures again
        return {"settings": self.settings, "rewrite": self.rewrite}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["settings"], state["rewrite"])

    def __repr__(self) -> str:
        return f"gnncompile.Backend(rewrite={self.rewrite}, {self.settings})"


def make_backend(inner: str = "auto", rewrite: bool = True, reassociate: bool = False,
                 settings: Optional[Settings] = None) -> Backend:
    """A configured backend (picklable): ``settings`` (default: the configuration's, see
    :meth:`Settings.from_config`) with ``inner`` (unless 'auto') and ``reassociate`` over them;
    ``rewrite=False`` skips the passes (for comparisons)."""
    s = Settings.from_config() if settings is None else settings
    if inner != "auto":
        if inner not in INNERS:
            raise ValueError(f"gnncompile: unknown inner compiler {inner!r}; expected 'auto' or one of {INNERS}")
        s = s.replace(inner=inner)
    if reassociate:
        s = s.replace(reassociate=True)
    return Backend(s, rewrite)


def gnncompile_backend(gm: GraphModule, example_inputs):
    """The registered backend (``torch.compile(m, backend="gnncompile")``): the passes with the
    configuration's settings (no device profile: the kernels' own knobs), then the inner
    compiler 'auto' resolves to. :func:`gnncompile.compile` applies a profile. Huge pages and the
    block cache (``choices['huge_pages']``, ``choices['buffer_cache']``,
    :mod:`gnncompile.hardware.memory`) are applied here, at the first compile of a graph with CPU
    inputs, as compile() applies them."""
    from ..hardware import memory

    be = make_backend("auto")
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    if "cpu" in devices:
        memory.apply(be.settings.huge_pages, devices)
        memory.apply_cache(be.settings.buffer_cache, devices)
    return be(gm, example_inputs)


def _register() -> None:
    """Registers ``"gnncompile"`` with Dynamo at import, so the name works once gnncompile is
    imported even where the install metadata lacks the ``torch_dynamo_backends`` entry point.

    Where Dynamo has already discovered the entry point (its registry holds an EntryPoint for
    the name), it registers what the entry point loads when the name is first looked up, and
    that lookup may be what is importing this module: registering here as well would make
    Dynamo's own registration fail as a duplicate, so this one is left to Dynamo."""
    from torch._dynamo.backends import registry

    if getattr(registry, "_BACKENDS", {}).get("gnncompile") is not None:
        return  # discovered through the entry point; lookup_backend registers it
    if "gnncompile" in getattr(registry, "_COMPILER_FNS", {}):
        return  # already registered (module reloaded)
    registry.register_backend(compiler_fn=gnncompile_backend, name="gnncompile")


class RecompileLimitWarning(UserWarning):
    """torch.compile stopped recompiling a function (its recompile limit): it runs eagerly,
    without gnncompile's rewrite, from then on."""


#: functions torch.compile stopped recompiling in this process: 'forward' (file:line), the
#: limit and Dynamo's last reason (explain() reports them)
RECOMPILE_LIMITS: List[str] = []


class _RecompileLimitWatch(logging.Filter):
    """Sees Dynamo's one log line when it hits its recompile limit (it then runs the function
    eagerly, silently unless its logger shows warnings) and says it loudly: a warning, once per
    function, when gnncompile has compiled something in this process."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(getattr(record, "msg", ""))
        if msg.startswith("torch._dynamo hit config.") and STATS["graphs"] and isinstance(record.args, tuple) \
                and len(record.args) >= 4:
            limit, value, func, reason = (str(a) for a in record.args[:4])
            text = f"{func}: {limit} = {value} reached; last reason: {one_line(reason, 200)}"
            if text not in RECOMPILE_LIMITS:
                RECOMPILE_LIMITS.append(text)
                warnings.warn(f"gnncompile: torch.compile hit its recompile limit ({limit} = {value}) for {func} "
                              f"and runs it eagerly from now on, without gnncompile's fused ops (last reason: "
                              f"{one_line(reason, 200)}). Sizes that change every call: compile(dynamic=True)",
                              RecompileLimitWarning, stacklevel=2)
        return True


logging.getLogger("torch._dynamo.convert_frame").addFilter(_RecompileLimitWatch())
_register()
loops.install()  # PyG's self-loop functions traced as gnncompile ops (see gnncompile.ops.loops)
_lean.install()  # lean forwards of PyG layers while a gnncompile scope is active (gnncompile.compiler.lean)
_trims.install()  # Dynamo's work that changes no result skipped in that scope (gnncompile.compiler.trims)

__all__ = ["gnncompile_backend", "make_backend", "Backend", "collect", "dynamic_output_shapes", "STATS",
           "RecompileLimitWarning", "RECOMPILE_LIMITS",
           "INNERS", "AUTO_INDUCTOR_MIN_SIZE", "choose_inner", "graph_size"]
