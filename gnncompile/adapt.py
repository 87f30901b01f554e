"""Runtime adaptation: a loader that re-chooses its batch size, pool size and workers while it trains.

    from gnncompile.adapt import AdaptiveLoader

    loader = AdaptiveLoader(dataset, by="graphs", sizes=[16, 32, 64, 128],
                            memory_budget=8 << 30, optimizer=opt, lr_scaling="sqrt")
    for epoch in range(E):
        for batch in loader:
            loss = step(model, batch)
            loader.step_done(loss)          # measures the step, may decide a switch
    print(loader.log)                       # every switch: step, what changed, gain, memory

:class:`AdaptiveLoader` wraps :class:`gnncompile.data.PooledLoader` (graph mini-batches);
:class:`AdaptiveNeighborLoader` wraps :class:`gnncompile.data.NeighborLoader` (seed nodes per
batch). Both yield the wrapped loader's batches and measure, per step:

* **time**: from the previous ``step_done`` (or the epoch's start) to this one, so it covers
  waiting for the batch and the training step. Throughput is compared per unit of work, nodes +
  edges per second, so batches of other sizes (graphs sorted by size) compare fairly; the
  neighbor loader compares seeds per second instead (a larger seed batch shares more of its
  sampled neighbourhood: less work per seed), and a new fanout
  (:meth:`AdaptiveNeighborLoader.set_num_neighbors`) starts a new measurement; the first step after a switch (the loader's restart, a recompile) is left out of the
  rate (it still counts in any wall-clock figure).
* **memory**: ``memory='cuda'``: ``torch.cuda.max_memory_allocated`` (peak reset at each step's
  start) against the allocated bytes at that start. ``memory='rss'`` (Linux): the process's
  peak resident set (``VmHWM``, reset at each step's start by writing 5 to
  ``/proc/self/clear_refs``) against its resident set at the start; every 8th step starts
  with ``malloc_trim(0)`` (freed heap pages handed back), so that its growth is the step's own
  and the memory model learns from it (:class:`RssMemory`; trimming every step would make
  every step fault its memory in again). The RSS counts the whole process (model, dataset,
  Python, the compiler's caches), which is what the operating system kills for; it is coarse
  (pages, not tensors), and between trims the allocator keeps what a step freed, so the
  budget check on the measured peak errs high. ``memory=callable``: any ``() -> bytes`` (the step's
  peak), e.g. in tests. ``'auto'``: ``'cuda'`` when ``device`` is a CUDA device, else ``'rss'``
  where ``/proc/self/clear_refs`` exists, else no memory measure (then ``memory_budget`` must
  be None).
* **density**: graphs, nodes and edges of the batch (``adapter.history``, one dict per step).

The policy (:class:`Policy`, deterministic given the measurements):

* Settings are a size (graphs per batch; with ``by='nodes'`` / ``'edges'`` a budget: graphs are
  packed in order until the next one would exceed it; seeds per batch for the neighbor
  loader) from ``sizes``, a pool size from ``pool_sizes`` (batches in flight: the prefetch
  depth) and a worker count from ``num_workers``.
* It measures the current setting for ``window`` steps, then tries a neighbouring setting (the
  next size up or down, the next pool size or worker count) for ``window`` steps, and keeps it
  only when its work per second is at least ``1 + min_gain`` times the current one's (hysteresis,
  default 5%); otherwise it goes back, and tries that neighbour again only after a back-off
  (doubling per refusal), and not at all while the batches' density (the largest nodes and
  edges per batch of a window) stays within ``Policy.DENSITY_TOL`` (1.25x) of what it was when
  that neighbour was measured slower (a refused trial, or the current setting kept over it):
  batches that turned denser, or sparser, are worth a new trial, the same batches are not.
  That rule holds at most ``Policy.WORSE_WINDOWS`` (64) windows, and only
  ``Policy.PROVISIONAL_WINDOWS`` (4) after a provisional refusal: a size up refused on its first
  measurement (its window pays the larger batches' one-time costs: the heap's growth, the
  release guard's clean starts) or on a shortened trial window, reading at least
  ``Policy.PROVISIONAL_FLOOR`` (0.9x) the current rate; the second refusal holds the full 64.
  The graph loader holds a size shrunk from (predicted over the line, or measured over the
  budget) the same way, from the size shrunk to, at the density of its first full window there
  (``Policy.hold_shrunk``; the neighbor loader keeps only the shrunk trial's back-off).
  Refusals in a row make it measure 1, 2, 4 ... (at most ``Policy.STREAK_CAP``) windows before
  its next trial. The climb: from the start, only sizes up are tried, and a size up kept is
  followed at the same step by the next trial up (the trial's window was its measurement), so
  the run reaches the largest size that pays one window per size; the climb ends at the first
  refusal or when no larger size may be tried (a size up that fits the budget but is not yet
  trusted, over ``Policy.EXTRAPOLATE`` times the work measured, is waited for up to
  ``Policy.CLIMB_WAIT`` windows, no other move tried meanwhile). Under a memory budget the size up it tries is not the next one but
  the largest predicted to fit (:meth:`Policy._grow`; after a refusal, the next smaller that
  fits), so batches whose graphs grow or shrink reach the largest size that fits in one trial.
* Memory: a model of bytes per unit of work (the largest ratio of a step's peak above its start
  to its nodes + edges among the last observations, a conservative linear model) predicts each
  candidate's peak on its next batches (known exactly for graph batches: the dataset's sizes;
  for neighbor batches from the graph's in-degrees, :class:`NeighborWorkModel`, calibrated by
  the measured batches); a candidate predicted above the
  budget less ``margin`` of the headroom (the budget less the memory at the first step's
  start), or whose batches hold more than ``Policy.EXTRAPOLATE`` (2.25: a doubled node or edge budget packs a
  little fuller than twice the smaller one's batches) times the work of the
  largest step measured so far (the linear model is not trusted further), is never tried. Each step's measured peak is compared with its prediction, and the
  largest recent excess (``Policy.excess``) is added to every later prediction: what the
  linear model missed once (a fixed cost per step, the allocator's growth) it does not miss
  again (the neighbor loader learns it from clean readings only, against the model's growth:
  what the allocator kept between them is the release guard's, below). Before each step (also the first after a kept
  trial or a revert), when the next batch under the current setting is predicted over that
  line, the size shrinks at once (to the largest that fits); when a step's measured peak
  exceeds the budget anyway, it shrinks at once too. Before each step the memory held now
  (``MemoryProbe.current``: the resident set between steps, what the allocators kept included;
  or the last peak) plus the rise the next step may bring (``Policy.rise_ahead``: the largest
  recent rise of the peak from one step to the next without a clean start, or the memory
  model's growth of the next batch, the larger) is checked against the budget: when it would cross it, the step starts clean
  (``MemoryProbe.release_next``: for ``'rss'`` the trim of a clean reading, out of schedule;
  counted in ``adapter.releases``, ``clean`` in each history record). Batches that grow step
  after step leave freed blocks too small for the next ones, and between clean readings the
  resident set had crept over the budget that way.
  The neighbor loader can also check each batch once sampled, from its own nodes and edges
  (``batch_guard=True``, an opt-in that costs clean starts, :class:`AdaptiveNeighborLoader`): the memory held plus that batch's
  modelled growth over the budget starts the step clean, and a batch predicted over the budget
  even from a clean start is dropped unyielded and the size shrunk.
* Learning rate: ``lr_scaling=None`` (default) leaves the optimizer alone; ``'linear'`` /
  ``'sqrt'`` set each param group's lr to its initial value times (size / first size) or its
  square root at every size switch.
* Data-parallel: when ``torch.distributed`` is initialized, every rank measures, the ranks'
  peaks and bytes per unit of work are reduced (max) each step, rank 0 decides and broadcasts
  the decision (a small tensor), so every rank switches at the same step. Batches are planned
  from the same global order on every rank (round-robin over the ranks), so the ranks take the
  same number of steps; a last step with fewer graphs than ranks is padded by wrapping around
  (as ``DistributedSampler`` pads).

No sample is lost or repeated within an epoch across a switch (single process): a switch ends
the wrapped loader's pass (batches it had prefetched are dropped, not counted) and the rest of
the epoch's order is planned again from the first graph (seed) not yet yielded. Pool size and
workers change through :meth:`PooledLoader.reconfigure` (the loader and its columnar store
are kept; workers restart).

Every switch is logged (logger ``gnncompile.adapt``, INFO) and appended to ``adapter.log``: a
dict with ``step``, ``epoch``, ``kind`` (``'explore'``, ``'keep'``, ``'revert'``, ``'shrink'``; ``'jump'``:
the neighbor loader's move to the largest size predicted to fit at a change of fanout),
``from`` / ``to`` (settings as dicts), ``gain`` (measured ratio of work rates, None when not
measured), ``predicted_bytes`` (the memory model's prediction for the new setting, None
without one) and ``reason``.
"""
from __future__ import annotations

import ctypes
import math
import numbers
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from ._log import get_logger

log = get_logger(__name__)

_BY = ("graphs", "nodes", "edges")
_LR = (None, "linear", "sqrt")
_KINDS = ("explore", "keep", "revert", "shrink", "jump")


@dataclass(frozen=True)
class Setting:
    """One loader setting: ``size`` (graphs per batch, or a node / edge budget, or seeds per
    batch), ``pool_size`` (batches in flight), ``num_workers``."""

    size: int
    pool_size: int
    num_workers: int

    def as_dict(self) -> Dict[str, int]:
        return asdict(self)


# ---------------------------------------------------------------------------------- memory


class MemoryProbe:
    """Measures a step's peak memory: ``start()`` before the step, ``peak()`` after it;
    ``base`` is the reading at the start. Bytes. ``clean``: whether ``peak - base`` of this
    step is its own growth (what the memory model learns from)."""

    name = "none"

    def __init__(self) -> None:
        self.base = 0
        self.clean = True

    def start(self) -> None:
        self.base = 0

    def peak(self) -> int:
        return 0

    def current(self) -> Optional[int]:
        """The memory held now, between steps (None: not known)."""
        return None

    def release_next(self) -> bool:
        """Ask for the next step to start by handing back memory held but idle (a clean
        reading); False where the probe cannot."""
        return False

    def next_clean(self) -> bool:
        """Whether the next step will start clean already (scheduled or asked for)."""
        return False


class CudaMemory(MemoryProbe):
    """Peak allocated CUDA memory (reset at each step's start) and the allocated bytes at the start."""

    name = "cuda"

    def __init__(self, device=None) -> None:
        super().__init__()
        self.device = torch.device(device if device is not None else "cuda")

    def start(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)
        self.base = int(torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        return int(torch.cuda.max_memory_allocated(self.device))


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


class RssMemory(MemoryProbe):
    """The process's peak resident set (Linux ``VmHWM``, reset at each step's start through
    ``/proc/self/clear_refs``); ``base`` is ``VmRSS`` at the start. Every ``trim_every``-th
    step starts with ``malloc_trim(0)``, which hands the heap's freed pages back, so that this
    step's ``peak - base`` is its own growth (a clean reading), and empties gnncompile's block
    cache of freed large allocations (:func:`gnncompile.hardware.memory.empty_cache`) for the
    same reason; in between the allocators reuse what they kept (no reading to learn from, but
    the peak is still the process's). Trimming every step would make each step fault its memory
    in again (slow)."""

    name = "rss"

    def __init__(self, trim_every: int = 8) -> None:
        super().__init__()
        if isinstance(trim_every, bool) or not isinstance(trim_every, numbers.Integral) or trim_every < 1:
            raise ValueError(f"RssMemory: trim_every must be an integer >= 1, got {trim_every!r}")
        self.trim_every = int(trim_every)
        self._n = 0
        self._force = False
        if not self.available():
            raise RuntimeError("memory='rss' needs Linux's /proc/self/clear_refs and /proc/self/status")
        try:
            self._trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):  # not glibc
            self._trim = None

    @staticmethod
    def available() -> bool:
        return os.path.exists("/proc/self/clear_refs") and os.path.exists("/proc/self/status")

    def start(self) -> None:
        self.clean = self._trim is not None and (self._force or self._n % self.trim_every == 0)
        self._force = False
        self._n += 1
        if self.clean:
            from .hardware import memory as _memory

            _memory.empty_cache()  # before the trim: its blocks go back to the heap, then to the system
            self._trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.base = _status_kib("VmRSS") * 1024

    def peak(self) -> int:
        return _status_kib("VmHWM") * 1024

    def current(self) -> Optional[int]:
        return _status_kib("VmRSS") * 1024

    def release_next(self) -> bool:
        """The next step starts clean (trimmed) whatever the schedule."""
        if self._trim is None:
            return False
        self._force = True
        return True

    def next_clean(self) -> bool:
        return self._trim is not None and (self._force or self._n % self.trim_every == 0)


