"""Never slower than eager: the speed guard of a rewritten graph piece.

The backend returns each graph piece the passes changed wrapped in a :class:`SpeedGuard`,
which holds two forms of it: the rewritten one (fused ops, hoisted regions, the inner
compiler) and the piece as Dynamo captured it, run op by op (the operations eager PyTorch runs
for it). For every size class of its inputs (grad mode; nodes and edges, each within a factor
of 4) the guard runs the two forms alternately on the first calls, times each call (its
forward, plus its backward: from the first gradient that reaches the piece's outputs to the
last gradient of its inputs), and once each form has :data:`SAMPLES` timed calls it keeps the
form whose fastest call was faster and calls only that one for the class from then on. The first call
of each form in a class is not timed (first-use work).

Pieces of :data:`MAX_SIZE` nodes + edges and more keep the rewritten form without measuring:
there the fused kernels were measured to win by several times (benchmarks/results/), and the
unrewritten form would hold per-edge ``E x F`` tensors that may not fit in memory.

A model compiled with :func:`gnncompile.compile` has one more guard around the whole call
(:class:`ModelGuard`): once its pieces have decided, the compiled model is timed against the
model as written (eager), per grad mode, so that Dynamo's own per-call cost, graph breaks and
recompiles count too; where eager wins, the compiled module calls it from then on. This race
decides by the paired calls: the two forms run back to back in pairs (the order alternating),
and the compiled model is kept when the median over the pairs of eager's time over the compiled
one's is at least 1 + :data:`MODEL_MARGIN`. Where the compiled model won by less than 2x (that
median under 1 + :data:`RECHECK_BELOW`: a close win), the two are timed again once, after
:data:`RECHECK_AFTER` more calls (:data:`RECHECK_SAMPLES` pairs), and the compiled model stays
only if it wins again: the first calls after the pieces' races can be slowed by transients that
the steady state does not have (HISTORY section 29), and 5 pairs of a noisy step can read 1.2x
where the steady state is 0.97x (GMMConv in benchmarks/results/zoo_zen4_s54_first.md).

Why the pieces decide by the fastest call and the whole model by the paired median
(benchmarks/results/guard_rule_zen4_s54.md: 15 zoo entries, 400-600 interleaved training steps
each, cut into windows of the races' sizes): a whole training step's fastest call misleads where
a form's own cost varies from call to call (eager's allocations and page faults: LEConv's
fastest eager step was 0.73x the compiled one's while its median was 1.35x slower), and it kept
the model as written where the compiled one was faster by the medians (GINConv 1.27x, FiLMConv
1.53x, GIN 1.08x) far more often than the paired median, without keeping fewer compiled models
that were slower. The pieces' rule was measured on pieces (HISTORY section 17) and is left as it
was.

``Settings.guard`` ('time', the default, or 'off'; ``$GNNCOMPILE_GUARD``) turns it on and off;
:func:`gnncompile.explain` of a compiled model lists the decisions
(``CompiledModule.guard_decisions()``).
"""
from __future__ import annotations

import statistics
import time
import weakref
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from .._log import get_logger

_log = get_logger(__name__)

#: timed calls of each form per size class before the guard decides
SAMPLES = 5
#: pieces with at least this many nodes + edges keep the rewritten form unmeasured
MAX_SIZE = 2_000_000

#: compiled calls before the model-level race starts, at most (the pieces' races decide first)
WARM = 2 + 2 * SAMPLES + 1
#: the compiled model is kept only when eager is this much slower (the median over the race's pairs
#: of back-to-back calls of eager's time over the compiled one's at least 1 + MODEL_MARGIN): within
#: the noise of a few pairs the model as written is the safe choice (it is exactly eager)
MODEL_MARGIN = 0.03
#: a model race the compiled model won by less than this (that median under 2.0) is a close win:
#: the two are timed again, once, after RECHECK_AFTER calls. Over windows of the long runs of
#: guard_rule_zen4_s54 a re-check of wins under 1.1x / 1.2x / 1.5x / 2x kept a compiled model that
#: was slower than eager (by > 1%, long-run medians) in 61 / 41 / 23 / 10 of 1440 windows, and
#: missed a faster one in 181 / 200 / 212 / 222; no win of 2x or more there was wrong
RECHECK_BELOW = 1.0
#: calls of the kept compiled model (per grad mode) between a close win and its re-check
RECHECK_AFTER = 150
#: timed calls of each form at the re-check (after one untimed call of the model as written)
RECHECK_SAMPLES = 20