class FnMemory(MemoryProbe):
    """A given ``() -> bytes`` read after each step (base 0)."""

    name = "callable"

    def __init__(self, fn: Callable[[], int]) -> None:
        super().__init__()
        self.fn = fn

    def peak(self) -> int:
        v = self.fn()
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or v < 0:
            raise ValueError(f"AdaptiveLoader: the memory callable returned {v!r}, not a byte count >= 0")
        return int(v)


def _probe(memory, device) -> Optional[MemoryProbe]:
    if isinstance(memory, MemoryProbe):
        return memory
    if callable(memory):
        return FnMemory(memory)
    if memory is None or memory == "none":
        return None
    if memory == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("AdaptiveLoader: memory='cuda' but CUDA is not available")
        return CudaMemory(device if device is not None and torch.device(device).type == "cuda" else None)
    if memory == "rss":
        return RssMemory()
    if memory == "auto":
        if device is not None and torch.device(device).type == "cuda":
            return CudaMemory(device)
        return RssMemory() if RssMemory.available() else None
    raise ValueError(f"AdaptiveLoader: memory must be 'auto', 'cuda', 'rss', None or a callable, got {memory!r}")


class Work(int):
    """A step's work (nodes + edges, an int) that also carries its ``nodes`` and ``edges``:
    what :class:`NodeEdgeMemoryModel` fits; every other use sees the int."""

    def __new__(cls, nodes: float, edges: float) -> "Work":
        nodes, edges = max(0, int(round(nodes))), max(0, int(round(edges)))
        w = int.__new__(cls, nodes + edges)
        w.nodes, w.edges = nodes, edges
        return w


class MemoryModel:
    """Bytes above a step's starting memory per unit of work (nodes + edges), from the last
    ``keep`` clean steps. ``predict(work, base)`` = base + ratio * work: by default the ratio
    is the largest observed (conservative). With ``nearest=True`` (the neighbor loader's) it
    is the largest among the observed steps of at most ``work`` whose work is at least half the
    largest such (the steps nearest below the candidate): a step's growth has a part that does
    not scale with its work (per-step buffers, the allocator's rounding), so its bytes per unit
    of work fall as batches grow, and the ratio of a smaller step is an upper bound for a larger
    one, while the ratio of much smaller steps overstates it many times over (on a neighbor
    workload 1.4 KiB per unit at 128 seeds, 0.6 KiB at 2048: the largest ratio of all kept every
    larger size out). A candidate below every observed step is bounded by the growth of the
    smallest steps (growth rises with work): the largest growth among the steps of at most 1.5x
    the smallest work."""

    def __init__(self, keep: int = 32, nearest: bool = False) -> None:
        self.keep = keep
        self.nearest = bool(nearest)
        self.obs: List[Tuple[int, int]] = []  # (work, growth) of clean steps

    @property
    def ratios(self) -> List[float]:
        return [g / w for w, g in self.obs]

    @property
    def per_work(self) -> Optional[float]:
        """The largest ratio observed (None before any)."""
        return max(self.ratios) if self.obs else None

    def observe(self, work: int, grown: int) -> None:
        if work > 0:
            self.obs.append((int(work), max(0, int(grown))))
            del self.obs[:-self.keep]

    def growth(self, work: int) -> Optional[float]:
        """The predicted growth (bytes) of a step of ``work``."""
        if not self.obs:
            return None
        if not self.nearest:
            return self.per_work * work
        below = [(w, g) for w, g in self.obs if w <= work]
        if below:
            top = max(w for w, _ in below)
            return max(g / w for w, g in below if 2 * w >= top) * work
        low = min(w for w, _ in self.obs)
        return float(max(g for w, g in self.obs if w <= 1.5 * low))

    def predict(self, work: int, base: int) -> Optional[int]:
        g = self.growth(work)
        return None if g is None else int(base + g)


def _nnls(rows: List[Tuple[float, ...]], y: List[float]) -> Optional[List[float]]:
    """Non-negative least squares for a handful of columns, exactly: the unconstrained fit on
    every subset of the columns, the best one whose coefficients are all >= 0 (None when no
    subset gives one)."""
    k = len(rows[0])
    A = torch.tensor(rows, dtype=torch.float64)
    b = torch.tensor(y, dtype=torch.float64).view(-1, 1)
    scale = A.abs().amax(0).clamp_min(1e-12)  # columns of comparable size (nodes vs 1)
    As = A / scale
    best, best_err = None, None
    for mask in range(1, 2 ** k):
        cols = [j for j in range(k) if mask >> j & 1]
        sol = torch.linalg.lstsq(As[:, cols], b).solution.view(-1)
        if bool((sol < 0).any()) or not bool(torch.isfinite(sol).all()):
            continue
        coef = [0.0] * k
        for j, v in zip(cols, sol.tolist()):
            coef[j] = v / float(scale[j])
        err = float(((A @ torch.tensor(coef, dtype=torch.float64).view(-1, 1) - b) ** 2).sum())
        if best_err is None or err < best_err - 1e-9 * max(1.0, err):
            best, best_err = coef, err
    return best


class NodeEdgeMemoryModel(MemoryModel):
    """The neighbor loader's memory model: a step's growth = a + b * nodes + c * edges (a, b, c
    >= 0, least squares over the last ``keep`` clean steps that carry their nodes and edges, see
    :class:`Work`), raised by the largest amount a kept step's growth exceeded the fit (so the
    fit bounds every kept reading from above), and never below the growth of a kept step with
    no more nodes and no more edges. A neighbor batch's memory is mostly per node (features and
    hidden rows: about 4 KiB a node against 0.2 KiB an edge on the adapt_fanout benchmark), and
    a larger seed batch shares more of its neighbourhood, so its nodes grow more slowly than its
    edges: the bytes per unit of nodes + edges of the steps nearest below (:class:`MemoryModel`
    with ``nearest=True``) overstate it. The fit is used only when the kept steps can separate
    nodes from edges: at least ``MIN_FIT`` of them, whose share of nodes in the work spans at
    least ``MIN_SPREAD`` (largest over smallest), and only for a candidate of at most ``TRUST``
    times the kept steps' largest nodes and largest edges; otherwise, and for work without nodes
    and edges, the nearest model answers. (Without that bound, on the adapt_fanout benchmark the
    kept steps of 128 and 256 seeds at fanout [40, 40] put all the growth on the nodes, c = 0,
    and 1024 seeds, whose nodes barely grow (the graph's 20k nodes saturate) but whose edges are
    2.5x, were predicted at about 90 MiB and measured at 98 and 144 MiB above the base: a run
    over the budget.)"""

    MIN_FIT = 6
    MIN_SPREAD = 1.15
    TRUST = 1.25

    def __init__(self, keep: int = 32) -> None:
        super().__init__(keep=keep, nearest=True)
        self.split: List[Tuple[int, int, int]] = []  # (nodes, edges, growth) of clean steps
        self._fit: Optional[Tuple[float, float, float, float]] = None  # (a, b, c, lift); stale: None
        self._fit_ok = False

    def observe(self, work: int, grown: int) -> None:
        super().observe(work, grown)
        if work > 0 and isinstance(work, Work):
            self.split.append((work.nodes, work.edges, max(0, int(grown))))
            del self.split[:-self.keep]
            self._fit_ok = False

    def fit(self) -> Optional[Tuple[float, float, float, float]]:
        """(a, b, c, lift): growth <= a + b * nodes + c * edges + lift for every kept step; None
        when the kept steps do not separate nodes from edges."""
        if self._fit_ok:
            return self._fit
        self._fit_ok, self._fit = True, None
        pts = self.split
        if len(pts) < self.MIN_FIT:
            return None
        shares = [n / max(1, n + e) for n, e, _ in pts]
        if min(shares) <= 0 or max(shares) / min(shares) < self.MIN_SPREAD:
            return None
        coef = _nnls([(1.0, float(n), float(e)) for n, e, _ in pts], [float(g) for _, _, g in pts])
        if coef is None:
            return None
        a, b, c = coef
        lift = max(0.0, max(g - (a + b * n + c * e) for n, e, g in pts))
        self._fit = (a, b, c, lift)
        return self._fit

    def growth(self, work: int) -> Optional[float]:
        if not self.obs:
            return None
        f = self.fit() if isinstance(work, Work) else None
        if f is None:
            return super().growth(work)
        if work.nodes > self.TRUST * max(n for n, _, _ in self.split) or \
                work.edges > self.TRUST * max(e for _, e, _ in self.split):
            return super().growth(work)  # beyond the kept steps: the fit's split is not trusted
        a, b, c, lift = f
        g = a + b * work.nodes + c * work.edges + lift
        dominated = [gr for n, e, gr in self.split if n <= work.nodes and e <= work.edges]
        return float(max([math.ceil(g) + 1] + dominated))  # + 1: the float's rounding


# ---------------------------------------------------------------------------------- policy