REWRITTEN, UNREWRITTEN = "rewritten", "unrewritten"
COMPILED, EAGER = "compiled", "eager"


@dataclass
class Decision:
    """What the guard kept for one size class of one piece, and why."""

    piece: str  # 'piece 2 (3 fused chain(s): spmm[sum] in conv1, ...)'
    nodes: int  # the sizes of the call that opened the class
    edges: int
    grad: bool
    kept: str  # REWRITTEN or UNREWRITTEN
    # the fastest timed call of each form (forward + backward); the median call where the race
    # decided by its pairs (ModelGuard)
    rewritten_ms: Optional[float] = None
    unrewritten_ms: Optional[float] = None
    reason: str = ""
    recheck: bool = False  # the re-check of a close win (ModelGuard), not a first race

    def __str__(self) -> str:
        mode = "training" if self.grad else "no grad"
        sizes = f", {self.nodes} nodes / {self.edges} edges" if self.nodes or self.edges else ""
        again = ", re-check of a close win" if self.recheck else ""
        return f"{self.piece}{sizes} ({mode}){again}: kept {self.kept}: {self.reason}"


def unrewritten_copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A GraphModule running ``gm``'s graph as it is now (the passes then change ``gm`` in place);
    shares ``gm``'s attributes."""
    graph = torch.fx.Graph()
    graph._codegen = gm.graph._codegen
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


def _bucket(n: int) -> int:
    return n.bit_length() // 2  # classes a factor of 4 wide


class _Race:
    __slots__ = ("calls", "samples", "pending", "winner", "nodes", "edges", "need", "recheck_in", "rechecking")

    def __init__(self, nodes: int, edges: int) -> None:
        self.calls = 0
        self.samples: Tuple[List[float], List[float]] = ([], [])
        self.pending = None  # the last timed call, until its backward has had its chance
        self.winner: Optional[Callable] = None
        self.nodes, self.edges = nodes, edges
        self.need = SAMPLES  # timed calls of each form before deciding
        self.recheck_in: Optional[int] = None  # calls of the winner left before its re-check
        self.rechecking = False  # this round is the re-check of a close win


class _Timing:
    """One timed call: its forward time, and the gradient hooks that time its backward (from
    the first gradient reaching an output to the last gradient of an input; read when the
    next call settles it, by which time the backward, if any, has run)."""

    __slots__ = ("form", "seconds", "first", "last", "handles", "leaves", "sync")

    def __init__(self, form: int, seconds: float, sync: bool) -> None:
        self.form, self.seconds, self.sync = form, seconds, sync
        self.first: Optional[float] = None
        self.last: Optional[float] = None
        self.handles: list = []
        self.leaves: list = []  # weak references to the watched leaf tensors (parameters)

    def watch(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> None:
        self.handles = [t.register_hook(self._output_grad) for t in outputs]
        self.handles += [t.register_hook(self._input_grad) for t in inputs]
        self.leaves = [weakref.ref(t) for t in inputs if t.grad_fn is None]

    def _now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def _output_grad(self, _grad) -> None:
        if self.first is None:
            self.first = self._now()

    def _input_grad(self, _grad) -> None:
        self.last = self._now()

    def total(self) -> float:
        """Forward plus backward seconds (forward alone when no backward ran); removes the hooks."""
        for h in self.handles:
            h.remove()
        self.handles = []
        for ref in self.leaves:
            _unhook(ref())
        self.leaves = []
        if self.first is not None and self.last is not None and self.last > self.first:
            return self.seconds + (self.last - self.first)
        return self.seconds


def _unhook(t: Optional[torch.Tensor]) -> None:
    """A leaf tensor whose Python gradient hooks have all been removed back to having none: torch
    keeps the emptied hook dict registered, and the backward of every later step calls into
    Python for it (about 2 us per parameter on this project's CPU), eager steps of the model as
    written included. A tensor with hooks of its own keeps them."""
    if t is not None and t.grad_fn is None and t._backward_hooks is not None and not t._backward_hooks:
        t._backward_hooks = None


class _Racer:
    """Runs two forms of one computation alternately and keeps the faster (per race key)."""

    _forms: Tuple[Callable, Callable]
    _names = (REWRITTEN, UNREWRITTEN)
    _margin = 0.0  # form 0 is kept when form 1 is at least this much (relative) slower
    _rule = "fastest"  # how a race decides: 'fastest' or 'paired' (_choose)
    label = ""

    def _run(self, race: _Race, grad: bool, warm: int, args, kwargs, inputs: Callable[[], list], sync: bool):
        """One call of ``race``: ``warm`` untimed calls of form 0 and one of form 1 first, then
        timed calls alternating in pairs (0 1, 1 0, ...) until each form has ``race.need``
        (SAMPLES; RECHECK_SAMPLES at a re-check)."""
        self._settle(race)
        if min(len(s) for s in race.samples) >= race.need:
            keep, ratio, reason, a, b = self._choose(race)
            self._decide(race, grad, keep, reason, a, b, ratio)
            return race.winner(*args, **kwargs)
        n = race.calls
        race.calls += 1
        if n <= warm:  # first uses: not timed
            return self._forms[0 if n < warm else 1](*args, **kwargs)
        k = n - warm - 1
        form = (k // 2 + k) % 2
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = self._forms[form](*args, **kwargs)
        if sync:
            torch.cuda.synchronize()
        timing = _Timing(form, time.perf_counter() - t0, sync)
        if grad:
            outs = [t for t in _tensors(out) if t.requires_grad]
            ins = inputs()
            if outs and ins:
                timing.watch(outs, ins)
        race.pending = timing
        return out

    def _choose(self, race: _Race) -> Tuple[int, float, str, float, float]:
        """Which form to keep once each has ``race.need`` timed calls: (form, the ratio of form 1's
        cost over form 0's it rests on, the reason, form 0's and form 1's figure in seconds).

        The fastest call of each (``_rule`` 'fastest', the pieces): on a shared machine a call is
        slowed by others, never sped up, and for a piece the minimum picked the faster form far
        more often than the median (benchmarks/results/HISTORY.md, "Speed guard"). The paired
        calls (``_rule`` 'paired', the whole model): the i-th timed call of each form ran back to
        back with the other's (the order alternating), and the median of the pairs' ratios is
        robust to calls slowed by others and to load that drifts during the race, and unlike the
        fastest call it counts a form's own variable costs (module docstring)."""
        c, e = race.samples
        names = self._names
        fa, fb = min(c), min(e)
        fastest = f"{fa * 1e3:.3f} ms {names[0]} vs {fb * 1e3:.3f} ms {names[1]}"
        if self._rule == "paired":
            ratio = statistics.median(y / x if x > 0 else float("inf") if y > 0 else 1.0 for x, y in zip(c, e))
            a, b = statistics.median(c), statistics.median(e)
            reason = (f"median of {len(c)} paired calls: {names[1]} / {names[0]} {ratio:.2f}x (median calls "
                      f"{a * 1e3:.3f} ms {names[0]} vs {b * 1e3:.3f} ms {names[1]}; fastest {fastest})")
        else:
            a, b = fa, fb
            ratio = b / a if a > 0 else float("inf")
            reason = f"fastest of {race.need} calls each: {fastest} ({ratio:.2f}x)"
        return (0 if ratio >= 1 + self._margin else 1), ratio, reason, a, b

    def _settle(self, race: _Race) -> None:
        """Counts the last timed call (forward, plus its backward if one ran since)."""
        t = race.pending
        if t is None:
            return
        race.samples[t.form].append(t.total())
        race.pending = None

    def _decide(self, race: _Race, grad: bool, keep: int, reason: str, a: Optional[float] = None,
                b: Optional[float] = None, ratio: Optional[float] = None) -> None:
        race.winner = self._forms[keep]
        race.samples = ([], [])
        d = Decision(self.label, race.nodes, race.edges, grad, self._names[keep],
                     None if a is None else a * 1e3, None if b is None else b * 1e3, reason, race.rechecking)
        race.rechecking = False
        self.decisions.append(d)
        _log.info("gnncompile speed guard: %s", d)


class SpeedGuard(_Racer):
    """The callable the backend returns for a rewritten piece (see the module docstring):
    ``rewritten`` is what the inner compiler returned, ``unrewritten`` a GraphModule's forward;
    Dynamo calls both, and the guard, with the piece's inputs as positional arguments."""

    def __init__(self, rewritten: Callable, unrewritten: Callable, label: str,
                 log: Optional[list] = None) -> None:
        self._forms = (rewritten, unrewritten)
        self.label = label
        self.decisions: List[Decision] = []
        self._races: dict = {}
        self._positions: Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]] = None
        if log is not None:
            log.append(weakref.ref(self))

    def verdict(self, grad: bool) -> Optional[str]:
        """For calls in grad mode ``grad``: REWRITTEN when some size class kept the rewritten
        form, UNREWRITTEN when every class met so far has decided and kept the unrewritten one,
        None while a class is still being measured (or none was met)."""
        races = [r for k, r in self._races.items() if k[0] == grad]
        if any(r.winner is self._forms[0] for r in races):
            return REWRITTEN
        if races and all(r.winner is not None for r in races):
            return UNREWRITTEN
        return None

    def __call__(self, *args):
        if self._positions is None:
            self._positions = _size_positions(args)
        nodes, edges = _sizes(args, *self._positions)
        grad = torch.is_grad_enabled()
        key = (grad, _bucket(nodes), _bucket(edges))
        race = self._races.get(key)
        if race is None:
            race = self._races[key] = _Race(nodes, edges)
            if nodes + edges >= MAX_SIZE:
                self._decide(race, grad, 0, f"{nodes + edges} nodes + edges >= {MAX_SIZE}: not measured "
                                            "(the fused kernels measured faster there on the CPU; the "
                                            "unrewritten form would hold E x F tensors)")
        if race.winner is not None:
            return race.winner(*args)
        sync = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        return self._run(race, grad, 1, args, {},
                         lambda: [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad], sync)