class Policy:
    """The decisions, apart from any loader: fed one step at a time (``observe``), it answers
    with the setting to run next and, when it changes, a log entry. Deterministic given the
    measurements, so tests drive it with a fake clock and fake memory.

    ``work_ahead(setting, steps)`` is given by the loader: the largest work (nodes + edges) of
    this rank's next ``steps`` batches under ``setting`` (None when unknown)."""

    MOVES = (("size", 1), ("size", -1), ("pool_size", 1), ("pool_size", -1), ("num_workers", 1),
             ("num_workers", -1))
    #: steps whose rise of the peak over the step before (without a clean start) :meth:`held_over` keeps
    CREEP_KEEP = 8
    #: under a budget, a setting whose next batches' work exceeds this many times the largest
    #: work of a step measured so far is not predicted to fit (see :meth:`fits`). Above 2: a grid
    #: of exact doublings of a node / edge budget packs the larger size fuller (a batch stops
    #: one graph short of its budget), so its work is a little over twice the smaller's; at
    #: 2.0 the first size up of the Zen 4 benchmark waited 48 steps for batches of smaller graphs
    EXTRAPOLATE = 2.25
    #: windows the climb waits at most for a size up that fits the budget but is not yet
    #: trusted (over ``EXTRAPOLATE`` times the work measured) before it ends
    CLIMB_WAIT = 4
    #: two windows' batches are of a similar density when their largest nodes and largest edges
    #: per batch each differ by at most this factor (see :meth:`_measured_worse`; the largest, so
    #: that an epoch's short last batch does not count as a change)
    DENSITY_TOL = 1.25
    #: the most windows a run of refusals makes the policy wait before its next trial
    STREAK_CAP = 16
    #: windows after which a setting measured slower may be tried again whatever the density
    #: (one noisy measurement does not rule a setting out for ever)
    WORSE_WINDOWS = 64
    #: windows for which a provisional refusal holds (instead of ``WORSE_WINDOWS``): a size up
    #: refused on its first measurement (the first window ever at that size since the workload
    #: began) or on a trial window shorter than ``window``. The first window at a larger size pays
    #: its one-time costs (the heap growing to the larger batches, the release guard's clean
    #: starts while the allocator settles: 3-4 of 8 steps in the refused 8192-node trials of
    #: adapt_zen4_s58c, about 1 in 4 at 8192 later), and a short window is little evidence; on
    #: Zen 4 the 4096 -> 8192 node trial read 0.95-1.04 in 3 of 8 runs and 1.15-1.34 in the 10
    #: others, and the refusal kept those 3 runs at 4096 for all four epochs. A second refusal
    #: (no longer a first measurement) holds ``WORSE_WINDOWS``
    PROVISIONAL_WINDOWS = 4
    #: a first measurement reading under this gain is a refusal of its own, not provisional: the
    #: first window at a size read 9-11% under that size's mean in the fixed 8192-node runs of
    #: adapt_zen4_s58c, and the 16384-node trials near the budget (a clean start nearly every step)
    #: read 0.39-0.83 (adapt_zen4_s59), where a second trial costs as much as the first
    PROVISIONAL_FLOOR = 0.9

    def __init__(self, sizes: Sequence[int], pool_sizes: Sequence[int], num_workers: Sequence[int], start: Setting,
                 memory_budget: Optional[int], margin: float, min_gain: float, window: int,
                 work_ahead: Callable[[Setting, int], Optional[int]]) -> None:
        self.grid = {"size": list(sizes), "pool_size": list(pool_sizes), "num_workers": list(num_workers)}
        self.current = start
        self.budget = memory_budget
        self.margin = margin
        self.min_gain = min_gain
        self.window = window
        self.work_ahead = work_ahead
        self.model = MemoryModel()
        self.misses: List[int] = []  # by how much measured peaks exceeded their prediction (>= 0)
        self._expected: Optional[int] = None  # the prediction for the step now running
        self.base = 0  # the memory at the last step's start
        self.seen_work = 0  # the largest work (nodes + edges) of a step whose memory was measured
        self.last_peak: Optional[int] = None  # the last step's measured peak
        # (work, peak - the previous step's peak) of steps without a clean start
        self.creep: List[Tuple[int, int]] = []
        self.floor: Optional[int] = None  # the memory at the first step's start
        self.rates: Dict[Setting, float] = {}
        # (setting we came from, its rate, its batches' density)
        self.trial: Optional[Tuple[Setting, float, Optional[Tuple[float, float]]]] = None
        self.backoff: Dict[Tuple[Setting, Setting], Tuple[int, int]] = {}  # -> (retry at window no, wait)
        self.windows = 0
        self.move_no = 0
        self.unit = "work"  # what the rates count (the log's wording): 'work' or 'seeds'
        # the climb: from the start, only sizes up are tried, and a kept size up is followed at
        # once by the next trial up (no window re-measuring it); it ends at the first refusal
        # or when no larger size may be tried
        self.climbing = True
        self.climb_waits = 0  # windows the climb has waited for a size up to be trusted
        self.extra: List[Dict[str, Any]] = []  # entries decided after observe's own (the climb's next trial)
        # (from, to) -> the density (largest nodes, edges per batch of a window) of ``from``'s batches when
        # ``to`` was measured slower than ``from`` (a refused trial, or ``from`` kept over ``to``)
        # -> (density, window no, windows it holds: ``WORSE_WINDOWS``, or ``PROVISIONAL_WINDOWS``)
        self.worse: Dict[Tuple[Setting, Setting], Tuple[Tuple[float, float], int, int]] = {}
        self._trial_provisional = False  # the trial under way would give a provisional refusal
        # the size last shrunk from (over the line, or measured over the budget): held like a refused
        # trial from the size shrunk to, at the density of its first full window (see :meth:`_shrunk`)
        self._shrunk_from: Optional[Setting] = None
        self.density: Optional[Tuple[float, float]] = None  # the last full window's largest nodes, edges per batch
        self.streak = 0  # refusals in a row (a keep, a shrink or a new workload ends the run)
        self.rest = 0  # windows still to measure before the next trial
        #: learn the excess (:attr:`excess`) from clean readings only, against the model's growth
        #: (the neighbor loader's): a step without a clean start also carries what the allocator
        #: kept from the steps before, which the release guard (:meth:`held_over`) handles
        self.clean_misses = False
        #: whether :meth:`rise_ahead` counts the memory model's growth of the next batch (the graph
        #: loader's; measured on the adapt benchmark, where a size up rose by a whole clean step's growth).
        #: The neighbor loader turns it off: in the adapt_fanout benchmark a guard with that growth started
        #: 62 steps clean against 2 and ran at 0.72x the best fixed size against 0.81x (s58d), the memory
        #: held between its steps being mostly the allocator's, which the next step reuses
        self.growth_ahead = True
        #: steps after a switch to a larger size, or a change of workload (:meth:`workload_changed`),
        #: for which :meth:`rise_ahead` counts the memory model's growth of the next batch even where
        #: ``growth_ahead`` is off (the neighbor loader's: 2). The rise of a step with more work than
        #: the steps before is not their creep's: in the adapt_fanout benchmark (s59) a one-step
        #: trial of 4096 seeds at fanout [10, 10] rose 34 MiB over the 2048-seed step before it
        #: (recent rises: 21 MiB), to 4.5 MiB over the budget, and 256 seeds at the first steps
        #: of fanout [40, 40] (1.6x the work of [20, 20]) crossed it by 0.5 MiB
        self.growth_after_up = 0
        #: a size shrunk from is held like a refused trial at the density of the first full window
        #: after the shrink (the graph loader's). Off for the neighbor loader, which keeps the
        #: shrunk trial's back-off alone: its peaks at one size jump 20-57 MiB from step to step
        #: (adapt_fanout_zen4_s59_merged_rises.md), so a shrink says little of the size, and with
        #: the hold on (adapt_fanout_zen4_s59_merged) a run jumped to 128 seeds at [40, 40] and
        #: stayed there for 4 epochs
        self.hold_shrunk = True
        self._since_up = 0
        self._expected_growth: Optional[int] = None
        #: ``room(setting)``: (steps left in this epoch, steps of a whole epoch) under ``setting``
        #: (None: not known). A trial is only started when the epoch leaves room for its window
        #: and the step left out after the switch: a curriculum changes the workload between
        #: epochs, and a trial cut by that change measured nothing (the neighbor loader's; see
        #: :meth:`_explore`); a trial whose window no epoch holds gets a shorter one
        #: (:meth:`_trial_window`)
        self.room: Optional[Callable[[Setting], Optional[Tuple[int, int]]]] = None
        self._window_now = window  # the steps of the window under way (a trial's may be shorter)
        self.deferred: Optional[Setting] = None  # a trial waiting for room (the next epoch's start)
        self._reset_window(skip=0)

    # -- measurement window
    def _reset_window(self, skip: int = 1) -> None:
        self.skip = skip  # steps left out of the rate (the first after a switch)
        self.w_work = 0
        self.w_time = 0.0
        self.w_steps = 0
        self.w_nodes = 0
        self.w_edges = 0

    @property
    def line(self) -> Optional[float]:
        """The most a prediction may reach: the budget less ``margin`` of the headroom above the
        memory at the first step's start (budget * (1 - margin) when that was 0)."""
        if self.budget is None:
            return None
        floor = min(self.floor or 0, self.budget)
        return self.budget - self.margin * (self.budget - floor)

    @property
    def excess(self) -> int:
        """The largest amount by which a measured peak exceeded its prediction among the last
        ``model.keep`` predicted steps (0 while none did): added to every prediction, so that
        what the linear model misses (a fixed cost per step, the allocator's growth) once is
        not missed again."""
        return max(self.misses) if self.misses else 0

    def _predict_work(self, work: Optional[int]) -> Optional[int]:
        p = None if work is None else self.model.predict(work, self.base)
        return None if p is None else p + self.excess

    def predict(self, setting: Setting) -> Optional[int]:
        return self._predict_work(self.work_ahead(setting, self.window))

    def fits(self, setting: Setting) -> bool:
        """Under the budget: the setting's next ``window`` batches are predicted under the line,
        and their largest work is at most ``EXTRAPOLATE`` times the largest work of a step
        measured so far and of a step the memory model holds now (the linear model is not
        trusted further: after a long stretch at a smaller size it holds only that size's
        steps, and a jump to 4x their work crossed the budget by 10% on Zen 4; a model learned on small
        batches, whose growth the allocator's retained memory partly hides, predicted a batch of
        16x their work at half its measured peak)."""
        return self._fit(setting) == "fits"

    def _fit(self, setting: Setting) -> str:
        """'fits', 'untrusted' (predicted under the line, but over the extrapolation bound) or
        'no' (predicted over the line, or not predicted)."""
        if self.budget is None:
            return "fits"
        work = self.work_ahead(setting, self.window)
        if work is None:
            return "no"
        p = self._predict_work(work)
        if p is None or p > self.line:
            return "no"
        learned = max((w for w, _ in self.model.obs), default=0)
        if work > self.EXTRAPOLATE * min(self.seen_work, learned or self.seen_work) + 1:
            return "untrusted"  # + 1: a prediction's rounding
        return "fits"

    def _up_untrusted(self) -> bool:
        """Whether a larger size (not backing off) is held back only by the extrapolation
        bound: the climb waits for it (a few windows) rather than ending."""
        sizes = self.grid["size"]
        i = sizes.index(self.current.size)
        for s in sizes[i + 1:]:
            cand = Setting(s, self.current.pool_size, self.current.num_workers)
            if not self._backing_off(cand) and self._fit(cand) == "untrusted":
                return True
        return False

    def rise_ahead(self) -> int:
        """The rise of the peak the next step may bring without a clean start: the largest
        among the last ``CREEP_KEEP`` such steps, or the memory model's growth of the next batch
        (a step whose freed blocks cannot be reused allocates all it needs anew), the larger;
        without a model, the recent rises per unit of work times the next batch's work when it
        is larger. Measured on Zen 4 (s58): a size up from 4096 to 8192 nodes rises by 27 MiB a
        step where 4096 rose by 13, and at 16384 nodes the rises went 17, 41, then 57 MiB (about
        a clean step's growth): a guard on the largest recent rise let both cross the budget.
        With ``growth_ahead`` off (the neighbor loader) the model's growth counts only for the
        ``growth_after_up`` steps after a size up or a change of workload."""
        if not self.creep:
            return 0
        est = max(0, max(r for _, r in self.creep))
        nxt = self.work_ahead(self.current, 1) if self.growth_ahead or self._since_up > 0 else None
        if nxt:
            g = self.model.growth(nxt)
            if g is None:
                g = max((r * nxt / w for w, r in self.creep if 0 < w < nxt and r > 0), default=0)
            est = max(est, int(g))
        return est

    def held_over(self, now: Optional[int]) -> bool:
        """Whether the next step should start by handing idle memory back: the memory held
        now (``now``, between steps; or the last measured peak, the larger) plus the rise the
        next step may bring (:meth:`rise_ahead`: the largest rise of the peak from one step to
        the next among the last ``CREEP_KEEP`` steps without a clean start, scaled up to a
        larger next batch) would cross the budget. Batches that grow step after step leave freed
        blocks too small for the next ones, so between clean readings the peak creeps up by
        about a step's growth per step, which the clean-reading model (the size choices, with
        their margin) does not see; this is the guard of the budget itself. (Also starting clean
        when the memory held now plus the next step's predicted growth crosses the budget was
        measured and withdrawn: 62 releases in the adapt_fanout benchmark's adaptive run against
        2, adaptive 0.72x the best fixed size against 0.81x: the memory held between steps is
        mostly the allocator's, which the next step reuses.)"""
        if self.budget is None or not self.creep or self.last_peak is None:
            return False
        held = max(self.last_peak, now or 0)
        return held + self.rise_ahead() > self.budget

    def _neighbour(self, dim: str, step: int) -> Optional[Setting]:
        vals = self.grid[dim]
        i = vals.index(getattr(self.current, dim)) + step
        if not 0 <= i < len(vals):
            return None
        d = self.current.as_dict()
        d[dim] = vals[i]
        return Setting(**d)

    def _entry(self, kind: str, new: Setting, gain: Optional[float], reason: str) -> Dict[str, Any]:
        return {"kind": kind, "from": self.current.as_dict(), "to": new.as_dict(), "gain": gain,
                "predicted_bytes": self.predict(new) if self.budget is not None or self.model.ratios else None,
                "reason": reason}

    def _switch(self, kind: str, new: Setting, gain: Optional[float], reason: str) -> Dict[str, Any]:
        e = self._entry(kind, new, gain, reason)
        if new.size > self.current.size:
            self._since_up = self.growth_after_up
        self.current = new
        self.deferred = None
        self._reset_window()
        return e

    # -- the two checks before a step
    def _shrunk(self, reason: str) -> Optional[Dict[str, Any]]:
        """The largest smaller size that fits (or the smallest), as a 'shrink' entry."""
        sizes = self.grid["size"]
        i = sizes.index(self.current.size)
        if i == 0:
            return None
        pick = sizes[0]
        for s in reversed(sizes[:i]):
            cand = Setting(s, self.current.pool_size, self.current.num_workers)
            if self.fits(cand):
                pick = s
                break
        if self.trial is not None:  # a trial shrunk for memory is a refusal: its back-off, as a revert's
            self._back_off((self.trial[0], self.current))
        self.trial = None
        self.streak = self.rest = 0
        self._shrunk_from = self.current if self.hold_shrunk else None
        return self._switch("shrink", Setting(pick, self.current.pool_size, self.current.num_workers), None, reason)

    def jump_to_fit(self, reason: str) -> Optional[Dict[str, Any]]:
        """At a change of workload whose batches the loader predicts (a new fanout under the
        work model): straight to the largest size predicted to fit (:meth:`fits`: under the line,
        within ``EXTRAPOLATE`` times the work measured), a 'jump' entry, rather than a climb
        from the size the old workload left, one trial window per size. Up only to a size so
        predicted; down only when the current size is predicted over the line (to the largest
        that fits; when none does, :meth:`before_step` shrinks as before the change). None when
        the size stays, without a budget or a memory model, or while a trial is under way."""
        if self.budget is None or self.model.per_work is None or self.trial is not None:
            return None
        cur = self.current
        fit = [s for s in self.grid["size"] if self.fits(Setting(s, cur.pool_size, cur.num_workers))]
        if not fit:
            return None
        pick = max(fit)
        if pick == cur.size or (pick < cur.size and self._fit(cur) != "no"):
            return None
        new = Setting(pick, cur.pool_size, cur.num_workers)
        pred = self.predict(new)
        what = "the largest size predicted to fit" + ("" if pred is None else f" ({pred / 2**20:.1f} MiB, line "
                                                                               f"{self.line / 2**20:.1f} MiB)")
        return self._switch("jump", new, None, f"{reason}: {what}")

    def before_step(self) -> Optional[Dict[str, Any]]:
        """Shrinks now when the next batches under the current setting are predicted over the line."""
        self._expected = self._expected_growth = None
        if self.budget is None or self.model.per_work is None:
            return None
        pred = self._predict_work(self.work_ahead(self.current, 1))
        if pred is None:
            return None
        entry = None
        if pred > self.line:
            entry = self._shrunk(f"next batch predicted at {pred / 2**20:.1f} MiB, over "
                                 f"{self.line / 2**20:.1f} MiB (budget less margin)")
            pred = self._predict_work(self.work_ahead(self.current, 1))
        self._expected = pred  # compared with the step's measured peak (observe)
        if pred is not None:
            work = self.work_ahead(self.current, 1)
            g = None if work is None else self.model.growth(work)
            self._expected_growth = None if g is None else int(g)
        return entry

    # -- after a step
    def observe(self, seconds: float, work: int, base: int, peak: Optional[int],
                grown: Optional[int] = None, learn: bool = True,
                progress: Optional[float] = None, nodes: Optional[int] = None,
                edges: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """One step's measurements: wall seconds, work (nodes + edges), the memory at its
        start and its peak (None without a probe); ``grown`` (default ``peak - base``) is what
        the memory model learns from, when ``learn`` (a clean reading; predictions start from
        the base of the last one); ``progress`` (default ``work``) is what the rates compare
        per second: the neighbor loader gives the step's seeds, since a larger seed batch
        shares more of its sampled neighbourhood and so does less work per seed; ``nodes`` and
        ``edges`` (the batch's; default: all its work counted as nodes) are its density, which
        decides whether a setting measured slower before is worth another trial. Returns a log
        entry when the setting changes or a trial is kept; a further entry decided at the same
        step (the climb's next trial after a kept one) is left in ``extra``."""
        if self.floor is None:
            self.floor = base
        if self.clean_misses:
            if peak is not None and learn and self._expected_growth is not None:
                own = peak - base if grown is None else grown
                self.misses.append(max(0, own - self._expected_growth))
                del self.misses[:-self.model.keep]
        elif peak is not None and self._expected is not None:
            self.misses.append(max(0, peak - self._expected))
            del self.misses[:-self.model.keep]
        self._expected = self._expected_growth = None
        if learn or self.model.per_work is None:
            self.base = base
        if self._since_up > 0:
            self._since_up -= 1
        if peak is not None:
            self.seen_work = max(self.seen_work, work)
            if not learn and self.last_peak is not None:
                self.creep.append((int(work), peak - self.last_peak))
                del self.creep[:-self.CREEP_KEEP]
            self.last_peak = peak
        if peak is not None and learn:
            self.model.observe(work, peak - base if grown is None else grown)
        if peak is not None:
            if self.budget is not None and peak > self.budget:
                return self._shrunk(f"measured peak {peak / 2**20:.1f} MiB over the budget "
                                    f"{self.budget / 2**20:.1f} MiB")
        e = self.resume_deferred()
        if e is not None:
            return e
        if self.skip > 0:
            self.skip -= 1
            return None
        self.w_work += work if progress is None else progress
        self.w_time += seconds
        self.w_steps += 1
        self.w_nodes = max(self.w_nodes, work if nodes is None else nodes)
        self.w_edges = max(self.w_edges, 0 if edges is None else edges)
        if self.w_steps < (self._window_now if self.trial is not None else self.window):
            return None
        rate = self.w_work / max(self.w_time, 1e-12)
        density = (float(self.w_nodes), float(self.w_edges))
        self.density = density
        self.windows += 1
        self._reset_window(skip=0)
        gone, self._shrunk_from = self._shrunk_from, None
        if gone is not None and gone.size > self.current.size and self.trial is None:
            # a size shrunk from does not fit these batches: not tried again from here while they
            # keep this density (as a refused trial; on Zen 4, s59, a 16384-node batch predicted to
            # fit, shrunk from two steps later, was tried again 80 steps on, once the memory model
            # had forgotten it, and shrunk from or refused again: 9-31 steps a run at 16384)
            self.worse[(self.current, gone)] = (density, self.windows, self.WORSE_WINDOWS)
        if self.trial is not None:
            prev, prev_rate, prev_density = self.trial
            self.trial = None
            gain = rate / prev_rate if prev_rate > 0 else float("inf")
            self.rates[self.current] = rate
            if gain >= 1.0 + self.min_gain:
                self.backoff.pop((prev, self.current), None)
                # prev measured slower, at these batches
                self.worse[(self.current, prev)] = (density, self.windows, self.WORSE_WINDOWS)
                self.streak = self.rest = 0
                e = self._entry("keep", self.current, gain, f"{(gain - 1) * 100:.1f}% more {self.unit} per second "
                                f"(>= {self.min_gain * 100:g}%)")
                e["from"] = prev.as_dict()
                if self.climbing:  # the trial's window is this size's measurement: the next one up at once
                    self.climb_waits = 0
                    nxt = self._try(rate, self.MOVES.index(("size", 1)))
                    if nxt is not None:
                        self.extra.append(nxt)
                    elif not self._up_untrusted():  # (a size up not yet trusted: the climb waits)
                        self.climbing = False
                return e
            key = (prev, self.current)
            self._back_off(key)
            provisional = self._trial_provisional and gain >= self.PROVISIONAL_FLOOR
            hold = self.PROVISIONAL_WINDOWS if provisional else self.WORSE_WINDOWS
            if prev_density is not None:
                self.worse[key] = (prev_density, self.windows, hold)
            self.climbing = False
            self.streak += 1
            self.rest = min(self.STREAK_CAP, 2 ** (self.streak - 1)) - 1
            note = (f" (a first or short measurement of a size up: may be tried again after {hold} windows)"
                    if provisional else "")
            return self._switch("revert", prev, gain, f"{(gain - 1) * 100:+.1f}% {self.unit} per second, under the "
                                f"{self.min_gain * 100:g}% needed to switch{note}")
        self.rates[self.current] = rate
        if self.rest > 0:  # a run of refusals: measure on before the next trial
            self.rest -= 1
            return None
        return self._explore(rate, up_only=self.climbing)

    def workload_changed(self, reason: str, climb: bool = False) -> Optional[Dict[str, Any]]:
        """The batches' nature changed (a new fanout): rates measured before do not compare with
        rates after, so the measurement window starts again (its first step left out), the
        refusals' back-offs are forgotten, and a trial under way ends without a verdict: back
        to the setting it came from (a 'revert' entry, gain None). With ``climb`` the climb
        starts again from the setting the change leaves (sizes up first, see :meth:`observe`):
        a refusal under the old workload ended it, and says nothing of the new one."""
        self.rates.clear()
        self.backoff.clear()
        self.worse.clear()
        self._shrunk_from = None  # a shrink under the old workload holds nothing under the new one
        self.streak = self.rest = 0
        self.deferred = None
        self._since_up = self.growth_after_up  # the next batches' work is not the creep's (rise_ahead)
        if climb:
            self.climbing = True
            self.climb_waits = 0
        if self.trial is not None:
            prev, _, _ = self.trial
            self.trial = None
            return self._switch("revert", prev, None, f"trial abandoned: {reason}")
        self._reset_window()
        return None

    def _back_off(self, key: Tuple[Setting, Setting]) -> None:
        """A refusal of the trial ``key`` (from, to): its next try waits twice as many windows
        as the last wait (1, 2, 4 ... 64)."""
        wait = min(64, 2 * self.backoff.get(key, (0, 1))[1])
        self.backoff[key] = (self.windows + wait, wait)

    def _backing_off(self, cand: Setting) -> bool:
        retry = self.backoff.get((self.current, cand))
        return (retry is not None and self.windows < retry[0]) or self._measured_worse(cand)

    def _measured_worse(self, cand: Setting) -> bool:
        """Whether ``cand`` was measured slower than the current setting (a refused trial, or
        the current one kept over it) on batches of a density similar to the current ones':
        the largest nodes and largest edges per batch of a window each within a factor ``DENSITY_TOL``. Such a trial
        is not repeated (whatever its back-off); batches whose density has changed since (graphs
        sorted by size under a graph count, denser graphs under a node budget) may be tried again,
        and so may any after ``WORSE_WINDOWS`` windows (``PROVISIONAL_WINDOWS`` after a
        provisional refusal: a size up refused on its first or a shortened measurement)."""
        got = self.worse.get((self.current, cand))
        now = self.density
        if got is None or now is None or self.windows - got[1] > got[2]:
            return False
        was = got[0]

        def near(a: float, b: float) -> bool:
            if a <= 0 or b <= 0:
                return a == b
            return max(a, b) <= self.DENSITY_TOL * min(a, b)

        return near(was[0], now[0]) and near(was[1], now[1])

    def resume_deferred(self) -> Optional[Dict[str, Any]]:
        """Starts the trial deferred for want of room (:meth:`_explore`) once the epoch holds it
        (the loader asks at an epoch's start and after each step); None otherwise."""
        if self.deferred is None or self.trial is not None or self.current not in self.rates or \
                not self._has_room(self.deferred):
            return None
        self.deferred = None
        return self._explore(self.rates[self.current], up_only=self.climbing)

    def _trial_window(self, cand: Setting) -> int:
        """The steps a trial of ``cand`` is measured for: ``window``, or where a whole epoch
        under ``cand`` holds fewer than ``window`` + 1 steps, the epoch's steps less the one left
        out (at least 1), so that the trial ends within one epoch."""
        r = self.room(cand) if self.room is not None else None
        if r is None or r[1] < 2:
            return self.window
        return max(1, min(self.window, r[1] - 1))

    def _has_room(self, cand: Setting) -> bool:
        """Whether the epoch leaves room for a trial of ``cand`` (always, without a ``room`` hook,
        and where an epoch holds no measured step of it: it straddles an epoch's end)."""
        r = self.room(cand) if self.room is not None else None
        if r is None or r[1] < 2:
            return True
        return r[0] >= self._trial_window(cand) + 1  # + 1: the step left out after the switch

    def _grow(self) -> Optional[Setting]:
        """Under a budget, the size to try upwards: the largest above the current one whose
        next batches are predicted to fit and whose trial from here is not backing off (after a
        refusal, the next smaller one that fits); None when none does. Batches whose size
        changes as they go (graphs sorted by size, an epoch's start after its largest graphs)
        reach the largest size that fits in one trial, not one grid step per trial."""
        sizes = self.grid["size"]
        i = sizes.index(self.current.size)
        for s in reversed(sizes[i + 1:]):
            cand = Setting(s, self.current.pool_size, self.current.num_workers)
            if not self._backing_off(cand) and self.fits(cand):
                return cand
        return None

    def _explore(self, rate: float, up_only: bool = False) -> Optional[Dict[str, Any]]:
        """The next trial from the current setting (measured at ``rate``), or None. The moves
        take turns; ``up_only`` (the climb) tries the size up first, and when it may not be
        tried the climb ends (and the moves take turns)."""
        if up_only:
            e = self._try(rate, self.MOVES.index(("size", 1)))
            if e is not None:
                self.climb_waits = 0
                return e
            if self.deferred is not None:  # the size up waits for an epoch that holds its trial
                return None
            if self.climb_waits < self.CLIMB_WAIT and self._up_untrusted():
                self.climb_waits += 1  # a size up that fits but is not yet trusted: measure on, no other move
                return None
            self.climbing = False
        for k in range(len(self.MOVES)):
            e = self._try(rate, (self.move_no + k) % len(self.MOVES))
            if e is not None:
                return e
            if self.deferred is not None:  # wait for an epoch that holds the trial (not another move meanwhile)
                return None
        return None

    def _try(self, rate: float, m: int) -> Optional[Dict[str, Any]]:
        """Move ``m`` of MOVES as a trial (an 'explore' entry), or None when it may not be tried."""
        dim, step = self.MOVES[m]
        jump = dim == "size" and step > 0 and self.budget is not None
        cand = self._grow() if jump else self._neighbour(dim, step)
        if cand is None or self._backing_off(cand):
            return None
        if dim == "size" and step > 0 and not self.fits(cand):
            return None
        if dim == "size" and step < 0 and self.budget is not None and not self.fits(cand):
            return None
        if not self._has_room(cand):  # wait for an epoch that holds the trial (:meth:`resume_deferred`)
            self.deferred = cand
            return None
        self.move_no = (m + 1) % len(self.MOVES)
        self.trial = (self.current, rate, self.density)
        self._window_now = self._trial_window(cand)
        # a refusal of this trial is provisional (:attr:`PROVISIONAL_WINDOWS`) when it is a size up
        # never measured before (since the workload began) or measured on a shortened window
        self._trial_provisional = (dim == "size" and cand.size > self.current.size
                                   and (cand not in self.rates or self._window_now < self.window))
        what = " (the largest predicted to fit)" if jump and cand != self._neighbour(dim, step) else ""
        return self._switch("explore", cand, None, f"trying {dim} {getattr(self.current, dim)} -> "
                            f"{getattr(cand, dim)}{what} for {self._window_now} steps")


# ---------------------------------------------------------------------------------- loaders


def _check_grid(name: str, values, minimum: int) -> List[int]:
    if isinstance(values, numbers.Integral) and not isinstance(values, bool):
        values = [values]
    try:
        vals = list(values)
    except TypeError:
        raise ValueError(f"AdaptiveLoader: {name} must be an int or a list of ints, got {values!r}") from None
    if not vals:
        raise ValueError(f"AdaptiveLoader: {name} is empty")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
            raise ValueError(f"AdaptiveLoader: every entry of {name} must be an integer >= {minimum}, got {v!r}")
    return sorted(set(int(v) for v in vals))


def _dist():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist
    return None


class _Adaptive:
    """What both adaptive loaders share: arguments, measurement, the policy, DDP, the log."""

    def __init__(self, *, sizes, pool_sizes, num_workers, start, memory_budget, memory, margin, min_gain,
                 window, optimizer, lr_scaling, device, clock) -> None:
        self.sizes = _check_grid("sizes", sizes, 1)
        self.pool_sizes = _check_grid("pool_sizes", pool_sizes, 1)
        self.worker_counts = _check_grid("num_workers", num_workers, 0)
        if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(memory_budget, numbers.Real)
                                          or not memory_budget > 0):
            raise ValueError(f"AdaptiveLoader: memory_budget must be a number of bytes > 0 (or None), "
                             f"got {memory_budget!r}")
        if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not 0 <= margin < 1:
            raise ValueError(f"AdaptiveLoader: margin must be in [0, 1), got {margin!r}")
        if isinstance(min_gain, bool) or not isinstance(min_gain, numbers.Real) or not min_gain >= 0:
            raise ValueError(f"AdaptiveLoader: min_gain must be a number >= 0, got {min_gain!r}")
        if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
            raise ValueError(f"AdaptiveLoader: window must be an integer >= 1, got {window!r}")
        if lr_scaling not in _LR:
            raise ValueError(f"AdaptiveLoader: lr_scaling must be None, 'linear' or 'sqrt', got {lr_scaling!r}")
        if lr_scaling is not None and (optimizer is None or not hasattr(optimizer, "param_groups")):
            raise ValueError("AdaptiveLoader: lr_scaling needs the optimizer (optimizer=...) whose lr it scales")
        if not callable(clock):
            raise ValueError(f"AdaptiveLoader: clock must be a callable returning seconds, got {clock!r}")
        self.probe = _probe(memory, device)
        if memory_budget is not None and self.probe is None:
            raise ValueError("AdaptiveLoader: a memory_budget needs a memory measure (memory='cuda', 'rss' or a "
                             "callable); none is available here")
        if start is None:
            start = Setting(self.sizes[0], self.pool_sizes[0], self.worker_counts[0])
        elif not isinstance(start, Setting):
            raise ValueError(f"AdaptiveLoader: start must be a Setting, got {start!r}")
        if start.size not in self.sizes or start.pool_size not in self.pool_sizes or \
                start.num_workers not in self.worker_counts:
            raise ValueError(f"AdaptiveLoader: start {start} is not in the grid (sizes {self.sizes}, pool_sizes "
                             f"{self.pool_sizes}, num_workers {self.worker_counts})")
        self.memory_budget = None if memory_budget is None else int(memory_budget)
        self.optimizer = optimizer
        self.lr_scaling = lr_scaling
        self.first_size = start.size
        self._base_lrs = [g["lr"] for g in optimizer.param_groups] if optimizer is not None and \
            hasattr(optimizer, "param_groups") else []
        self.clock = clock
        self.device = device
        self.policy = Policy(self.sizes, self.pool_sizes, self.worker_counts, start, self.memory_budget, float(margin),
                             float(min_gain), int(window), self._work_ahead)
        self.log: List[Dict[str, Any]] = []
        self.history: List[Dict[str, Any]] = []
        self.releases = 0  # steps started clean because held memory would have crossed the line
        self.step = 0  # steps taken, all epochs
        self.epoch = -1
        self._pending: Optional[Dict[str, Any]] = None  # the yielded step not yet done
        self._t_last = 0.0
        self._replan = False

    @property
    def setting(self) -> Setting:
        return self.policy.current

    # -- hooks of a concrete loader
    def _work_ahead(self, setting: Setting, steps: int) -> Optional[int]:
        raise NotImplementedError

    def _apply(self, old: Setting, new: Setting) -> None:
        """Makes the loader deliver ``new`` from the next batch on (the generator re-plans)."""
        self._replan = True

    # -- the step protocol
    def _begin(self, info: Dict[str, Any]) -> None:
        if self.probe is not None:
            self.probe.start()
        info["base"] = self.probe.base if self.probe is not None else 0
        info["clean"] = self.probe.clean if self.probe is not None else True
        self._pending = info

    def step_done(self, loss: Any = None) -> None:
        """Ends the step of the last batch yielded: records its time (since the previous
        step's end), memory, density and ``loss`` (a float or a 0-d tensor; ``.item()`` is
        called, so it syncs a CUDA device), and lets the policy decide. Calling it is optional:
        the loader ends a step itself when the next batch is asked for (without the loss)."""
        info = self._pending
        if info is None:
            return
        self._pending = None
        now = self.clock()
        peak = self.probe.peak() if self.probe is not None else None
        seconds = now - self._t_last
        self._t_last = now
        if loss is not None:
            loss = float(loss.detach().item()) if isinstance(loss, torch.Tensor) else float(loss)
        rec = dict(step=self.step, epoch=self.epoch, **self.setting.as_dict(), graphs=info["graphs"],
                   nodes=info["nodes"], edges=info["edges"], seconds=seconds, base=info["base"], peak=peak, loss=loss,
                   clean=info["clean"])
        self.history.append(rec)
        self.step += 1
        work = Work(info["nodes"], info["edges"])
        base = info["base"]
        grown = None
        dist = _dist()
        if dist is not None:
            peak, base, grown, clean = self._reduce_memory(dist, work, base, peak, info["clean"])
        else:
            clean = info["clean"]
        entries = []
        if dist is None or dist.get_rank() == 0:  # under DDP only rank 0's policy decides
            # what the measurement decides, then the check of the next batch under the setting
            # that decision leaves (after a kept trial or a revert too: a size kept for the
            # batches it was tried on may not fit the larger ones that follow)
            entries = [self.policy.observe(seconds, work, base, peak, grown, clean, self._progress(info),
                                           nodes=info["nodes"], edges=info["edges"])]
            entries += self.policy.extra
            self.policy.extra = []
            entries.append(self.policy.before_step() if self._more_to_come() else None)
            entries = [e for e in entries if e is not None]
        if dist is not None:  # the other ranks need the setting rank 0 ends with: its last entry
            last = self._broadcast(dist, entries[-1] if entries else None)
            if dist.get_rank() != 0:
                entries = [] if last is None else [last]
        for entry in entries:
            self._record(entry)
        if self._more_to_come():
            self._maybe_release()

    def _maybe_release(self) -> None:
        """Before the next step: when the memory held now plus the recent creep of the peak
        would cross the budget (:meth:`Policy.held_over`), the step starts clean (the probe
        hands idle memory back first). Under DDP only rank 0's policy observes, so only rank 0
        checks (its peaks are the ranks' largest)."""
        if self.probe is None or self.policy.budget is None:
            return
        now = self.probe.current()
        if now is None:
            return
        if self.policy.held_over(now) and self.probe.release_next():
            self.releases += 1
            log.debug("adapt: step %d starts clean: %.1f MiB held, creeping up to %.1f MiB a step, budget %.1f MiB",
                      self.step, now / 2**20, self.policy.rise_ahead() / 2**20, self.policy.budget / 2**20)

    def _more_to_come(self) -> bool:
        return True

    def _progress(self, info: Dict[str, Any]) -> Optional[float]:
        """What a step's rate counts (None: its work, nodes + edges)."""
        return None

    def _check_ahead(self) -> None:
        """At an epoch's start: shrink now if its first batch is predicted over the budget; else
        start a trial that waited for an epoch to hold it (:meth:`Policy.resume_deferred`)."""
        dist = _dist()
        entries = []
        if dist is None or dist.get_rank() == 0:
            entries = [self.policy.before_step()]
            if entries[0] is None:
                entries = [self.policy.resume_deferred()]
                if entries[0] is not None:
                    entries.append(self.policy.before_step())  # the trial's first batch
            entries = [e for e in entries if e is not None]
        if dist is not None:
            last = self._broadcast(dist, entries[-1] if entries else None)
            if dist.get_rank() != 0:
                entries = [] if last is None else [last]
        for entry in entries:
            self._record(entry)
        self._maybe_release()

    def _reduce_memory(self, dist, work: int, base: int, peak: Optional[int], clean: bool):
        """(peak, base, grown, clean) over the ranks: the largest peak and base, what the memory
        model learns (the largest bytes per unit of work of a clean reading on any rank, times
        this step's work) and whether any rank's reading was clean."""
        ratio = -1.0 if peak is None or work <= 0 or not clean else max(0, peak - base) / work
        t = torch.tensor([ratio, float(-1 if peak is None else peak), float(base) if clean else -1.0],
                         dtype=torch.float64, device=self._dist_device(dist))
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ratio, peak_all, base_all = (float(v) for v in t.cpu())
        if peak is None:
            return None, int(base), None, False
        if ratio < 0:  # no clean reading on any rank
            return int(peak_all), int(base), None, False
        return int(peak_all), int(base_all), int(ratio * work), True

    @staticmethod
    def _dist_device(dist) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _broadcast(self, dist, entry: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        """Rank 0's decision to every rank: [changed, kind, size, pool, workers, gain, predicted]."""
        rank = dist.get_rank()
        before = self.setting
        t = torch.zeros(7, dtype=torch.float64, device=self._dist_device(dist))
        if rank == 0 and entry is not None:
            to = entry["to"]
            t[0] = 1
            t[1] = _KINDS.index(entry["kind"])
            t[2], t[3], t[4] = to["size"], to["pool_size"], to["num_workers"]
            t[5] = -1 if entry["gain"] is None else entry["gain"]
            t[6] = -1 if entry["predicted_bytes"] is None else entry["predicted_bytes"]
        dist.broadcast(t, src=0)
        v = t.cpu().tolist()
        if rank == 0:
            return entry
        if v[0] == 0:
            return None
        new = Setting(int(v[2]), int(v[3]), int(v[4]))
        entry = {"kind": _KINDS[int(v[1])], "from": before.as_dict(), "to": new.as_dict(),
                 "gain": None if v[5] < 0 else v[5], "predicted_bytes": None if v[6] < 0 else int(v[6]),
                 "reason": "decided on rank 0"}
        self.policy.current = new
        return entry

    def _record(self, entry: Dict[str, Any]) -> None:
        old, new = Setting(**entry["from"]), Setting(**entry["to"])
        entry = dict(entry, step=self.step, epoch=self.epoch)
        if entry["kind"] == "keep":  # the trial's setting runs on: nothing to change
            self.log.append(entry)
            log.info("adapt: step %d keeps %s over %s (gain %.3f): %s", self.step, new, old, entry["gain"],
                     entry["reason"])
            return
        if self.lr_scaling is not None and old.size != new.size:
            f = new.size / self.first_size
            f = f if self.lr_scaling == "linear" else math.sqrt(f)
            lrs = []
            for g, lr0 in zip(self.optimizer.param_groups, self._base_lrs):
                g["lr"] = lr0 * f
                lrs.append(g["lr"])
            entry["lr"] = lrs
        self.log.append(entry)
        log.info("adapt: step %d %s %s -> %s (gain %s, predicted %s bytes): %s", self.step, entry["kind"], old, new,
                 "n/a" if entry["gain"] is None else f"{entry['gain']:.3f}", entry["predicted_bytes"], entry["reason"])
        self._apply(old, new)


class AdaptiveLoader(_Adaptive):
    """Graph mini-batches (a :class:`gnncompile.data.PooledLoader` inside) whose batch size,
    pool size and workers are re-chosen while training; see the module's docstring.

    Args:
        dataset: a sequence of ``Data`` graphs (as for ``PooledLoader``).
        by: ``'graphs'`` (``sizes`` are graphs per batch), ``'nodes'`` or ``'edges'`` (``sizes``
            are budgets: graphs are taken in order until the next would exceed the budget; a
            graph larger than the budget makes a batch of its own).
        sizes: the candidate sizes (ints >= 1).
        pool_sizes, num_workers: candidate pool sizes (>= 1) and worker counts (>= 0).
        start: the first :class:`Setting` (default: the smallest of each grid).
        shuffle, seed: the epoch's order of graphs (a permutation from ``seed`` and the epoch
            when shuffled; the same on every rank).
        memory_budget: bytes the measured peak must stay under (None: no budget).
        memory: ``'auto'``, ``'cuda'``, ``'rss'``, None or a callable (see the module docstring).
        margin: predictions must stay under the budget less this share of the headroom above
            the memory at the first step's start (default 0.1).
        min_gain: the measured gain a switch needs (default 0.05: 5%).
        window: steps per measurement (default 8).
        optimizer, lr_scaling: ``None`` / ``'linear'`` / ``'sqrt'`` learning-rate rescaling at
            size switches (opt-in).
        device: where batches go (as ``PooledLoader``'s ``device``).
        clock: seconds (``time.perf_counter``; tests give a fake one).
        loader_kwargs: further ``PooledLoader`` keywords (follow_batch, exclude_keys, pin_memory,
            persistent_workers, timeout).

    ValueError on a bad argument.
    """

    def __init__(self, dataset: Sequence, *, by: str = "graphs", sizes: Sequence[int] = (16, 32, 64, 128),
                 pool_sizes: Sequence[int] = (2,), num_workers: Sequence[int] = (0,), start: Optional[Setting] = None,
                 shuffle: bool = False, seed: int = 0, memory_budget: Optional[int] = None, memory: Any = "auto",
                 margin: float = 0.1, min_gain: float = 0.05, window: int = 8, optimizer: Any = None,
                 lr_scaling: Optional[str] = None, device=None, clock: Callable[[], float] = time.perf_counter,
                 **loader_kwargs) -> None:
        if by not in _BY:
            raise ValueError(f"AdaptiveLoader: by must be one of {_BY}, got {by!r}")
        for k in ("batch_size", "pool_size", "shuffle", "drop_last", "generator"):
            if k in loader_kwargs:
                raise ValueError(f"AdaptiveLoader chooses {k} itself; give sizes / pool_sizes / shuffle, seed")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"AdaptiveLoader: seed must be an int, got {seed!r}")
        super().__init__(sizes=sizes, pool_sizes=pool_sizes, num_workers=num_workers, start=start,
                         memory_budget=memory_budget, memory=memory, margin=margin, min_gain=min_gain, window=window,
                         optimizer=optimizer, lr_scaling=lr_scaling, device=device, clock=clock)
        from .data import PooledLoader

        if not hasattr(dataset, "__len__") or len(dataset) == 0:
            raise ValueError("AdaptiveLoader: dataset must be a non-empty sequence of graphs")
        self.by = by
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.dataset = dataset
        self.nodes = torch.tensor([int(d.num_nodes) for d in dataset], dtype=torch.long)
        self.edges = torch.tensor([int(d.num_edges) for d in dataset], dtype=torch.long)
        # the same counts as Python lists: planning reads them graph by graph, several times a
        # step (indexing a tensor per graph cost about 0.3 ms a step at 8192-node batches)
        self._node_counts: List[int] = self.nodes.tolist()
        self._edge_counts: List[int] = self.edges.tolist()
        s = self.setting
        self.loader = PooledLoader(dataset, batch_size=1 if by != "graphs" else s.size, pool_size=s.pool_size,
                                   num_workers=s.num_workers, device=device, **loader_kwargs)
        dist = _dist()
        self.world = dist.get_world_size() if dist is not None else 1
        self.rank = dist.get_rank() if dist is not None else 0
        self._order: List[int] = []
        self._pos = 0
        # the work ahead already planned at this position of this epoch's order: the policy asks
        # for the same (size, steps) several times a step (the next batch's check, the release
        # guard, each candidate's fit); the order and position it holds for
        self._ahead: Tuple[Optional[List[int]], int, Dict[Tuple[int, int], Optional[int]]] = (None, -1, {})

    # -- planning
    def _epoch_order(self, epoch: int) -> List[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator().manual_seed((self.seed * 1000003 + epoch) % (2**63))
        return torch.randperm(n, generator=g).tolist()

    def plan(self, size: int, start: int, steps: Optional[int] = None) -> List[List[List[int]]]:
        """The steps from position ``start`` of this epoch's order under ``size``: per step, one
        batch (list of graph ids) per rank. Graphs go round-robin to the ranks; a step ends when
        each rank's batch holds ``size`` graphs (by='graphs') or when the next graph would push
        a rank's batch over the budget. A last step with fewer graphs than ranks is padded by
        wrapping around to the order's start."""
        order, R = self._order, self.world
        counts = None if self.by == "graphs" else self._node_counts if self.by == "nodes" else self._edge_counts
        out: List[List[List[int]]] = []
        i, n = start, len(order)
        while i < n and (steps is None or len(out) < steps):
            bins: List[List[int]] = [[] for _ in range(R)]
            load = [0] * R
            k = 0
            while i < n:
                r = k % R
                m = 1 if counts is None else counts[order[i]]
                if counts is None:
                    if load[r] >= size:
                        break
                elif bins[r] and load[r] + m > size:
                    break
                bins[r].append(order[i])
                load[r] += m
                i += 1
                k += 1
            j = 0
            for r in range(R):  # the epoch's tail: fewer graphs than ranks
                if not bins[r]:
                    bins[r].append(order[j % n])
                    j += 1
            out.append(bins)
        return out

    def _work(self, batch: List[int]) -> int:
        nc, ec = self._node_counts, self._edge_counts
        return sum(nc[g] + ec[g] for g in batch)

    def _work_ahead(self, setting: Setting, steps: int) -> Optional[int]:
        """The largest work of this rank's next ``steps`` batches under ``setting``; past the
        epoch's end, the first batches of this epoch's order stand for the next epoch's.
        Remembered until the position or the order changes (one planning per question a step)."""
        order, pos, memo = self._ahead
        if order is not self._order or pos != self._pos:
            memo = {}
            self._ahead = (self._order, self._pos, memo)
        key = (setting.size, steps)
        if key not in memo:
            plan = self.plan(setting.size, self._pos, steps)
            if len(plan) < steps and self._order:
                plan += self.plan(setting.size, 0, steps - len(plan))
            memo[key] = max(self._work(bins[r]) for bins in plan for r in range(self.world)) if plan else None
        return memo[key]

    def _more_to_come(self) -> bool:
        return self._pos < len(self._order)

    def _apply(self, old: Setting, new: Setting) -> None:
        self._replan = True
        if (old.pool_size, old.num_workers) != (new.pool_size, new.num_workers):
            self.loader.reconfigure(pool_size=new.pool_size, num_workers=new.num_workers)

    def __len__(self) -> int:
        """Steps of an epoch under the current setting."""
        saved = self._order
        if not saved:
            self._order = self._epoch_order(max(self.epoch, 0))
        try:
            return len(self.plan(self.setting.size, 0))
        finally:
            self._order = saved

    def __iter__(self) -> Iterator:
        self.step_done()  # a step left open by the previous epoch
        self.epoch += 1
        self._order = self._epoch_order(self.epoch)
        self._pos = 0
        self._check_ahead()
        self._t_last = self.clock()
        n = len(self._order)
        while self._pos < n:
            self._replan = False
            steps = self.plan(self.setting.size, self._pos)
            it = self.loader.iter_batches([bins[self.rank] for bins in steps])
            for bins in steps:
                batch = next(it)
                mine = bins[self.rank]
                self._begin({"graphs": len(mine), "nodes": sum(self._node_counts[g] for g in mine),
                             "edges": sum(self._edge_counts[g] for g in mine), "ids": mine})
                self._pos += min(sum(len(b) for b in bins), n - self._pos)
                yield batch
                self.step_done()
                if self._replan:
                    break
            it.close()

    def close(self) -> None:
        self.loader.close()


class NeighborWorkModel:
    """The expected nodes + edges per seed of a neighbor-sampled batch of ``seeds`` seeds under a
    fanout, from the graph's in-degrees (computed, not sampled; what
    :class:`AdaptiveNeighborLoader` predicts a new fanout or an untried size by).

    Hop by hop, every node of the frontier (hop 0: the seeds, each input node a seed with
    probability q = seeds / inputs) draws min(deg, f) of its in-edges, each in-edge of v with
    probability min(1, f / deg(v)) (sampling without replacement, the default). So the expected sampled edges of a hop are the frontier's sum of min(deg, f):
    E[min(deg, f)] under the frontier's distribution, which past the seeds is not the graph's
    degree distribution but that of the sources of sampled edges (weighted by how often each
    node is sampled). The next frontier is the nodes sampled for the first time: a source u is
    sampled with probability 1 - exp(-lambda(u)), lambda(u) the expected number of its sampled
    out-edges (a Poisson occupancy), and is new unless already seen; so the model counts the
    neighbours the seeds of one batch share, which makes the work per seed fall as the batch
    grows. Nodes = seeds + the new nodes of every hop; edges = the sampled edges of every hop.

    Measured on a 20k-node / 1M-edge power-law graph (the adapt_fanout benchmark's), fanouts
    [5, 5] to [40, 40] and 128 to 8192 seeds: within 1-4% of the sampled sizes, below them;
    the loader multiplies by a calibration from the batches it measured. Without the sharing
    (1 + 2 E[edges] per seed) it overstates the change of fanout by 11-20% ([5, 5] -> [10, 10] ->
    [20, 20] -> [40, 40] at 128 seeds), the fanouts' bound 1 + 2 (f1 + f1 f2) by 24-134%.

    Cost: the degrees and a fixed random subset of ``subset`` nodes with their out-edges at
    construction (a pass over the edges); per first hop's fanout one pass over the edges
    (cached); per (seeds, fanout) one pass over the edges for each hop but the first and the
    last, and over the subset's out-edges for the last (whose new nodes are estimated on the
    subset, scaled up). ``disjoint=True`` (every seed its own tree): the work of a single seed."""

    SUBSET = 4096

    def __init__(self, edge_index: torch.Tensor, num_nodes: int, inputs: torch.Tensor, *, disjoint: bool = False, num_inputs: Optional[int] = None, subset: int = SUBSET,
                 seed: int = 0) -> None:
        import numpy as np

        n = int(num_nodes)
        if n <= 0:
            raise ValueError("NeighborWorkModel: the graph has no nodes")
        # numpy, one thread: a few small passes between steps, kept out of torch's thread pool
        # (whose parallel regions wait on a busy core)
        src = edge_index[0].detach().cpu().numpy().astype(np.int64, copy=False)
        dst = edge_index[1].detach().cpu().numpy().astype(np.int64, copy=False)
        self.n = n
        self.src, self.dst = src, dst
        self.deg = np.bincount(dst, minlength=n).astype(np.float64)
        t = np.zeros(n, dtype=np.float64)
        t[inputs.detach().cpu().long().numpy()] = 1.0
        self.inputs = t
        self.num_inputs = max(1, int(num_inputs) if num_inputs is not None else int(t.sum()))
        self.disjoint = bool(disjoint)
        if n > subset:
            nodes = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:subset].numpy()
            local = np.full(n, -1, dtype=np.int64)
            local[nodes] = np.arange(subset)
            ls = local[src]
            keep = ls >= 0
            self.sub_nodes, self.sub_src, self.sub_dst = nodes, ls[keep], dst[keep]
            self.scale = n / subset
        else:
            self.sub_nodes, self.sub_src, self.sub_dst, self.scale = np.arange(n), src, dst, 1.0
        self._first: Dict[int, Any] = {}  # first hop's fanout -> sum over a node's out-edges of inputs * p
        self._cache: Dict[Tuple[int, Tuple[int, ...]], Tuple[float, float]] = {}

    def _hop(self, f: int):
        """(expected sampled in-edges of a node, probability that each of its in-edges is sampled)."""
        import numpy as np

        d = self.deg
        if f < 0:
            return d, np.ones_like(d)
        return np.minimum(d, float(f)), np.minimum(float(f) / np.maximum(d, 1.0), 1.0)

    def nodes_edges(self, seeds: int, fanout: Sequence[int]) -> Tuple[float, float]:
        """Expected (nodes, edges) per seed of a batch of ``seeds`` seeds (cached)."""
        import numpy as np

        seeds = max(1, int(seeds))
        key = (1 if self.disjoint else seeds, tuple(int(f) for f in fanout))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        q = min(1.0, key[0] / self.num_inputs)
        front = q * self.inputs
        seen = front.copy()
        count = float(front.sum())
        nodes, edges = count, 0.0
        L = len(key[1])
        for h, f in enumerate(key[1]):
            per, p = self._hop(f)
            edges += float(front @ per)
            if h == L - 1:  # the last hop's new nodes, on the subset
                w = front * p
                lam = np.bincount(self.sub_src, weights=w[self.sub_dst], minlength=len(self.sub_nodes))
                nodes += self.scale * float((-np.expm1(-lam)) @ (1 - seen[self.sub_nodes]))
                break
            if h == 0:
                a = self._first.get(f)
                if a is None:
                    a = np.bincount(self.src, weights=(self.inputs * p)[self.dst], minlength=self.n)
                    self._first[f] = a
                lam = q * a
            else:
                lam = np.bincount(self.src, weights=(front * p)[self.dst], minlength=self.n)
            new = -np.expm1(-lam) * (1 - seen)
            nodes += float(new.sum())
            seen = np.minimum(seen + new, 1.0)
            front = new
        out = (nodes / count, edges / count)
        self._cache[key] = out
        return out

    def per_seed(self, seeds: int, fanout: Sequence[int]) -> float:
        """Expected nodes + edges per seed."""
        n, e = self.nodes_edges(seeds, fanout)
        return n + e


class AdaptiveNeighborLoader(_Adaptive):
    """Neighbor-sampled mini-batches (a :class:`gnncompile.data.NeighborLoader` per plan) whose
    seeds per batch, prefetch depth (``pool_sizes``) and workers are re-chosen while training.

    ``sizes`` are seed counts per batch. The epoch's order of input nodes is drawn from
    ``seed`` and the epoch (shuffled) or kept; under data-parallel training each rank takes
    every world-size-th seed of it (padded by wrapping around to equal shares), so the ranks
    take the same steps. At a switch the rest of this rank's share is sampled by a new
    ``NeighborLoader`` (the sampler's CSC is the structure cache's, built once). The work of a
    batch (its nodes + edges) is known only once sampled: under a budget a candidate's is
    predicted by :class:`NeighborWorkModel` (from the graph's in-degrees, any size and fanout)
    times the largest measured-over-modelled ratio of the recent batches (``work_model=False``,
    or where the model does not apply: from the largest observed work per seed of the batches
    nearest below). Rates are compared in seeds per second (not work: a larger seed batch shares
    more of its sampled neighbourhood, so it does less work per seed, and seeds are what an
    epoch is made of). :meth:`set_num_neighbors` changes the fanout between epochs (a
    curriculum) or from the next batch. ``trials_in_epoch`` (default True): a trial starts only
    where the epoch's remaining seeds hold its window and the step left out after the switch,
    else at the next epoch's start (forgotten if the fanout changes there); a size whose
    window no epoch holds is measured for an epoch's steps less one. ``jump_at_change`` (default
    True): at a change of fanout the climb starts again from the size the change leaves, and
    where the work model predicts the new fanout's batches the size goes straight to the largest
    predicted to fit (:meth:`Policy.jump_to_fit`, a 'jump' entry); False: the size stays (shrunk
    before the next batch when predicted over the line) and the policy goes on from there, as
    before. ``batch_guard`` (default False: an opt-in; under a budget with a memory measure): each batch
    is checked once sampled, before it is yielded, from its own nodes and edges (the memory
    model's growth of that batch, :class:`NodeEdgeMemoryModel`): when the memory held now plus
    that growth would cross the budget, the step starts clean (counted in ``releases`` and
    ``batch_releases``); when even a clean start (the last clean reading's start, plus the
    growth and ``Policy.excess``) would cross it, the batch is dropped unyielded (its seeds not
    consumed; ``batch_drops``) and the size shrinks (a 'shrink' entry), the rest of the epoch
    re-planned. On the adapt_fanout benchmark (Zen 4, s60) a step's peak stayed under the
    memory at its start plus its batch's clean growth in each of 1642 steps without a clean
    start, while such a step's own growth reached 46-74 MiB at one size and fanout, without
    warning from the rises before it that the creep guard (``Policy.held_over``) watches: the
    allocator's, not the batch's (its nodes and edges vary by 0.3-2.4% there; see
    benchmarks/results/adapt_fanout_rises_zen4_s60b.md). Its price: it starts 21-70% of the steps
    clean there (a clean step costs 1.4-2x), and in interleaved pairs (s60b, e6) the 512-seed
    runs ran at 0.69x the seeds/s without it and the adaptive runs at 0.76x, hence an opt-in.
    ``batch_guard=False`` (the default): the creep guard alone, as before. Other arguments as
    :class:`AdaptiveLoader`; ``loader_kwargs`` go to ``NeighborLoader`` (replace, directed,
    disjoint, ...)."""

    def __init__(self, data: Any, num_neighbors: Any, *, input_nodes: Any = None, sizes: Sequence[int] = (256, 512, 1024),
                 pool_sizes: Sequence[int] = (2,), num_workers: Sequence[int] = (0,), start: Optional[Setting] = None,
                 shuffle: bool = False, seed: int = 0, memory_budget: Optional[int] = None, memory: Any = "auto",
                 margin: float = 0.1, min_gain: float = 0.05, window: int = 8, optimizer: Any = None,
                 lr_scaling: Optional[str] = None, device=None, clock: Callable[[], float] = time.perf_counter,
                 work_model: bool = True, trials_in_epoch: bool = True, jump_at_change: bool = True,
                 batch_guard: bool = False, **loader_kwargs) -> None:
        for k in ("batch_size", "shuffle", "sampler", "batch_sampler", "distributed", "num_replicas", "rank"):
            if k in loader_kwargs:
                raise ValueError(f"AdaptiveNeighborLoader chooses {k} itself")
        self.jump_at_change = bool(jump_at_change)
        self.batch_guard = bool(batch_guard)
        self.batch_releases = 0  # steps the batch guard started clean
        self.batch_drops = 0  # sampled batches the batch guard dropped (the size shrunk before them)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise ValueError(f"AdaptiveNeighborLoader: seed must be an int, got {seed!r}")
        super().__init__(sizes=sizes, pool_sizes=pool_sizes, num_workers=num_workers, start=start,
                         memory_budget=memory_budget, memory=memory, margin=margin, min_gain=min_gain, window=window,
                         optimizer=optimizer, lr_scaling=lr_scaling, device=device, clock=clock)
        self.data = data
        self.num_neighbors = self._check_fanout(num_neighbors)
        self.policy.unit = "seeds"
        self.policy.model = NodeEdgeMemoryModel()
        self.policy.clean_misses = True
        self.policy.growth_ahead = False  # see Policy.growth_ahead
        self.policy.growth_after_up = 2  # see Policy.growth_after_up
        self.policy.hold_shrunk = False  # see Policy.hold_shrunk
        if trials_in_epoch:
            self.policy.room = self._room
        self.work_model = bool(work_model)
        self._wm: Optional[NeighborWorkModel] = None
        self._wm_failed = False
        self._calib: Optional[float] = None  # measured / modelled work per seed (the last fanout's, after a change)
        self._estimated = False  # _per_seed holds only an estimate for a new fanout
        if input_nodes is None:
            self.inputs = torch.arange(int(data.num_nodes))
        else:
            t = torch.as_tensor(input_nodes)
            self.inputs = t.nonzero().view(-1) if t.dtype == torch.bool else t.long().view(-1)
        if self.inputs.numel() == 0:
            raise ValueError("AdaptiveNeighborLoader: no input nodes")
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.loader_kwargs = loader_kwargs
        dist = _dist()
        self.world = dist.get_world_size() if dist is not None else 1
        self.rank = dist.get_rank() if dist is not None else 0
        self._share = torch.empty(0, dtype=torch.long)
        self._pos = 0
        self._per_seed: List[Tuple[int, float]] = []  # (seeds, nodes + edges per seed) of recent batches

    def _epoch_share(self, epoch: int) -> torch.Tensor:
        n = self.inputs.numel()
        if self.shuffle:
            g = torch.Generator().manual_seed((self.seed * 1000003 + epoch) % (2**63))
            order = self.inputs[torch.randperm(n, generator=g)]
        else:
            order = self.inputs
        R = self.world
        if R == 1:
            return order
        total = -(-n // R) * R
        if total > n:
            order = order.repeat(-(-total // n))[:total]
        return order[self.rank:total:R]

    @staticmethod
    def _check_fanout(num_neighbors: Any) -> Any:
        """A list of ints >= 1 or -1 (all neighbors), one per hop; or a dict of them (hetero)."""
        def ok(v):
            return (not isinstance(v, (str, bytes, dict)) and hasattr(v, "__iter__") and len(list(v)) > 0 and
                    all(not isinstance(k, bool) and isinstance(k, numbers.Integral) and (k >= 1 or k == -1)
                        for k in v))
        if isinstance(num_neighbors, dict):
            if not num_neighbors or not all(ok(v) for v in num_neighbors.values()):
                raise ValueError(f"AdaptiveNeighborLoader: num_neighbors must map edge types to lists of ints "
                                 f">= 1 (or -1), got {num_neighbors!r}")
            return {k: [int(x) for x in v] for k, v in num_neighbors.items()}
        if not ok(num_neighbors):
            raise ValueError(f"AdaptiveNeighborLoader: num_neighbors must be a non-empty list of ints >= 1 (or -1: "
                             f"every neighbor), one per hop, got {num_neighbors!r}")
        return [int(x) for x in num_neighbors]

    @staticmethod
    def _fanout_bound(num_neighbors: Any) -> Optional[float]:
        """The most nodes + edges one seed can bring: 1 + 2 * (f1 + f1 f2 + ...); None when not
        bounded by the fanout alone (-1, or per edge type)."""
        if isinstance(num_neighbors, dict) or any(k < 0 for k in num_neighbors):
            return None
        total, prod = 1.0, 1.0
        for k in num_neighbors:
            prod *= k
            total += 2 * prod
        return total

    def set_num_neighbors(self, num_neighbors: Any) -> None:
        """Samples with ``num_neighbors`` from the next batch on (between epochs: from the next
        epoch), without a restart: the seeds not yet yielded are sampled by a new
        ``NeighborLoader`` (as at a switch; none lost or repeated). The number of hops may not
        change (the model's depth). Under a budget the new fanout's work is predicted by
        :class:`NeighborWorkModel` with the calibration measured under the old one until the
        first batch under the new fanout is measured; where the model does not apply, the
        observed work per seed is scaled by the ratio of the fanouts' bounds (1 + 2 * (f1 + f1
        f2 + ...), conservative), and without a bound (-1, per edge type) it is unknown until
        measured and the size shrinks to the smallest. The policy starts a new measurement
        window (:meth:`Policy.workload_changed`). ValueError on a bad fanout."""
        new = self._check_fanout(num_neighbors)
        old = self.num_neighbors
        if isinstance(new, dict) != isinstance(old, dict) or (
                not isinstance(new, dict) and len(new) != len(old)) or (
                isinstance(new, dict) and any(len(v) != len(old.get(k, v)) for k, v in new.items())):
            raise ValueError(f"AdaptiveNeighborLoader.set_num_neighbors: {num_neighbors!r} has another number of "
                             f"hops (or edge types) than {old!r}")
        if new == old:
            return
        modelled = self._calibration() is not None  # before the fanout changes: this fanout's calibration
        self.num_neighbors = new
        reason = f"fanout {old} -> {new}"
        b_old, b_new = self._fanout_bound(old), self._fanout_bound(new)
        if modelled:
            self._per_seed, self._estimated = [], False  # the model predicts the new fanout; calibration carried
        elif self._per_seed:
            if b_old is not None and b_new is not None:
                size = self.setting.size
                self._per_seed = [(size, self._seed_work(size) / size * b_new / b_old)]
                self._estimated = True
            else:
                self._per_seed = []
        entries = []
        dist = _dist()
        if dist is None or dist.get_rank() == 0:
            entries.append(self.policy.workload_changed(reason, climb=self.jump_at_change))
            if not modelled and not self._per_seed and self.policy.budget is not None and \
                    self.setting.size != self.sizes[0]:
                entries.append(self.policy._switch("shrink", Setting(self.sizes[0], self.setting.pool_size,
                                                                     self.setting.num_workers), None,
                                                   f"{reason}: work per seed unknown until measured"))
            elif modelled and self.jump_at_change:  # the new fanout's batches are predicted: the largest that fits
                entries.append(self.policy.jump_to_fit(reason))
            entries = [e for e in entries if e is not None]
        else:
            self.policy.workload_changed(reason, climb=self.jump_at_change)
        if dist is not None:
            last = self._broadcast(dist, entries[-1] if entries else None)
            if dist.get_rank() != 0:
                entries = [] if last is None else [last]
        for e in entries:
            self._record(e)
        log.info("adapt: step %d fanout %s -> %s", self.step, old, new)
        self._replan = True

    def _progress(self, info: Dict[str, Any]) -> Optional[float]:
        return info["graphs"]  # seeds

    def _work_ahead(self, setting: Setting, steps: int) -> Optional[int]:
        # a full batch even near the epoch's end: the next epoch's batches follow (a trial
        # predicted on the last few seeds only would take any size for one that fits)
        seeds = min(setting.size, max(1, self._share.numel() or self.inputs.numel()))
        w = self._modelled_work(seeds)
        if w is not None:
            return w  # a Work: its nodes and edges for the memory model
        if not self._per_seed:
            return None
        return int(round(self._seed_work(seeds)))

    def _room(self, setting: Setting) -> Optional[Tuple[int, int]]:
        """(steps left in this epoch, steps of a whole epoch) under ``setting``: 0 left after the
        epoch's last step (a trial waits for the next epoch's start, :meth:`_check_ahead`, after a
        change of fanout if any). None before the first epoch."""
        n = self._share.numel()
        if n == 0:
            return None
        whole = -(-n // setting.size)
        if self._pos == 0:  # an epoch about to start
            return whole, whole
        return -(-(n - self._pos) // setting.size), whole  # 0 at the epoch's last step: the next epoch's start

    def _model(self) -> Optional["NeighborWorkModel"]:
        """The work model of this graph (:class:`NeighborWorkModel`, built at its first use), or
        None where it does not apply: ``work_model=False``, a heterogeneous graph or fanout,
        ``directed=False`` (the induced subgraph), ``replace=True`` (the model overstated the
        sampled work by 22% there: not used), temporal or weighted sampling."""
        if self._wm is not None or self._wm_failed:
            return self._wm
        kw = self.loader_kwargs
        ei = getattr(self.data, "edge_index", None) if not isinstance(self.num_neighbors, dict) else None
        if self.policy.budget is None:  # predictions only steer a budget
            return None
        if (not self.work_model or not isinstance(ei, torch.Tensor) or ei.dim() != 2 or ei.size(0) != 2
                or not kw.get("directed", True) or kw.get("replace", False) or any(kw.get(k) is not None for k in
                                                        ("time_attr", "weight_attr", "input_time"))):
            self._wm_failed = True
            return None
        self._wm = NeighborWorkModel(ei, int(self.data.num_nodes), self.inputs, disjoint=bool(kw.get("disjoint", False)),
                                     num_inputs=-(-self.inputs.numel() // self.world), seed=self.seed)
        return self._wm

    def _calibration(self) -> Optional[float]:
        """Measured over modelled work per seed: the largest ratio among the recent batches under
        this fanout (the model falls a few percent short, and batches vary), else the last
        fanout's (None before any batch)."""
        wm = self._model()
        if wm is None:
            return None
        if self._per_seed and not self._estimated:
            self._calib = max(p / max(1e-9, wm.per_seed(s, self.num_neighbors)) for s, p in self._per_seed[-32:])
        return self._calib

    def _modelled_work(self, seeds: int) -> Optional[float]:
        """The work (nodes + edges) of a batch of ``seeds`` seeds under the current fanout from
        the work model and its calibration; None without them."""
        c = self._calibration()
        if c is None:
            return None
        n, e = self._wm.nodes_edges(seeds, self.num_neighbors)
        return Work(seeds * n * c, seeds * e * c)

    def _seed_work(self, seeds: int) -> float:
        """The predicted work (nodes + edges) of a batch of ``seeds`` seeds from the recent
        batches: ``seeds`` times the largest work per seed among the batches of the largest
        seed count at most ``seeds`` (a larger seed batch
        shares more of its neighbourhood, so its work per seed is at most a smaller one's; the
        largest per-seed work of all, from the smallest batches, predicted 512 seeds at 1.1x
        the work of 256 at fanout [5, 5] on a 20k-node graph and so never let the size
        double under Policy.EXTRAPOLATE); below every batch measured, the work of the smallest
        (fewer seeds sample no more)."""
        obs = self._per_seed[-32:]
        below = [(s, p) for s, p in obs if s <= seeds]
        if below:
            top = max(s for s, _ in below)
            return seeds * max(p for s, p in below if s == top)
        low = min(s for s, _ in obs)
        return max(s * p for s, p in obs if s == low)

    def _more_to_come(self) -> bool:
        return self._pos < self._share.numel()

    def _guard_batch(self, seeds: int, nodes: int, edges: int) -> bool:
        """The batch guard (``batch_guard``) on a sampled batch before it is yielded: True when
        the batch is dropped (the size shrunk); may ask for a clean start."""
        pol, probe = self.policy, self.probe
        if not self.batch_guard or probe is None or pol.budget is None:
            return False
        work = Work(nodes, edges)
        g = pol.model.growth(work)
        if g is None:
            return False
        clean_peak = pol._predict_work(work)
        if clean_peak is not None and clean_peak > pol.budget and self.setting.size > self.sizes[0] \
                and _dist() is None:
            entry = pol._shrunk(f"the sampled batch ({seeds} seeds: {nodes} nodes, {edges} edges) predicted at "
                                f"{clean_peak / 2**20:.1f} MiB from a clean start, over the budget "
                                f"{pol.budget / 2**20:.1f} MiB")
            if entry is not None:
                self.batch_drops += 1
                self._record(entry)
                nxt = pol.before_step()
                if nxt is not None:
                    self._record(nxt)
                return True
        if probe.next_clean():
            return False
        now = probe.current()
        if now is not None and now + int(g) > pol.budget and probe.release_next():
            self.releases += 1
            self.batch_releases += 1
            log.debug("adapt: step %d starts clean: %.1f MiB held + the batch's growth %.1f MiB over the budget",
                      self.step, now / 2**20, g / 2**20)
        return False

    def _loader(self, seeds: torch.Tensor):
        from .data import NeighborLoader

        s = self.setting
        kw = dict(self.loader_kwargs)
        if s.num_workers > 0:
            kw.setdefault("prefetch_factor", max(1, math.ceil(s.pool_size / s.num_workers)))
        return NeighborLoader(self.data, self.num_neighbors, input_nodes=seeds, batch_size=s.size, shuffle=False,
                              num_workers=s.num_workers, seed=(self.seed * 7919 + self.epoch * 104729 + self._pos)
                              % (2**62), **kw)

    def __len__(self) -> int:
        n = -(-self.inputs.numel() // self.world)
        return -(-n // self.setting.size)

    def __iter__(self) -> Iterator:
        self.step_done()
        self.epoch += 1
        self._share = self._epoch_share(self.epoch)
        self._pos = 0
        self._check_ahead()
        self._t_last = self.clock()
        n = self._share.numel()
        while self._pos < n:
            self._replan = False
            loader = self._loader(self._share[self._pos:])
            for batch in loader:
                seeds = int(batch.batch_size)
                nodes, edges = int(batch.num_nodes), int(batch.edge_index.size(1))
                if self._estimated:  # the first batch under a new fanout replaces the estimate
                    self._per_seed, self._estimated = [], False
                self._per_seed.append((seeds, (nodes + edges) / max(1, seeds)))
                del self._per_seed[:-64]
                if self._guard_batch(seeds, nodes, edges):
                    break  # dropped: the size shrank, the rest of the epoch is planned again from _pos
                if self.device is not None:
                    batch = batch.to(self.device, non_blocking=True)
                self._begin({"graphs": seeds, "nodes": nodes, "edges": edges})
                self._pos += seeds
                yield batch
                self.step_done()
                if self._replan:
                    break
            del loader


__all__ = ["AdaptiveLoader", "AdaptiveNeighborLoader", "NeighborWorkModel", "Setting", "Policy", "MemoryModel", "NodeEdgeMemoryModel", "Work", "MemoryProbe",
           "CudaMemory", "RssMemory", "FnMemory"]