class ModelGuard(_Racer):
    """The whole compiled model against the model as written, per grad mode: Dynamo's own
    per-call cost, graph breaks and recompiles included. The compiled form runs first until the
    pieces' guards have decided (``verdict(grad)`` is not None) or :data:`WARM` calls have
    passed; then both run alternately in pairs of back-to-back calls, timed, and the compiled
    model is kept when the median over the pairs of eager's time over its own is at least
    1 + :data:`MODEL_MARGIN`. A close win (under 1 + :data:`RECHECK_BELOW`, 2x) is timed again
    once, :data:`RECHECK_AFTER` calls later, :data:`RECHECK_SAMPLES` pairs, with the same rule
    (:meth:`settled` says when nothing is left to time). Where the model as written wins, it runs from then on without Dynamo, and the compiled module calls it without
    any work of its own per call (:attr:`as_written`). A win of the model as written is not
    re-checked: it is exactly eager."""

    _names = (COMPILED, EAGER)
    _margin = MODEL_MARGIN
    _rule = "paired"

    def __init__(self, compiled: Callable, model: torch.nn.Module, verdict: Callable[[bool], Optional[str]]) -> None:
        self._forms = (compiled, model)
        self._model = model
        self._verdict = verdict
        self.label = f"the whole model ({type(model).__name__}, Dynamo included)"
        self.decisions: List[Decision] = []
        self._races: dict = {}
        self._warm: dict = {}  # grad mode -> compiled calls before its race
        # grad mode -> the model as written, once the race of that mode kept it: the compiled
        # module calls it directly from then on, without its own call, forward or this guard
        # (CompiledModule.__call__)
        self.as_written: dict = {}

    def _decide(self, race: _Race, grad: bool, keep: int, reason: str, a: Optional[float] = None,
                b: Optional[float] = None, ratio: Optional[float] = None) -> None:
        if race.rechecking:
            reason = f"timed again after {RECHECK_AFTER} calls: {reason}"
        elif keep == 0 and ratio is not None and ratio < 1 + RECHECK_BELOW:
            # a close win: the first timed calls after the pieces' races can be slowed by
            # transients (of either form), and 5 pairs do not always outlast them
            race.recheck_in = RECHECK_AFTER
            reason += (f"; a close win (under {1 + RECHECK_BELOW:.2f}x): timed again after "
                       f"{RECHECK_AFTER} calls")
        super()._decide(race, grad, keep, reason, a, b)
        if keep == 1:
            self.as_written[grad] = self._forms[1]

    def settled(self, grad: bool = True) -> bool:
        """Whether the race of grad mode ``grad`` has decided for good: decided, and no re-check
        of a close win pending or under way (a benchmark times the kept form from then on)."""
        race = self._races.get(grad)
        return race is not None and race.winner is not None and race.recheck_in is None

    def __call__(self, *args, **kwargs):
        grad = torch.is_grad_enabled()
        race = self._races.get(grad)
        if race is None:
            race = self._races[grad] = _Race(0, 0)
        if race.winner is not None:
            if race.recheck_in is None:
                return race.winner(*args, **kwargs)
            if race.recheck_in > 0:
                race.recheck_in -= 1
                return race.winner(*args, **kwargs)
            # the re-check of a close win: one untimed call of the model as written, then
            # RECHECK_SAMPLES timed calls of each form, in pairs (each a real call: its output
            # is returned, its backward is the caller's)
            race.recheck_in, race.winner, race.rechecking = None, None, True
            race.calls, race.need = 0, RECHECK_SAMPLES
            self._warm[grad] = 0
        warm = self._warm.get(grad)
        if warm is None:  # still warming up the compiled form (its pieces decide meanwhile)
            if race.calls >= 2 and (race.calls >= WARM or self._verdict(grad) is not None):
                warm = self._warm[grad] = race.calls
            else:
                race.calls += 1
                return self._forms[0](*args, **kwargs)
        params = [p for p in self._model.parameters() if p.requires_grad]
        sync = any(p.is_cuda for p in params[:1])

        def inputs():
            return params + [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        return self._run(race, grad, warm, args, kwargs, inputs, sync)


def _tensors(out):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (list, tuple)):
        for o in out:
            yield from _tensors(o)


def _size_positions(args) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """Where a call's node and edge counts are: float tensors that are not parameters (dim 0),
    integer ``[2, E]`` tensors (dim 1)."""
    nodes, edges = [], []
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor) or isinstance(a, torch.nn.Parameter) or a.dim() == 0:
            continue
        if a.is_floating_point():
            nodes.append(i)
        elif a.dim() == 2 and a.shape[0] == 2 and not a.is_complex():
            edges.append(i)
    return tuple(nodes), tuple(edges)


def _sizes(args, nodes_at, edges_at) -> Tuple[int, int]:
    """A call's node and edge counts: the most edges of its ``[2, E]`` tensors, and the most rows
    of its float tensors other than per-edge ones (as many rows as an edge_index has columns:
    edge features, whose rows would count the edges twice); where every float tensor is per
    edge, their rows."""
    edge_counts = {int(args[i].shape[1]) for i in edges_at}
    rows = [int(args[i].shape[0]) for i in nodes_at]
    node_rows = [r for r in rows if r not in edge_counts] or rows
    return max(node_rows, default=0), max(edge_counts, default=0)


__all__ = ["SpeedGuard", "ModelGuard", "Decision", "SAMPLES", "MAX_SIZE", "WARM", "MODEL_MARGIN", "RECHECK_BELOW",
           "RECHECK_AFTER", "RECHECK_SAMPLES", "unrewritten_copy", "REWRITTEN", "UNREWRITTEN", "COMPILED", "EAGER"]
